#include "server/usage.h"

#include <algorithm>

namespace strata::server {

void UsageTally::Add(int choice, const scheduler::RequestOutput& ev) {
  if (choice < 0 || static_cast<size_t>(choice) >= completion_.size()) return;
  completion_[static_cast<size_t>(choice)] = ev.completion_tokens;
  if (!ev.prefill_instance.empty() && (prefill_instance_.empty() || choice == 0)) prefill_instance_ = ev.prefill_instance;
  for (const std::string& d : ev.decode_instances) {
    if (std::find(decode_instances_.begin(), decode_instances_.end(), d) == decode_instances_.end())
      decode_instances_.push_back(d);
  }
  if (choice != 0) return;
  prompt_ = ev.prompt_tokens;
  cached_ = ev.cached_tokens;
  by_tier_ = ev.cached_tokens_by_tier;
  if (ttft_ms_ < 0 && ev.timings.first_token > 0)
    ttft_ms_ = static_cast<double>(ev.timings.first_token - ev.timings.arrival) / 1e6;
}

int64_t UsageTally::completion_tokens() const {
  int64_t sum = 0;
  for (int32_t c : completion_) sum += c;
  return sum;
}

Usage UsageTally::Make(std::span<const kvcache::TierKind> tier_kinds) const {
  Usage u;
  u.prompt_tokens = prompt_;
  u.completion_tokens = completion_tokens();
  u.cached_tokens = cached_;
  AddCachedByTier(by_tier_, tier_kinds, &u);
  u.prefill_instance = prefill_instance_;
  u.decode_instances = decode_instances_;
  return u;
}

}  // namespace strata::server
