#pragma once
// Writing ModelWeights as a Hugging Face model directory that LoadHfModel (and
// transformers) can read: config.json, safetensors weights (one file or
// shards + index), tokenizer files.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "model/backend/dtype.h"
#include "model/model_config.h"
#include "model/tensor.h"
#include "model/weights.h"

namespace strata {

// config.json text for `c` ("architectures", "model_type", sizes, rope_theta,
// rope_scaling, tie_word_embeddings, attention_bias for llama, ...) with
// "torch_dtype" from `dtype`. rope_style is not written: HF checkpoints are
// always half-split (kNeox), see WriteHfModel. GGUF per-frequency RoPE
// divisors (rope_freq_factors) are written as the Llama-3 rope_scaling that
// reproduces them (low 1, high 4, original context 8192, factor solved from
// the lowest frequency's divisor), else Unsupported. Unsupported also for an unknown arch or a
// dtype other than F32/F16/BF16.
Result<std::string> MakeHfConfigJson(const ModelConfig& c, DType dtype);

// Reorders the rows of a Q or K projection (ne = {in, n_heads * head_dim}) or
// of its bias (ne = {n_heads * head_dim}, one element per row) from GGUF's
// interleaved RoPE pairing to HF's half-split pairing. Within each head, for
// i < head_dim / 2:
//   out row i                = in row 2i
//   out row i + head_dim / 2 = in row 2i + 1
// This is the inverse of llama.cpp's convert_hf_to_gguf permute(). For K,
// pass the KV head count. InvalidArgument when the row count is not
// n_heads * head_dim, head_dim is odd, or the type is quantized.
Result<std::vector<uint8_t>> PermuteInterleavedToNeox(const Tensor& t, int n_heads, int head_dim);

// Writes `w` into `dir` (created, parents included; existing files replaced):
// - config.json (MakeHfConfigJson, torch_dtype from the token embedding);
// - model.safetensors, or, when max_shard_bytes > 0 and the tensors do not fit
//   in one file of that size, model-0000i-of-0000n.safetensors plus
//   model.safetensors.index.json. Shards are filled greedily in HF tensor
//   order; a tensor larger than max_shard_bytes gets a shard of its own. A
//   stale model.safetensors or index from an earlier layout is removed so it
//   cannot shadow the new one.
// - tokenizer.json and tokenizer_config.json when non-empty.
// Tensor data is streamed from w's storage; only permuted Q/K rows (see
// below) are copied, one shard at a time.
// REQUIRES: ValidateWeights(w) passes (checked; its error is returned).
// Unsupported for quantized tensors (named) and for mistral with qkv biases.
// With config.rope_style == kInterleaved (GGUF llama/mistral), Q/K weights and
// biases are written through PermuteInterleavedToNeox so the checkpoint
// computes the same function under HF's rotate_half. Layouts HF requires but
// Strata does not store are written as zeros: o_proj.bias for llama with
// qkv_bias, q/k/v biases for qwen2 without qkv_bias (which therefore loads
// back with qkv_bias = true). On failure `dir` may hold some of the files.
Status WriteHfModel(const std::string& dir, const ModelWeights& w, std::string_view tokenizer_json,
                    std::string_view tokenizer_config_json, size_t max_shard_bytes = 0);

}  // namespace strata
