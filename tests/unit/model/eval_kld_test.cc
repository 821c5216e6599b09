// strata eval kld's library: the per-position divergence against
// hand-computed values, a model against itself, a perturbed model, and the
// project's default text.

#include "model/eval_kld.h"

#include <gtest/gtest.h>

#include <cmath>
#include <sstream>

#include "model/synth.h"

namespace strata {
namespace {

TEST(EvalKld, KlDivergenceByHand) {
  // p = softmax(0, log 3) = (1/4, 3/4); q = (1/2, 1/2).
  const float ref[2] = {0.0f, std::log(3.0f)};
  const float cand[2] = {5.0f, 5.0f};  // a shift changes nothing
  const double want = 0.25 * std::log(0.25 / 0.5) + 0.75 * std::log(0.75 / 0.5);
  EXPECT_NEAR(KlDivergence(ref, cand, 2), want, 1e-7);
  EXPECT_EQ(KlDivergence(ref, ref, 2), 0.0);
  const float big[3] = {1000.0f, 999.0f, -1000.0f};  // no overflow
  EXPECT_EQ(KlDivergence(big, big, 3), 0.0);
  // Non-finite logits: never a silent 0.
  const float nan[2] = {0.0f, NAN};
  EXPECT_TRUE(std::isnan(KlDivergence(ref, nan, 2)));
  EXPECT_TRUE(std::isnan(KlDivergence(nan, ref, 2)));
  const float inf[2] = {0.0f, INFINITY};
  EXPECT_TRUE(std::isnan(KlDivergence(ref, inf, 2)));
  // p = 0 terms contribute nothing; q = 0 where p > 0 is infinite.
  const float p0[2] = {0.0f, -INFINITY};
  EXPECT_NEAR(KlDivergence(p0, cand, 2), std::log(2.0), 1e-12);
  EXPECT_EQ(KlDivergence(cand, p0, 2), INFINITY);
}

ModelConfig Tiny() {
  auto c = SynthPresetConfig("tiny", 0);
  EXPECT_TRUE(c);
  return *c;
}

std::vector<int32_t> Tokens(int n, int vocab) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  uint32_t s = 7;
  for (auto& v : t) {
    s = s * 1664525u + 1013904223u;
    v = static_cast<int32_t>((s >> 8) % static_cast<uint32_t>(vocab));
  }
  return t;
}

TEST(EvalKld, AModelAgainstItselfIsZeroAndAgreesEverywhere) {
  auto w = MakeSyntheticWeights(Tiny(), SynthOptions{});
  ASSERT_TRUE(w);
  ThreadPool pool(2);
  KldOptions opt;
  opt.context = 64;
  opt.bos_id = 1;
  auto r = EvaluateKld(*w, *w, Tokens(64 * 3 + 10, w->config.vocab_size), opt, &pool);
  ASSERT_TRUE(r) << r.error().ToString();
  EXPECT_EQ(r->chunks, 3);
  EXPECT_EQ(r->positions, 3 * (64 - 1 - 32));
  EXPECT_EQ(r->mean_kld, 0.0);
  EXPECT_EQ(r->max_kld, 0.0);
  EXPECT_EQ(r->top1_agreement, 1.0);
  EXPECT_EQ(r->model_ppl, r->reference_ppl);
}

TEST(EvalKld, OtherWeightsDivergeAndQuantizedOnesLess) {
  const ModelConfig c = Tiny();
  auto ref = MakeSyntheticWeights(c, SynthOptions{});
  SynthOptions q8;
  q8.dtype = DType::kQ8_0;
  auto near = MakeSyntheticWeights(c, q8);  // the same values, quantized
  SynthOptions other;
  other.seed = 2;
  auto far = MakeSyntheticWeights(c, other);
  ASSERT_TRUE(ref && near && far);
  ThreadPool pool(2);
  KldOptions opt;
  opt.context = 64;
  const auto tokens = Tokens(128, c.vocab_size);
  auto rn = EvaluateKld(*near, *ref, tokens, opt, &pool);
  auto rf = EvaluateKld(*far, *ref, tokens, opt, &pool);
  ASSERT_TRUE(rn && rf);
  EXPECT_GT(rn->mean_kld, 0.0);
  EXPECT_LT(rn->mean_kld, rf->mean_kld / 100);
  EXPECT_GT(rn->top1_agreement, rf->top1_agreement);
  EXPECT_GE(rn->max_kld, rn->p99_kld);
}

TEST(EvalKld, RefusesTooFewTokensAndBadContexts) {
  auto w = MakeSyntheticWeights(Tiny(), SynthOptions{});
  ASSERT_TRUE(w);
  ThreadPool pool(1);
  KldOptions opt;
  opt.context = 64;
  auto short_text = EvaluateKld(*w, *w, Tokens(63, w->config.vocab_size), opt, &pool);
  ASSERT_FALSE(short_text);
  EXPECT_EQ(short_text.error().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(short_text.error().message().find("fewer than one chunk of 64"), std::string::npos);
  opt.context = w->config.context_length + 1;
  auto long_ctx = EvaluateKld(*w, *w, Tokens(4096, w->config.vocab_size), opt, &pool);
  ASSERT_FALSE(long_ctx);
  EXPECT_NE(long_ctx.error().message().find("--context"), std::string::npos);
  opt.context = 64;
  auto bad = Tokens(64, w->config.vocab_size);
  bad[10] = w->config.vocab_size;
  auto out_of_range = EvaluateKld(*w, *w, bad, opt, &pool);
  ASSERT_FALSE(out_of_range);
  EXPECT_NE(out_of_range.error().message().find("out of range"), std::string::npos);
  ModelConfig other = Tiny();
  other.vocab_size = 256;
  auto w2 = MakeSyntheticWeights(other, SynthOptions{});
  ASSERT_TRUE(w2);
  auto vocab = EvaluateKld(*w2, *w, Tokens(128, 256), opt, &pool);
  ASSERT_FALSE(vocab);
  EXPECT_NE(vocab.error().message().find("vocabulary"), std::string::npos);
}

TEST(EvalKld, DefaultTextIsFixedAndLongEnough) {
  const std::string a = DefaultEvalText();
  EXPECT_EQ(a, DefaultEvalText());
  EXPECT_NE(a, DefaultEvalText(6000, 2));
  std::istringstream in(a);
  int words = 0;
  for (std::string word; in >> word;) ++words;
  EXPECT_GE(words, 6000);
  EXPECT_EQ(a.rfind("Once upon a time", 0), 0u);
}

}  // namespace
}  // namespace strata
