#include "model/weights.h"

#include <string>

#include "common/sha256.h"

namespace strata {

namespace {

std::string Shape(const Tensor& t) {
  std::string s = "{";
  for (size_t i = 0; i < t.ne.size(); ++i) s += (i ? ", " : "") + std::to_string(t.ne[i]);
  return s + "}";
}

Status Expect(const Tensor& t, const std::string& what, const std::vector<int64_t>& want, bool small) {
  if (!t.present()) return Status::NotFound("tensor '" + what + "' is missing");
  if (t.ne != want) {
    Tensor w;
    w.ne = want;
    return Status::Corrupt("tensor '" + t.name + "' has shape " + Shape(t) + ", expected " + Shape(w));
  }
  if (small && t.type != DType::kF32 && t.type != DType::kF16 && t.type != DType::kBF16)
    return Status::Unsupported("tensor '" + t.name + "' (norm or bias) must be f32, f16 or bf16, not " +
                               std::string(DTypeName(t.type)));
  if (t.cols() % GetDTypeInfo(t.type).block_elems != 0)
    return Status::Corrupt("tensor '" + t.name + "' row length " + std::to_string(t.cols()) +
                           " is not a multiple of its " + std::string(DTypeName(t.type)) + " block");
  if (t.nbytes != RowBytes(t.type, t.cols()) * static_cast<size_t>(t.rows()))
    return Status::Corrupt("tensor '" + t.name + "' byte size does not match its shape and type");
  return Status::Ok();
}

}  // namespace

std::string ComputeWeightsDigest(const ModelWeights& w) {
  Sha256 h;
  const ModelConfig& c = w.config;
  std::string head = c.arch + "|" + std::to_string(c.vocab_size) + "|" + std::to_string(c.dim) + "|" +
                     std::to_string(c.n_layers) + "|" + std::to_string(c.n_heads) + "|" + std::to_string(c.n_kv_heads) +
                     "|" + std::to_string(c.head_dim) + "|" + std::to_string(c.ffn_dim) + "|" +
                     std::to_string(c.rope_theta) + "|" + std::to_string(static_cast<int>(c.rope_style)) + "|";
  h.Update(head);
  auto add = [&](const Tensor& t) {
    if (!t.present()) return;
    std::string d = t.name + ":" + std::string(DTypeName(t.type));
    for (int64_t n : t.ne) d += "," + std::to_string(n);
    h.Update(d);
    constexpr size_t kWhole = 1 << 20, kSample = 4096, kSamples = 64;
    if (t.nbytes <= kWhole) {
      h.Update(t.data, t.nbytes);
    } else {
      size_t stride = (t.nbytes - kSample) / kSamples;
      for (size_t i = 0; i < kSamples; ++i) h.Update(t.data + i * stride, kSample);
      h.Update(t.data + t.nbytes - kSample, kSample);
    }
  };
  add(w.tok_embd);
  add(w.output_norm);
  if (w.output.data != w.tok_embd.data) add(w.output);
  for (const auto& l : w.layers) {
    for (const Tensor* t : {&l.attn_norm, &l.wq, &l.wk, &l.wv, &l.wo, &l.bq, &l.bk, &l.bv, &l.ffn_norm, &l.w_gate,
                            &l.w_up, &l.w_down})
      add(*t);
  }
  return ToHex(h.Finish());
}

std::vector<int64_t> LayerTensorInfo::Shape(const ModelConfig& c) const {
  auto size = [&](Dim d) -> int64_t {
    switch (d) {
      case Dim::kModel:
        return c.dim;
      case Dim::kQ:
        return c.q_dim();
      case Dim::kKv:
        return c.kv_dim();
      case Dim::kFfn:
        return c.ffn_dim;
      case Dim::kNone:
        break;
    }
    return 0;
  };
  if (ne1 == Dim::kNone) return {size(ne0)};
  return {size(ne0), size(ne1)};
}

Status ValidateWeights(const ModelWeights& w) {
  const ModelConfig& c = w.config;
  STRATA_RETURN_IF_ERROR(c.Validate());
  STRATA_RETURN_IF_ERROR(Expect(w.tok_embd, "token_embd", {c.dim, c.vocab_size}, false));
  STRATA_RETURN_IF_ERROR(Expect(w.output_norm, "output_norm", {c.dim}, true));
  STRATA_RETURN_IF_ERROR(Expect(w.output, "output", {c.dim, c.vocab_size}, false));
  if (static_cast<int>(w.layers.size()) != c.n_layers)
    return Status::Corrupt("model has " + std::to_string(w.layers.size()) + " layers, config says " +
                           std::to_string(c.n_layers));
  for (int i = 0; i < c.n_layers; ++i) {
    const LayerWeights& l = w.layers[i];
    const std::string p = "blk." + std::to_string(i) + ".";
    for (const LayerTensorInfo& info : kLayerTensors) {
      if (!info.Present(c)) continue;
      // Named as before: "blk.0.attn_q" for a matrix or norm, "blk.0.attn_q.bias" for a bias.
      std::string name = p + info.name;
      if (name.ends_with(".weight")) name.resize(name.size() - 7);
      STRATA_RETURN_IF_ERROR(Expect(l.*info.member, name, info.Shape(c), info.kind != LayerTensorInfo::Kind::kMatrix));
    }
  }
  return Status::Ok();
}

}  // namespace strata
