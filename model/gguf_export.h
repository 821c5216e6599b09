#pragma once
// Writing models as standard GGUF files that other GGUF readers load.

#include <map>
#include <string>

#include "common/status.h"
#include "model/synth.h"
#include "model/tokenizer/tokenizer_spec.h"
#include "model/weights.h"

namespace strata {

// Writes `w` (any supported tensor types) with `tok` as its tokenizer.
Status WriteModelGguf(const ModelWeights& w, const TokenizerSpec& tok, const std::string& path);

struct GgufExportOptions {
  // Tensors (by GGUF name) written in another type: decoded to f32 and
  // encoded again (QuantizeRow), a chunk of rows at a time while writing.
  // A tensor not named keeps its stored type and bytes.
  std::map<std::string, DType> types;
  bool synthetic = false;  // mark the file as random weights (strata.synthetic)
  int threads = 1;         // threads converting (the caller's included)
  QuantFit fit = QuantFit::kGgml;  // how converted tensors' block scales are chosen
};
// The same, with tensors converted as `opt` says (while writing: `w`'s
// storage is read until this returns). InvalidArgument when a tensor's rows
// do not divide into its new type's blocks; Unsupported for weights GGUF
// cannot carry (interleaved pairing under qwen2). Llama-3 RoPE scaling (or
// a GGUF source's per-frequency factors) is written as the rope_freqs
// tensor llama.cpp reads.
// Weights in the NeoX RoPE pairing under arch llama/mistral (a Hugging Face
// Llama directory, as it loads) are written with their attn_q/attn_k rows
// (and biases) permuted to the interleaved pairing GGUF llama implies, as
// llama.cpp's converter does; the file computes the same function.
Status WriteModelGguf(const ModelWeights& w, const TokenizerSpec& tok, const std::string& path,
                      const GgufExportOptions& opt);

// Writes a synthetic model tensor by tensor (generated while writing, so a
// multi-GB model never sits in memory). The file says it is synthetic:
// general.name ends in "-random-weights" and key strata.synthetic = true.
Status WriteSyntheticGguf(const ModelConfig& c, const TokenizerSpec& tok, const SynthOptions& opt,
                          const std::string& path);

}  // namespace strata
