#pragma once
// The weights of a loaded model, in their stored types. ModelWeights owns the
// storage (mapped files, or buffers for tensors converted at load) that every
// Tensor points into; it is immutable after loading and safe to share across
// threads.

#include <memory>
#include <string>
#include <vector>

#include "common/mapped_file.h"
#include "common/sha256.h"
#include "model/model_config.h"
#include "model/tensor.h"

namespace strata {

struct LayerWeights {
  Tensor attn_norm;             // {dim}
  Tensor wq, wk, wv, wo;        // {dim, q_dim}, {dim, kv_dim}, {dim, kv_dim}, {q_dim, dim}
  Tensor bq, bk, bv;            // biases when config.qkv_bias, else absent
  Tensor ffn_norm;              // {dim}
  Tensor w_gate, w_up, w_down;  // {dim, ffn}, {dim, ffn}, {ffn, dim}
};

// The one list of a layer's tensors, in GGUF file order: the name after
// "blk.N.", the member, its kind and its shape (GGUF order: ne[0] = row
// width). Loading, validation, enumeration and synthesis all read it.
struct LayerTensorInfo {
  enum class Kind { kNorm, kMatrix, kBias };  // a bias exists only with config.qkv_bias
  enum class Dim { kNone, kModel, kQ, kKv, kFfn };
  const char* name;
  Tensor LayerWeights::*member;
  Kind kind;
  Dim ne0, ne1;  // ne1 kNone: one dimension
  std::vector<int64_t> Shape(const ModelConfig& c) const;
  bool Present(const ModelConfig& c) const { return kind != Kind::kBias || c.qkv_bias; }
};
inline constexpr LayerTensorInfo kLayerTensors[] = {
    {"attn_norm.weight", &LayerWeights::attn_norm, LayerTensorInfo::Kind::kNorm, LayerTensorInfo::Dim::kModel,
     LayerTensorInfo::Dim::kNone},
    {"attn_q.weight", &LayerWeights::wq, LayerTensorInfo::Kind::kMatrix, LayerTensorInfo::Dim::kModel,
     LayerTensorInfo::Dim::kQ},
    {"attn_k.weight", &LayerWeights::wk, LayerTensorInfo::Kind::kMatrix, LayerTensorInfo::Dim::kModel,
     LayerTensorInfo::Dim::kKv},
    {"attn_v.weight", &LayerWeights::wv, LayerTensorInfo::Kind::kMatrix, LayerTensorInfo::Dim::kModel,
     LayerTensorInfo::Dim::kKv},
    {"attn_q.bias", &LayerWeights::bq, LayerTensorInfo::Kind::kBias, LayerTensorInfo::Dim::kQ,
     LayerTensorInfo::Dim::kNone},
    {"attn_k.bias", &LayerWeights::bk, LayerTensorInfo::Kind::kBias, LayerTensorInfo::Dim::kKv,
     LayerTensorInfo::Dim::kNone},
    {"attn_v.bias", &LayerWeights::bv, LayerTensorInfo::Kind::kBias, LayerTensorInfo::Dim::kKv,
     LayerTensorInfo::Dim::kNone},
    {"attn_output.weight", &LayerWeights::wo, LayerTensorInfo::Kind::kMatrix, LayerTensorInfo::Dim::kQ,
     LayerTensorInfo::Dim::kModel},
    {"ffn_norm.weight", &LayerWeights::ffn_norm, LayerTensorInfo::Kind::kNorm, LayerTensorInfo::Dim::kModel,
     LayerTensorInfo::Dim::kNone},
    {"ffn_gate.weight", &LayerWeights::w_gate, LayerTensorInfo::Kind::kMatrix, LayerTensorInfo::Dim::kModel,
     LayerTensorInfo::Dim::kFfn},
    {"ffn_up.weight", &LayerWeights::w_up, LayerTensorInfo::Kind::kMatrix, LayerTensorInfo::Dim::kModel,
     LayerTensorInfo::Dim::kFfn},
    {"ffn_down.weight", &LayerWeights::w_down, LayerTensorInfo::Kind::kMatrix, LayerTensorInfo::Dim::kFfn,
     LayerTensorInfo::Dim::kModel},
};

struct ModelWeights {
  ModelWeights() = default;
  ModelWeights(ModelWeights&&) = default;
  ModelWeights& operator=(ModelWeights&&) = default;
  // Tensors point into owned storage: a copy would share or dangle.
  ModelWeights(const ModelWeights&) = delete;
  ModelWeights& operator=(const ModelWeights&) = delete;

  ModelConfig config;
  Tensor tok_embd;     // {dim, vocab}
  Tensor output_norm;  // {dim}
  Tensor output;       // {dim, vocab}; equals tok_embd when tied
  std::vector<LayerWeights> layers;

  // Identity of the weights (feeds the KV namespace digest): SHA-256 over the
  // file bytes' sampled digest, architecture and shapes. Hex.
  std::string digest;

  // Storage that the tensors point into.
  std::vector<std::unique_ptr<MappedFile>> files;
  std::vector<std::shared_ptr<const void>> holders;  // e.g. the parsed GgufFile
  std::vector<std::vector<uint8_t>> owned;

  // Copies `bytes` into storage owned by this object and returns its address.
  const uint8_t* Own(std::vector<uint8_t> bytes) {
    owned.push_back(std::move(bytes));
    return owned.back().data();
  }
};

// SHA-256 (hex) over the architecture, every tensor's name, type and shape,
// and its bytes (tensors over 1 MiB contribute 64 evenly spaced 4 KiB samples
// plus their last 4 KiB, so multi-GB models hash in milliseconds).
std::string ComputeWeightsDigest(const ModelWeights& w);

// Calls fn(gguf_name, tensor) for every present tensor of `w` in GGUF naming
// and file order (token_embd, then each layer's, output_norm, output; the
// output is skipped when the embeddings are tied).
template <typename Fn>
void ForEachWeightTensor(const ModelWeights& w, Fn&& fn) {
  auto add = [&](const std::string& name, const Tensor& t) {
    if (t.present()) fn(name, t);
  };
  add("token_embd.weight", w.tok_embd);
  for (size_t i = 0; i < w.layers.size(); ++i) {
    const LayerWeights& l = w.layers[i];
    const std::string p = "blk." + std::to_string(i) + ".";
    for (const LayerTensorInfo& info : kLayerTensors) add(p + info.name, l.*info.member);
  }
  add("output_norm.weight", w.output_norm);
  if (!w.config.tied_embeddings) add("output.weight", w.output);
}

// Checks that every tensor is present with the shape the config implies and
// a supported type (norms and biases must be F32, F16 or BF16).
Status ValidateWeights(const ModelWeights& w);

}  // namespace strata
