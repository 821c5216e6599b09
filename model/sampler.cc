#include "model/sampler.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <string>
#include <string_view>

#include "model/backend/cpu/kernels.h"

namespace strata {
namespace {

constexpr float kGreedyBelow = 1e-5f;
constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr int kMaxTopLogprobs = 20;
constexpr float kMaxBias = 100.0f;

// Per-thread scratch shared by every Sampler on the thread: a vocab-sized
// buffer per Sampler would cost ~1 MB per running sequence at 150k vocab.
struct Scratch {
  std::vector<float> logits;
  std::vector<float> probs;
  std::vector<int32_t> ids;
  std::vector<int32_t> tail;
  std::vector<uint16_t> bucket_of;  // per token
  std::vector<uint32_t> bucket_count;
  std::vector<double> bucket_mass;
};

Scratch& ThreadScratch() {
  thread_local Scratch scratch;
  return scratch;
}

std::string Num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}

Status OutOfRange(std::string_view field, std::string_view range, double got) {
  return Status::InvalidArgument(std::string(field) + " must be " + std::string(range) + ", got " +
                                 Num(got));
}

// NaN-safe: a NaN is never "in".
bool InClosed(float v, float lo, float hi) { return v >= lo && v <= hi; }

// Uniform in [0, 1) from the top 53 bits: identical on every platform, unlike
// std::uniform_real_distribution.
double UniformDouble(std::mt19937_64& rng) { return static_cast<double>(rng() >> 11) * 0x1p-53; }

uint64_t RandomSeed() {
  try {
    std::random_device rd;
    return (static_cast<uint64_t>(rd()) << 32) ^ rd();
  } catch (...) {
    // No entropy source: the clock is good enough to make runs differ.
    return static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
  }
}

// Lowest id among the largest values. NaN-free input. Two passes (max, then
// its first position) because a running (value, index) pair is one long
// dependency chain; the max pass uses independent lanes the compiler can
// vectorize.
int32_t Argmax(const float* x, int n) {
  constexpr int kLanes = 16;
  float lane[kLanes];
  for (float& l : lane) l = x[0];
  int i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) lane[j] = x[i + j] > lane[j] ? x[i + j] : lane[j];
  }
  float m = x[0];
  for (float l : lane) m = l > m ? l : m;
  for (; i < n; ++i) m = x[i] > m ? x[i] : m;
  int32_t best = 0;
  while (x[best] != m) ++best;  // m is one of the values, so this stops
  return best;
}

// Sum of the p[i] >= threshold, in double with independent accumulators.
double SumAtLeast(const float* p, int n, float threshold) {
  double acc[4] = {0.0, 0.0, 0.0, 0.0};
  int i = 0;
  for (; i + 4 <= n; i += 4) {
    for (int j = 0; j < 4; ++j) acc[j] += p[i + j] >= threshold ? p[i + j] : 0.0f;
  }
  for (; i < n; ++i) acc[0] += p[i] >= threshold ? p[i] : 0.0f;
  return (acc[0] + acc[1]) + (acc[2] + acc[3]);
}

// Tokens grouped by how far their (scaled) logit lies below the max: bucket 0
// holds the most likely. Bucket order is logit order, so "the k most likely"
// or "the most likely up to mass p" takes one histogram pass, one collect
// pass and a sort of only the bucket where the cut falls, not of the vocab.
constexpr int kBuckets = 4096;
constexpr float kBucketSpan = 40.0f;  // nats below the max; the rest share the last bucket

int BucketOf(float logit, float max) {
  const float d = (max - logit) * (static_cast<float>(kBuckets) / kBucketSpan);
  return d < static_cast<float>(kBuckets - 1) ? static_cast<int>(d) : kBuckets - 1;
}

// Orders ids by value, largest first, ties by lower id (a strict weak order
// because values are NaN-free).
struct ByValueDesc {
  const float* v;
  bool operator()(int32_t a, int32_t b) const { return v[a] > v[b] || (v[a] == v[b] && a < b); }
};

// The n largest of x (ties: lower id first), largest first.
void TopN(const float* x, int vocab, int n, std::vector<TokenLogprob>& out) {
  out.clear();
  n = std::min(n, vocab);
  if (n <= 0) return;
  out.reserve(n);
  for (int32_t i = 0; i < vocab; ++i) {
    if (static_cast<int>(out.size()) == n && !(x[i] > out.back().logprob)) continue;
    if (static_cast<int>(out.size()) == n) out.pop_back();
    // Insert after every entry >= x[i], so equal values stay in id order.
    auto pos = std::find_if(out.begin(), out.end(),
                            [&](const TokenLogprob& t) { return t.logprob < x[i]; });
    out.insert(pos, TokenLogprob{i, x[i]});
  }
}

// Draws one of ids[0, count) in proportion to probs[id]. count >= 1.
int32_t DrawFrom(const int32_t* ids, size_t count, const float* probs, double u) {
  double total = 0.0;
  for (size_t j = 0; j < count; ++j) total += probs[ids[j]];
  const double target = u * total;
  double cum = 0.0;
  int32_t last_live = ids[0];
  for (size_t j = 0; j < count; ++j) {
    const float p = probs[ids[j]];
    if (p <= 0.0f) continue;
    cum += p;
    last_live = ids[j];
    if (cum > target) return ids[j];
  }
  return last_live;  // rounding left target just above the final sum
}

}  // namespace

Status ValidateSamplingParams(const SamplingParams& p, int vocab_size) {
  if (vocab_size <= 0) return OutOfRange("vocab_size", "> 0", vocab_size);
  if (!InClosed(p.temperature, 0.0f, 2.0f))
    return OutOfRange("temperature", "in [0, 2]", p.temperature);
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) return OutOfRange("top_p", "in (0, 1]", p.top_p);
  if (p.top_k < -1) return OutOfRange("top_k", "-1 or 0 (off) or >= 1", p.top_k);
  if (!InClosed(p.min_p, 0.0f, 1.0f)) return OutOfRange("min_p", "in [0, 1]", p.min_p);
  if (!InClosed(p.presence_penalty, -2.0f, 2.0f)) {
    return OutOfRange("presence_penalty", "in [-2, 2]", p.presence_penalty);
  }
  if (!InClosed(p.frequency_penalty, -2.0f, 2.0f)) {
    return OutOfRange("frequency_penalty", "in [-2, 2]", p.frequency_penalty);
  }
  if (!(p.repetition_penalty > 0.0f && std::isfinite(p.repetition_penalty))) {
    return OutOfRange("repetition_penalty", "> 0 and finite", p.repetition_penalty);
  }
  for (const auto& [id, bias] : p.logit_bias) {
    if (id < 0 || id >= vocab_size) {
      return OutOfRange("logit_bias token id", "in [0, " + std::to_string(vocab_size) + ")", id);
    }
    if (!InClosed(bias, -kMaxBias, kMaxBias)) {
      return OutOfRange("logit_bias value for token " + std::to_string(id), "in [-100, 100]", bias);
    }
  }
  if (p.top_logprobs < 0 || p.top_logprobs > kMaxTopLogprobs) {
    return OutOfRange("top_logprobs", "in [0, 20]", p.top_logprobs);
  }
  return Status::Ok();
}

Result<Sampler> Sampler::Create(SamplingParams params, int vocab_size) {
  STRATA_RETURN_IF_ERROR(ValidateSamplingParams(params, vocab_size));
  return Sampler(std::move(params), vocab_size);
}

Sampler::Sampler(SamplingParams params, int vocab_size)
    : params_(std::move(params)), vocab_size_(std::max(vocab_size, 0)) {
  // Clamp so that a caller that skipped validation still gets defined
  // behaviour (NaN compares false, so each check also catches it).
  SamplingParams& p = params_;
  if (!InClosed(p.temperature, 0.0f, 2.0f)) p.temperature = p.temperature > 2.0f ? 2.0f : 0.0f;
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f)) p.top_p = 1.0f;
  if (p.top_k < 0) p.top_k = 0;
  if (!InClosed(p.min_p, 0.0f, 1.0f)) p.min_p = p.min_p > 1.0f ? 1.0f : 0.0f;
  if (!InClosed(p.presence_penalty, -2.0f, 2.0f)) p.presence_penalty = 0.0f;
  if (!InClosed(p.frequency_penalty, -2.0f, 2.0f)) p.frequency_penalty = 0.0f;
  if (!(p.repetition_penalty > 0.0f && std::isfinite(p.repetition_penalty))) {
    p.repetition_penalty = 1.0f;
  }
  std::erase_if(p.logit_bias, [&](const std::pair<int32_t, float>& b) {
    return b.first < 0 || b.first >= vocab_size_ || !InClosed(b.second, -kMaxBias, kMaxBias);
  });
  p.top_logprobs = std::clamp(p.top_logprobs, 0, kMaxTopLogprobs);
  seed_ = p.seed.has_value() ? *p.seed : RandomSeed();
  rng_.seed(seed_);
}

Sampler::Sampler(SamplingParams params, int vocab_size, const SamplerState& state)
    : Sampler(std::move(params), vocab_size) {
  seed_ = state.seed;
  rng_.seed(seed_);
  rng_.discard(state.draws);
  draws_ = state.draws;
  for (const auto& [id, count] : state.generated_counts)
    if (id >= 0 && id < vocab_size_ && count > 0) generated_counts_[id] += count;
  num_generated_ = state.num_generated;
}

SamplerState Sampler::State() const {
  SamplerState s;
  s.seed = seed_;
  s.draws = draws_;
  s.num_generated = num_generated_;
  s.generated_counts.assign(generated_counts_.begin(), generated_counts_.end());
  std::sort(s.generated_counts.begin(), s.generated_counts.end());
  return s;
}

void Sampler::AcceptPrompt(std::span<const int32_t> prompt) {
  if (params_.repetition_penalty == 1.0f) return;
  for (int32_t id : prompt) {
    if (id >= 0 && id < vocab_size_) prompt_tokens_.insert(id);
  }
}

void Sampler::Accept(int32_t token) {
  if (token < 0 || token >= vocab_size_) return;
  ++generated_counts_[token];
  ++num_generated_;
}

void Sampler::ApplyPenalties(float* logits) const {
  const float r = params_.repetition_penalty;
  if (r != 1.0f) {
    const auto penalize = [&](int32_t id) {
      float& x = logits[id];
      x = x > 0.0f ? x / r : x * r;
    };
    for (int32_t id : prompt_tokens_) penalize(id);
    for (const auto& [id, count] : generated_counts_) {
      if (!prompt_tokens_.contains(id)) penalize(id);
    }
  }
  const float f = params_.frequency_penalty;
  const float pres = params_.presence_penalty;
  if (f != 0.0f || pres != 0.0f) {
    for (const auto& [id, count] : generated_counts_) {
      logits[id] -= f * static_cast<float>(count);
      logits[id] -= pres;
    }
  }
}

int32_t Sampler::Draw(float* logits) {
  const int vocab = vocab_size_;
  const float t = params_.temperature;
  if (t != 1.0f) {
    for (int i = 0; i < vocab; ++i) logits[i] /= t;
  }
  const int32_t best = Argmax(logits, vocab);
  const float max = logits[best];
  // +inf (a huge logit over a small temperature) or all -inf: nothing to
  // weigh, take the argmax.
  if (!std::isfinite(max)) return best;

  Scratch& s = ThreadScratch();
  s.probs.assign(logits, logits + vocab);
  cpu::Softmax(s.probs.data(), vocab);
  const float* probs = s.probs.data();
  const double u = UniformDouble(rng_);
  ++draws_;
  const float min_p_threshold = params_.min_p * probs[best];

  const bool top_k = params_.top_k > 0 && params_.top_k < vocab;
  const bool top_p = params_.top_p < 1.0f;
  if (!top_k && !top_p) {
    // No ordering needed: draw in id order among what min-p keeps.
    const double target = u * SumAtLeast(probs, vocab, min_p_threshold);
    double cum = 0.0;
    int32_t last_live = best;
    for (int32_t i = 0; i < vocab; ++i) {
      if (probs[i] < min_p_threshold || probs[i] <= 0.0f) continue;
      cum += probs[i];
      last_live = i;
      if (cum > target) return i;
    }
    return last_live;
  }

  // Find the bucket where the top-k (or, without top-k, the top-p) cut falls.
  s.bucket_count.assign(kBuckets, 0);
  s.bucket_mass.assign(kBuckets, 0.0);
  s.bucket_of.resize(vocab);
  uint16_t* bucket_of = s.bucket_of.data();
  for (int i = 0; i < vocab; ++i) bucket_of[i] = static_cast<uint16_t>(BucketOf(logits[i], max));
  for (int i = 0; i < vocab; ++i) {
    ++s.bucket_count[bucket_of[i]];
    s.bucket_mass[bucket_of[i]] += probs[i];
  }
  int cut = 0;
  size_t count_above = 0;
  double mass_above = 0.0;
  double want = 0.0;
  if (top_k) {
    const size_t k = static_cast<size_t>(params_.top_k);
    for (; cut < kBuckets - 1 && count_above + s.bucket_count[cut] < k; ++cut) {
      count_above += s.bucket_count[cut];
    }
  } else {
    double total = 0.0;
    for (double m : s.bucket_mass) total += m;
    want = static_cast<double>(params_.top_p) * total;
    for (; cut < kBuckets - 1 && mass_above + s.bucket_mass[cut] < want; ++cut) {
      mass_above += s.bucket_mass[cut];
    }
  }
  // Everything above the cut bucket is in; only the cut bucket is sorted.
  std::vector<int32_t>& ids = s.ids;
  std::vector<int32_t>& tail = s.tail;
  ids.clear();
  tail.clear();
  for (int32_t i = 0; i < vocab; ++i) {
    const int b = bucket_of[i];
    if (b < cut) {
      ids.push_back(i);
    } else if (b == cut) {
      tail.push_back(i);
    }
  }
  const ByValueDesc order{logits};
  std::sort(tail.begin(), tail.end(), order);

  if (top_k) {
    const size_t need = static_cast<size_t>(params_.top_k) - count_above;
    ids.insert(ids.end(), tail.begin(), tail.begin() + std::min(need, tail.size()));
    std::sort(ids.begin(), ids.end(), order);
    if (top_p) {
      double mass = 0.0;
      for (int32_t id : ids) mass += probs[id];
      want = static_cast<double>(params_.top_p) * mass;
      double cum = 0.0;
      size_t j = 0;
      while (j < ids.size()) {
        cum += probs[ids[j++]];
        if (cum >= want) break;
      }
      ids.resize(j);
    }
  } else {
    double cum = mass_above;
    size_t j = 0;
    while (j < tail.size()) {
      cum += probs[tail[j++]];
      if (cum >= want) break;
    }
    ids.insert(ids.end(), tail.begin(), tail.begin() + j);
  }
  if (params_.min_p > 0.0f) {
    std::erase_if(ids, [&](int32_t id) { return probs[id] < min_p_threshold; });
  }
  // The argmax is always kept (bucket 0, first in order, p >= any threshold).
  if (ids.empty()) return best;
  return DrawFrom(ids.data(), ids.size(), probs, u);
}

SampleResult Sampler::Sample(const float* logits) {
  SampleResult result;
  if (logits == nullptr || vocab_size_ <= 0) return result;
  const int vocab = vocab_size_;
  Scratch& s = ThreadScratch();
  s.logits.resize(vocab);
  float* w = s.logits.data();
  for (int i = 0; i < vocab; ++i) {
    const float x = logits[i];
    w[i] = x == x ? x : -kInf;  // NaN → -inf (written so that it vectorizes)
  }

  // 1. Logprobs of the raw distribution: logprob_i = x_i - lse, with
  // lse = max + log(sum exp(x - max)) = max - log(p_max), p_max from the
  // vectorized softmax (p_max >= 1/vocab, so the log is well conditioned).
  const bool want_logprobs = params_.logprobs || params_.top_logprobs > 0;
  float raw_max = -kInf;
  double lse = -kInf;
  if (want_logprobs) {
    const int32_t best = Argmax(w, vocab);
    raw_max = w[best];
    if (std::isfinite(raw_max)) {
      s.probs.assign(w, w + vocab);
      cpu::Softmax(s.probs.data(), vocab);
      lse = static_cast<double>(raw_max) - std::log(static_cast<double>(s.probs[best]));
    }
    TopN(w, vocab, params_.top_logprobs, result.top);
  }
  const auto logprob_of = [&](float raw) {
    // Degenerate max (+inf or all -inf): all mass on the tokens at the max.
    if (!std::isfinite(raw_max)) return raw == raw_max ? 0.0f : -kInf;
    return static_cast<float>(raw - lse);
  };
  for (TokenLogprob& t : result.top) t.logprob = logprob_of(t.logprob);

  // 2-3. Bias and penalties.
  for (const auto& [id, bias] : params_.logit_bias) w[id] += bias;
  ApplyPenalties(w);

  // 4-5. Choose.
  result.token = params_.temperature < kGreedyBelow ? Argmax(w, vocab) : Draw(w);
  if (want_logprobs) {
    const float raw = logits[result.token];
    result.logprob = logprob_of(std::isnan(raw) ? -kInf : raw);
  }
  Accept(result.token);
  return result;
}

}  // namespace strata
