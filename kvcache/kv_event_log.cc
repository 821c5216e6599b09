#include "kvcache/kv_event_log.h"

namespace strata::kvcache {

KvEventLog::KvEventLog(std::string instance, std::string incarnation, uint64_t epoch, size_t keep_batches)
    : instance_(std::move(instance)), incarnation_(std::move(incarnation)), epoch_(epoch),
      keep_(keep_batches == 0 ? 1 : keep_batches) {}

void KvEventLog::Record(const BlockHash& hash, TierKind tier, bool stored) {
  std::lock_guard lock(mu_);
  auto [it, fresh] = step_.try_emplace(hash);
  if (fresh) {
    it->second.fill(0);
    step_order_.push_back(hash);
  }
  // The last word of the step wins; Flush compares it with the state.
  it->second[static_cast<size_t>(tier)] = stored ? 1 : -1;
}

void KvEventLog::Stored(const BlockHash& hash, TierKind tier) { Record(hash, tier, true); }
void KvEventLog::Removed(const BlockHash& hash, TierKind tier) { Record(hash, tier, false); }

std::optional<KvEventBatch> KvEventLog::Flush() {
  std::lock_guard lock(mu_);
  KvEventBatch b{instance_, incarnation_, epoch_, next_seq_, {}};
  for (const BlockHash& h : step_order_) {
    const auto& change = step_.at(h);
    auto st = state_.find(h);
    TierMask mask = st == state_.end() ? 0 : st->second;
    TierMask before = mask;
    for (size_t t = 0; t < kNumTierKinds; ++t) {
      TierMask bit = MaskOf(static_cast<TierKind>(t));
      if (change[t] > 0 && !(mask & bit)) {
        b.events.push_back({KvEvent::Kind::kStored, h, static_cast<TierKind>(t)});
        mask |= bit;
      } else if (change[t] < 0 && (mask & bit)) {
        b.events.push_back({KvEvent::Kind::kRemoved, h, static_cast<TierKind>(t)});
        mask &= static_cast<TierMask>(~bit);
      }
    }
    if (mask != before) {
      if (mask == 0) {
        state_.erase(h);
      } else {
        state_[h] = mask;
      }
    }
  }
  step_.clear();
  step_order_.clear();
  if (b.events.empty()) return std::nullopt;
  next_seq_ += b.events.size();
  recent_.push_back(b);
  while (recent_.size() > keep_) recent_.pop_front();
  return b;
}

std::optional<std::vector<KvEventBatch>> KvEventLog::Since(uint64_t seq) const {
  std::lock_guard lock(mu_);
  std::vector<KvEventBatch> out;
  if (seq + 1 >= next_seq_) return out;  // up to date
  if (recent_.empty() || recent_.front().seq_first > seq + 1) return std::nullopt;
  for (const auto& b : recent_) {
    if (b.seq_first + b.events.size() - 1 > seq) out.push_back(b);
  }
  return out;
}

KvSnapshot KvEventLog::Snapshot() const {
  std::lock_guard lock(mu_);
  KvSnapshot s{instance_, incarnation_, epoch_, next_seq_ - 1, {}};
  for (const auto& [h, mask] : state_) {
    for (size_t t = 0; t < kNumTierKinds; ++t) {
      if (mask & MaskOf(static_cast<TierKind>(t))) s.blocks.push_back({h, static_cast<TierKind>(t)});
    }
  }
  return s;
}

uint64_t KvEventLog::last_seq() const {
  std::lock_guard lock(mu_);
  return next_seq_ - 1;
}

}  // namespace strata::kvcache
