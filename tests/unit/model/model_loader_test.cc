// Loading models from GGUF: architecture metadata, tensor checks, tokenizer
// metadata, BOS rules, and clear errors for files that are not usable.

#include "model/model_loader.h"

#include <gtest/gtest.h>

#include <cstring>
#include <functional>

#include "model/backend/cpu/matmul.h"
#include "model/backend/cpu/matmul_q8.h"
#include "model/gguf_export.h"
#include "model/gguf_model.h"
#include "model/gguf_tokenizer.h"
#include "model/gguf_writer.h"
#include "model/synth.h"
#include "tests/support/test_env.h"

namespace strata {
namespace {

ModelConfig Small() {
  auto c = SynthPresetConfig("tiny", 0);
  return *c;
}

std::string WriteSynthetic(const ModelConfig& c, DType dtype, const std::string& name) {
  std::string path = testing::MakeTempDir("strata-loader-") + "/" + name + ".gguf";
  SynthOptions opt;
  opt.dtype = dtype;
  Status s = WriteSyntheticGguf(c, SyntheticVocab(c.vocab_size), opt, path);
  EXPECT_TRUE(s.ok()) << s.ToString();
  return path;
}

TEST(ModelLoader, SyntheticGgufRoundTripsConfigAndWeights) {
  ModelConfig c = Small();
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0}) {
    std::string path = WriteSynthetic(c, t, "m");
    auto m = LoadModel(path);
    ASSERT_TRUE(m) << m.error().ToString();
    const ModelConfig& got = (*m)->weights.config;
    EXPECT_EQ(got.dim, c.dim);
    EXPECT_EQ(got.n_layers, c.n_layers);
    EXPECT_EQ(got.n_heads, c.n_heads);
    EXPECT_EQ(got.n_kv_heads, c.n_kv_heads);
    EXPECT_EQ(got.ffn_dim, c.ffn_dim);
    EXPECT_EQ(got.vocab_size, c.vocab_size);
    EXPECT_EQ(got.rope_style, RopeStyle::kInterleaved);
    EXPECT_TRUE((*m)->synthetic);
    EXPECT_EQ((*m)->id, "m");
    EXPECT_EQ((*m)->weights.layers[0].wq.type, t);
    // The bytes in the file are the synthetic generator's bytes.
    auto mem = MakeSyntheticWeights(c, SynthOptions{t, 1, 0.0f});
    ASSERT_TRUE(mem);
    const Tensor& a = (*m)->weights.layers[1].w_down;
    const Tensor& b = mem->layers[1].w_down;
    ASSERT_EQ(a.nbytes, b.nbytes);
    EXPECT_EQ(0, std::memcmp(a.data, b.data, a.nbytes));
    EXPECT_EQ((*m)->weights.digest, mem->digest);
  }
}

// A model file of type `type` loaded with the activation mode `mode` set
// (restored to auto after) and `pack` as LoadOptions::pack_weights; `want`
// is whether the test expects the copy it looks for.
struct PackCase {
  DType type;
  cpu::ActivationMode mode;
  bool pack;
  bool want;
  std::string What() const {
    return std::string(DTypeName(type)) + " mode " + std::to_string(static_cast<int>(mode)) +
           (pack ? "" : " pack_weights=false");
  }
};

Result<std::unique_ptr<LoadedModel>> LoadUnder(const ModelConfig& c, const PackCase& k, const std::string& name) {
  cpu::SetActivationMode(k.mode);
  const std::string path = WriteSynthetic(c, k.type, name);
  LoadOptions lo;
  lo.pack_weights = k.pack;
  auto m = LoadModel(path, lo);
  cpu::SetActivationMode(cpu::ActivationMode::kAuto);
  return m;
}

// Loading packs Q4_0 / Q8_0 and K-quant matrices for the int8 lane kernels where the
// activation mode uses it (model/weight_pack.h), and the file's bytes stay
// readable after their pages are dropped; the digest is the file's.
TEST(ModelLoader, QuantizedMatricesArePackedWhereTheLaneKernelReadsThem) {
  const ModelConfig c = Small();
  const bool lanes = cpu::internal::ActiveQ8Kernels().reads_lanes;
  const bool k_lanes = cpu::internal::ReadsLanes(cpu::internal::ActiveQ8Kernels(), DType::kQ4_K);
  const PackCase cases[] = {
      {DType::kQ4_0, cpu::ActivationMode::kAuto, true, lanes},  {DType::kQ4_0, cpu::ActivationMode::kAuto, false, false},
      {DType::kQ4_0, cpu::ActivationMode::kExact, true, false},
      // Q8_0's default, wide activations, reads the lanes too.
      {DType::kQ8_0, cpu::ActivationMode::kAuto, true, lanes},
      {DType::kQ8_0, cpu::ActivationMode::kExact, true, false},
      {DType::kQ8_0, cpu::ActivationMode::kInt8, true, lanes},
      // The K-quants: where their lane kernels run (AVX-512 VNNI).
      {DType::kQ4_K, cpu::ActivationMode::kAuto, true, k_lanes},
      {DType::kQ4_K, cpu::ActivationMode::kAuto, false, false},
      {DType::kQ4_K, cpu::ActivationMode::kExact, true, false},
      {DType::kQ5_K, cpu::ActivationMode::kAuto, true, k_lanes},
      {DType::kQ6_K, cpu::ActivationMode::kAuto, true, k_lanes},
      {DType::kQ6_K, cpu::ActivationMode::kExact, true, false},
  };
  // K-quants need rows of a multiple of 256.
  ModelConfig kc = c;
  kc.dim = 256;
  kc.head_dim = kc.dim / kc.n_heads;
  kc.ffn_dim = 512;
  for (const PackCase& k : cases) {
    const std::string what = k.What();
    const bool k_quant = k.type == DType::kQ4_K || k.type == DType::kQ5_K || k.type == DType::kQ6_K;
    const ModelConfig& cfg = k_quant ? kc : c;
    auto m = LoadUnder(cfg, k, "p");
    ASSERT_TRUE(m) << m.error().ToString();
    auto mem = MakeSyntheticWeights(cfg, SynthOptions{k.type, 1, 0.0f});
    ASSERT_TRUE(mem);
    EXPECT_EQ((*m)->weights.digest, mem->digest) << what;
    const Tensor& a = (*m)->weights.layers[0].w_up;
    ASSERT_GE(a.rows(), 16);
    EXPECT_EQ(a.lanes != nullptr, k.want) << what;
    EXPECT_EQ((*m)->weights.output.lanes != nullptr, k.want) << what;
    EXPECT_EQ(reinterpret_cast<uintptr_t>(a.lanes) % 64, 0u) << what;
    EXPECT_EQ(0, std::memcmp(a.data, mem->layers[0].w_up.data, a.nbytes)) << what;
    if (a.lanes != nullptr) {
      std::vector<uint8_t> want(cpu::internal::LanePackedBytes(a));
      cpu::internal::PackLanes(mem->layers[0].w_up, want.data());
      EXPECT_EQ(0, std::memcmp(a.lanes, want.data(), want.size())) << what;
    }
  }
}

// Loading splits matrices with wide rows into column panels where f32
// activations multiply them (model/weight_pack.h), not where the int8 path
// does or packing is off; `data` keeps the file's bytes.
TEST(ModelLoader, WideMatricesGetColumnPanels) {
  ModelConfig c = Small();
  c.ffn_dim = 4096;  // w_down: 4096 columns, f16: 16 KiB of x + 8 KiB a row
  const PackCase cases[] = {
      {DType::kF16, cpu::ActivationMode::kAuto, true, true},
      {DType::kF16, cpu::ActivationMode::kAuto, false, false},
      {DType::kQ8_0, cpu::ActivationMode::kExact, true, true},
      // Where Q8_0's default is wide activations, its integer kernels read no panels.
      {DType::kQ8_0, cpu::ActivationMode::kAuto, true,
       !cpu::UsesIntegerActivations(DType::kQ8_0, cpu::ActivationMode::kAuto)},
      {DType::kQ8_0, cpu::ActivationMode::kInt8, true, false},
  };
  for (const PackCase& k : cases) {
    const std::string what = k.What();
    auto m = LoadUnder(c, k, "wide");
    ASSERT_TRUE(m) << m.error().ToString();
    const Tensor& down = (*m)->weights.layers[1].w_down;
    EXPECT_EQ(down.panels != nullptr, k.want) << what;
    EXPECT_EQ((*m)->weights.layers[1].w_up.panels, nullptr) << what;  // 64 columns
    auto mem = MakeSyntheticWeights(c, SynthOptions{k.type, 1, 0.0f});
    ASSERT_TRUE(mem);
    EXPECT_EQ((*m)->weights.digest, mem->digest) << what;
    EXPECT_EQ(0, std::memcmp(down.data, mem->layers[1].w_down.data, down.nbytes)) << what;
    if (down.panels != nullptr) {
      EXPECT_EQ(down.panel_cols, 2048) << what;
      EXPECT_EQ(reinterpret_cast<uintptr_t>(down.panels) % 64, 0u) << what;
      std::vector<uint8_t> want(cpu::PanelPackedBytes(down, down.panel_cols));
      cpu::PackPanels(mem->layers[1].w_down, down.panel_cols, want.data());
      EXPECT_EQ(0, std::memcmp(down.panels, want.data(), want.size())) << what;
    }
  }
}

TEST(ModelLoader, DigestDiffersAcrossWeights) {
  ModelConfig c = Small();
  auto a = MakeSyntheticWeights(c, SynthOptions{DType::kF32, 1, 0.0f});
  auto b = MakeSyntheticWeights(c, SynthOptions{DType::kF32, 2, 0.0f});
  auto q = MakeSyntheticWeights(c, SynthOptions{DType::kQ8_0, 1, 0.0f});
  EXPECT_NE(a->digest, b->digest);
  EXPECT_NE(a->digest, q->digest);
  EXPECT_EQ(a->digest.size(), 64u);
}

TEST(ModelLoader, BosIsAddedOnceAndChatRendered) {
  auto m = LoadModel(testing::Stories260KPath());
  ASSERT_TRUE(m) << m.error().ToString();
  std::vector<int32_t> ids = TokenizePrompt(**m, "Once upon a time");
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids[0], 1);
  // Text that already starts with the BOS text does not get a second BOS.
  std::vector<int32_t> again = TokenizePrompt(**m, "<s>Once upon a time");
  EXPECT_EQ(again, ids);
  // stories260K has no chat template: the plain format, BOS once.
  auto chat = TokenizeChat(**m, {{"user", "Tell me a story."}});
  ASSERT_TRUE(chat) << chat.error().ToString();
  EXPECT_EQ((*m)->chat_family, ChatTemplateFamily::kPlain);
  EXPECT_EQ((*chat)[0], 1);
  EXPECT_NE((*chat)[1], 1);
  auto bad = TokenizeChat(**m, {{"wizard", "hi"}});
  EXPECT_FALSE(bad);
}

TEST(ModelLoader, ChatTemplateOverride) {
  LoadOptions lo;
  lo.chat_template = "chatml";
  auto m = LoadModel(testing::Stories260KPath(), lo);
  ASSERT_TRUE(m) << m.error().ToString();
  EXPECT_EQ((*m)->chat_family, ChatTemplateFamily::kChatML);
  lo.chat_template = "no-such-format";
  auto bad = LoadModel(testing::Stories260KPath(), lo);
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message().find("no-such-format"), std::string::npos);
}

// Writes a GGUF whose metadata or tensors are edited by `edit`.
std::string WriteEdited(const std::function<void(ModelConfig&)>& cfg_edit, bool drop_tensor = false,
                        const std::string& arch_override = "") {
  ModelConfig c = Small();
  cfg_edit(c);
  auto w = MakeSyntheticWeights(Small(), SynthOptions{});
  EXPECT_TRUE(w);
  GgufWriter out;
  const std::string a = (arch_override.empty() ? c.arch : arch_override) + ".";
  out.SetString("general.architecture", arch_override.empty() ? c.arch : arch_override);
  out.SetU32(a + "context_length", static_cast<uint32_t>(c.context_length));
  out.SetU32(a + "embedding_length", static_cast<uint32_t>(c.dim));
  out.SetU32(a + "block_count", static_cast<uint32_t>(c.n_layers));
  out.SetU32(a + "feed_forward_length", static_cast<uint32_t>(c.ffn_dim));
  out.SetU32(a + "attention.head_count", static_cast<uint32_t>(c.n_heads));
  out.SetU32(a + "attention.head_count_kv", static_cast<uint32_t>(c.n_kv_heads));
  AddTokenizerToGguf(SyntheticVocab(c.vocab_size), &out);
  auto add = [&](const std::string& n, const Tensor& t) {
    if (t.present()) {
      EXPECT_TRUE(out.AddTensor(n, t.type, t.ne, t.data, t.nbytes).ok());
    }
  };
  add("token_embd.weight", w->tok_embd);
  add("output_norm.weight", w->output_norm);
  add("output.weight", w->output);
  for (int i = 0; i < Small().n_layers; ++i) {
    const LayerWeights& l = w->layers[i];
    std::string p = "blk." + std::to_string(i) + ".";
    add(p + "attn_norm.weight", l.attn_norm);
    if (!(drop_tensor && i == 1)) add(p + "attn_q.weight", l.wq);
    add(p + "attn_k.weight", l.wk);
    add(p + "attn_v.weight", l.wv);
    add(p + "attn_output.weight", l.wo);
    add(p + "ffn_norm.weight", l.ffn_norm);
    add(p + "ffn_gate.weight", l.w_gate);
    add(p + "ffn_up.weight", l.w_up);
    add(p + "ffn_down.weight", l.w_down);
  }
  std::string path = testing::MakeTempDir("strata-loader-") + "/edited.gguf";
  EXPECT_TRUE(out.Write(path).ok());
  return path;
}

TEST(ModelLoader, UnusableFilesGiveErrorsNamingTheProblem) {
  auto expect_error = [](const std::string& path, const std::string& needle) {
    auto m = LoadModel(path);
    ASSERT_FALSE(m) << "loaded " << path;
    EXPECT_NE(m.error().message().find(needle), std::string::npos) << m.error().message();
  };
  expect_error(WriteEdited([](ModelConfig&) {}, /*drop_tensor=*/true), "blk.1.attn_q.weight");
  expect_error(WriteEdited([](ModelConfig& c) { c.ffn_dim = 100; }), "ffn_gate");
  expect_error(WriteEdited([](ModelConfig& c) { c.n_kv_heads = 3; }), "KV head count 3");
  expect_error(WriteEdited([](ModelConfig&) {}, false, "gpt-neox"), "architecture 'gpt-neox'");
  expect_error("/nonexistent/x.gguf", "/nonexistent/x.gguf");
  // The intact version of the same file loads.
  EXPECT_TRUE(LoadModel(WriteEdited([](ModelConfig&) {})));
}

TEST(ModelLoader, DefaultModelIsWrittenOnceAndMarkedRandom) {
  std::string dir = testing::MakeTempDir("strata-cache-");
  setenv("STRATA_CACHE_DIR", dir.c_str(), 1);
  auto p = EnsureDefaultModel();
  ASSERT_TRUE(p) << p.error().ToString();
  EXPECT_NE(p->find("random-weights"), std::string::npos);
  auto m = LoadModel(*p);
  ASSERT_TRUE(m) << m.error().ToString();
  EXPECT_TRUE((*m)->synthetic);
  EXPECT_NE((*m)->id.find("random"), std::string::npos);
  auto again = EnsureDefaultModel();
  EXPECT_EQ(*again, *p);
  unsetenv("STRATA_CACHE_DIR");
}

}  // namespace
}  // namespace strata
