#pragma once
// Quantizing a model's weights to a GGUF file: `strata model quantize`.
//
// A recipe names the weight type: one type for every matrix ("pure", as
// `llama-quantize --pure` does: q8_0, q4_0, q4_k, q5_k, q6_k, or f16, bf16,
// f32), or the q4_k_m mix, which assigns types tensor by tensor exactly as
// llama.cpp's `llama-quantize Q4_K_M` does (src/llama-quant.cpp at c392e509)
// for Llama-family models:
//   - output.weight (token_embd.weight when the embeddings are tied): q6_k;
//   - attn_v.weight and ffn_down.weight of layer i of n: q6_k when
//     i < n/8, i >= 7n/8 or (i - n/8) % 3 == 2 ("use more bits"), else q4_k
//     (attn_v: q5_k in a "70B" model: 80 layers, and grouped KV heads
//     unless the arch is qwen2);
//   - every other matrix: q4_k.
// Norms and biases (1-D tensors) keep their stored type.
//
// Fallback rule, for a matrix whose row width does not divide the chosen
// type's block: a K-quant (256-element blocks) falls back to q8_0, then any
// 32-element type to f16 (the output rule of llama-quantize gives q8_0 too;
// for q4_k and q5_k it would pick q5_0 / q5_1, which Strata does not
// implement, so there the census differs from llama.cpp's).
//
// Values are quantized from f32, f16 or bf16 weights (already quantized
// weights are dequantized first only when allow_requantize is set), with
// ggml's reference quantizers (no importance matrix) except as the plan's
// `fit` says: by default q8_0 and q4_0 blocks take the least-squares scale
// (QuantFit::kLeastSquares in model/backend/dtype.h), so their files are
// llama-quantize's byte for byte only with fit = kGgml; every other type's
// bytes are ggml's either way.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"
#include "model/backend/dtype.h"
#include "model/tokenizer/tokenizer_spec.h"
#include "model/weights.h"

namespace strata {

// "f32", "f16", "bf16", "q8_0", "q4_0", "q4_k", "q5_k", "q6_k", "q4_k_m".
std::vector<std::string> QuantizeRecipeNames();

struct TensorQuantPlan {
  std::string name;
  std::vector<int64_t> ne;
  DType from = DType::kF32;
  DType to = DType::kF32;
  bool fallback = false;  // `to` is the fallback rule's, not the recipe's
};

struct QuantizePlan {
  std::string recipe;
  std::vector<TensorQuantPlan> tensors;  // in file order
  QuantFit fit = QuantFit::kLeastSquares;
  // Tensors per resulting type name ("q4_k" -> 154).
  std::map<std::string, int> Census() const;
};

// The type of every tensor of `w` under `recipe`. InvalidArgument for an
// unknown recipe, or a quantized source tensor that would change type
// without allow_requantize.
Result<QuantizePlan> PlanQuantization(const ModelWeights& w, const std::string& recipe, bool allow_requantize);

// Writes `w` as GGUF with every tensor converted as `plan` says, tensor by
// tensor (the output is never held in memory whole), using `threads`
// threads (>= 1) for the conversion. `synthetic` keeps the file marked as
// random weights. Atomic: on failure `path` is untouched.
// REQUIRES: plan came from PlanQuantization(w, ...).
Status WriteQuantizedGguf(const ModelWeights& w, const TokenizerSpec& tok, const QuantizePlan& plan, bool synthetic,
                          int threads, const std::string& path);

}  // namespace strata
