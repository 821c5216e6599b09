#pragma once
// A deliberately slow, obviously correct forward pass in double precision,
// written straight from the Llama equations with no blocks, no batching, no
// SIMD. The fast engine is checked against it on the same dequantized weights.

#include <cstdint>
#include <vector>

#include "model/weights.h"

namespace strata::testing {

class ReferenceModel {
 public:
  explicit ReferenceModel(const ModelWeights& w);
  // Logits (vocab_size doubles) for every position of `tokens`.
  std::vector<std::vector<double>> Forward(const std::vector<int32_t>& tokens) const;

 private:
  using Mat = std::vector<double>;  // rows × cols, row-major
  struct Layer {
    Mat attn_norm, wq, wk, wv, wo, bq, bk, bv, ffn_norm, w_gate, w_up, w_down;
  };
  const ModelConfig c_;
  Mat tok_embd_, output_norm_, output_;
  std::vector<Layer> layers_;
  std::vector<double> inv_freq_;
};

}  // namespace strata::testing
