// strata model quantize's library: the per-tensor plan (pure types, the
// q4_k_m recipe with its 70B rule, the fallback rule, requantizing refused)
// and the file it writes (bytes equal to the reference quantizers', values
// within each format's error bound, loadable) from f32, f16 and bf16
// sources, llama and qwen2, with a NeoX llama's Q/K permuted to GGUF's
// pairing.

#include "model/quantize.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <map>
#include <vector>

#include "model/backend/cpu/quant.h"
#include "model/gguf_tokenizer.h"
#include "model/model_loader.h"
#include "model/synth.h"
#include "tests/support/reference_forward.h"
#include "tests/support/test_env.h"

namespace strata {
namespace {

ModelConfig Shape(int dim, int layers, int ffn, int vocab) {
  ModelConfig c;
  c.arch = "llama";
  c.name = "quantize-test";
  c.dim = dim;
  c.n_layers = layers;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = dim / 4;
  c.ffn_dim = ffn;
  c.vocab_size = vocab;
  c.context_length = 128;
  c.rms_eps = 1e-5f;
  c.rope_theta = 10000.0f;
  return c;
}

ModelWeights Synth(const ModelConfig& c, DType t = DType::kF32) {
  SynthOptions opt;
  opt.dtype = t;
  auto w = MakeSyntheticWeights(c, opt);
  EXPECT_TRUE(w) << w.error().ToString();
  return std::move(*w);
}

const TensorQuantPlan* Find(const QuantizePlan& p, const std::string& name) {
  for (const auto& t : p.tensors)
    if (t.name == name) return &t;
  return nullptr;
}

// Llama-2-7B's layout (32 layers): llama-quantize Q4_K_M gives 193 q4_K, 33
// q6_K (attn_v and ffn_down of 16 layers, and output) and 65 f32 tensors.
TEST(Quantize, Q4KMRecipeMatchesLlamaQuantizeOn32Layers) {
  ModelWeights w = Synth(Shape(256, 32, 256, 512));
  auto plan = PlanQuantization(w, "q4_k_m", false);
  ASSERT_TRUE(plan) << plan.error().ToString();
  auto census = plan->Census();
  EXPECT_EQ(census["q4_k"], 193);
  EXPECT_EQ(census["q6_k"], 33);
  EXPECT_EQ(census["f32"], 65);
  EXPECT_EQ(census.size(), 3u);
  // use_more_bits(i, 32): i < 4, i >= 28, or (i - 4) % 3 == 2.
  for (int i = 0; i < 32; ++i) {
    const bool more = i < 4 || i >= 28 || (i - 4) % 3 == 2;
    const std::string p = "blk." + std::to_string(i) + ".";
    EXPECT_EQ(Find(*plan, p + "attn_v.weight")->to, more ? DType::kQ6_K : DType::kQ4_K) << i;
    EXPECT_EQ(Find(*plan, p + "ffn_down.weight")->to, more ? DType::kQ6_K : DType::kQ4_K) << i;
    EXPECT_EQ(Find(*plan, p + "attn_q.weight")->to, DType::kQ4_K);
    EXPECT_EQ(Find(*plan, p + "attn_norm.weight")->to, DType::kF32);
  }
  EXPECT_EQ(Find(*plan, "output.weight")->to, DType::kQ6_K);
  EXPECT_EQ(Find(*plan, "token_embd.weight")->to, DType::kQ4_K);
  for (const auto& t : plan->tensors) EXPECT_FALSE(t.fallback) << t.name;
}

// Llama-2-70B's layout (80 layers, 8 query heads per KV head): what
// llama-quantize Q4_K_M prints for it, 161 f32, 441 q4_K, 40 q5_K (attn_v
// outside the "more bits" layers) and 81 q6_K tensors. Without grouped KV
// heads (llama.cpp's "65B") attn_v stays q4_K there.
TEST(Quantize, Q4KMRecipeGivesA70BModelsAttnVMoreBits) {
  ModelConfig c = Shape(256, 80, 256, 256);
  auto plan = PlanQuantization(Synth(c, DType::kF16), "q4_k_m", false);
  ASSERT_TRUE(plan) << plan.error().ToString();
  auto census = plan->Census();
  EXPECT_EQ(census["f32"], 161);
  EXPECT_EQ(census["q4_k"], 441);
  EXPECT_EQ(census["q5_k"], 40);
  EXPECT_EQ(census["q6_k"], 81);
  EXPECT_EQ(Find(*plan, "blk.10.attn_v.weight")->to, DType::kQ5_K);
  EXPECT_EQ(Find(*plan, "blk.12.attn_v.weight")->to, DType::kQ6_K);
  EXPECT_EQ(Find(*plan, "blk.10.ffn_down.weight")->to, DType::kQ4_K);

  c.n_kv_heads = c.n_heads;
  plan = PlanQuantization(Synth(c, DType::kF16), "q4_k_m", false);
  ASSERT_TRUE(plan);
  census = plan->Census();
  EXPECT_EQ(census.count("q5_k"), 0u);
  EXPECT_EQ(census["q4_k"], 481);
}

TEST(Quantize, TiedEmbeddingsTakeTheOutputType) {
  ModelConfig c = Shape(256, 8, 256, 512);
  c.tied_embeddings = true;
  ModelWeights w = Synth(c);
  auto plan = PlanQuantization(w, "q4_k_m", false);
  ASSERT_TRUE(plan);
  EXPECT_EQ(Find(*plan, "token_embd.weight")->to, DType::kQ6_K);
  EXPECT_EQ(Find(*plan, "output.weight"), nullptr);
}

TEST(Quantize, FallbackRuleForRowsThatDoNotDivideIntoBlocks) {
  // dim 96: rows of 96 divide into 32-blocks, not 256; ffn 200 into neither.
  ModelWeights w = Synth(Shape(96, 2, 200, 256));
  auto plan = PlanQuantization(w, "q4_k", false);
  ASSERT_TRUE(plan);
  const TensorQuantPlan* q = Find(*plan, "blk.0.attn_q.weight");  // rows of 96
  EXPECT_EQ(q->to, DType::kQ8_0);
  EXPECT_TRUE(q->fallback);
  const TensorQuantPlan* down = Find(*plan, "blk.0.ffn_down.weight");  // rows of 200
  EXPECT_EQ(down->to, DType::kF16);
  EXPECT_TRUE(down->fallback);
  auto q8 = PlanQuantization(w, "q8_0", false);
  ASSERT_TRUE(q8);
  EXPECT_EQ(Find(*q8, "blk.0.attn_q.weight")->to, DType::kQ8_0);
  EXPECT_FALSE(Find(*q8, "blk.0.attn_q.weight")->fallback);
  EXPECT_EQ(Find(*q8, "blk.0.ffn_down.weight")->to, DType::kF16);
}

TEST(Quantize, UnknownRecipeAndRequantizingAreRefused) {
  ModelWeights w = Synth(Shape(256, 2, 256, 512));
  auto bad = PlanQuantization(w, "q3_k", false);
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message().find("q4_k_m"), std::string::npos) << bad.error().message();
  ModelWeights q = Synth(Shape(256, 2, 256, 512), DType::kQ8_0);
  auto again = PlanQuantization(q, "q4_k", false);
  ASSERT_FALSE(again);
  EXPECT_NE(again.error().message().find("--allow-requantize"), std::string::npos);
  EXPECT_TRUE(PlanQuantization(q, "q4_k", true));
  EXPECT_TRUE(PlanQuantization(q, "q8_0", false)) << "keeping a type is not requantizing";
  EXPECT_TRUE(PlanQuantization(q, "f32", false)) << "decoding is not requantizing";
}

// Relative RMS error bound of each format on N(0, s) weights.
double RmsBound(DType t) {
  switch (t) {
    case DType::kQ8_0:
      return 0.01;
    case DType::kQ6_K:
      return 0.03;
    case DType::kQ5_K:
      return 0.06;
    case DType::kQ4_K:
      return 0.12;
    case DType::kQ4_0:
      return 0.15;
    case DType::kF16:
      return 1e-3;
    case DType::kBF16:
      return 8e-3;
    default:
      return 0;
  }
}

double MaxLogitDiff(const ModelWeights& a, const ModelWeights& b);

// Every tensor of `got` (loaded from a file written by `plan` from `w`) has
// the type the plan says, and each row the bytes the quantizer gives (with
// the plan's fit) for the same row of `w` decoded to f32, within the type's
// bound.
void ExpectReferenceBytes(const ModelWeights& w, const QuantizePlan& plan, const ModelWeights& got_w) {
  std::map<std::string, const Tensor*> got, src;
  ForEachWeightTensor(got_w, [&](const std::string& name, const Tensor& t) { got[name] = &t; });
  ForEachWeightTensor(w, [&](const std::string& name, const Tensor& t) { src[name] = &t; });
  ASSERT_EQ(got.size(), plan.tensors.size());
  for (const auto& tp : plan.tensors) {
    const Tensor* t = got[tp.name];
    const Tensor* s = src[tp.name];
    ASSERT_NE(t, nullptr) << tp.name;
    ASSERT_NE(s, nullptr) << tp.name;
    ASSERT_EQ(t->type, tp.to) << tp.name;
    ASSERT_EQ(t->ne, tp.ne);
    const int64_t cols = t->cols();
    std::vector<float> x(static_cast<size_t>(cols)), y(static_cast<size_t>(cols));
    std::vector<uint8_t> want(RowBytes(tp.to, cols));
    double err2 = 0, sum2 = 0;
    for (int64_t r = 0; r < t->rows(); ++r) {
      cpu::DequantizeRow(s->type, s->row(r), x.data(), cols);
      cpu::QuantizeRow(tp.to, x.data(), want.data(), cols, plan.fit);
      ASSERT_EQ(0, std::memcmp(want.data(), t->row(r), want.size())) << tp.name << " row " << r;
      cpu::DequantizeRow(t->type, t->row(r), y.data(), cols);
      for (int64_t k = 0; k < cols; ++k) {
        err2 += (x[k] - y[k]) * static_cast<double>(x[k] - y[k]);
        sum2 += x[k] * static_cast<double>(x[k]);
      }
    }
    if (tp.to != DType::kF32 && tp.to != s->type) {
      EXPECT_LE(std::sqrt(err2 / sum2), RmsBound(tp.to)) << tp.name;
    }
  }
}

// Writes `w` by `recipe` into `dir`, loads the file and checks its bytes.
void QuantizeAndCheck(const ModelWeights& w, const std::string& recipe, const std::string& dir,
                      QuantFit fit = QuantFit::kLeastSquares) {
  SCOPED_TRACE(recipe + (fit == QuantFit::kGgml ? " (ggml fit)" : ""));
  auto plan = PlanQuantization(w, recipe, false);
  ASSERT_TRUE(plan) << plan.error().ToString();
  EXPECT_EQ(plan->fit, QuantFit::kLeastSquares);  // the default
  plan->fit = fit;
  const std::string path = dir + "/" + recipe + (fit == QuantFit::kGgml ? "-ggml" : "") + ".gguf";
  ASSERT_TRUE(WriteQuantizedGguf(w, SyntheticVocab(w.config.vocab_size), *plan, true, 2, path).ok());
  auto m = LoadModel(path);
  ASSERT_TRUE(m) << m.error().ToString();
  EXPECT_TRUE((*m)->synthetic);
  EXPECT_EQ((*m)->weights.config.arch, w.config.arch);
  ExpectReferenceBytes(w, *plan, (*m)->weights);
}

TEST(Quantize, WrittenFilesHoldTheReferenceQuantizersBytesWithinEachFormatsBound) {
  const std::string dir = testing::MakeTempDir("strata-quantize-");
  ModelWeights w = Synth(Shape(256, 2, 512, 512));
  for (const char* recipe : {"q8_0", "q4_0", "q4_k", "q5_k", "q6_k", "q4_k_m", "f16", "bf16"})
    QuantizeAndCheck(w, recipe, dir);
  QuantizeAndCheck(w, "q8_0", dir, QuantFit::kGgml);  // llama-quantize's bytes
}

// f16 and bf16 files quantize from their decoded values, and convert to
// f32 and to each other.
TEST(Quantize, F16AndBf16SourcesQuantizeFromTheirDecodedValues) {
  for (DType from : {DType::kF16, DType::kBF16}) {
    SCOPED_TRACE(DTypeName(from));
    const std::string dir = testing::MakeTempDir("strata-quantize-from-");
    ModelWeights w = Synth(Shape(256, 2, 512, 512), from);
    for (const char* recipe : {"q8_0", "q4_k", "q6_k", "q4_k_m", "f32", "f16", "bf16"}) QuantizeAndCheck(w, recipe, dir);
  }
}

// qwen2 is NeoX in GGUF too: its Q/K rows and biases are written as they
// are (row r from row r, checked by the bytes), the biases keep f32, and
// the f32 copy computes the same logits.
TEST(Quantize, Qwen2KeepsItsPairingAndBiases) {
  const std::string dir = testing::MakeTempDir("strata-quantize-qwen2-");
  ModelConfig c = Shape(256, 2, 512, 512);
  c.arch = "qwen2";
  c.rope_style = RopeStyle::kNeox;
  c.qkv_bias = true;
  const ModelWeights w = Synth(c);
  for (const char* recipe : {"q8_0", "q4_k_m", "f32"}) QuantizeAndCheck(w, recipe, dir);
  auto m = LoadModel(dir + "/f32.gguf");
  ASSERT_TRUE(m) << m.error().ToString();
  EXPECT_EQ((*m)->weights.config.rope_style, RopeStyle::kNeox);
  EXPECT_TRUE((*m)->weights.config.qkv_bias);
  EXPECT_LT(MaxLogitDiff(w, (*m)->weights), 1e-4);
}

double MaxLogitDiff(const ModelWeights& a, const ModelWeights& b) {
  const std::vector<int32_t> tokens = {1, 5, 9, 3, 7, 2, 30, 11, 4, 60};
  const auto la = testing::ReferenceModel(a).Forward(tokens);
  const auto lb = testing::ReferenceModel(b).Forward(tokens);
  double d = 0;
  for (size_t i = 0; i < la.size(); ++i)
    for (size_t k = 0; k < la[i].size(); ++k) d = std::max(d, std::abs(la[i][k] - lb[i][k]));
  return d;
}

// A Hugging Face Llama directory loads with the NeoX RoPE pairing; GGUF
// llama implies the interleaved one. Writing it permutes the attn_q/attn_k
// rows (as llama.cpp's converter does): the file computes the same logits,
// and its q8_0 copy holds exactly the bytes of the q8_0 copy of the
// interleaved file (each row is quantized on its own).
TEST(Quantize, ANeoxLlamaIsWrittenWithItsQKRowsInTheInterleavedPairing) {
  const std::string dir = testing::MakeTempDir("strata-quantize-neox-");
  ModelConfig c = Shape(64, 2, 128, 64);
  c.rope_style = RopeStyle::kNeox;
  c.qkv_bias = true;  // the biases of Q and K are permuted too
  const ModelWeights w = Synth(c);
  auto f32 = PlanQuantization(w, "f32", false);
  ASSERT_TRUE(f32);
  ASSERT_TRUE(WriteQuantizedGguf(w, SyntheticVocab(64), *f32, true, 1, dir + "/f32.gguf").ok());
  auto m = LoadModel(dir + "/f32.gguf");
  ASSERT_TRUE(m) << m.error().ToString();
  const ModelWeights& back = (*m)->weights;
  EXPECT_EQ(back.config.rope_style, RopeStyle::kInterleaved);
  EXPECT_LT(MaxLogitDiff(w, back), 1e-4);
  // Control: the same rows read in the other pairing compute something else.
  ModelWeights unpermuted = Synth(c);
  unpermuted.config.rope_style = RopeStyle::kInterleaved;
  EXPECT_GT(MaxLogitDiff(w, unpermuted), 1e-2);

  auto q8 = PlanQuantization(w, "q8_0", false);
  ASSERT_TRUE(q8);
  ASSERT_TRUE(WriteQuantizedGguf(w, SyntheticVocab(64), *q8, true, 2, dir + "/from-neox.gguf").ok());
  auto q8b = PlanQuantization(back, "q8_0", false);
  ASSERT_TRUE(q8b);
  ASSERT_TRUE(WriteQuantizedGguf(back, SyntheticVocab(64), *q8b, true, 2, dir + "/from-gguf.gguf").ok());
  auto a = LoadModel(dir + "/from-neox.gguf");
  auto b = LoadModel(dir + "/from-gguf.gguf");
  ASSERT_TRUE(a && b);
  std::map<std::string, const Tensor*> tb;
  ForEachWeightTensor((*b)->weights, [&](const std::string& name, const Tensor& t) { tb[name] = &t; });
  int compared = 0;
  ForEachWeightTensor((*a)->weights, [&](const std::string& name, const Tensor& t) {
    ASSERT_EQ(tb.count(name), 1u) << name;
    ASSERT_EQ(t.nbytes, tb[name]->nbytes) << name;
    EXPECT_EQ(0, std::memcmp(t.data, tb[name]->data, t.nbytes)) << name;
    ++compared;
  });
  EXPECT_EQ(compared, static_cast<int>(tb.size()));
}

// GGUF carries Llama-3 RoPE scaling (a Hugging Face Llama 3.x directory's
// rope_scaling) as the rope_freqs tensor: the file's frequencies are the
// original's, and a GGUF file with that tensor keeps it when quantized.
TEST(Quantize, Llama3RopeScalingIsWrittenAsRopeFreqs) {
  const std::string dir = testing::MakeTempDir("strata-quantize-rope-");
  ModelConfig c = Shape(256, 2, 256, 64);
  c.head_dim = 128;
  c.n_heads = 2;
  c.n_kv_heads = 1;
  c.rope_theta = 500000.0f;
  c.rope_scaling.type = RopeScaling::Type::kLlama3;
  c.rope_scaling.factor = 8.0f;
  const ModelWeights w = Synth(c);
  const size_t half = static_cast<size_t>(c.head_dim / 2);
  std::vector<float> want(half), plain(half), got(half), again(half);
  ComputeRopeInvFreq(c, want.data());
  ModelConfig unscaled = c;
  unscaled.rope_scaling = RopeScaling{};
  ComputeRopeInvFreq(unscaled, plain.data());
  EXPECT_NEAR(plain[half - 1] / want[half - 1], 8.0, 1e-3);  // the scaling matters at this width

  auto plan = PlanQuantization(w, "q8_0", false);
  ASSERT_TRUE(plan);
  ASSERT_TRUE(WriteQuantizedGguf(w, SyntheticVocab(64), *plan, true, 1, dir + "/a.gguf").ok());
  auto a = LoadModel(dir + "/a.gguf");
  ASSERT_TRUE(a) << a.error().ToString();
  ComputeRopeInvFreq((*a)->weights.config, got.data());
  for (size_t i = 0; i < half; ++i) EXPECT_NEAR(got[i] / want[i], 1.0, 1e-6) << i;

  auto plan_b = PlanQuantization((*a)->weights, "q8_0", false);
  ASSERT_TRUE(plan_b);
  ASSERT_TRUE(WriteQuantizedGguf((*a)->weights, SyntheticVocab(64), *plan_b, true, 1, dir + "/b.gguf").ok());
  auto b = LoadModel(dir + "/b.gguf");
  ASSERT_TRUE(b) << b.error().ToString();
  ComputeRopeInvFreq((*b)->weights.config, again.data());
  for (size_t i = 0; i < half; ++i) EXPECT_EQ(again[i], got[i]) << i;
}

}  // namespace
}  // namespace strata
