#pragma once
// A metadata-only lower tier for the cluster simulator: a BlockStore that
// keeps hashes (no bytes) in an LRU of `capacity_bytes / block_bytes` blocks
// and finishes reads and writes after the time their bytes would take at the
// tier's bandwidth, on the injected (virtual) clock.
//
// Timing model: reads and writes each go through one FIFO channel; an
// operation starts when its channel is free (or at submit time, whichever is
// later) and takes block_bytes / bandwidth seconds (0 bandwidth = instant).
// A written block becomes visible (Contains, CountPrefix, reads) when its
// write completes; a write of a hash already held completes OK at once and
// touches it. A read of a hash not held completes NotFound at once. A read
// touches the block (a use). Eviction: the block the store's eviction
// policy picks (kvcache/eviction_policy.h, the same code the live tiers
// run), when a write completes into a full store (the eviction listener is
// told first); a block the policy does not admit is not stored. capacity 0 =
// the tier is off (writes fail).
//
// Remote mode (kind kRemote, the cluster pool): the store holds nothing of
// its own; its blocks are its peers' (SetPeers: the other instances' host
// and disk SimStores, as the cluster index would say). CountPrefix is the
// longest prefix one peer holds; a read touches the holder's block (a use)
// and takes latency_s + block_bytes / read_bytes_per_s on this store's
// channel (the transfer). Writes are refused (read-only, as the remote
// tier).
//
// Unlike HostStore's metadata-only mode (instant operations), this lets tier
// bandwidth show up in simulated TTFT: the engine does not run a request
// until its loads complete.
//
// Thread-safety: one thread drives a store (BlockStore's rule).

#include <cstdint>
#include <memory>
#include <queue>
#include <string>
#include <unordered_map>
#include <vector>

#include "kvcache/block_hash.h"
#include "kvcache/block_store.h"
#include "kvcache/clock.h"
#include "kvcache/eviction_policy.h"

namespace strata::bench {

struct SimStoreOptions {
  std::string name = "host";     // "host", "disk", ...
  uint64_t capacity_bytes = 0;   // rounded down to whole blocks
  uint64_t block_bytes = 0;      // REQUIRES: > 0
  double read_bytes_per_s = 0;   // 0 = instant
  double write_bytes_per_s = 0;  // 0 = instant
  kvcache::TierKind kind = kvcache::TierKind::kHost;
  double latency_s = 0;  // remote mode: per read, on top of the bandwidth
  std::string eviction_policy = kvcache::kDefaultEvictionPolicy;  // kvcache/eviction_policy.h names
};

class SimStore final : public kvcache::BlockStore {
 public:
  // `clock` must outlive the store. InvalidArgument for an unknown policy or
  // more than kMaxBlocks blocks (the policy keeps per-block state).
  static Result<std::unique_ptr<SimStore>> Create(const SimStoreOptions& options, kvcache::Clock* clock);
  static constexpr uint64_t kMaxBlocks = uint64_t{1} << 23;

  std::string_view name() const override { return options_.name; }
  kvcache::TierKind kind() const override { return options_.kind; }
  kvcache::StoreStats stats() const override;

  bool Contains(const BlockHash& h) const override;
  size_t CountPrefix(std::span<const BlockHash> chain) const override;

  // `src` and `dst` are ignored (no bytes exist); they may be Region{}.
  Status SubmitWrite(const BlockHash& h, const Sha256Digest& ns, const Region& src, uint64_t tag) override;
  Status SubmitRead(const BlockHash& h, const Region& dst, uint64_t tag) override;
  // Completes the operations whose finish time is <= the clock's now.
  size_t Poll(std::vector<kvcache::StoreCompletion>* out) override;
  // Completes everything pending regardless of time (shutdown).
  void Drain(std::vector<kvcache::StoreCompletion>* out) override;

  // On the injected clock; remembered until the block's write completes.
  void KeepFor(const BlockHash& h, int64_t nanos) override;
  Status Remove(const BlockHash& h) override;
  Status Flush(const Sha256Digest* ns) override;
  // Called with (victim, Region{}) when a landing write evicts a block, as
  // HostStore does: the mover passes it on to a write-back tier below.
  void SetEvictionListener(EvictionListener listener) override { eviction_listener_ = std::move(listener); }

  // Remote mode: the stores whose blocks this one reads (not owned; they
  // outlive it).
  void SetPeers(std::vector<SimStore*> peers) { peers_ = std::move(peers); }
  // Remote mode: blocks read from each peer's tiers so far.
  uint64_t remote_reads() const { return remote_reads_; }

  // Clock time of the earliest pending completion; INT64_MAX when none.
  int64_t next_completion_nanos() const;
  // Clock time by which every pending operation has completed (its
  // channels are free again); INT64_MAX when none is pending.
  int64_t last_completion_nanos() const;
  Status ReplaceEvictionPolicy(const PolicyFactory& make) override;
  uint64_t max_blocks() const { return max_blocks_; }

 private:
  struct Pending {
    int64_t done_nanos;
    uint64_t seq;  // FIFO among equal times
    uint64_t tag;
    bool is_write;
    BlockHash hash;
    Status status;
    bool operator>(const Pending& o) const {
      return done_nanos != o.done_nanos ? done_nanos > o.done_nanos : seq > o.seq;
    }
  };
  SimStore(const SimStoreOptions& options, kvcache::Clock* clock, std::unique_ptr<kvcache::EvictionPolicy> policy);
  int64_t Schedule(int64_t* channel_free, double bytes_per_s);
  void Insert(const BlockHash& h);
  void Touch(const BlockHash& h);

  const SimStoreOptions options_;
  kvcache::Clock* const clock_;
  const uint64_t max_blocks_;
  std::unique_ptr<kvcache::EvictionPolicy> policy_;
  std::vector<BlockHash> slot_hash_;  // grown up to max_blocks_ as blocks arrive
  std::vector<int32_t> free_slots_;
  std::unordered_map<BlockHash, int32_t, kvcache::BlockHashHasher> index_;
  std::unordered_map<BlockHash, int64_t, kvcache::BlockHashHasher> keep_pending_;  // asked before the write landed
  std::priority_queue<Pending, std::vector<Pending>, std::greater<Pending>> pending_;
  int64_t read_free_nanos_ = 0, write_free_nanos_ = 0;
  uint64_t next_seq_ = 0;
  uint64_t evictions_ = 0, write_errors_ = 0;
  EvictionListener eviction_listener_;
  std::vector<SimStore*> peers_;  // remote mode
  uint64_t remote_reads_ = 0;
  bool remote() const { return options_.kind == kvcache::TierKind::kRemote; }
};

}  // namespace strata::bench
