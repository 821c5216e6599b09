#pragma once
// The publishing side of the cluster KV index (kvcache/cluster_index.h): an
// instance records `stored` / `removed` events for its blocks as they
// happen, closes them into one numbered batch per engine step, keeps the
// recent batches for subscribers that fell behind, and answers snapshots
// (its whole state, consistent with a sequence number) for the rest.
//
// Events of one step are coalesced: a block stored and removed in the same
// step in the same tier yields nothing, so a batch carries the step's net
// change.
//
// Thread-safety: every method may be called from any thread (one mutex);
// the engine thread records and flushes, subscribers' threads read.

#include <cstdint>
#include <deque>
#include <mutex>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "kvcache/cluster_index.h"

namespace strata::kvcache {

class KvEventLog {
 public:
  // `keep_batches`: how many recent batches Since() can still answer from.
  KvEventLog(std::string instance, std::string incarnation, uint64_t epoch, size_t keep_batches = 1024);

  void Stored(const BlockHash& hash, TierKind tier);
  void Removed(const BlockHash& hash, TierKind tier);
  // The step's net events as the next batch (nullopt when nothing changed).
  std::optional<KvEventBatch> Flush();

  // The kept batches after sequence `seq` (possibly none); nullopt when some
  // of them are no longer kept (then the subscriber needs Snapshot()).
  std::optional<std::vector<KvEventBatch>> Since(uint64_t seq) const;
  // The state as of the last flushed batch.
  KvSnapshot Snapshot() const;
  uint64_t last_seq() const;
  const std::string& instance() const { return instance_; }
  const std::string& incarnation() const { return incarnation_; }
  uint64_t epoch() const { return epoch_; }

 private:
  void Record(const BlockHash& hash, TierKind tier, bool stored);

  const std::string instance_, incarnation_;
  const uint64_t epoch_;
  const size_t keep_;
  mutable std::mutex mu_;
  // Flushed state (what the batches so far say) and the step's pending net
  // change per (block, tier): +1 stored, -1 removed.
  std::unordered_map<BlockHash, TierMask, BlockHashHasher> state_;
  std::unordered_map<BlockHash, std::array<int8_t, kNumTierKinds>, BlockHashHasher> step_;
  std::vector<BlockHash> step_order_;  // first-touch order, for deterministic batches
  std::deque<KvEventBatch> recent_;
  uint64_t next_seq_ = 1;
};

}  // namespace strata::kvcache
