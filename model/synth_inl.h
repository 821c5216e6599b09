#pragma once
// Template part of model/synth.h.

#include <string>

namespace strata {

template <typename Fn>
void ForEachModelTensor(const ModelConfig& c, Fn&& fn) {
  const int64_t dim = c.dim, vocab = c.vocab_size;
  fn(std::string("token_embd.weight"), 'e', std::vector<int64_t>{dim, vocab});
  for (int i = 0; i < c.n_layers; ++i) {
    const std::string p = "blk." + std::to_string(i) + ".";
    for (const LayerTensorInfo& info : kLayerTensors) {
      if (!info.Present(c)) continue;
      const char kind = info.kind == LayerTensorInfo::Kind::kNorm   ? 'n'
                        : info.kind == LayerTensorInfo::Kind::kBias ? 'b'
                                                                    : 'w';
      fn(p + info.name, kind, info.Shape(c));
    }
  }
  fn(std::string("output_norm.weight"), 'n', std::vector<int64_t>{dim});
  if (!c.tied_embeddings) fn(std::string("output.weight"), 'w', std::vector<int64_t>{dim, vocab});
}

}  // namespace strata
