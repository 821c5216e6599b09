#include "model/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <string>
#include <vector>

namespace strata {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<float> RandomLogits(int vocab, uint64_t seed, double scale = 4.0) {
  std::mt19937_64 gen(seed);
  std::vector<float> v(vocab);
  for (float& x : v)
    x = static_cast<float>((static_cast<double>(gen() >> 11) * 0x1p-53 - 0.5) * scale);
  return v;
}

std::vector<double> SoftmaxRef(const std::vector<float>& logits, double temperature = 1.0) {
  const double m = *std::max_element(logits.begin(), logits.end());
  std::vector<double> p(logits.size());
  double sum = 0.0;
  for (size_t i = 0; i < logits.size(); ++i)
    sum += (p[i] = std::exp((logits[i] - m) / temperature));
  for (double& x : p) x /= sum;
  return p;
}

int32_t ArgmaxRef(const std::vector<float>& v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

SamplingParams Seeded(uint64_t seed, float temperature = 1.0f) {
  SamplingParams p;
  p.seed = seed;
  p.temperature = temperature;
  return p;
}

// Counts of each token over n samples.
std::map<int32_t, int> Histogram(Sampler& s, const std::vector<float>& logits, int n) {
  std::map<int32_t, int> h;
  for (int i = 0; i < n; ++i) ++h[s.Sample(logits.data()).token];
  return h;
}

int32_t Greedy(SamplingParams p, const std::vector<float>& logits,
               const std::vector<int32_t>& prompt = {},
               const std::vector<int32_t>& generated = {}) {
  p.temperature = 0.0f;
  Sampler s(p, static_cast<int>(logits.size()));
  s.AcceptPrompt(prompt);
  for (int32_t t : generated) s.Accept(t);
  return s.Sample(logits.data()).token;
}

TEST(SamplerTest, GreedyPicksTheArgmax) {
  for (uint64_t seed = 0; seed < 20; ++seed) {
    const auto logits = RandomLogits(1000, seed);
    EXPECT_EQ(Greedy({}, logits), ArgmaxRef(logits));
    Sampler tiny(Seeded(seed, 1e-6f), 1000);  // below 1e-5 is greedy too
    EXPECT_EQ(tiny.Sample(logits.data()).token, ArgmaxRef(logits));
  }
}

TEST(SamplerTest, GreedyTiesGoToTheLowestId) {
  EXPECT_EQ(Greedy({}, {1.0f, 3.0f, 3.0f, 2.0f}), 1);
  EXPECT_EQ(Greedy({}, {-kInf, -kInf, -kInf}), 0);
}

TEST(SamplerTest, SameSeedSameSequenceDifferentSeedsDiffer) {
  const auto logits = RandomLogits(50, 7, 2.0);
  auto run = [&](uint64_t seed) {
    Sampler s(Seeded(seed), 50);
    std::vector<int32_t> out;
    for (int i = 0; i < 100; ++i) out.push_back(s.Sample(logits.data()).token);
    return out;
  };
  EXPECT_EQ(run(42), run(42));
  EXPECT_NE(run(42), run(43));
  // Unseeded samplers draw fresh seeds.
  SamplingParams unseeded;
  Sampler a(unseeded, 50);
  Sampler b(unseeded, 50);
  std::vector<int32_t> sa, sb;
  for (int i = 0; i < 100; ++i) {
    sa.push_back(a.Sample(logits.data()).token);
    sb.push_back(b.Sample(logits.data()).token);
  }
  EXPECT_NE(sa, sb);
}

TEST(SamplerTest, EmpiricalDistributionMatchesSoftmax) {
  const std::vector<float> logits = {1.0f, 2.0f, 0.5f, -1.0f, 1.5f};
  const auto p = SoftmaxRef(logits);
  Sampler s(Seeded(2024), 5);
  const int n = 20000;
  const auto h = Histogram(s, logits, n);
  double chi2 = 0.0;
  for (int i = 0; i < 5; ++i) {
    const double expected = n * p[i];
    const double got = h.contains(i) ? h.at(i) : 0;
    chi2 += (got - expected) * (got - expected) / expected;
  }
  // 4 degrees of freedom: P(chi2 > 30) ~ 5e-6. Deterministic with the seed.
  EXPECT_LT(chi2, 30.0);
}

TEST(SamplerTest, TopKOneEqualsGreedy) {
  for (uint64_t seed = 0; seed < 10; ++seed) {
    const auto logits = RandomLogits(3000, seed);
    SamplingParams p = Seeded(seed);
    p.top_k = 1;
    Sampler s(p, 3000);
    for (int i = 0; i < 20; ++i) EXPECT_EQ(s.Sample(logits.data()).token, ArgmaxRef(logits));
  }
}

TEST(SamplerTest, TopKKeepsOnlyTheKMostLikely) {
  const int vocab = 150000;
  const auto logits = RandomLogits(vocab, 5, 10.0);
  std::vector<int32_t> order(vocab);
  std::iota(order.begin(), order.end(), 0);
  std::partial_sort(order.begin(), order.begin() + 40, order.end(),
                    [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  const std::set<int32_t> top40(order.begin(), order.begin() + 40);
  SamplingParams p = Seeded(9);
  p.top_k = 40;
  Sampler s(p, vocab);
  std::set<int32_t> seen;
  for (int i = 0; i < 300; ++i) {
    const int32_t t = s.Sample(logits.data()).token;
    ASSERT_TRUE(top40.contains(t)) << t;
    seen.insert(t);
  }
  EXPECT_GT(seen.size(), 5u);
}

TEST(SamplerTest, SmallTopPKeepsOnlyTheTopToken) {
  const auto logits = RandomLogits(5000, 3);
  SamplingParams p = Seeded(1);
  p.top_p = 1e-4f;  // the top token alone has ~8e-4
  Sampler s(p, 5000);
  for (int i = 0; i < 200; ++i) EXPECT_EQ(s.Sample(logits.data()).token, ArgmaxRef(logits));
}

// Tokens 1234, 77, 2999 stand out of 2997 equal ones; ties among those go to
// the lower id, so the top-p set is known exactly.
TEST(SamplerTest, TopPKeepsTheSmallestPrefixReachingP) {
  const int vocab = 3000;
  std::vector<float> logits(vocab, 0.0f);
  logits[1234] = 5.0f;
  logits[77] = 4.0f;
  logits[2999] = 3.5f;
  const auto prob = SoftmaxRef(logits);
  for (float top_p : {0.05f, 0.07f, 0.5f, 0.95f}) {
    SCOPED_TRACE(top_p);
    // Reference: walk the order the contract defines.
    std::vector<int32_t> order(vocab);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
    std::set<int32_t> expected;
    double cum = 0.0;
    for (int32_t id : order) {
      expected.insert(id);
      if ((cum += prob[id]) >= top_p) break;
    }
    SamplingParams p = Seeded(11);
    p.top_p = top_p;
    Sampler s(p, vocab);
    std::set<int32_t> seen;
    for (int i = 0; i < 2500; ++i) {
      const int32_t t = s.Sample(logits.data()).token;
      ASSERT_TRUE(expected.contains(t)) << t;
      seen.insert(t);
    }
    // The least likely kept tokens are reachable (the set is not smaller).
    if (expected.size() <= 3) {
      EXPECT_EQ(seen, expected);
    } else {
      const auto flat_max = [](const std::set<int32_t>& ids) {
        int32_t m = -1;
        for (int32_t id : ids) {
          if (id != 1234 && id != 77 && id != 2999) m = std::max(m, id);
        }
        return m;
      };
      EXPECT_GT(flat_max(seen), flat_max(expected) - 300);
      EXPECT_TRUE(seen.contains(2999));
    }
  }
}

TEST(SamplerTest, TruncationsKeepTheRightTokens) {
  // probs 0.5, 0.3, 0.15, 0.05.
  const std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.15f),
                                     std::log(0.05f)};
  const auto run = [&](SamplingParams p) {
    Sampler s(p, 4);
    std::set<int32_t> seen;
    for (const auto& [t, n] : Histogram(s, logits, 5000)) seen.insert(t);
    return seen;
  };
  SamplingParams p = Seeded(5);
  EXPECT_EQ(run(p), (std::set<int32_t>{0, 1, 2, 3}));
  p.min_p = 0.2f;  // drops p < 0.1
  EXPECT_EQ(run(p), (std::set<int32_t>{0, 1, 2}));
  p.min_p = 0.7f;  // drops p < 0.35
  EXPECT_EQ(run(p), (std::set<int32_t>{0}));
  p = Seeded(5);
  p.top_k = 2;
  EXPECT_EQ(run(p), (std::set<int32_t>{0, 1}));
  p = Seeded(5);
  p.top_p = 0.7f;  // 0.5 < 0.7 <= 0.8
  EXPECT_EQ(run(p), (std::set<int32_t>{0, 1}));
  p.top_k = 3;
  p.min_p = 0.5f;  // threshold 0.25: keeps 0.3
  EXPECT_EQ(run(p), (std::set<int32_t>{0, 1}));
  p.min_p = 0.61f;  // 0.3 < 0.305: drops token 1
  EXPECT_EQ(run(p), (std::set<int32_t>{0}));
}

TEST(SamplerTest, TemperatureSharpensOrFlattens) {
  const std::vector<float> logits = {2.0f, 1.0f, 0.0f, -1.0f};
  const int n = 20000;
  double prev = 1.0;
  for (float t : {0.5f, 1.0f, 2.0f}) {
    SCOPED_TRACE(t);
    Sampler s(Seeded(77, t), 4);
    const auto h = Histogram(s, logits, n);
    const double freq = static_cast<double>(h.at(0)) / n;
    EXPECT_NEAR(freq, SoftmaxRef(logits, t)[0], 0.02);
    EXPECT_LT(freq, prev);  // the top token's share falls as t rises
    prev = freq;
  }
}

TEST(SamplerTest, PresencePenaltySubtractsOnceForGeneratedTokens) {
  const std::vector<float> logits = {2.0f, 1.5f, 0.0f};
  SamplingParams p;
  p.presence_penalty = 0.6f;  // 2.0 - 0.6 = 1.4 < 1.5
  EXPECT_EQ(Greedy(p, logits, {}, {0}), 1);
  EXPECT_EQ(Greedy(p, logits, {}, {0, 0, 0}), 1);
  EXPECT_EQ(Greedy(p, logits, {0}, {}), 0);  // the prompt does not count
  p.presence_penalty = 0.4f;                 // 1.6 > 1.5
  EXPECT_EQ(Greedy(p, logits, {}, {0, 0, 0}), 0);
  p.presence_penalty = -0.6f;  // negative encourages: 1.5 + 0.6 > 2.0
  EXPECT_EQ(Greedy(p, logits, {}, {1}), 1);
}

TEST(SamplerTest, FrequencyPenaltyScalesWithTheCount) {
  const std::vector<float> logits = {2.0f, 1.5f, 0.0f};
  SamplingParams p;
  p.frequency_penalty = 0.3f;
  EXPECT_EQ(Greedy(p, logits, {}, {0}), 0);     // 2.0 - 0.3 = 1.7
  EXPECT_EQ(Greedy(p, logits, {}, {0, 0}), 1);  // 2.0 - 0.6 = 1.4
  EXPECT_EQ(Greedy(p, logits, {0, 0, 0}, {}), 0);
}

TEST(SamplerTest, RepetitionPenaltyDividesPositiveAndMultipliesNegative) {
  SamplingParams p;
  p.repetition_penalty = 1.5f;  // 2 / 1.5 = 1.33 < 1.5
  EXPECT_EQ(Greedy(p, {2.0f, 1.5f}, {0}), 1);
  EXPECT_EQ(Greedy(p, {2.0f, 1.5f}, {}, {0}), 1);  // generated tokens count too
  p.repetition_penalty = 1.2f;                     // 1.67 > 1.5
  EXPECT_EQ(Greedy(p, {2.0f, 1.5f}, {0}), 0);
  p.repetition_penalty = 1.3f;  // -1.0 * 1.3 = -1.3 < -1.2
  EXPECT_EQ(Greedy(p, {-1.0f, -1.2f}, {0}), 1);
  p.repetition_penalty = 1.1f;  // -1.1 > -1.2
  EXPECT_EQ(Greedy(p, {-1.0f, -1.2f}, {0}), 0);
  // Once per distinct token, even if in the prompt and generated, repeatedly:
  // 2 / 1.3 = 1.54 > 1.5, while twice would give 1.18.
  p.repetition_penalty = 1.3f;
  EXPECT_EQ(Greedy(p, {2.0f, 1.5f}, {0, 0}, {0, 0}), 0);
  // Below 1 it rewards repetition.
  p.repetition_penalty = 0.5f;
  EXPECT_EQ(Greedy(p, {1.0f, 1.5f}, {0}), 0);
}

TEST(SamplerTest, SampleRecordsItsTokenAcceptRecordsOthers) {
  SamplingParams p;
  p.temperature = 0.0f;
  p.presence_penalty = 1.0f;
  const std::vector<float> logits = {2.0f, 1.5f, 1.2f};
  Sampler s(p, 3);
  EXPECT_EQ(s.Sample(logits.data()).token, 0);
  EXPECT_EQ(s.Sample(logits.data()).token, 1);  // 0 is now at 1.0
  EXPECT_EQ(s.num_generated(), 2);
  s.Accept(1);
  s.Accept(-5);  // ignored
  s.Accept(3);   // ignored
  EXPECT_EQ(s.num_generated(), 3);
  EXPECT_EQ(s.Sample(logits.data()).token, 2);
}

TEST(SamplerTest, LogitBiasForcesOrBansTokens) {
  const auto logits = RandomLogits(1000, 21);
  SamplingParams p = Seeded(3);
  p.logit_bias = {{7, 100.0f}};
  Sampler s(p, 1000);
  for (int i = 0; i < 50; ++i) EXPECT_EQ(s.Sample(logits.data()).token, 7);
  SamplingParams ban;
  const int32_t best = ArgmaxRef(logits);
  ban.logit_bias = {{best, -100.0f}};
  EXPECT_NE(Greedy(ban, logits), best);
}

TEST(SamplerTest, LogprobsComeFromTheRawDistribution) {
  const int vocab = 16;
  auto logits = RandomLogits(vocab, 4);
  logits[5] = -kInf;
  SamplingParams p = Seeded(8, 0.7f);
  p.logprobs = true;
  p.top_logprobs = vocab > 20 ? 20 : vocab;
  p.presence_penalty = 1.5f;  // must not change the reported logprobs
  p.logit_bias = {{3, 5.0f}};
  Sampler s(p, vocab);
  s.Accept(ArgmaxRef(logits));
  const auto ref = SoftmaxRef(logits);
  for (int i = 0; i < 5; ++i) {
    const SampleResult r = s.Sample(logits.data());
    EXPECT_NEAR(r.logprob, std::log(ref[r.token]), 1e-5);
    ASSERT_EQ(r.top.size(), static_cast<size_t>(vocab));
    double total = 0.0;
    for (size_t j = 0; j < r.top.size(); ++j) {
      total += std::exp(static_cast<double>(r.top[j].logprob));
      if (j > 0) {
        EXPECT_GE(r.top[j - 1].logprob, r.top[j].logprob);
      }
      if (r.top[j].id == 5) {
        EXPECT_EQ(r.top[j].logprob, -kInf);
      } else {
        EXPECT_NEAR(r.top[j].logprob, std::log(ref[r.top[j].id]), 1e-5);
      }
    }
    EXPECT_NEAR(total, 1.0, 1e-5);
    EXPECT_EQ(r.top[0].id, ArgmaxRef(logits));
  }
}

TEST(SamplerTest, TopLogprobsOnALargeVocab) {
  const int vocab = 150000;
  auto logits = RandomLogits(vocab, 6, 20.0);
  logits[100] = logits[200] = 50.0f;  // a tie at the top: lower id first
  SamplingParams p = Seeded(1, 0.0f);
  p.top_logprobs = 3;
  Sampler s(p, vocab);
  const SampleResult r = s.Sample(logits.data());
  EXPECT_EQ(r.token, 100);
  ASSERT_EQ(r.top.size(), 3u);
  EXPECT_EQ(r.top[0].id, 100);
  EXPECT_EQ(r.top[1].id, 200);
  EXPECT_EQ(r.top[0].logprob, r.top[1].logprob);
  const auto ref = SoftmaxRef(logits);
  EXPECT_NEAR(r.logprob, std::log(ref[100]), 1e-5);
  EXPECT_NEAR(r.top[2].logprob, std::log(ref[r.top[2].id]), 1e-4);
  // Without logprobs asked for, none are returned.
  Sampler plain(Seeded(1, 0.0f), vocab);
  const SampleResult q = plain.Sample(logits.data());
  EXPECT_EQ(q.logprob, 0.0f);
  EXPECT_TRUE(q.top.empty());
}

TEST(SamplerTest, NanLogitsAreNeverChosen) {
  std::vector<float> logits = {std::nanf(""), 1.0f, std::nanf(""), 0.5f};
  EXPECT_EQ(Greedy({}, logits), 1);
  SamplingParams p = Seeded(2);
  p.logprobs = true;
  Sampler s(p, 4);
  for (int i = 0; i < 100; ++i) {
    const SampleResult r = s.Sample(logits.data());
    EXPECT_TRUE(r.token == 1 || r.token == 3);
    EXPECT_FALSE(std::isnan(r.logprob));
  }
}

TEST(SamplerTest, NullLogitsGiveTokenZero) {
  Sampler s({}, 10);
  EXPECT_EQ(s.Sample(nullptr).token, 0);
  EXPECT_EQ(s.num_generated(), 0);
}

TEST(SamplerTest, ValidationNamesTheFieldAndRange) {
  const auto check = [](const SamplingParams& p, const std::string& field) {
    const Status st = ValidateSamplingParams(p, 100);
    EXPECT_EQ(st.code(), StatusCode::kInvalidArgument) << field;
    EXPECT_NE(st.message().find(field), std::string::npos) << st.message();
    EXPECT_FALSE(Sampler::Create(p, 100).has_value()) << field;
  };
  EXPECT_TRUE(ValidateSamplingParams({}, 100).ok());
  EXPECT_EQ(ValidateSamplingParams({}, 0).code(), StatusCode::kInvalidArgument);
  SamplingParams p;
  p.temperature = 2.5f;
  check(p, "temperature");
  p.temperature = -0.1f;
  check(p, "temperature");
  p.temperature = std::nanf("");
  check(p, "temperature");
  p = {};
  p.top_p = 0.0f;
  check(p, "top_p");
  p.top_p = 1.01f;
  check(p, "top_p");
  p = {};
  p.top_k = -2;
  check(p, "top_k");
  p = {};
  p.min_p = 1.5f;
  check(p, "min_p");
  p.min_p = -0.1f;
  check(p, "min_p");
  p = {};
  p.presence_penalty = 2.1f;
  check(p, "presence_penalty");
  p = {};
  p.frequency_penalty = -2.1f;
  check(p, "frequency_penalty");
  p = {};
  p.repetition_penalty = 0.0f;
  check(p, "repetition_penalty");
  p.repetition_penalty = kInf;
  check(p, "repetition_penalty");
  p = {};
  p.logit_bias = {{100, 1.0f}};
  check(p, "logit_bias");
  p.logit_bias = {{-1, 1.0f}};
  check(p, "logit_bias");
  p.logit_bias = {{5, 100.5f}};
  check(p, "logit_bias");
  p = {};
  p.top_logprobs = 21;
  check(p, "top_logprobs");
  p.top_logprobs = -1;
  check(p, "top_logprobs");

  // The edges themselves are fine.
  p = {};
  p.temperature = 2.0f;
  p.top_p = 1.0f;
  p.top_k = 0;
  p.min_p = 1.0f;
  p.presence_penalty = -2.0f;
  p.frequency_penalty = 2.0f;
  p.repetition_penalty = 2.0f;
  p.logit_bias = {{0, -100.0f}, {99, 100.0f}};
  p.top_logprobs = 20;
  EXPECT_TRUE(ValidateSamplingParams(p, 100).ok());
  const Status st = ValidateSamplingParams(
      [] {
        SamplingParams q;
        q.top_p = 0.0f;
        return q;
      }(),
      100);
  EXPECT_EQ(st.message(), "top_p must be in (0, 1], got 0");
}

TEST(SamplerTest, UnvalidatedParamsStillBehave) {
  SamplingParams p;
  p.temperature = std::nanf("");
  p.top_p = -3.0f;
  p.top_k = -7;
  p.logit_bias = {{1000, 5.0f}, {-1, 5.0f}, {1, std::nanf("")}};
  p.top_logprobs = 500;
  p.logprobs = true;
  Sampler s(p, 10);
  const auto logits = RandomLogits(10, 1);
  const SampleResult r = s.Sample(logits.data());
  EXPECT_EQ(r.token, ArgmaxRef(logits));  // NaN temperature became greedy
  EXPECT_EQ(r.top.size(), 10u);
}

}  // namespace
}  // namespace strata
