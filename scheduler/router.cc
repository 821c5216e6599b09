#include "scheduler/router.h"

#include <algorithm>
#include <array>

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
constexpr std::array<PolicyName, 2> kPolicies = {{
    {RoutingPolicy::kRoundRobin, "round-robin"},
    {RoutingPolicy::kLongestPrefix, "longest-prefix"},
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

size_t Router::Pick(std::span<const RouteCandidate> candidates) {
  const size_t n = candidates.size();
  size_t target = turn_ % n;
  if (policy_ == RoutingPolicy::kLongestPrefix && n > 1) {
    int32_t best = -1;
    for (size_t k = 0; k < n; ++k) {
      const size_t j = (turn_ + k) % n;
      const RouteCandidate& c = candidates[j];
      if (c.cached_tokens > best || (c.cached_tokens == best && c.unfinished < candidates[target].unfinished)) {
        best = c.cached_tokens;
        target = j;
      }
    }
  }
  ++turn_;
  return target;
}

}  // namespace strata::scheduler
