#pragma once
// Loading a Hugging Face model directory (config.json + safetensors weights +
// tokenizer files) into ModelWeights. Supported architectures:
// LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM (or model_type
// llama / mistral / qwen2 when "architectures" is absent).
//
// Mapping decisions:
// - rope_style is always RopeStyle::kNeox: HF checkpoints rotate halves
//   (rotate_half), so Q/K rows are used as stored.
// - rope_scaling null / "default" / "linear" / "llama3" are supported (read
//   from "rope_scaling", or transformers v5's "rope_parameters"); any other
//   type ("yarn", "dynamic", ...) is Unsupported naming it.
// - Sliding-window attention (mistral "sliding_window"; qwen2 with
//   "use_sliding_window": true) is not implemented. When the window is smaller
//   than max_position_embeddings, context_length is clamped to the window
//   (and a warning logged): within one window sliding-window attention equals
//   plain causal attention, so the model computes exactly HF's function for
//   every sequence it accepts.
// - llama "attention_bias": true gives q/k/v biases (qkv_bias) and also an
//   o_proj bias, which Strata has no slot for: it is accepted only if it is
//   all zeros (as WriteHfModel writes it), else Unsupported naming the tensor.
// - qwen2 always has q/k/v biases. "mlp_bias": true, hidden_act other than
//   "silu", and "quantization_config" are Unsupported.

#include <string>
#include <string_view>

#include "common/status.h"
#include "model/model_config.h"
#include "model/weights.h"

namespace strata {

struct HfModel {
  ModelWeights weights;  // tensors point into weights.files (mapped shards)
  // Contents of these files, empty when the file is absent.
  std::string tokenizer_json;
  std::string tokenizer_config_json;
  std::string generation_config_json;
};

// Parses a config.json text. config.name is left empty. Errors name the key at
// fault; unknown keys are ignored.
Result<ModelConfig> ParseHfConfig(std::string_view config_json);

// Loads `dir`: config.json, then model.safetensors if present, else the shards
// listed in model.safetensors.index.json (each shard mapped once and kept in
// weights.files; only shards holding needed tensors are opened). Tensors are
// used in place, never copied; extra tensors in the files are ignored. When
// tie_word_embeddings is set, weights.output aliases weights.tok_embd (any
// lm_head.weight is ignored, as HF does). Ends with ValidateWeights().
// config.name is the directory's base name; weights.digest is left empty.
// Errors: NotFound for a missing config.json / weights file / tensor (named),
// Unsupported for an unknown architecture (named), Corrupt for malformed JSON
// or shape mismatches (tensor named).
Result<HfModel> LoadHfModel(const std::string& dir);

}  // namespace strata
