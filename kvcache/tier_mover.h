#pragma once
// TierMover: the half of the KV manager that moves bytes between the device
// pool and the chain of lower tiers (host, disk, any BlockStore). It owns
// the chain's policies and everything in flight; the KvManager (requests,
// prefix matching, allocation) tells it what happened and asks it to load.
//
//   lookup     LowerHits: from the first block the device lacks, each tier in
//              order is asked how many leading blocks of the rest it holds
//              (CountPrefix); the walk continues from the first tier holding
//              the next block, and stops where a run is not worth loading
//              (LoadPolicy; kAuto compares its bytes' read time with the
//              recompute time of its tokens).
//   loads      SubmitLoad reads a block from a tier into a device block; the
//              completion reaches the owner's LoadDoneFn from Poll().
//   writes     write-through: a newly committed block (OnCommitted), or once
//              hit admit_after times, or promoted above the tier it loaded
//              from (OnHit). write-back: a block the level just above
//              drops (the device pool's evictions; a tier's, through its
//              eviction listener) goes to one tier only, the nearest
//              write-back tier that admits it, unless a tier on the way
//              holds it or is writing it. So an exclusive host above an
//              exclusive disk holds no block the disk holds.
//   staging    an evicted device block is handed out again at once, while a
//              store may read its source until completion (O_DIRECT); so the
//              mover copies it (copy engine, waiting on the fence) into one
//              of its StagingBuffers (at most max(1, writeback_staging_bytes
//              / block_bytes)), shared by every write-back tier. When none is
//              free the mover polls the stores once (never blocks); if still
//              none, the write-back is dropped and counted
//              (writebacks_dropped), as after a failed write.
//   device     when the device segment is not host-addressable (a GPU), no
//   memory     store ever sees it: a load reads into a staging buffer, then
//              the copy engine moves it into the device block, and the load
//              completes (LoadDoneFn) only when that copy has; a
//              write-through first copies the block into a staging buffer
//              (waiting on the copy's fence). Without a free buffer the load
//              or write fails and is counted (the block is recomputed or
//              simply not stored), never blocking.
//   segments   regions name memory in one SegmentTable: the device pool's
//              segment, each store's own memory (the mover attaches every
//              store to the table: BlockStore::Attach) and the staging
//              buffers.
//
// Ownership: the stores, the pool, the clock and a DeviceKv's table and
// copy engine are not owned and outlive the mover; the mover registers its
// staging buffers in that table and attaches the stores to it, and undoes
// both when destroyed. A block under a load or a write-through holds a pool
// reference until its completion is handled (not reused meanwhile).
//
// Thread-safety: none. The owner's thread (the engine loop) calls
// everything, and the stores are driven from it (BlockStore's rule).

#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <span>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "common/copy_engine.h"
#include "common/memory_segment.h"
#include "common/status.h"
#include "kvcache/block_pool.h"
#include "kvcache/clock.h"
#include "kvcache/hierarchy_policy.h"
#include "kvcache/kv_types.h"
#include "kvcache/staging_buffers.h"

namespace strata::kvcache {

// A load finished (from Poll or Drain). `epoch` is the one given to
// SubmitLoad: the owner ignores completions for an older incarnation of a
// request id.
struct LoadDone {
  RequestId request;
  uint64_t epoch = 0;
  int32_t block_index = 0;
  int tier = 0;
  bool ok = false;
};
using LoadDoneFn = std::function<void(const LoadDone&)>;

// What TierMover::WriteDown did.
struct WriteDownResult {
  int tier = -1;             // the tier written to; -1: no disk tier (nothing done)
  uint64_t kept = 0;         // blocks chosen to be there afterwards (at most its slots)
  uint64_t already = 0;      // of those, held by it already
  uint64_t written = 0;      // writes that landed
  uint64_t refused = 0;      // writes it declined (every slot busy)
  uint64_t failed = 0;       // writes that failed or could not be submitted
  uint64_t not_submitted = 0;  // left out when max_seconds ran out
  double seconds = 0;
};

class TierMover {
 public:
  // REQUIRES: no null store, none attached to another segment table;
  // device.segments and device.copy set; a valid device.segment holds
  // num_device_blocks blocks of block_bytes > 0 (else InvalidArgument).
  // `pool` and `clock` outlive the mover; `clock` is the one lookup
  // deadlines are given in. `on_load_done` is called on the owner's thread
  // from Poll() (which WriteBackEvicted may call when staging runs short)
  // and from the destructor's drain, before the load's block reference is
  // released (from the drain, loads and writes are refused).
  static Result<std::unique_ptr<TierMover>> Create(const KvManagerOptions& options, DeviceKv device,
                                                   std::vector<LowerTier> lowers, BlockPool* pool, Clock* clock,
                                                   LoadDoneFn on_load_done);
  // The BlockMemoryFn convenience (kv_types.h): the mover owns the segment
  // table and a CpuCopyEngine. REQUIRES: block_bytes > 0 with
  // `device_memory`, whose blocks form one contiguous range.
  static Result<std::unique_ptr<TierMover>> Create(const KvManagerOptions& options, BlockMemoryFn device_memory,
                                                   std::vector<LowerTier> lowers, BlockPool* pool, Clock* clock,
                                                   LoadDoneFn on_load_done);
  // Drains every store and copy (completions are handled, load completions
  // reported), then unregisters the staging buffers and detaches the stores.
  ~TierMover();
  TierMover(const TierMover&) = delete;
  TierMover& operator=(const TierMover&) = delete;

  size_t num_tiers() const { return lowers_.size(); }
  const LowerTier& tier(size_t i) const { return lowers_[i]; }
  // Tier i's read rate for load estimates: its store's own measured rate
  // (a remote tier's, from its transfers), else the configured estimate;
  // 0 when neither is known.
  double ReadBytesPerS(size_t i) const;

  // Source tier of each block [from, from + result.size()) of `chain`,
  // capped at max_blocks (see the top). A pure query.
  std::vector<int> LowerHits(std::span<const BlockHash> chain, size_t from, size_t max_blocks) const;

  // LowerHits asked asynchronously (BlockStore::SubmitCountPrefix) with a
  // deadline in Clock time, so a tier whose index is remote never blocks
  // the caller. Local tiers answer at once: with only those, the lookup is
  // done when SubmitLookup returns. Answers advance in Poll().
  uint64_t SubmitLookup(std::vector<BlockHash> chain, size_t from, size_t max_blocks, int64_t deadline_nanos);
  // kDone: *src as LowerHits would have answered. kExpired (the deadline
  // passed unanswered): a miss, *src empty. Either forgets the lookup (a late
  // answer is ignored); kPending leaves it. An unknown id is kExpired.
  LookupState TakeLookup(uint64_t id, std::vector<int>* src);
  void CancelLookup(uint64_t id);
  size_t lookups_pending() const { return lookups_.size(); }

  // Queues a read of `hash` from tier `tier` into device block `block`,
  // reporting to LoadDoneFn. An error means nothing was queued (counted as a
  // failed load).
  Status SubmitLoad(int tier, BlockId block, const BlockHash& hash, RequestId request, uint64_t epoch,
                    int32_t block_index);
  // A block loaded from `tier` served a request: counts the hit.
  void CountLoadHit(int tier);

  // Reads `hash` from tier `tier` into `dst` (host memory registered in the
  // table, block_bytes long; the caller keeps it untouched until `done`),
  // not into a device block: the cluster pool's holder stages a block held
  // only on disk for a peer to read (cluster/kv_holder.h). `done` runs on
  // the owner's thread from Poll() (or the destructor's drain) with the
  // read's status. An error means nothing was queued (`done` not called).
  using StageDoneFn = std::function<void(const Status&)>;
  Status SubmitStage(int tier, const BlockHash& hash, const Region& dst, StageDoneFn done);

  // A newly named full device block: write-through tiers with admit_after 0.
  void OnCommitted(BlockId block, const BlockHash& h);
  // A block served from cache (device hit: source -1; or a finished load
  // from tier `source`): counts its hits, admits it where the count now
  // suffices, and promotes it to write-through tiers above `source`; an
  // exclusive `source` tier drops its copy (the device holds it now).
  void OnHit(BlockId block, const BlockHash& h, int source);
  // Writes back the blocks the pool evicted since the last call. Call right
  // after every pool Allocate, before anything writes the evicted blocks.
  // `loads_from`: the tier of each load the caller submits next (SubmitLoad,
  // each call once): an exclusive tier counts them as promotions in flight
  // until each completes or fails, and write-backs to it wait for them (see
  // SubmitWriteBack).
  void WriteBackEvicted(std::span<const int> loads_from = {});
  // The one policy over the device pool and tier 0 (kvcache/
  // hierarchy_policy.h), when the KvManager made one: after write-backs are
  // submitted, dropped or completed, the mover tells it which demoted blocks
  // no write will store. Not owned; null = none.
  void set_hierarchy(HierarchyPolicy* hierarchy) { hierarchy_ = hierarchy; }

  // A graceful stop (kv.stop_write_down_seconds): the last disk tier is
  // the one cache a restart finds, but once full it holds what no tier above
  // holds (it gives up its copies of their blocks first: hierarchy_policy.h),
  // so the hottest blocks would be lost. This writes into it what the device
  // pool and the tiers between hold and it lacks: it first waits for what
  // is in flight, tells the one policy to keep the last tier's copies
  // (HierarchyPolicy::KeepCopies), then ranks the blocks, the most
  // valuable first (device blocks in use, then the device's cached ones
  // from the last to be evicted, then each tier's from its last victim, the
  // nearest tier first), keeps the first as many as the disk has slots
  // (counting what it already holds) and writes the missing ones, the most
  // valuable first (a time limit leaves out the least valuable), at most 32
  // at a time; the disk makes room by evicting the blocks only it holds, in
  // the policy's order, and only once none is left its least recently
  // stored or read copies. Then it refreshes every block kept there, the
  // least valuable first (BlockStore::Refresh), so that the disk's
  // persisted recency, which a restart evicts by, follows the ranking. Blocks the
  // tiers above hold are pinned while written from their memory. Waits for
  // the writes, at most `max_seconds` in all (real time); what is left is
  // not submitted, and writes in flight at the end complete in the
  // destructor's drain. Blocking: the engine must have stopped (no request
  // allocates any more). A disk tier with its own policy evicts by it.
  WriteDownResult WriteDown(double max_seconds);

  // Handles finished operations. Never blocks. Returns how many.
  size_t Poll();
  // Operations submitted and not yet handled by Poll().
  size_t ops_in_flight() const { return ops_.size(); }

  // Drops tier t's blocks of namespace `ns` (all when null) for each
  // lower_tiers[t]; `removed[t]` = blocks it held before minus after. On a
  // store error the tiers before it are flushed and the error is returned.
  Status Flush(const std::vector<bool>& lower_tiers, const Sha256Digest* ns, std::vector<uint64_t>* removed);

  // Fills the lower-tier figures of `s`: bytes moved, failures, load time,
  // and `tiers` (corrupt block counts from the stores).
  void FillStats(KvManagerStats* s) const;

  const SegmentTable& segments() const { return *segments_; }
  SegmentTable& segments() { return *segments_; }
  SegmentId device_segment() const { return device_segment_; }
  // Whether loads and writes stage through host buffers (see the top).
  bool stages_device() const { return !device_host_; }

 private:
  enum class OpKind { kLoad, kWrite, kStage };
  struct Op {
    OpKind kind;
    int tier = 0;
    BlockId block;
    BlockHash hash;
    int64_t start_nanos = 0;
    bool holds_block = true;  // holds a pool reference on `block` (not write-backs)
    int32_t staging = -1;     // staging buffer the store reads or writes (-1: none)
    bool copying = false;     // a staged load: the staging -> device copy is in flight
    RequestId request = {};   // loads
    uint64_t epoch = 0;       // loads
    int32_t block_index = 0;  // loads
    StageDoneFn stage_done = {};  // stages
    int unpin_tier = -1;          // a write from tier unpin_tier's memory (WriteDown): unpinned when done
  };
  // An asynchronous lookup walking the chain as LowerHits does: at `pos`,
  // tier `tier` is being asked (question tag `asking`, 0 = none).
  struct Lookup {
    std::vector<BlockHash> chain;
    size_t pos = 0, max = 0, tier = 0;
    std::vector<int> src;
    int64_t deadline_nanos = 0;
    uint64_t asking = 0;
    bool done = false;
  };

  // Asks the next question of lookup `id`, applying answers already there,
  // until it waits for one or is done.
  void AdvanceLookup(uint64_t id);
  void ApplyAnswer(Lookup& l, size_t blocks);
  // Applies an answer to the lookup that asked it; returns that lookup's id,
  // or 0 when no lookup waits for it (cancelled, expired).
  uint64_t TakeAnswer(const BlockStore::PrefixAnswer& a);
  // Polls every tier's count answers and advances their lookups.
  size_t PollLookups();

  TierMover(const KvManagerOptions& options, DeviceKv device, std::vector<LowerTier> lowers, BlockPool* pool,
            Clock* clock, LoadDoneFn on_load_done);
  Status Init();
  bool WorthLoading(const LowerTier& t, size_t blocks) const;
  // Block `id`'s region of the device segment (Region{} when metadata-only).
  Region BlockRegion(BlockId id) const;
  // Writes `block` (named `h`) to tier `tier` unless it is there or on its
  // way. *shared_staging: the staging copy of the block shared by the
  // caller's tiers (-1: none yet; the caller puts it back when unused).
  void SubmitWrite(int tier, BlockId block, const BlockHash& h, int32_t* shared_staging);
  void OnLowerEvicted(size_t from, const BlockHash& h, const Region& data);
  // Drops `h` from exclusive tier `source` after a load promoted it.
  void Promoted(int source, const BlockHash& h);
  // Writes back `h` to tier t; to an exclusive tier while promotions (loads
  // that will drop their block from an exclusive tier, any of them) are in
  // flight, it waits for them first (deferred_), so that the tier does not
  // evict the oldest blocks it holds to make room while the promoted blocks
  // are still in it: the tiers then act as one LRU of their total size. Any
  // tier's, because a request's loaded blocks leave their tiers only when
  // its last load is done.
  // (`data`: a staging copy of the block, or Region{} for metadata only:
  // a write-back never holds the device block.)
  void SubmitWriteBack(size_t t, const BlockHash& h, const Region& data, int32_t staging, int64_t keep_until);
  void SubmitWriteBackNow(size_t t, const BlockHash& h, const Region& data, int32_t staging, int64_t keep_until);
  // One promotion out of tier t ended (loaded, failed or never submitted).
  void EndPromotion(size_t t);
  // Submits up to `max` deferred write-backs of tier t (oldest first).
  void FlushDeferred(size_t t, size_t max);
  // Drops every deferred write-back of the tiers marked (all when null).
  void DropDeferred(const std::vector<bool>* tiers);
  // Whether tier `t` takes a write-back of `h` now (counts a deferral).
  bool AdmitsWriteBack(size_t t, const BlockHash& h);
  // The staging copy shared by one block's write-backs (see the top).
  bool StageOnce(size_t t, int32_t* staging, const Region& src, bool may_poll);
  // Copies `src` into a fresh staging buffer and waits for it; -1 when none
  // is free or the copy failed (logged). may_poll: poll the stores once when
  // no buffer is free (never from inside a store's callback).
  int32_t StageCopy(const Region& src, bool may_poll);
  int32_t AcquireStaging(bool may_poll);
  // Polls the copy engine; completions of staged loads wait in copy_ready_
  // for Poll() (never handled from inside a store's callback).
  void CollectCopies();
  // Finishes the staged loads whose copy completed; returns how many.
  size_t FinishCopiedLoads();
  void FinishLoad(const Op& op, const Status& status);
  // WriteDown's parts (tier_write_down.cc).
  struct DownCandidate {
    int source = -1;  // -1: the device pool (block), else the lower tier holding it
    BlockId block;
    BlockHash hash;
    bool held = false;  // the target holds it already (or is writing it)
  };
  std::vector<DownCandidate> RankForWriteDown(size_t target, WriteDownResult* r) const;
  // Submits one candidate's write into `target`; false when it could not.
  bool SubmitWriteDown(size_t target, const DownCandidate& c);
  // Polls (sleeping briefly when nothing finished) while more than `max_ops`
  // operations are in flight and `deadline` (steady clock nanoseconds) is ahead.
  void WaitOps(size_t max_ops, int64_t deadline);
  void Complete(const StoreCompletion& c);

  const KvManagerOptions options_;
  // The BlockMemoryFn convenience's own table and engine (null otherwise);
  // the table before the engine, which reads it until destroyed.
  std::unique_ptr<SegmentTable> own_segments_;
  std::unique_ptr<CopyEngine> own_copy_;
  SegmentTable* segments_ = nullptr;
  CopyEngine* copy_ = nullptr;
  SegmentId device_segment_;
  bool device_host_ = true;  // the device segment is host-addressable (or absent)
  std::vector<CopyCompletion> copy_done_;
  std::vector<CopyCompletion> copy_ready_;  // staged loads' copies, for Poll
  CopyCompletion staging_copy_;             // the copy StageCopy waits for (tag 0: none)
  std::vector<BlockStore*> attached_;       // stores the mover attached
  bool draining_ = false;                   // in the destructor
  std::vector<LowerTier> lowers_;  // names filled in by Init
  BlockPool* const pool_;
  Clock* const clock_;
  const LoadDoneFn on_load_done_;
  std::unordered_map<uint64_t, Op> ops_;
  std::unordered_map<uint64_t, Lookup> lookups_;
  std::unordered_map<uint64_t, uint64_t> questions_;  // question tag -> lookup id
  uint64_t next_lookup_ = 1;
  std::vector<BlockStore::PrefixAnswer> answers_;  // reused by PollLookups
  std::vector<std::unordered_set<BlockHash, BlockHashHasher>> writes_in_flight_;  // per tier
  // Hits per hash, for admit_after; cleared when it grows past kMaxHitCounts.
  std::unordered_map<BlockHash, uint32_t, BlockHashHasher> hit_counts_;
  static constexpr size_t kMaxHitCounts = 1 << 20;
  uint64_t next_tag_ = 1;
  KvManagerStats stats_;  // the lower-tier fields only (FillStats)
  std::vector<StoreCompletion> completions_;  // reused by Poll
  bool any_writeback_ = false;
  struct Evicted {
    BlockId block;
    BlockHash hash;
    int64_t keep_until = 0;  // cache_ttl_seconds ask, passed down with the block
  };
  std::vector<Evicted> evicted_;  // by the pool's hook, until WriteBackEvicted
  struct Deferred {
    size_t tier = 0;
    BlockHash hash;
    Region data;          // the staging buffer's region (Region{}: metadata only)
    int32_t staging = -1;  // referenced while deferred
    int64_t keep_until = 0;
  };
  std::deque<Deferred> deferred_;       // see SubmitWriteBack
  HierarchyPolicy* hierarchy_ = nullptr;  // set_hierarchy
  void SettleHierarchy();
  std::vector<uint32_t> promotions_;    // per tier: loads from an exclusive tier in flight
  std::unique_ptr<StagingBuffers> staging_;  // in segments_; made by Init
};

}  // namespace strata::kvcache
