#include "model/synth.h"

#include <cmath>
#include <cstring>

#include "model/backend/cpu/quant.h"

namespace strata {

namespace {

uint64_t SplitMix(uint64_t& s) {
  uint64_t z = (s += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t HashName(const std::string& s) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (unsigned char ch : s) h = (h ^ ch) * 1099511628211ull;
  return h;
}

// Standard normal samples (Box-Muller) from a SplitMix stream.
class Normal {
 public:
  explicit Normal(uint64_t seed) : s_(seed) {}
  float Next() {
    if (have_) {
      have_ = false;
      return spare_;
    }
    double u1 = (static_cast<double>(SplitMix(s_) >> 11) + 0.5) * 0x1.0p-53;
    double u2 = (static_cast<double>(SplitMix(s_) >> 11) + 0.5) * 0x1.0p-53;
    double r = std::sqrt(-2.0 * std::log(u1));
    spare_ = static_cast<float>(r * std::sin(2 * M_PI * u2));
    have_ = true;
    return static_cast<float>(r * std::cos(2 * M_PI * u2));
  }

 private:
  uint64_t s_;
  bool have_ = false;
  float spare_ = 0;
};

ModelConfig Base(int dim, int layers, int heads, int kv_heads, int ffn, int vocab, int ctx) {
  ModelConfig c;
  c.arch = "llama";
  c.dim = dim;
  c.n_layers = layers;
  c.n_heads = heads;
  c.n_kv_heads = kv_heads;
  c.head_dim = dim / heads;
  c.ffn_dim = ffn;
  c.vocab_size = vocab;
  c.context_length = ctx;
  c.rms_eps = 1e-5f;
  c.rope_theta = 10000.0f;
  return c;
}

}  // namespace

std::vector<std::string> SynthPresetNames() { return {"tiny", "bench-110m", "bench-1b"}; }

Result<ModelConfig> SynthPresetConfig(const std::string& preset, int vocab_size) {
  ModelConfig c;
  if (preset == "tiny") {
    c = Base(64, 2, 4, 2, 176, 512, 512);
  } else if (preset == "bench-110m") {
    c = Base(768, 12, 12, 12, 2048, 32000, 4096);
  } else if (preset == "bench-1b") {  // TinyLlama-1.1B shapes
    c = Base(2048, 22, 32, 4, 5632, 32000, 4096);
  } else {
    return Status::InvalidArgument("unknown synthetic preset '" + preset + "' (tiny, bench-110m, bench-1b)");
  }
  if (vocab_size > 0) c.vocab_size = vocab_size;
  c.name = "strata-synthetic-" + preset;
  STRATA_RETURN_IF_ERROR(c.Validate());
  return c;
}

DType SynthTensorType(DType want, int64_t cols) {
  DType t = want;
  if (GetDTypeInfo(t).block_elems == 256 && cols % 256 != 0) t = DType::kQ8_0;
  if (GetDTypeInfo(t).block_elems == 32 && cols % 32 != 0) t = DType::kF16;
  return t;
}

std::vector<uint8_t> SynthTensorBytes(const std::string& name, char kind, const std::vector<int64_t>& ne, DType type,
                                      const SynthOptions& opt) {
  const int64_t cols = ne[0];
  int64_t rows = 1;
  for (size_t i = 1; i < ne.size(); ++i) rows *= ne[i];
  float std_dev = opt.init_std > 0 ? opt.init_std : static_cast<float>(1.0 / std::sqrt(static_cast<double>(cols)));
  Normal rng(opt.seed * 0x100000001B3ull ^ HashName(name));
  std::vector<uint8_t> out(RowBytes(type, cols) * static_cast<size_t>(rows));
  std::vector<float> row(static_cast<size_t>(cols));
  for (int64_t r = 0; r < rows; ++r) {
    for (auto& v : row) {
      float z = rng.Next();
      switch (kind) {
        case 'n': v = 1.0f + 0.1f * z; break;
        case 'b': v = 0.1f * z; break;
        case 'e': v = z; break;
        default: v = std_dev * z; break;
      }
    }
    cpu::QuantizeRow(type, row.data(), out.data() + static_cast<size_t>(r) * RowBytes(type, cols), cols);
  }
  return out;
}

Result<ModelWeights> MakeSyntheticWeights(const ModelConfig& c, const SynthOptions& opt) {
  STRATA_RETURN_IF_ERROR(c.Validate());
  ModelWeights w;
  w.config = c;
  w.layers.resize(static_cast<size_t>(c.n_layers));
  auto slot = [&](const std::string& name) -> Tensor* {
    if (name == "token_embd.weight") return &w.tok_embd;
    if (name == "output_norm.weight") return &w.output_norm;
    if (name == "output.weight") return &w.output;
    int layer = std::stoi(name.substr(4));
    std::string rest = name.substr(name.find('.', 4) + 1);
    LayerWeights& l = w.layers[static_cast<size_t>(layer)];
    for (const LayerTensorInfo& info : kLayerTensors)
      if (rest == info.name) return &(l.*info.member);
    return nullptr;  // ForEachModelTensor names only kLayerTensors
  };
  ForEachModelTensor(c, [&](const std::string& name, char kind, const std::vector<int64_t>& ne) {
    DType type = (kind == 'n' || kind == 'b') ? DType::kF32 : SynthTensorType(opt.dtype, ne[0]);
    Tensor* t = slot(name);
    t->name = name;
    t->type = type;
    t->ne = ne;
    std::vector<uint8_t> bytes = SynthTensorBytes(name, kind, ne, type, opt);
    t->nbytes = bytes.size();
    t->data = w.Own(std::move(bytes));
  });
  if (c.tied_embeddings) w.output = w.tok_embd;
  STRATA_RETURN_IF_ERROR(ValidateWeights(w));
  w.digest = ComputeWeightsDigest(w);
  return w;
}

}  // namespace strata
