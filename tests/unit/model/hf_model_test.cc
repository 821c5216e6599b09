#include "model/hf_model.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "common/mapped_file.h"
#include "model/hf_writer.h"
#include "model/safetensors.h"
#include "tests/support/reference_forward.h"
#include "tests/support/test_env.h"

namespace strata {
namespace {

using ::testing::HasSubstr;
namespace fs = std::filesystem;

struct Spec {
  std::string arch = "llama";
  DType type = DType::kF32;  // matrices; norms and biases are F32
  bool tied = false;
  bool bias = false;
  RopeStyle style = RopeStyle::kNeox;
  RopeScaling scaling;
  bool real = false;  // F32 values in [-0.5, 0.5) instead of random bytes
  int dim = 32, layers = 2, heads = 4, kv_heads = 2, ffn = 24, vocab = 40;
};

class Builder {
 public:
  Builder(ModelWeights& w, uint32_t seed, bool real = false) : w_(w), rng_(seed), real_(real) {}
  Tensor Make(const std::string& name, DType type, std::vector<int64_t> ne) {
    Tensor t;
    t.name = name;
    t.type = type;
    t.ne = std::move(ne);
    t.nbytes = RowBytes(type, t.cols()) * static_cast<size_t>(t.rows());
    std::vector<uint8_t> bytes(t.nbytes);
    if (real_ && type == DType::kF32) {
      std::uniform_real_distribution<float> u(-0.5f, 0.5f);
      for (size_t i = 0; i < bytes.size(); i += 4) {
        float v = u(rng_);
        std::memcpy(&bytes[i], &v, 4);
      }
    } else {
      for (auto& b : bytes) b = static_cast<uint8_t>(rng_());
    }
    t.data = w_.Own(std::move(bytes));
    return t;
  }

 private:
  ModelWeights& w_;
  std::mt19937 rng_;
  bool real_;
};

ModelWeights MakeWeights(const Spec& s, uint32_t seed = 7) {
  ModelWeights w;
  ModelConfig& c = w.config;
  c.arch = s.arch;
  c.name = "tiny";
  c.vocab_size = s.vocab;
  c.dim = s.dim;
  c.n_layers = s.layers;
  c.n_heads = s.heads;
  c.n_kv_heads = s.kv_heads;
  c.head_dim = s.dim / s.heads;
  c.ffn_dim = s.ffn;
  c.context_length = 256;
  c.rms_eps = 1e-5f;
  c.rope_theta = 500000.0f;
  c.rope_style = s.style;
  c.rope_scaling = s.scaling;
  c.tied_embeddings = s.tied;
  c.qkv_bias = s.bias;
  Builder b(w, seed, s.real);
  const int64_t dim = c.dim, q = c.q_dim(), kv = c.kv_dim(), ffn = c.ffn_dim;
  w.tok_embd = b.Make("token_embd.weight", s.type, {dim, c.vocab_size});
  w.output_norm = b.Make("output_norm.weight", DType::kF32, {dim});
  w.output = s.tied ? w.tok_embd : b.Make("output.weight", s.type, {dim, c.vocab_size});
  for (int i = 0; i < c.n_layers; ++i) {
    LayerWeights l;
    std::string p = "blk." + std::to_string(i) + ".";
    l.attn_norm = b.Make(p + "attn_norm.weight", DType::kF32, {dim});
    l.wq = b.Make(p + "attn_q.weight", s.type, {dim, q});
    l.wk = b.Make(p + "attn_k.weight", s.type, {dim, kv});
    l.wv = b.Make(p + "attn_v.weight", s.type, {dim, kv});
    l.wo = b.Make(p + "attn_output.weight", s.type, {q, dim});
    if (s.bias) {
      l.bq = b.Make(p + "attn_q.bias", DType::kF32, {q});
      l.bk = b.Make(p + "attn_k.bias", DType::kF32, {kv});
      l.bv = b.Make(p + "attn_v.bias", DType::kF32, {kv});
    }
    l.ffn_norm = b.Make(p + "ffn_norm.weight", DType::kF32, {dim});
    l.w_gate = b.Make(p + "ffn_gate.weight", s.type, {dim, ffn});
    l.w_up = b.Make(p + "ffn_up.weight", s.type, {dim, ffn});
    l.w_down = b.Make(p + "ffn_down.weight", s.type, {ffn, dim});
    w.layers.push_back(std::move(l));
  }
  return w;
}

void ExpectSameTensor(const Tensor& got, const Tensor& want, const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_TRUE(got.present());
  EXPECT_EQ(got.type, want.type);
  EXPECT_EQ(got.ne, want.ne);
  ASSERT_EQ(got.nbytes, want.nbytes);
  EXPECT_EQ(std::memcmp(got.data, want.data, want.nbytes), 0);
}

void ExpectSameConfig(const ModelConfig& a, const ModelConfig& b) {
  EXPECT_EQ(a.arch, b.arch);
  EXPECT_EQ(a.vocab_size, b.vocab_size);
  EXPECT_EQ(a.dim, b.dim);
  EXPECT_EQ(a.n_layers, b.n_layers);
  EXPECT_EQ(a.n_heads, b.n_heads);
  EXPECT_EQ(a.n_kv_heads, b.n_kv_heads);
  EXPECT_EQ(a.head_dim, b.head_dim);
  EXPECT_EQ(a.ffn_dim, b.ffn_dim);
  EXPECT_EQ(a.context_length, b.context_length);
  EXPECT_EQ(a.rms_eps, b.rms_eps);
  EXPECT_EQ(a.rope_theta, b.rope_theta);
  EXPECT_EQ(a.rope_scaling.type, b.rope_scaling.type);
  EXPECT_EQ(a.rope_scaling.factor, b.rope_scaling.factor);
  if (a.rope_scaling.type == RopeScaling::Type::kLlama3) {
    EXPECT_EQ(a.rope_scaling.low_freq_factor, b.rope_scaling.low_freq_factor);
    EXPECT_EQ(a.rope_scaling.high_freq_factor, b.rope_scaling.high_freq_factor);
    EXPECT_EQ(a.rope_scaling.original_context, b.rope_scaling.original_context);
  }
  EXPECT_EQ(a.tied_embeddings, b.tied_embeddings);
  EXPECT_EQ(a.qkv_bias, b.qkv_bias);
}

// Every tensor byte-identical (for kNeox input, where nothing is permuted).
void ExpectSameWeights(const ModelWeights& got, const ModelWeights& want) {
  ExpectSameConfig(got.config, want.config);
  EXPECT_EQ(got.config.rope_style, RopeStyle::kNeox);
  ExpectSameTensor(got.tok_embd, want.tok_embd, "tok_embd");
  ExpectSameTensor(got.output_norm, want.output_norm, "output_norm");
  ExpectSameTensor(got.output, want.output, "output");
  if (want.config.tied_embeddings) {
    EXPECT_EQ(got.output.data, got.tok_embd.data);
  }
  ASSERT_EQ(got.layers.size(), want.layers.size());
  for (size_t i = 0; i < want.layers.size(); ++i) {
    const LayerWeights& g = got.layers[i];
    const LayerWeights& e = want.layers[i];
    std::string p = "layer " + std::to_string(i) + " ";
    ExpectSameTensor(g.attn_norm, e.attn_norm, p + "attn_norm");
    ExpectSameTensor(g.wq, e.wq, p + "wq");
    ExpectSameTensor(g.wk, e.wk, p + "wk");
    ExpectSameTensor(g.wv, e.wv, p + "wv");
    ExpectSameTensor(g.wo, e.wo, p + "wo");
    if (want.config.qkv_bias) {
      ExpectSameTensor(g.bq, e.bq, p + "bq");
      ExpectSameTensor(g.bk, e.bk, p + "bk");
      ExpectSameTensor(g.bv, e.bv, p + "bv");
    }
    ExpectSameTensor(g.ffn_norm, e.ffn_norm, p + "ffn_norm");
    ExpectSameTensor(g.w_gate, e.w_gate, p + "w_gate");
    ExpectSameTensor(g.w_up, e.w_up, p + "w_up");
    ExpectSameTensor(g.w_down, e.w_down, p + "w_down");
  }
}

bool InsideFiles(const ModelWeights& w, const Tensor& t) {
  for (const auto& f : w.files)
    if (t.data >= f->data() && t.data + t.nbytes <= f->data() + f->size()) return true;
  return false;
}

class HfModelTest : public ::testing::Test {
 protected:
  std::string NewDir(const std::string& name) { return root_ + "/" + name; }

  // Round trip: write, load, compare.
  void RoundTrip(const Spec& s, size_t max_shard = 0) {
    ModelWeights w = MakeWeights(s);
    std::string dir = NewDir("rt");
    Status st = WriteHfModel(dir, w, R"({"model":{}})", R"({"bos_token":"<s>"})", max_shard);
    ASSERT_TRUE(st.ok()) << st.ToString();
    auto m = LoadHfModel(dir);
    ASSERT_TRUE(m.ok()) << m.error().ToString();
    ExpectSameWeights(m->weights, w);
    EXPECT_EQ(m->weights.config.name, "rt");
    EXPECT_TRUE(m->weights.digest.empty());
    EXPECT_EQ(m->tokenizer_json, R"({"model":{}})");
    EXPECT_EQ(m->tokenizer_config_json, R"({"bos_token":"<s>"})");
    EXPECT_EQ(m->generation_config_json, "");
    EXPECT_TRUE(InsideFiles(m->weights, m->weights.layers[0].wq));  // used in place
  }

  static nlohmann::json ReadJson(const std::string& path) {
    auto text = ReadFileToString(path);
    EXPECT_TRUE(text.ok());
    return nlohmann::json::parse(text.ok() ? *text : "null");
  }
  static void WriteJson(const std::string& path, const nlohmann::json& j) {
    std::string s = j.dump();
    ASSERT_TRUE(WriteFileAtomic(path, s.data(), s.size()).ok());
  }

  // Rewrites a safetensors file without `drop`, with `fill` set to bytes 0x3c.
  static void RewriteSafetensors(const std::string& path, const std::string& drop,
                                 const std::string& fill = "") {
    std::vector<std::vector<uint8_t>> keep;
    SafetensorsWriter wr;
    {
      auto f = SafetensorsFile::Open(path);
      ASSERT_TRUE(f.ok()) << f.error().ToString();
      for (const Tensor& t : (*f)->tensors()) {
        if (t.name == drop) continue;
        keep.emplace_back(t.data, t.data + t.nbytes);
        if (t.name == fill) std::fill(keep.back().begin(), keep.back().end(), 0x3c);
        Tensor c = t;
        c.data = keep.back().data();
        ASSERT_TRUE(wr.AddTensor(c).ok());
      }
    }
    ASSERT_TRUE(wr.Write(path).ok());
  }

  std::string root_ = testing::MakeTempDir("hf_model_test_");
};

TEST_F(HfModelTest, LlamaUntiedF32) { RoundTrip(Spec{}); }

TEST_F(HfModelTest, Qwen2TiedBf16WithBias) {
  Spec s;
  s.arch = "qwen2";
  s.type = DType::kBF16;
  s.tied = true;
  s.bias = true;
  RoundTrip(s);
  auto cfg = ReadJson(NewDir("rt") + "/config.json");
  EXPECT_EQ(cfg["architectures"][0], "Qwen2ForCausalLM");
  EXPECT_EQ(cfg["torch_dtype"], "bfloat16");
  EXPECT_EQ(cfg["tie_word_embeddings"], true);
  auto st = SafetensorsFile::Open(NewDir("rt") + "/model.safetensors");
  ASSERT_TRUE(st.ok());
  EXPECT_EQ((*st)->Find("lm_head.weight"), nullptr);  // tied: not written
  EXPECT_EQ((*st)->metadata().at("format"), "pt");
}

TEST_F(HfModelTest, MistralF16Llama3Scaling) {
  Spec s;
  s.arch = "mistral";
  s.type = DType::kF16;
  s.scaling.type = RopeScaling::Type::kLlama3;
  s.scaling.factor = 8.0f;
  s.scaling.low_freq_factor = 1.0f;
  s.scaling.high_freq_factor = 4.0f;
  s.scaling.original_context = 8192;
  RoundTrip(s);
  auto cfg = ReadJson(NewDir("rt") + "/config.json");
  EXPECT_EQ(cfg["rope_scaling"]["rope_type"], "llama3");
  EXPECT_EQ(cfg["rms_norm_eps"].dump(), "1e-05");  // shortest form, not 9.99e-06
}

TEST_F(HfModelTest, LlamaLinearScalingWithBias) {
  Spec s;
  s.bias = true;
  s.scaling.type = RopeScaling::Type::kLinear;
  s.scaling.factor = 2.5f;
  RoundTrip(s);
  // attention_bias also implies o_proj.bias in HF; it is written as zeros.
  auto st = SafetensorsFile::Open(NewDir("rt") + "/model.safetensors");
  ASSERT_TRUE(st.ok());
  const Tensor* bo = (*st)->Find("model.layers.1.self_attn.o_proj.bias");
  ASSERT_NE(bo, nullptr);
  EXPECT_EQ(bo->ne, (std::vector<int64_t>{32}));
  for (size_t i = 0; i < bo->nbytes; ++i) EXPECT_EQ(bo->data[i], 0);
}

TEST_F(HfModelTest, ShardedLoadsTheSame) {
  Spec s;
  s.tied = true;
  ModelWeights w = MakeWeights(s);
  std::string dir = NewDir("sharded");
  ASSERT_TRUE(WriteHfModel(dir, w, "", "", 6000).ok());
  EXPECT_FALSE(fs::exists(dir + "/model.safetensors"));
  EXPECT_FALSE(fs::exists(dir + "/tokenizer.json"));  // empty: not written
  auto index = ReadJson(dir + "/model.safetensors.index.json");
  std::set<std::string> shards;
  for (const auto& [name, file] : index["weight_map"].items())
    shards.insert(file.get<std::string>());
  ASSERT_GE(shards.size(), 3u);
  char first[64], last[64];
  std::snprintf(first, sizeof first, "model-00001-of-%05zu.safetensors", shards.size());
  std::snprintf(last, sizeof last, "model-%05zu-of-%05zu.safetensors", shards.size(),
                shards.size());
  EXPECT_TRUE(shards.count(first));
  EXPECT_TRUE(shards.count(last));
  uint64_t total = 0;
  for (const auto& f : shards) {
    EXPECT_LE(fs::file_size(dir + "/" + f), 6000u + 4096u);  // data under the limit + header
    auto sf = SafetensorsFile::Open(dir + "/" + f);
    ASSERT_TRUE(sf.ok());
    for (const Tensor& t : (*sf)->tensors()) total += t.nbytes;
  }
  EXPECT_EQ(index["metadata"]["total_size"].get<uint64_t>(), total);

  auto m = LoadHfModel(dir);
  ASSERT_TRUE(m.ok()) << m.error().ToString();
  ExpectSameWeights(m->weights, w);
  EXPECT_EQ(m->weights.files.size(), shards.size());  // each shard mapped once
  EXPECT_TRUE(m->tokenizer_json.empty());

  // Writing again as one file removes the index, so it cannot shadow it.
  ASSERT_TRUE(WriteHfModel(dir, w, "", "").ok());
  EXPECT_FALSE(fs::exists(dir + "/model.safetensors.index.json"));
  auto m2 = LoadHfModel(dir);
  ASSERT_TRUE(m2.ok()) << m2.error().ToString();
  ExpectSameWeights(m2->weights, w);
  EXPECT_EQ(m2->weights.files.size(), 1u);
}

TEST_F(HfModelTest, PermutationExample) {
  // 2 heads of head_dim 8; the value of each element is its row index.
  std::vector<float> rows(16);
  for (int i = 0; i < 16; ++i) rows[i] = static_cast<float>(i);
  Tensor bias;
  bias.name = "b";
  bias.type = DType::kF32;
  bias.ne = {16};
  bias.data = reinterpret_cast<const uint8_t*>(rows.data());
  bias.nbytes = 64;
  auto out = PermuteInterleavedToNeox(bias, 2, 8);
  ASSERT_TRUE(out.ok()) << out.error().ToString();
  std::vector<float> got(16);
  std::memcpy(got.data(), out->data(), 64);
  EXPECT_EQ(got, (std::vector<float>{0, 2, 4, 6, 1, 3, 5, 7, 8, 10, 12, 14, 9, 11, 13, 15}));

  // A matrix moves whole rows: ne = {3, 16}.
  std::vector<float> m(48);
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 3; ++c) m[r * 3 + c] = static_cast<float>(r * 10 + c);
  Tensor mat = bias;
  mat.ne = {3, 16};
  mat.data = reinterpret_cast<const uint8_t*>(m.data());
  mat.nbytes = 192;
  auto mo = PermuteInterleavedToNeox(mat, 2, 8);
  ASSERT_TRUE(mo.ok());
  const float* p = reinterpret_cast<const float*>(mo->data());
  for (int r = 0; r < 16; ++r)
    for (int c = 0; c < 3; ++c) EXPECT_EQ(p[r * 3 + c], got[r] * 10 + c);

  // Inverse of llama.cpp's permute: reshape(n_head, 2, d/2).swapaxes(1, 2).
  std::vector<float> back(16);
  for (int h = 0; h < 2; ++h)
    for (int a = 0; a < 2; ++a)
      for (int i = 0; i < 4; ++i) back[h * 8 + i * 2 + a] = got[h * 8 + a * 4 + i];
  EXPECT_EQ(back, rows);

  EXPECT_EQ(PermuteInterleavedToNeox(bias, 3, 8).error().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(PermuteInterleavedToNeox(bias, 4, 3).error().code(), StatusCode::kInvalidArgument);
}

TEST_F(HfModelTest, PermutationMakesRopeStylesAgree) {
  // Rotating interleaved pairs then permuting == permuting then rotating
  // halves, so Q.K scores of the exported model equal the original's.
  const int d = 8;
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1, 1);
  std::vector<float> x(d);
  for (auto& v : x) v = u(rng);
  const float pos = 5;
  auto angle = [&](int i) { return pos * std::pow(10000.0f, -2.0f * i / d); };
  std::vector<float> inter = x;
  for (int i = 0; i < d / 2; ++i) {
    float c = std::cos(angle(i)), s = std::sin(angle(i));
    inter[2 * i] = x[2 * i] * c - x[2 * i + 1] * s;
    inter[2 * i + 1] = x[2 * i] * s + x[2 * i + 1] * c;
  }
  auto permute = [&](const std::vector<float>& v) {
    Tensor t;
    t.type = DType::kF32;
    t.ne = {d};
    t.data = reinterpret_cast<const uint8_t*>(v.data());
    t.nbytes = d * 4;
    auto r = PermuteInterleavedToNeox(t, 1, d);
    std::vector<float> out(d);
    std::memcpy(out.data(), r->data(), d * 4);
    return out;
  };
  std::vector<float> px = permute(x);
  std::vector<float> neox = px;
  for (int i = 0; i < d / 2; ++i) {
    float c = std::cos(angle(i)), s = std::sin(angle(i));
    neox[i] = px[i] * c - px[i + d / 2] * s;
    neox[i + d / 2] = px[i] * s + px[i + d / 2] * c;
  }
  std::vector<float> want = permute(inter);
  for (int i = 0; i < d; ++i) EXPECT_FLOAT_EQ(neox[i], want[i]) << i;
}

TEST_F(HfModelTest, InterleavedWeightsArePermutedOnExport) {
  Spec s;
  s.style = RopeStyle::kInterleaved;
  s.bias = true;
  ModelWeights w = MakeWeights(s);
  std::string dir = NewDir("inter");
  ASSERT_TRUE(WriteHfModel(dir, w, "", "").ok());
  auto m = LoadHfModel(dir);
  ASSERT_TRUE(m.ok()) << m.error().ToString();
  const ModelConfig& c = w.config;
  const int hd = c.head_dim;
  for (size_t li = 0; li < w.layers.size(); ++li) {
    const LayerWeights& e = w.layers[li];
    const LayerWeights& g = m->weights.layers[li];
    // Out row h*hd + i ← in row h*hd + 2i; out row h*hd + hd/2 + i ← in row h*hd + 2i + 1.
    auto check = [&](const Tensor& got, const Tensor& in, int heads, bool vector) {
      const size_t rb = vector ? 4 : RowBytes(in.type, in.cols());
      ASSERT_EQ(got.nbytes, in.nbytes);
      for (int h = 0; h < heads; ++h)
        for (int i = 0; i < hd / 2; ++i) {
          EXPECT_EQ(std::memcmp(got.data + (h * hd + i) * rb, in.data + (h * hd + 2 * i) * rb, rb),
                    0);
          EXPECT_EQ(std::memcmp(got.data + (h * hd + hd / 2 + i) * rb,
                                in.data + (h * hd + 2 * i + 1) * rb, rb),
                    0);
        }
    };
    check(g.wq, e.wq, c.n_heads, false);
    check(g.wk, e.wk, c.n_kv_heads, false);
    check(g.bq, e.bq, c.n_heads, true);
    check(g.bk, e.bk, c.n_kv_heads, true);
    ExpectSameTensor(g.wv, e.wv, "wv");
    ExpectSameTensor(g.bv, e.bv, "bv");
    ExpectSameTensor(g.wo, e.wo, "wo");
  }
  EXPECT_EQ(m->weights.config.rope_style, RopeStyle::kNeox);
}

// What llama.cpp stores as rope_freqs.weight for Llama-3 scaling (factor 8).
std::vector<float> Llama3FreqFactors(const ModelConfig& c) {
  ModelConfig l3 = c;
  l3.rope_scaling.type = RopeScaling::Type::kLlama3;
  l3.rope_scaling.factor = 8.0f;
  std::vector<float> plain(c.head_dim / 2), scaled(c.head_dim / 2), out;
  ComputeRopeInvFreq(c, plain.data());
  ComputeRopeInvFreq(l3, scaled.data());
  for (size_t i = 0; i < plain.size(); ++i) out.push_back(plain[i] / scaled[i]);
  return out;
}

double MaxLogitDiff(const ModelWeights& a, const ModelWeights& b) {
  const std::vector<int32_t> tokens = {1, 5, 9, 3, 7, 2, 30, 11, 4, 39};
  auto la = testing::ReferenceModel(a).Forward(tokens);
  auto lb = testing::ReferenceModel(b).Forward(tokens);
  double diff = 0;
  for (size_t p = 0; p < la.size(); ++p)
    for (size_t v = 0; v < la[p].size(); ++v) diff = std::max(diff, std::fabs(la[p][v] - lb[p][v]));
  return diff;
}

TEST_F(HfModelTest, ExportedGgufModelComputesTheSameLogits) {
  Spec s;
  s.style = RopeStyle::kInterleaved;
  s.bias = true;
  s.real = true;
  ModelWeights w = MakeWeights(s);
  w.config.rope_freq_factors = Llama3FreqFactors(w.config);
  std::string dir = NewDir("same");
  ASSERT_TRUE(WriteHfModel(dir, w, "", "").ok());
  auto m = LoadHfModel(dir);
  ASSERT_TRUE(m.ok()) << m.error().ToString();
  EXPECT_LT(MaxLogitDiff(w, m->weights), 1e-4);

  // Control: the same HF checkpoint without the permutation would differ.
  ModelWeights unpermuted = MakeWeights(s);
  unpermuted.config = m->weights.config;
  EXPECT_GT(MaxLogitDiff(w, unpermuted), 1e-2);
}

TEST_F(HfModelTest, GgufFreqFactorsBecomeLlama3Scaling) {
  Spec s;
  s.style = RopeStyle::kInterleaved;
  ModelWeights w = MakeWeights(s);
  // What llama.cpp stores for Llama-3.1 (factor 8) as rope_freqs.weight.
  ModelConfig l3 = w.config;
  l3.rope_scaling.type = RopeScaling::Type::kLlama3;
  l3.rope_scaling.factor = 8.0f;
  std::vector<float> plain(l3.head_dim / 2), scaled(l3.head_dim / 2);
  ComputeRopeInvFreq(w.config, plain.data());
  ComputeRopeInvFreq(l3, scaled.data());
  for (size_t i = 0; i < plain.size(); ++i)
    w.config.rope_freq_factors.push_back(plain[i] / scaled[i]);
  ASSERT_GT(w.config.rope_freq_factors.back(), 7.9f);  // exercises both the band and the tail
  ASSERT_GT(w.config.rope_freq_factors[plain.size() - 2], 1.1f);

  std::string dir = NewDir("freqs");
  Status st = WriteHfModel(dir, w, "", "");
  ASSERT_TRUE(st.ok()) << st.ToString();
  auto m = LoadHfModel(dir);
  ASSERT_TRUE(m.ok()) << m.error().ToString();
  const RopeScaling& r = m->weights.config.rope_scaling;
  EXPECT_EQ(r.type, RopeScaling::Type::kLlama3);
  EXPECT_NEAR(r.factor, 8.0f, 1e-4);
  std::vector<float> got(plain.size());
  ComputeRopeInvFreq(m->weights.config, got.data());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], scaled[i], 1e-5f * scaled[i]);

  // Divisors that no Llama-3 setting produces are refused, not dropped.
  w.config.rope_freq_factors.assign(plain.size(), 3.0f);
  Status bad = WriteHfModel(NewDir("freqs2"), w, "", "");
  EXPECT_EQ(bad.code(), StatusCode::kUnsupported);
  EXPECT_THAT(bad.message(), HasSubstr("rope_freqs"));
}

TEST_F(HfModelTest, Qwen2WithoutBiasGetsZeroBiases) {
  Spec s;
  s.arch = "qwen2";
  ModelWeights w = MakeWeights(s);
  std::string dir = NewDir("q2");
  ASSERT_TRUE(WriteHfModel(dir, w, "", "").ok());
  auto m = LoadHfModel(dir);
  ASSERT_TRUE(m.ok()) << m.error().ToString();
  EXPECT_TRUE(m->weights.config.qkv_bias);
  const Tensor& bq = m->weights.layers[0].bq;
  ASSERT_TRUE(bq.present());
  for (size_t i = 0; i < bq.nbytes; ++i) EXPECT_EQ(bq.data[i], 0);
  ExpectSameTensor(m->weights.layers[1].wq, w.layers[1].wq, "wq");
}

TEST_F(HfModelTest, NonZeroOutputBiasIsUnsupported) {
  Spec s;
  s.bias = true;
  ModelWeights w = MakeWeights(s);
  std::string dir = NewDir("obias");
  ASSERT_TRUE(WriteHfModel(dir, w, "", "").ok());
  RewriteSafetensors(dir + "/model.safetensors", "", "model.layers.1.self_attn.o_proj.bias");
  auto m = LoadHfModel(dir);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.error().code(), StatusCode::kUnsupported);
  EXPECT_THAT(m.error().message(), HasSubstr("model.layers.1.self_attn.o_proj.bias"));
}

TEST_F(HfModelTest, LoadErrorsNameTheProblem) {
  ModelWeights w = MakeWeights(Spec{});
  std::string dir = NewDir("err");
  ASSERT_TRUE(WriteHfModel(dir, w, "", "").ok());
  const std::string cfg_path = dir + "/config.json";
  const nlohmann::json cfg = ReadJson(cfg_path);

  auto expect = [&](StatusCode code, const std::string& substr) {
    auto m = LoadHfModel(dir);
    ASSERT_FALSE(m.ok()) << substr;
    EXPECT_EQ(m.error().code(), code) << m.error().ToString();
    EXPECT_THAT(m.error().message(), HasSubstr(substr));
  };

  nlohmann::json j = cfg;
  j["architectures"] = {"GemmaForCausalLM"};
  WriteJson(cfg_path, j);
  expect(StatusCode::kUnsupported, "GemmaForCausalLM");

  j = cfg;
  j["rope_scaling"] = {{"rope_type", "yarn"}, {"factor", 4.0}};
  WriteJson(cfg_path, j);
  expect(StatusCode::kUnsupported, "yarn");

  j = cfg;
  j["intermediate_size"] = 48;
  WriteJson(cfg_path, j);
  expect(StatusCode::kCorrupt, "model.layers.0.mlp.gate_proj.weight");

  j = cfg;
  j.erase("hidden_size");
  WriteJson(cfg_path, j);
  expect(StatusCode::kNotFound, "hidden_size");

  j = cfg;
  j["num_attention_heads"] = "four";
  WriteJson(cfg_path, j);
  expect(StatusCode::kCorrupt, "num_attention_heads");

  WriteJson(cfg_path, cfg);
  ASSERT_TRUE(LoadHfModel(dir).ok());
  RewriteSafetensors(dir + "/model.safetensors", "model.layers.1.mlp.up_proj.weight");
  expect(StatusCode::kNotFound, "model.layers.1.mlp.up_proj.weight");

  fs::remove(dir + "/model.safetensors");
  expect(StatusCode::kNotFound, "model.safetensors");

  fs::remove(cfg_path);
  expect(StatusCode::kNotFound, "config.json");

  std::string text = "{not json";
  ASSERT_TRUE(WriteFileAtomic(cfg_path, text.data(), text.size()).ok());
  expect(StatusCode::kCorrupt, "config.json");
}

TEST_F(HfModelTest, ShardIndexErrors) {
  ModelWeights w = MakeWeights(Spec{});
  std::string dir = NewDir("idx");
  ASSERT_TRUE(WriteHfModel(dir, w, "", "", 6000).ok());
  const std::string idx_path = dir + "/model.safetensors.index.json";
  nlohmann::json idx = ReadJson(idx_path);

  nlohmann::json j = idx;
  j["weight_map"].erase("model.norm.weight");
  WriteJson(idx_path, j);
  auto m = LoadHfModel(dir);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.error().code(), StatusCode::kNotFound);
  EXPECT_THAT(m.error().message(), HasSubstr("model.norm.weight"));

  j = idx;
  j["weight_map"]["model.norm.weight"] = "../elsewhere.safetensors";
  WriteJson(idx_path, j);
  m = LoadHfModel(dir);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.error().code(), StatusCode::kCorrupt);

  // The index points at a shard that does not hold the tensor.
  j = idx;
  ASSERT_NE(j["weight_map"]["model.norm.weight"], j["weight_map"]["model.embed_tokens.weight"]);
  j["weight_map"]["model.norm.weight"] = j["weight_map"]["model.embed_tokens.weight"];
  WriteJson(idx_path, j);
  m = LoadHfModel(dir);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.error().code(), StatusCode::kCorrupt);
  EXPECT_THAT(m.error().message(), HasSubstr("model.norm.weight"));

  WriteJson(idx_path, idx);
  fs::remove(dir + "/" + idx["weight_map"]["model.norm.weight"].get<std::string>());
  m = LoadHfModel(dir);
  ASSERT_FALSE(m.ok());
  EXPECT_EQ(m.error().code(), StatusCode::kIoError);
}

TEST_F(HfModelTest, WriteErrors) {
  Spec s;
  s.arch = "mistral";
  s.bias = true;
  Status st = WriteHfModel(NewDir("w1"), MakeWeights(s), "", "");
  EXPECT_EQ(st.code(), StatusCode::kUnsupported);

  ModelWeights q = MakeWeights(Spec{});
  Builder b(q, 1);
  q.layers[0].wv = b.Make("blk.0.attn_v.weight", DType::kQ8_0, {32, q.config.kv_dim()});
  st = WriteHfModel(NewDir("w2"), q, "", "");
  EXPECT_EQ(st.code(), StatusCode::kUnsupported);
  EXPECT_THAT(st.message(), HasSubstr("model.layers.0.self_attn.v_proj.weight"));

  ModelWeights broken = MakeWeights(Spec{});
  broken.layers[1].w_up = Tensor();
  st = WriteHfModel(NewDir("w3"), broken, "", "");
  EXPECT_EQ(st.code(), StatusCode::kNotFound);
}

TEST(ParseHfConfigTest, DefaultsAndVariants) {
  auto c = ParseHfConfig(R"({"model_type": "llama", "hidden_size": 64, "num_hidden_layers": 2,
      "num_attention_heads": 8, "intermediate_size": 128, "vocab_size": 100})");
  ASSERT_TRUE(c.ok()) << c.error().ToString();
  EXPECT_EQ(c->arch, "llama");
  EXPECT_EQ(c->n_kv_heads, 8);
  EXPECT_EQ(c->head_dim, 8);
  EXPECT_EQ(c->rope_theta, 10000.0f);
  EXPECT_EQ(c->context_length, 2048);
  EXPECT_FALSE(c->tied_embeddings);
  EXPECT_FALSE(c->qkv_bias);
  EXPECT_EQ(c->rope_style, RopeStyle::kNeox);
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kNone);

  const std::string base = R"("hidden_size": 64, "num_hidden_layers": 2, "num_attention_heads": 8,
      "num_key_value_heads": 2, "intermediate_size": 128, "vocab_size": 100,
      "max_position_embeddings": 32768)";
  // Mistral's sliding window below the context clamps the context.
  c = ParseHfConfig(R"({"architectures": ["MistralForCausalLM"], "sliding_window": 4096, )" + base +
                    "}");
  ASSERT_TRUE(c.ok()) << c.error().ToString();
  EXPECT_EQ(c->context_length, 4096);
  // Qwen2 ignores sliding_window unless use_sliding_window; always has biases.
  c = ParseHfConfig(R"({"architectures": ["Qwen2ForCausalLM"], "sliding_window": 4096,
      "use_sliding_window": false, "tie_word_embeddings": true, )" +
                    base + "}");
  ASSERT_TRUE(c.ok()) << c.error().ToString();
  EXPECT_EQ(c->context_length, 32768);
  EXPECT_TRUE(c->qkv_bias);
  EXPECT_TRUE(c->tied_embeddings);
  // transformers v5 rope_parameters; "type" instead of "rope_type".
  c = ParseHfConfig(
      R"({"model_type": "llama", "rope_parameters": {"rope_type": "linear", "factor": 2.0,
      "rope_theta": 500000.0}, )" +
      base + "}");
  ASSERT_TRUE(c.ok()) << c.error().ToString();
  EXPECT_EQ(c->rope_theta, 500000.0f);
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kLinear);
  EXPECT_EQ(c->rope_scaling.factor, 2.0f);
  c = ParseHfConfig(R"({"model_type": "llama", "rope_scaling": {"type": "default"}, )" + base +
                    "}");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->rope_scaling.type, RopeScaling::Type::kNone);

  auto err = [&](const std::string& extra, StatusCode code, const std::string& substr) {
    auto r = ParseHfConfig("{" + extra + base + "}");
    ASSERT_FALSE(r.ok()) << extra;
    EXPECT_EQ(r.error().code(), code) << r.error().ToString();
    EXPECT_THAT(r.error().message(), HasSubstr(substr));
  };
  err(R"("model_type": "gemma", )", StatusCode::kUnsupported, "gemma");
  err("", StatusCode::kNotFound, "architectures");
  err(R"("model_type": "llama", "hidden_act": "gelu", )", StatusCode::kUnsupported, "gelu");
  err(R"("model_type": "llama", "mlp_bias": true, )", StatusCode::kUnsupported, "mlp_bias");
  err(R"("model_type": "llama", "rope_scaling": {"rope_type": "dynamic", "factor": 2}, )",
      StatusCode::kUnsupported, "dynamic");
  err(R"("model_type": "llama", "rope_scaling": {"rope_type": "llama3", "factor": 8}, )",
      StatusCode::kNotFound, "low_freq_factor");
  err(R"("model_type": "llama", "quantization_config": {"quant_method": "gptq"}, )",
      StatusCode::kUnsupported, "gptq");
  err(R"("model_type": "llama", "rms_norm_eps": "small", )", StatusCode::kCorrupt, "rms_norm_eps");
  err(R"("model_type": "llama", "head_dim": 7, )", StatusCode::kCorrupt, "head dimension");
  EXPECT_EQ(ParseHfConfig("[]").error().code(), StatusCode::kCorrupt);
  EXPECT_EQ(ParseHfConfig("").error().code(), StatusCode::kCorrupt);
}

}  // namespace
}  // namespace strata
