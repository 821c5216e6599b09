// The fast forward pass against the double-precision reference, and batching
// invariances: mixed batches and chunked prefill compute what single
// sequences and one-shot prefill compute.

#include "model/forward.h"
#include "model/backend/cpu/matmul.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <span>

#include "model/synth.h"
#include "model/weight_pack.h"
#include "tests/support/reference_forward.h"

namespace strata {
namespace {

// These tests compare the forward pass with a double reference of f32
// activations (and mixed batches with tolerance); the int8 path has its own
// bitwise tests (forward_int8_test.cc).
class ExactActivations : public ::testing::Environment {
 public:
  void SetUp() override { cpu::SetActivationMode(cpu::ActivationMode::kExact); }
};
const auto* const kExactEnv = ::testing::AddGlobalTestEnvironment(new ExactActivations);

ModelConfig Shape(int dim, int layers, int heads, int kv_heads, int ffn, int vocab) {
  ModelConfig c;
  c.arch = "llama";
  c.dim = dim;
  c.n_layers = layers;
  c.n_heads = heads;
  c.n_kv_heads = kv_heads;
  c.head_dim = dim / heads;
  c.ffn_dim = ffn;
  c.vocab_size = vocab;
  c.context_length = 128;
  c.rms_eps = 1e-5f;
  c.rope_theta = 10000.0f;
  return c;
}

std::vector<int32_t> Tokens(int n, int vocab, uint32_t seed) {
  std::vector<int32_t> t(n);
  uint32_t s = seed * 2654435761u + 1;
  for (auto& v : t) {
    s = s * 1664525u + 1013904223u;
    v = static_cast<int32_t>((s >> 8) % static_cast<uint32_t>(vocab));
  }
  return t;
}

// max |a - b| / max |b| over one row.
double RelErr(const float* a, const std::vector<double>& b) {
  double num = 0, den = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    num = std::max(num, std::abs(static_cast<double>(a[i]) - b[i]));
    den = std::max(den, std::abs(b[i]));
  }
  return num / den;
}

std::vector<int32_t> Blocks(int first, int n) {
  std::vector<int32_t> b(n);
  std::iota(b.begin(), b.end(), first);
  return b;
}

struct Case {
  std::string name;
  ModelConfig config;
  DType wtype;
  DType kvtype;
  double tol;
  // Split the wide matrices into column panels as loading does
  // (PackWeightPanels), and check that some were.
  bool panels = false;
};

class ForwardVsReference : public ::testing::TestWithParam<Case> {};

TEST_P(ForwardVsReference, AllPositionsMatch) {
  const Case& tc = GetParam();
  SynthOptions opt;
  opt.dtype = tc.wtype;
  opt.seed = 7;
  auto w = MakeSyntheticWeights(tc.config, opt);
  ASSERT_TRUE(w) << w.error().ToString();
  if (tc.panels) {
    ASSERT_GT(PackWeightPanels(&*w, {}), 0) << tc.name;
    ASSERT_NE(w->layers[0].w_down.panels, nullptr) << tc.name;
  }
  ThreadPool pool(2);
  KvOptions kv;
  kv.block_size = 4;
  kv.dtype = tc.kvtype;
  kv.num_blocks = 16;
  auto eng = ForwardEngine::Create(*w, kv, &pool);
  ASSERT_TRUE(eng) << eng.error().ToString();

  const int n = 19;  // spans several blocks, last one partial
  std::vector<int32_t> toks = Tokens(n, tc.config.vocab_size, 3);
  std::vector<int32_t> table = Blocks(0, 5);
  ForwardSeq seq{toks, 0, table, /*all_logits=*/true};
  std::vector<float> logits;
  ASSERT_TRUE((*eng)->Forward({&seq, 1}, &logits).ok());

  testing::ReferenceModel ref(*w);
  auto want = ref.Forward(toks);
  const size_t V = static_cast<size_t>(tc.config.vocab_size);
  double worst = 0;
  for (int t = 0; t < n; ++t) worst = std::max(worst, RelErr(logits.data() + t * V, want[t]));
  EXPECT_LE(worst, tc.tol) << tc.name;
  RecordProperty("worst_rel_err", std::to_string(worst));
  if (tc.panels) {
    // Token by token too (one-token products read the panels through the
    // dot kernels), into blocks of their own.
    std::vector<int32_t> table2 = Blocks(5, 5);
    double worst1 = 0;
    for (int t = 0; t < n; ++t) {
      ForwardSeq one{std::span<const int32_t>(toks).subspan(static_cast<size_t>(t), 1), t, table2,
                     /*all_logits=*/false};
      std::vector<float> l1;
      ASSERT_TRUE((*eng)->Forward({&one, 1}, &l1).ok());
      worst1 = std::max(worst1, RelErr(l1.data(), want[static_cast<size_t>(t)]));
    }
    EXPECT_LE(worst1, tc.tol) << tc.name << " token by token";
  }
  // The error bound must not be vacuous: logits are far from constant.
  double spread = *std::max_element(want[n - 1].begin(), want[n - 1].end()) -
                  *std::min_element(want[n - 1].begin(), want[n - 1].end());
  EXPECT_GT(spread, 0.5);
}

std::vector<Case> Cases() {
  std::vector<Case> cs;
  ModelConfig mha = Shape(64, 2, 4, 4, 96, 67);
  ModelConfig gqa = Shape(64, 3, 8, 2, 160, 101);
  ModelConfig odd = Shape(36, 2, 3, 1, 50, 37);  // head_dim 12, odd sizes
  ModelConfig tied = Shape(64, 2, 4, 2, 96, 80);
  tied.tied_embeddings = true;
  ModelConfig qwen = Shape(64, 2, 4, 2, 96, 90);
  qwen.arch = "qwen2";
  qwen.qkv_bias = true;
  qwen.tied_embeddings = true;
  qwen.rope_style = RopeStyle::kNeox;
  qwen.rope_theta = 1000000.0f;
  ModelConfig llama3 = Shape(64, 2, 4, 2, 96, 70);
  llama3.rope_scaling.type = RopeScaling::Type::kLlama3;
  llama3.rope_scaling.factor = 8;
  llama3.rope_scaling.low_freq_factor = 1;
  llama3.rope_scaling.high_freq_factor = 4;
  llama3.rope_scaling.original_context = 32;
  llama3.rope_theta = 500000.0f;
  ModelConfig linear = Shape(64, 2, 4, 4, 96, 70);
  linear.rope_scaling.type = RopeScaling::Type::kLinear;
  linear.rope_scaling.factor = 4;
  for (auto [n, c] : {std::pair{"mha", mha}, {"gqa", gqa}, {"odd", odd}, {"tied", tied}, {"qwen2_bias_neox", qwen},
                      {"llama3_rope", llama3}, {"linear_rope", linear}}) {
    cs.push_back({std::string(n) + "_f32", c, DType::kF32, DType::kF32, 1e-4});
  }
  cs.push_back({"gqa_f32_kvf16", gqa, DType::kF32, DType::kF16, 2e-3});
  cs.push_back({"gqa_f32_kvbf16", gqa, DType::kF32, DType::kBF16, 2e-2});
  cs.push_back({"gqa_f16", gqa, DType::kF16, DType::kF32, 2e-3});
  cs.push_back({"gqa_bf16", gqa, DType::kBF16, DType::kF32, 2e-3});
  cs.push_back({"gqa_q8_0", gqa, DType::kQ8_0, DType::kF32, 2e-2});
  cs.push_back({"gqa_q4_0", gqa, DType::kQ4_0, DType::kF32, 2e-2});
  // An FFN wide enough (4096) for w_down to be split into column panels:
  // the 19-token prefill goes through the tile kernels panel by panel.
  ModelConfig wide = Shape(64, 2, 4, 2, 4096, 67);
  cs.push_back({"wide_ffn_f32_panels", wide, DType::kF32, DType::kF32, 1e-4, true});
  cs.push_back({"wide_ffn_f16_panels", wide, DType::kF16, DType::kF32, 2e-3, true});
  cs.push_back({"wide_ffn_q8_0_panels", wide, DType::kQ8_0, DType::kF32, 2e-2, true});
  // K-quants need rows of 256.
  ModelConfig kq = Shape(256, 2, 4, 2, 512, 300);
  cs.push_back({"k_q4_k", kq, DType::kQ4_K, DType::kF32, 2e-2});
  cs.push_back({"k_q5_k", kq, DType::kQ5_K, DType::kF32, 2e-2});
  cs.push_back({"k_q6_k", kq, DType::kQ6_K, DType::kF32, 2e-2});
  return cs;
}

INSTANTIATE_TEST_SUITE_P(Shapes, ForwardVsReference, ::testing::ValuesIn(Cases()),
                         [](const auto& info) { return info.param.name; });

// Runs `toks` through the engine in chunks of `chunk` tokens; returns the
// logits of the last token of every chunk plus greedy continuation tokens.
struct Fixture {
  ModelWeights w;
  ThreadPool pool{2};
  std::unique_ptr<ForwardEngine> eng;
  explicit Fixture(int num_blocks) {
    ModelConfig c = Shape(64, 3, 8, 2, 160, 101);
    SynthOptions opt;
    opt.seed = 11;
    w = std::move(MakeSyntheticWeights(c, opt).value());
    KvOptions kv;
    kv.block_size = 4;
    kv.dtype = DType::kF32;
    kv.num_blocks = num_blocks;
    eng = std::move(ForwardEngine::Create(w, kv, &pool).value());
  }
};

int Argmax(const float* v, int n) { return static_cast<int>(std::max_element(v, v + n) - v); }

TEST(ForwardBatching, MixedBatchEqualsSequencesAlone) {
  const int V = 101;
  // Alone: three sequences, each prefilled then decoded greedily 6 steps.
  std::vector<std::vector<int32_t>> prompts = {Tokens(9, V, 1), Tokens(3, V, 2), Tokens(14, V, 3)};
  std::vector<std::vector<float>> alone_logits;
  std::vector<std::vector<int32_t>> alone_gen(3);
  {
    Fixture f(64);
    for (int s = 0; s < 3; ++s) {
      std::vector<int32_t> table = Blocks(s * 8, 8);
      std::vector<int32_t> seq = prompts[s];
      std::vector<float> lg;
      ForwardSeq fs{seq, 0, table};
      ASSERT_TRUE(f.eng->Forward({&fs, 1}, &lg).ok());
      alone_logits.push_back(lg);
      for (int step = 0; step < 6; ++step) {
        int32_t next = Argmax(lg.data(), V);
        alone_gen[s].push_back(next);
        seq.push_back(next);
        ForwardSeq d{std::span<const int32_t>(&seq.back(), 1), static_cast<int32_t>(seq.size() - 1), table};
        ASSERT_TRUE(f.eng->Forward({&d, 1}, &lg).ok());
        alone_logits.push_back(lg);
      }
    }
  }
  // Batched: sequence 1 starts first; later steps mix its decode tokens with
  // prompt chunks of sequences 0 and 2 (chunks of 5 tokens).
  Fixture f(64);
  std::vector<std::vector<int32_t>> seqs = prompts;
  std::vector<size_t> done(3, 0);  // prompt tokens processed
  std::vector<std::vector<int32_t>> gen(3);
  std::vector<std::vector<float>> got(3);
  std::vector<std::vector<int32_t>> tables = {Blocks(0, 8), Blocks(8, 8), Blocks(16, 8)};
  int rounds = 0;
  while ((gen[0].size() < 6 || gen[1].size() < 6 || gen[2].size() < 6) && rounds++ < 50) {
    std::vector<ForwardSeq> batch;
    std::vector<int> who;
    for (int s : {1, 0, 2}) {
      if (s != 1 && rounds < 2) continue;  // 0 and 2 join late
      if (gen[s].size() >= 6 && done[s] == seqs[s].size()) continue;
      if (done[s] < prompts[s].size()) {
        size_t n = std::min<size_t>(5, prompts[s].size() - done[s]);
        batch.push_back({std::span<const int32_t>(seqs[s].data() + done[s], n), static_cast<int32_t>(done[s]),
                         tables[s]});
      } else {
        batch.push_back({std::span<const int32_t>(&seqs[s].back(), 1), static_cast<int32_t>(seqs[s].size() - 1),
                         tables[s]});
      }
      who.push_back(s);
    }
    if (batch.empty()) break;
    std::vector<float> lg;
    ASSERT_TRUE(f.eng->Forward(batch, &lg).ok());
    for (size_t i = 0; i < batch.size(); ++i) {
      int s = who[i];
      done[s] = batch[i].start_pos + batch[i].tokens.size();
      if (done[s] < prompts[s].size()) continue;  // mid-prompt chunk: no token yet
      const float* row = lg.data() + i * V;
      got[s].insert(got[s].end(), row, row + V);
      if (gen[s].size() < 6) {
        int32_t next = Argmax(row, V);
        gen[s].push_back(next);
        seqs[s].push_back(next);
      }
    }
  }
  for (int s = 0; s < 3; ++s) {
    EXPECT_EQ(gen[s], alone_gen[s]) << "sequence " << s;
    for (int step = 0; step < 7 && (step + 1) * V <= static_cast<int>(got[s].size()); ++step) {
      const auto& a = alone_logits[s * 7 + step];
      std::vector<double> ad(a.begin(), a.end());
      EXPECT_LE(RelErr(got[s].data() + step * V, ad), 1e-5) << "sequence " << s << " step " << step;
    }
  }
}

TEST(ForwardBatching, ChunkedPrefillEqualsOneShot) {
  const int V = 101;
  std::vector<int32_t> p = Tokens(23, V, 5);
  std::vector<int32_t> table = Blocks(0, 8);
  Fixture one(16), chunked(16);
  std::vector<float> a, b;
  ForwardSeq whole{p, 0, table, true};
  ASSERT_TRUE(one.eng->Forward({&whole, 1}, &a).ok());
  std::vector<float> all;
  for (size_t start = 0; start < p.size(); start += 6) {
    size_t n = std::min<size_t>(6, p.size() - start);
    ForwardSeq c{std::span<const int32_t>(p.data() + start, n), static_cast<int32_t>(start), table, true};
    ASSERT_TRUE(chunked.eng->Forward({&c, 1}, &b).ok());
    all.insert(all.end(), b.begin(), b.end());
  }
  ASSERT_EQ(all.size(), a.size());
  for (size_t t = 0; t < p.size(); ++t) {
    std::vector<double> ref(a.begin() + t * V, a.begin() + (t + 1) * V);
    EXPECT_LE(RelErr(all.data() + t * V, ref), 1e-5) << "position " << t;
    EXPECT_EQ(Argmax(all.data() + t * V, V), Argmax(a.data() + t * V, V));
  }
}

// Decode at batch 1 and 2 past 32 positions (blocks of 4): with 2 threads
// each token's context is split into ranges of whole blocks, one task each,
// merged by log-sum-exp (ForwardEngine::Attention). Every decoded token's
// logits against the double reference over the whole sequence, for f32 and
// f16 KV and a GQA shape; and the same tokens decoded two at a time in one
// batch agree with batch 1.
TEST(ForwardBatching, LongContextDecodeMatchesReference) {
  for (DType kvt : {DType::kF32, DType::kF16}) {
    ModelConfig c = Shape(64, 2, 8, 2, 96, 71);
    SynthOptions opt;
    opt.seed = 13;
    auto w = MakeSyntheticWeights(c, opt);
    ASSERT_TRUE(w) << w.error().ToString();
    ThreadPool pool(2);
    KvOptions kv;
    kv.block_size = 4;
    kv.dtype = kvt;
    kv.num_blocks = 3 * 32;
    auto eng = ForwardEngine::Create(*w, kv, &pool);
    ASSERT_TRUE(eng) << eng.error().ToString();
    const int n = 120;
    const int prompt = 40;
    std::vector<int32_t> toks = Tokens(n, c.vocab_size, 9);
    testing::ReferenceModel ref(*w);
    auto want = ref.Forward(toks);
    const size_t V = static_cast<size_t>(c.vocab_size);
    const double tol = kvt == DType::kF32 ? 1e-4 : 2e-3;

    // Batch 1: prefill `prompt` tokens, then one token per step.
    std::vector<int32_t> table = Blocks(0, 32);
    std::vector<float> lg;
    ForwardSeq pre{std::span<const int32_t>(toks.data(), prompt), 0, table};
    ASSERT_TRUE((*eng)->Forward({&pre, 1}, &lg).ok());
    double worst = 0;
    std::vector<std::vector<float>> one(n);
    for (int t = prompt; t < n; ++t) {
      ForwardSeq d{std::span<const int32_t>(toks.data() + t, 1), t, table};
      ASSERT_TRUE((*eng)->Forward({&d, 1}, &lg).ok());
      one[t] = lg;
      worst = std::max(worst, RelErr(lg.data(), want[t]));
    }
    EXPECT_LE(worst, tol) << DTypeName(kvt) << " batch 1";

    // Batch 2: the same sequence in two more block tables, one token each per step.
    std::vector<std::vector<int32_t>> tables = {Blocks(32, 32), Blocks(64, 32), table};
    for (int s = 0; s < 2; ++s) {
      ForwardSeq p{std::span<const int32_t>(toks.data(), prompt), 0, tables[s]};
      ASSERT_TRUE((*eng)->Forward({&p, 1}, &lg).ok());
    }
    for (int t = prompt; t < n; ++t) {
      std::vector<ForwardSeq> batch;
      for (int s = 0; s < 2; ++s) batch.push_back({std::span<const int32_t>(toks.data() + t, 1), t, tables[s]});
      ASSERT_TRUE((*eng)->Forward(batch, &lg).ok());
      for (int s = 0; s < 2; ++s) {
        std::vector<double> a(one[t].begin(), one[t].end());
        EXPECT_LE(RelErr(lg.data() + s * V, a), 1e-5) << DTypeName(kvt) << " batch 2, position " << t;
      }
    }
  }
}

TEST(ForwardValidation, RejectsBadBatches) {
  Fixture f(4);
  std::vector<float> lg;
  std::vector<int32_t> toks = {1, 2, 3};
  std::vector<int32_t> table = {0};
  ForwardSeq short_table{toks, 2, table};  // needs 2 blocks of 4
  Status s = f.eng->Forward({&short_table, 1}, &lg);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("needs 2 blocks"), std::string::npos) << s.message();

  std::vector<int32_t> bad_tok = {1, 500};
  std::vector<int32_t> t2 = {0};
  ForwardSeq oov{bad_tok, 0, t2};
  s = f.eng->Forward({&oov, 1}, &lg);
  EXPECT_NE(s.message().find("token id 500"), std::string::npos) << s.message();

  std::vector<int32_t> bad_block = {9};
  ForwardSeq bb{std::span<const int32_t>(toks.data(), 1), 0, bad_block};
  s = f.eng->Forward({&bb, 1}, &lg);
  EXPECT_NE(s.message().find("not a valid block id"), std::string::npos) << s.message();

  std::vector<int32_t> tab = Blocks(0, 4);
  ForwardSeq past{std::span<const int32_t>(toks.data(), 1), 128, tab};
  s = f.eng->Forward({&past, 1}, &lg);
  EXPECT_NE(s.message().find("past the context length"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace strata
