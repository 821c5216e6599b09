#include "model/gguf_model.h"

#include <string>

namespace strata {

namespace {

// Reads an integer key that must be present and positive-or-zero.
Result<int> RequiredInt(const GgufFile& f, const std::string& key) {
  auto v = f.GetInt(key);
  if (!v) return v.error().WithContext(f.origin());
  if (*v < 0 || *v > (int64_t{1} << 30))
    return Status::Corrupt(f.origin() + ": key '" + key + "' = " + std::to_string(*v) + " is out of range");
  return static_cast<int>(*v);
}

Result<int> OptionalInt(const GgufFile& f, const std::string& key, int fallback) {
  if (!f.Has(key)) return fallback;
  return RequiredInt(f, key);
}

Result<float> OptionalFloat(const GgufFile& f, const std::string& key, float fallback) {
  if (!f.Has(key)) return fallback;
  auto v = f.GetFloat(key);
  if (!v) return v.error().WithContext(f.origin());
  return static_cast<float>(*v);
}

}  // namespace

std::string GgufLayerTensorName(int layer, const char* what) {
  return "blk." + std::to_string(layer) + "." + what;
}

Result<ModelConfig> ModelConfigFromGguf(const GgufFile& f) {
  ModelConfig c;
  auto arch = f.GetString("general.architecture");
  if (!arch) return arch.error().WithContext(f.origin());
  c.arch = *arch;
  if (c.arch != "llama" && c.arch != "mistral" && c.arch != "qwen2")
    return Status::Unsupported(f.origin() + ": architecture '" + c.arch +
                               "' is not supported (llama, mistral and qwen2 are)");
  if (f.Has("general.name")) {
    auto n = f.GetString("general.name");
    if (n) c.name = *n;
  }
  const std::string a = c.arch + ".";
  STRATA_ASSIGN_OR_RETURN(c.dim, RequiredInt(f, a + "embedding_length"));
  STRATA_ASSIGN_OR_RETURN(c.n_layers, RequiredInt(f, a + "block_count"));
  STRATA_ASSIGN_OR_RETURN(c.ffn_dim, RequiredInt(f, a + "feed_forward_length"));
  STRATA_ASSIGN_OR_RETURN(c.n_heads, RequiredInt(f, a + "attention.head_count"));
  STRATA_ASSIGN_OR_RETURN(c.n_kv_heads, OptionalInt(f, a + "attention.head_count_kv", c.n_heads));
  STRATA_ASSIGN_OR_RETURN(c.context_length, RequiredInt(f, a + "context_length"));
  int default_head_dim = c.n_heads > 0 ? c.dim / c.n_heads : 0;
  STRATA_ASSIGN_OR_RETURN(c.head_dim, OptionalInt(f, a + "attention.key_length", default_head_dim));
  STRATA_ASSIGN_OR_RETURN(int value_len, OptionalInt(f, a + "attention.value_length", c.head_dim));
  if (value_len != c.head_dim)
    return Status::Unsupported(f.origin() + ": key length " + std::to_string(c.head_dim) + " != value length " +
                               std::to_string(value_len));
  STRATA_ASSIGN_OR_RETURN(int rope_dims, OptionalInt(f, a + "rope.dimension_count", c.head_dim));
  if (rope_dims != c.head_dim)
    return Status::Unsupported(f.origin() + ": partial RoPE (" + std::to_string(rope_dims) + " of " +
                               std::to_string(c.head_dim) + " dimensions) is not supported");
  STRATA_ASSIGN_OR_RETURN(c.rms_eps, OptionalFloat(f, a + "attention.layer_norm_rms_epsilon", 1e-5f));
  STRATA_ASSIGN_OR_RETURN(c.rope_theta, OptionalFloat(f, a + "rope.freq_base", 10000.0f));
  // llama.cpp writes qwen2 without the Q/K permutation, so it rotates halves.
  c.rope_style = c.arch == "qwen2" ? RopeStyle::kNeox : RopeStyle::kInterleaved;
  if (f.Has(a + "rope.scaling.type")) {
    auto t = f.GetString(a + "rope.scaling.type");
    if (!t) return t.error().WithContext(f.origin());
    if (*t == "linear") {
      c.rope_scaling.type = RopeScaling::Type::kLinear;
      STRATA_ASSIGN_OR_RETURN(c.rope_scaling.factor, OptionalFloat(f, a + "rope.scaling.factor", 1.0f));
    } else if (*t != "none") {
      return Status::Unsupported(f.origin() + ": RoPE scaling type '" + *t + "' is not supported (linear is)");
    }
  } else if (f.Has(a + "rope.scale_linear")) {
    c.rope_scaling.type = RopeScaling::Type::kLinear;
    STRATA_ASSIGN_OR_RETURN(c.rope_scaling.factor, OptionalFloat(f, a + "rope.scale_linear", 1.0f));
  }
  // Vocabulary size: explicit key, else the embedding table's rows.
  if (f.Has(a + "vocab_size")) {
    STRATA_ASSIGN_OR_RETURN(c.vocab_size, RequiredInt(f, a + "vocab_size"));
  } else if (const GgufTensor* t = f.FindTensor("token_embd.weight"); t != nullptr && t->ne.size() == 2) {
    c.vocab_size = static_cast<int>(t->ne[1]);
  }
  c.tied_embeddings = f.FindTensor("output.weight") == nullptr;
  c.qkv_bias = f.FindTensor("blk.0.attn_q.bias") != nullptr;
  // Llama-3.1 style scaling is stored as per-frequency divisors.
  if (const GgufTensor* rf = f.FindTensor("rope_freqs.weight"); rf != nullptr) {
    if (rf->type != DType::kF32 || rf->ne.size() != 1 || rf->ne[0] != c.head_dim / 2)
      return Status::Corrupt(f.origin() + ": tensor 'rope_freqs.weight' must be f32 with head_dim/2 = " +
                             std::to_string(c.head_dim / 2) + " entries");
    const float* p = reinterpret_cast<const float*>(rf->data);
    c.rope_freq_factors.assign(p, p + rf->ne[0]);
  }
  STRATA_RETURN_IF_ERROR(c.Validate().WithContext(f.origin()));
  return c;
}

Result<ModelWeights> WeightsFromGguf(std::shared_ptr<const GgufFile> f) {
  ModelWeights w;
  STRATA_ASSIGN_OR_RETURN(w.config, ModelConfigFromGguf(*f));
  const ModelConfig& c = w.config;
  auto get = [&](const std::string& name, bool required, Tensor* out) -> Status {
    const GgufTensor* t = f->FindTensor(name);
    if (t == nullptr) {
      if (required) return Status::NotFound(f->origin() + ": tensor '" + name + "' is missing");
      return Status::Ok();
    }
    *out = t->ToTensor();
    return Status::Ok();
  };
  STRATA_RETURN_IF_ERROR(get("token_embd.weight", true, &w.tok_embd));
  STRATA_RETURN_IF_ERROR(get("output_norm.weight", true, &w.output_norm));
  if (c.tied_embeddings) {
    w.output = w.tok_embd;
  } else {
    STRATA_RETURN_IF_ERROR(get("output.weight", true, &w.output));
  }
  w.layers.resize(static_cast<size_t>(c.n_layers));
  for (int i = 0; i < c.n_layers; ++i) {
    LayerWeights& l = w.layers[static_cast<size_t>(i)];
    for (const LayerTensorInfo& info : kLayerTensors)
      STRATA_RETURN_IF_ERROR(get(GgufLayerTensorName(i, info.name), info.Present(c), &(l.*info.member)));
  }
  STRATA_RETURN_IF_ERROR(ValidateWeights(w).WithContext(f->origin()));
  w.digest = ComputeWeightsDigest(w);
  w.holders.push_back(std::move(f));
  return w;
}

}  // namespace strata
