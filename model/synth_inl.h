#pragma once
// Template part of model/synth.h.

#include <string>

namespace strata {

template <typename Fn>
void ForEachModelTensor(const ModelConfig& c, Fn&& fn) {
  const int64_t dim = c.dim, q = c.q_dim(), kv = c.kv_dim(), ffn = c.ffn_dim, vocab = c.vocab_size;
  fn(std::string("token_embd.weight"), 'e', std::vector<int64_t>{dim, vocab});
  for (int i = 0; i < c.n_layers; ++i) {
    std::string p = "blk." + std::to_string(i) + ".";
    fn(p + "attn_norm.weight", 'n', std::vector<int64_t>{dim});
    fn(p + "attn_q.weight", 'w', std::vector<int64_t>{dim, q});
    fn(p + "attn_k.weight", 'w', std::vector<int64_t>{dim, kv});
    fn(p + "attn_v.weight", 'w', std::vector<int64_t>{dim, kv});
    if (c.qkv_bias) {
      fn(p + "attn_q.bias", 'b', std::vector<int64_t>{q});
      fn(p + "attn_k.bias", 'b', std::vector<int64_t>{kv});
      fn(p + "attn_v.bias", 'b', std::vector<int64_t>{kv});
    }
    fn(p + "attn_output.weight", 'w', std::vector<int64_t>{q, dim});
    fn(p + "ffn_norm.weight", 'n', std::vector<int64_t>{dim});
    fn(p + "ffn_gate.weight", 'w', std::vector<int64_t>{dim, ffn});
    fn(p + "ffn_up.weight", 'w', std::vector<int64_t>{dim, ffn});
    fn(p + "ffn_down.weight", 'w', std::vector<int64_t>{ffn, dim});
  }
  fn(std::string("output_norm.weight"), 'n', std::vector<int64_t>{dim});
  if (!c.tied_embeddings) fn(std::string("output.weight"), 'w', std::vector<int64_t>{dim, vocab});
}

}  // namespace strata
