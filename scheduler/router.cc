#include "scheduler/router.h"

#include <algorithm>
#include <array>
#include <tuple>
#include <vector>

namespace strata::scheduler {

double CostModel::StepSeconds(std::span<const ForwardSeq> batch) const {
  if (batch.empty()) return 0;
  double prefill_tokens = 0, prefill_attn = 0, decode_seqs = 0, decode_ctx = 0;
  bool any_prefill = false, any_decode = false;
  for (const ForwardSeq& s : batch) {
    const double t = static_cast<double>(s.tokens.size());
    if (s.tokens.size() <= 1) {
      any_decode = true;
      decode_seqs += 1;
      decode_ctx += static_cast<double>(s.start_pos) + 1;
    } else {
      any_prefill = true;
      prefill_tokens += t;
      prefill_attn += t * (static_cast<double>(s.start_pos) + t / 2);
    }
  }
  double fixed = 0, sec = 0;
  if (any_prefill) {
    fixed = std::max(fixed, a);
    sec += b * prefill_tokens + c * prefill_attn;
  }
  if (any_decode) {
    fixed = std::max(fixed, d);
    sec += e * decode_seqs + f * decode_ctx;
  }
  return fixed + sec;
}

namespace {

struct PolicyName {
  RoutingPolicy policy;
  std::string_view name;
};
constexpr std::array<PolicyName, 4> kPolicies = {{
    {RoutingPolicy::kRoundRobin, "round-robin"},
    {RoutingPolicy::kLongestPrefix, "longest-prefix"},
    {RoutingPolicy::kLeastLoaded, "least-loaded"},
    {RoutingPolicy::kTtft, "ttft"},
}};

}  // namespace

std::string_view RoutingPolicyName(RoutingPolicy p) {
  for (const auto& e : kPolicies)
    if (e.policy == p) return e.name;
  return "?";
}

std::optional<RoutingPolicy> RoutingPolicyFromName(std::string_view name) {
  for (const auto& e : kPolicies)
    if (e.name == name) return e.policy;
  return std::nullopt;
}

std::string RoutingPolicyNames() {
  std::string s;
  for (const auto& e : kPolicies) s += (s.empty() ? "" : ", ") + std::string(e.name);
  return s;
}

double CostModel::PrefillTokensPerS(int chunk) const {
  const double t = chunk;
  const double secs = a + b * t + c * t * t / 2;
  return b > 0 || c > 0 ? t / secs : 0.0;
}

double CostModel::DecodeStepSeconds(int batch, int context) const {
  if (d <= 0 && e <= 0 && f <= 0) return 0;
  return d + e * batch + f * batch * (context + 1.0);
}

CalibratedRates RatesFromCostModel(const CostModel& m) {
  return {m.PrefillTokensPerS(512), m.DecodeStepSeconds(1, 512)};
}

double PredictTtftSeconds(const RouteCandidate& c, double fallback_rate) {
  const double rate = c.prefill_tokens_per_s > 0 ? c.prefill_tokens_per_s : fallback_rate;
  if (rate <= 0) return -1;
  const double queue = std::max(0.0, static_cast<double>(c.queue_tokens) / rate - c.queue_done_seconds);
  return (queue + static_cast<double>(c.uncached_tokens) / rate) * c.ttft_scale + c.load_seconds;
}

double MeanKnownPrefillRate(std::span<const RouteCandidate> candidates) {
  double sum = 0;
  int known = 0;
  for (const RouteCandidate& c : candidates) {
    if (c.prefill_tokens_per_s <= 0) continue;
    sum += c.prefill_tokens_per_s;
    ++known;
  }
  return known > 0 ? sum / known : 0.0;
}

size_t Router::Pick(std::span<const RouteCandidate> candidates) {
  const size_t n = candidates.size();
  size_t target = turn_ % n;
  ++turn_;
  if (n == 1 || policy_ == RoutingPolicy::kRoundRobin) return target;
  const size_t first = target;
  // A score per candidate, lower wins; ties: fewer unfinished, then turn order.
  std::vector<double> score(n, 0);
  if (policy_ == RoutingPolicy::kLongestPrefix) {
    for (size_t j = 0; j < n; ++j) score[j] = -static_cast<double>(candidates[j].cached_tokens);
  } else if (policy_ == RoutingPolicy::kTtft) {
    const double mean = MeanKnownPrefillRate(candidates);
    for (size_t j = 0; j < n; ++j)
      score[j] = mean > 0 ? PredictTtftSeconds(candidates[j], mean) : static_cast<double>(candidates[j].unfinished);
  } else {  // least-loaded
    for (size_t j = 0; j < n; ++j) score[j] = static_cast<double>(candidates[j].unfinished);
  }
  for (size_t k = 1; k < n; ++k) {
    const size_t j = (first + k) % n;
    const RouteCandidate& c = candidates[j];
    const RouteCandidate& t = candidates[target];
    if (score[j] < score[target] || (score[j] == score[target] && c.unfinished < t.unfinished)) target = j;
  }
  return target;
}

size_t Router::PickDecode(std::span<const RouteCandidate> candidates, int64_t need_kv_tokens) {
  if (policy_ != RoutingPolicy::kTtft) return Pick(candidates);
  const size_t n = candidates.size();
  size_t target = turn_ % n;
  ++turn_;
  const size_t first = target;
  double sum = 0;
  int known = 0;
  for (const RouteCandidate& c : candidates) {
    if (c.tpot_seconds > 0) {
      sum += c.tpot_seconds;
      ++known;
    }
  }
  // Lexicographic score, lower wins: no room, predicted TPOT, -cached, unfinished.
  auto key = [&](const RouteCandidate& c) {
    const bool no_room = c.free_kv_tokens >= 0 && c.free_kv_tokens < need_kv_tokens;
    const double tpot = known == 0 ? 0.0 : (c.tpot_seconds > 0 ? c.tpot_seconds : sum / known);
    return std::tuple(no_room, tpot, -static_cast<int64_t>(c.cached_tokens), c.unfinished);
  };
  for (size_t k = 1; k < n; ++k) {
    const size_t j = (first + k) % n;
    if (key(candidates[j]) < key(candidates[target])) target = j;
  }
  return target;
}

}  // namespace strata::scheduler
