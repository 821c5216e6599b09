// TierMover::WriteDown: at a graceful stop, the blocks the device pool and
// the tiers above the last disk tier hold go into that disk (tier_mover.h).

#include <algorithm>
#include <chrono>
#include <thread>
#include <unordered_set>

#include "common/logging.h"
#include "kvcache/tier_mover.h"

namespace strata::kvcache {

namespace {

int64_t SteadyNanos() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

// At most this many write-down writes in flight (a disk store's usual queue
// depth).
constexpr size_t kWriteDownWindow = 32;

}  // namespace

void TierMover::WaitOps(size_t max_ops, int64_t deadline) {
  while (ops_.size() > max_ops && SteadyNanos() < deadline) {
    if (Poll() == 0) std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

std::vector<TierMover::DownCandidate> TierMover::RankForWriteDown(size_t target, WriteDownResult* r) const {
  const BlockStore& disk = *lowers_[target].store;
  // The disk's slots are blocks rounded up to 4096 bytes (O_DIRECT).
  const uint64_t slot_bytes = (options_.block_bytes + 4095) / 4096 * 4096;
  const uint64_t slots = slot_bytes == 0 ? 0 : disk.stats().capacity_bytes / slot_bytes;
  std::vector<DownCandidate> ranked;  // the most valuable first
  std::unordered_set<BlockHash, BlockHashHasher> seen;
  auto add = [&](const DownCandidate& c) {
    if (r->kept >= slots || !seen.insert(c.hash).second) return;
    ++r->kept;
    ranked.push_back(c);
    if (disk.Contains(c.hash) || writes_in_flight_[target].contains(c.hash)) {
      ranked.back().held = true;
      ++r->already;
    }
  };
  // The device: blocks still in use (referenced), then the cached ones from
  // the last the policy would evict.
  for (const BlockHash& h : pool_->Hashes()) {
    const std::optional<BlockId> b = pool_->Lookup(h);
    if (b && pool_->ref(*b) > 0) add({-1, *b, h});
  }
  const std::vector<BlockId> order = pool_->EvictionOrder();
  for (auto it = order.rbegin(); it != order.rend(); ++it) add({-1, *it, pool_->hash(*it)});
  // The tiers between, the nearest first (in an exclusive chain a block
  // moves down as it cools).
  for (size_t t = 0; t < target; ++t) {
    const std::vector<BlockHash> held = lowers_[t].store->HeldInEvictionOrder();
    for (auto it = held.rbegin(); it != held.rend(); ++it) add({static_cast<int>(t), BlockId(), *it});
  }
  return ranked;  // the most valuable first
}

bool TierMover::SubmitWriteDown(size_t target, const DownCandidate& c) {
  if (c.source < 0) {  // its failures are counted in the tier's stats
    int32_t staging = -1;
    SubmitWrite(static_cast<int>(target), c.block, c.hash, &staging);
    staging_->PutBack(staging);
    return true;
  }
  BlockStore* source = lowers_[static_cast<size_t>(c.source)].store;
  const std::optional<BlockStore::BlockLocation> loc = source->Locate(c.hash);
  if (!loc || !source->Pin(c.hash)) return false;  // gone, or bytes a caller cannot address
  const uint64_t tag = next_tag_++;
  Op op{OpKind::kWrite, static_cast<int>(target), BlockId(), c.hash, clock_->NowNanos()};
  op.holds_block = false;
  op.unpin_tier = c.source;
  ops_.emplace(tag, op);
  writes_in_flight_[target].insert(c.hash);
  ++stats_.tiers[target].writes;
  Status s = lowers_[target].store->SubmitWrite(c.hash, options_.ns, loc->region, tag);
  if (!s.ok()) {
    ops_.erase(tag);
    writes_in_flight_[target].erase(c.hash);
    source->Unpin(c.hash);
    ++stats_.writes_failed;
    ++stats_.tiers[target].writes_failed;
    STRATA_LOG_WARN("kv manager: write-down to {} not submitted: {}", lowers_[target].name, s.ToString());
  }
  return true;
}

WriteDownResult TierMover::WriteDown(double max_seconds) {
  WriteDownResult r;
  const int64_t start = SteadyNanos();
  const int64_t deadline = start + static_cast<int64_t>(std::max(0.0, max_seconds) * 1e9);
  int target = -1;
  for (size_t t = 0; t < lowers_.size(); ++t)
    if (lowers_[t].store->kind() == TierKind::kDisk) target = static_cast<int>(t);
  if (target < 0 || draining_ || max_seconds <= 0) return r;
  r.tier = target;
  const size_t tt = static_cast<size_t>(target);
  // What waits or is in flight lands first (deferred write-backs, loads).
  for (size_t t = 0; t < lowers_.size() && !deferred_.empty(); ++t) FlushDeferred(t, deferred_.size());
  WaitOps(0, deadline);
  if (hierarchy_ != nullptr && tt + 1 == hierarchy_->num_tiers()) hierarchy_->KeepCopies();

  const LowerTierStats before = stats_.tiers[tt];
  const std::vector<DownCandidate> ranked = RankForWriteDown(tt, &r);
  uint64_t skipped = 0;  // gone from their tier, or not pinnable there
  for (size_t i = 0; i < ranked.size(); ++i) {
    if (ranked[i].held) continue;
    WaitOps(kWriteDownWindow - 1, deadline);
    // A device block in memory a store cannot address takes a staging
    // buffer until its write lands.
    while (ranked[i].source < 0 && stages_device() && staging_->none_free() && SteadyNanos() < deadline) {
      if (Poll() == 0) std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    if (SteadyNanos() >= deadline) {
      for (size_t k = i; k < ranked.size(); ++k) r.not_submitted += !ranked[k].held;
      break;
    }
    if (!SubmitWriteDown(tt, ranked[i])) ++skipped;
  }
  WaitOps(0, deadline);
  // A restart evicts by the disk's persisted recency: the least valuable
  // kept block becomes the least recent.
  for (auto it = ranked.rbegin(); it != ranked.rend(); ++it) lowers_[tt].store->Refresh(it->hash);
  Poll();  // persists them
  const LowerTierStats& after = stats_.tiers[tt];
  r.written = (after.bytes_down - before.bytes_down) / std::max<uint64_t>(1, options_.block_bytes);
  r.refused = after.writes_refused - before.writes_refused;
  r.failed = after.writes_failed - before.writes_failed + skipped;
  r.seconds = static_cast<double>(SteadyNanos() - start) * 1e-9;
  return r;
}

}  // namespace strata::kvcache
