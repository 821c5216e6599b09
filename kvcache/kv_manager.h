#pragma once
// KvManager: the narrow interface the scheduler and generation use to get KV
// blocks (DESIGN.md: "blocks, or not now"). Behind it: the device BlockPool
// with its prefix index, and an ordered chain of lower tiers (host DRAM, then
// disk; any BlockStore) that receive full blocks by write-through (or, per
// tier, only after a block was hit N times) and serve prefix hits by
// asynchronous loads into device blocks.
//
// Write policies, per lower tier (LowerTier::write_policy):
//   kWriteThrough  a newly full block is copied down when committed (or once
//                  hit admit_after times), and promoted into it when loaded
//                  from a tier below.
//   kWriteBack     nothing is written at commit; a hashed block is copied
//                  down when the device pool evicts it (it leaves the device
//                  prefix cache to be reused), unless the tier already holds
//                  it or a write of it is in flight (and, with admit_after N,
//                  only once it was hit N times). Every write-back tier gets
//                  the device's evictions, and a block a lower store evicts
//                  (its eviction listener) is passed on, through a staging
//                  copy, to the write-back tiers below it that lack it.
//                  Operator flush (Flush) discards without writing back.
//   Staging: the evicted device block is handed out again at once (the
//   caller writes new KV into it), while BlockStore::SubmitWrite may read
//   `data` until its completion is polled (the disk store reads it with
//   O_DIRECT from io_uring). So the manager copies the block, inside the
//   Allocate that evicted it and before any load can overwrite it, into a
//   staging buffer it owns (4096-aligned for O_DIRECT, allocated on first
//   use, reused, at most max(1, writeback_staging_bytes / block_bytes)); one
//   copy serves every write-back tier, and the buffer returns to the free
//   list when its last write completes. Deferring the reuse instead was
//   rejected: it would make Allocate answer "not now" while blocks are
//   merely waiting for I/O, coupling admission to disk latency. When every
//   buffer is busy the manager polls the stores once (never blocks); if none
//   came free the write-back is dropped and counted (writebacks_dropped):
//   the block is simply not cached below, as after a failed write.
//
// Lookup: device first; from the first block the device lacks, each lower
// tier in order is asked how many leading blocks of the rest it holds
// (CountPrefix); the walk continues from the first tier holding the next
// block, so a prefix may come partly from host and partly from disk. Each
// block loads from the tier that answered for it. A block loaded from tier i
// is also written to the write-through tiers above i that lack it.
//
// Per request:
//   AddRequest(id, prompt, salt)  hashes the prompt's full blocks once.
//   Allocate(id, n)               makes the block table cover n positions.
//                                 The first call takes the cached prefix:
//                                 device hits are shared (ref counted), host
//                                 hits get fresh device blocks and loads are
//                                 queued. kNotNow when the pool cannot supply
//                                 the blocks even after evicting; then nothing
//                                 changed. At most prompt_tokens - 1 tokens
//                                 come from cache (the last is always computed
//                                 for its logits), in whole blocks.
//   IsReady(id) / Poll()          loads finish when Poll() sees their
//                                 completions; until IsReady(id), the request
//                                 must not be run. Then CachedTokens(id)
//                                 positions hold KV (a failed load lowers it:
//                                 the rest is recomputed).
//   Commit(id, tokens)            after a forward step: names the blocks that
//                                 `tokens` (all tokens with KV so far) fill,
//                                 so later requests hit them; queues
//                                 write-through to the lower tiers
//                                 (write-back tiers get blocks on eviction).
//   Free(id)                      releases blocks, tail first (so a chain's
//                                 tail is evicted before its head).
//
// Metadata-only mode: with no device memory function, no bytes move (the
// lower tier should then be metadata-only too); the same policy runs, for the
// cluster simulator. Time comes from the injected Clock.
//
// Thread-safety: none. One thread (the engine loop) calls everything; the
// lower tier is driven from that thread too (BlockStore's rule).

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "common/status.h"
#include "common/strong_id.h"
#include "kvcache/block_hash.h"
#include "kvcache/block_pool.h"
#include "kvcache/block_store.h"
#include "kvcache/clock.h"
#include "kvcache/copy_engine.h"

namespace strata::kvcache {

enum class WritePolicy {
  kNone,          // nothing goes down to the lower tier
  kWriteThrough,  // every newly full block is copied down when committed
  kWriteBack,     // a block is copied down when the device pool evicts it
};

enum class LoadPolicy {
  kAuto,    // load when cheaper than recomputing (estimates below); unknown → load
  kAlways,  // always load lower-tier hits
  kNever,   // never load; recompute (lower tier still written)
};

struct KvManagerOptions {
  int block_size = 16;
  int32_t num_device_blocks = 0;
  uint64_t block_bytes = 0;  // bytes of one block (KvLayout::block_bytes); >0 with memory
  Sha256Digest ns{};         // NamespaceDigest of the model
  WritePolicy write_policy = WritePolicy::kWriteThrough;
  LoadPolicy load_policy = LoadPolicy::kAuto;
  // Estimates for kAuto (measured at start by the engine); 0 = unknown.
  double lower_read_bytes_per_s = 0;
  double recompute_tokens_per_s = 0;
  // Staging memory for write-back tiers (see the top): at most
  // max(1, this / block_bytes) block buffers, allocated on demand.
  uint64_t writeback_staging_bytes = 64ull << 20;
  // What memory the device blocks are (the CPU backend's pool is host memory).
  SegmentKind device_memory_kind = SegmentKind::kHost;
};

// Device block memory: the start of block `id` (block_bytes long), e.g.
// ForwardEngine::block_data. The blocks must form one contiguous range
// (block i at block 0 + i * block_bytes): the manager registers it as a
// memory segment (kvcache/copy_engine.h moves bytes by segment and offset).
// Empty function = metadata-only mode.
using BlockMemoryFn = std::function<uint8_t*(BlockId)>;

// How much of a prompt is cached: `device_tokens` leading tokens in device
// blocks, then `lower_tokens` more in the lower tier. Already capped at
// prompt_tokens - 1 and whole blocks.
struct PrefixMatch {
  int32_t device_tokens = 0;
  int32_t lower_tokens = 0;               // sum over lower tiers
  std::vector<int32_t> lower_tier_tokens;  // per lower tier, in chain order
  int32_t total() const { return device_tokens + lower_tokens; }
};

// One lower tier of the chain, in order (host before disk).
struct LowerTier {
  BlockStore* store = nullptr;  // not owned; must outlive the manager
  WritePolicy write_policy = WritePolicy::kWriteThrough;
  // 0: every newly full block is written when committed. N > 0: a block is
  // written only once it was hit (served from cache to a request) N times;
  // hits are counted per hash in this process's memory (not across restarts).
  uint32_t admit_after = 0;
  double read_bytes_per_s = 0;  // kAuto estimate for this tier; 0 = unknown
  // The tier's name in stats, the API and metrics (unique when the tier
  // registry built the chain); empty = the store's name().
  std::string name = {};
};

enum class AllocOutcome { kAllocated, kNotNow };

// Where a cached block of a request came from.
inline constexpr int kDeviceTier = 0;  // lower tier i is reported as i + 1

struct TierHits {
  uint64_t blocks = 0;
  uint64_t tokens = 0;
};

// Upper bounds (seconds) of the latency buckets LowerTierStats counts loads
// and writes in (submit → completion, Clock time); a last, open bucket
// takes the rest. Cumulative like Prometheus' le buckets only when summed.
inline constexpr std::array<double, 12> kTierLatencyBounds = {1e-4,   2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3,
                                                              1e-2,   2.5e-2, 5e-2, 0.1,  0.25,   1.0};
using TierLatencyCounts = std::array<uint64_t, kTierLatencyBounds.size() + 1>;  // per bucket, not cumulative

struct LowerTierStats {
  std::string name;              // LowerTier::name
  TierKind kind = TierKind::kHost;  // the store's kind()
  TierHits hits;                 // prefix blocks loaded from this tier (completed OK)
  uint64_t bytes_down = 0;       // device → this tier (writes completed OK)
  uint64_t bytes_up = 0;         // this tier → device (loads completed OK)
  uint64_t writes = 0;           // writes submitted (write-backs included)
  uint64_t writebacks = 0;       // write-backs submitted (evicted device blocks; kWriteBack)
  uint64_t writebacks_dropped = 0;  // evicted blocks not written back: no staging buffer free
  uint64_t admissions_deferred = 0;  // full blocks not written yet (admit_after)
  uint64_t writes_failed = 0;
  uint64_t loads_failed = 0;
  int64_t load_nanos = 0;
  int64_t write_nanos = 0;             // sum over completed writes of submit → completion
  TierLatencyCounts load_latency{};    // completed loads (OK or not) by latency bucket
  TierLatencyCounts write_latency{};   // completed writes (OK or not) by latency bucket
  uint64_t corrupt_blocks = 0;         // the store's StoreStats::corrupt_blocks (filled by stats())
};

struct KvManagerStats {
  uint64_t queries = 0;        // requests whose prefix was looked up (first Allocate)
  uint64_t query_tokens = 0;   // their prompt tokens
  TierHits device;             // prefix blocks shared from device
  // The next five sum over lower tiers; `tiers` has them per tier.
  TierHits lower;              // prefix blocks loaded from lower tiers (completed OK)
  uint64_t bytes_down = 0;     // device → lower tiers (writes completed OK)
  uint64_t bytes_up = 0;       // lower tiers → device (loads completed OK)
  uint64_t writes_failed = 0;
  uint64_t loads_failed = 0;
  int64_t load_nanos = 0;      // sum over loads of submit→completion (Clock time)
  BlockPoolStats device_pool;  // includes device evictions
  std::vector<LowerTierStats> tiers;  // per lower tier, in chain order
};

// What Flush() removed. `lower_blocks` is per lower tier, in chain order
// (blocks the tier held before minus after; 0 for tiers not flushed).
struct FlushResult {
  uint64_t device_blocks = 0;
  std::vector<uint64_t> lower_blocks;
};

class KvManager {
 public:
  // `lowers` (may be empty: device only; no null stores) and `clock` must
  // outlive the manager. REQUIRES: block_size > 0, num_device_blocks >= 0;
  // block_bytes > 0 when `device_memory` is set. options.write_policy and
  // options.lower_read_bytes_per_s are ignored here (per tier in LowerTier).
  static Result<std::unique_ptr<KvManager>> Create(const KvManagerOptions& options,
                                                   BlockMemoryFn device_memory,
                                                   std::vector<LowerTier> lowers, Clock* clock);
  // One lower tier (may be null: device only) with options.write_policy,
  // admission on first commit and options.lower_read_bytes_per_s.
  static Result<std::unique_ptr<KvManager>> Create(const KvManagerOptions& options,
                                                   BlockMemoryFn device_memory,
                                                   BlockStore* lower, Clock* clock);
  // Waits for (drains) the lower tier's outstanding operations.
  ~KvManager();
  KvManager(const KvManager&) = delete;
  KvManager& operator=(const KvManager&) = delete;

  const KvManagerOptions& options() const { return options_; }

  // Pure query (no state change, no stats): how much of `prompt` would hit now.
  PrefixMatch Match(std::span<const int32_t> prompt, std::string_view cache_salt) const;

  // Starts tracking a request. InvalidArgument if `id` is already tracked or
  // the prompt is empty.
  Status AddRequest(RequestId id, std::span<const int32_t> prompt, std::string_view cache_salt);

  // Makes the request's block table cover `num_tokens` positions (the first
  // call also takes the cached prefix, possibly covering more). kNotNow:
  // not enough blocks now; state unchanged, retry after others free. Errors:
  // NotFound for an unknown id.
  Result<AllocOutcome> Allocate(RequestId id, int32_t num_tokens);

  // Block ids for positions [0, block_size * size()) of the request, as ForwardSeq
  // wants them. Valid until the next Allocate/Free of this request. Empty
  // for an unknown id.
  std::span<const int32_t> BlockTable(RequestId id) const;
  // False while loads for the request are in flight. True for unknown ids.
  bool IsReady(RequestId id) const;
  // Leading positions whose KV came from cache (0 before the first
  // Allocate). Final once IsReady(id). This is the "cached tokens" count.
  int32_t CachedTokens(RequestId id) const;
  // For each of the CachedTokens(id) / block_size leading blocks, where it
  // came from: kDeviceTier, or i + 1 for lower tier i. Final once IsReady(id).
  std::vector<int> CachedBlockTiers(RequestId id) const;
  // "device" for kDeviceTier, else the lower tier's name (LowerTier::name).
  std::string_view tier_name(int tier) const;
  // TierKind::kDevice for kDeviceTier, else the lower tier's store kind().
  TierKind tier_kind(int tier) const;
  size_t num_lower_tiers() const { return lowers_.size(); }
  // Lower-tier operations (loads and writes) submitted and not yet handled
  // by Poll(). A device block stays referenced, and so out of the reach of
  // Flush(), while a write-back from it is in flight.
  size_t ops_in_flight() const { return ops_.size(); }
  // Lower tier i's store (for usage figures; its stats() is safe to read
  // from the engine thread).
  const BlockStore& lower_store(size_t i) const { return *lowers_[i].store; }
  // The memory the manager moves bytes between, registered as segments: the
  // device pool (device_segment()), each lower store's memory(), and its
  // write-back staging buffers.
  const SegmentTable& segments() const { return segments_; }
  SegmentId device_segment() const { return device_segment_; }

  // `tokens`: every token whose KV is now in the request's blocks (prompt
  // prefix, then generated ones), in order. REQUIRES: IsReady(id), tokens
  // start with the prompt given to AddRequest (or a prefix of it), and the
  // block table covers tokens.size() positions (else InvalidArgument).
  Status Commit(RequestId id, std::span<const int32_t> tokens);

  // Releases the request's blocks (tail first). Loads still in flight keep
  // their blocks until they complete. Unknown ids are ignored.
  void Free(RequestId id);

  // Handles finished lower-tier operations. Never blocks. Returns how many.
  size_t Poll();

  // Operator flush (`strata cache flush`). `device`: every cached device
  // block (unreferenced, hashed) leaves the prefix index and becomes free;
  // blocks in use by requests keep their hashes, contents and references, so
  // running requests go on (and Commit/Free) unaffected. `lower_tiers[i]`
  // (missing entries = false): lower tier i drops its blocks of this
  // manager's namespace (every namespace when `all_namespaces`) through
  // BlockStore::Flush. Writes still in flight to a flushed tier may land
  // afterwards (a disk store cancels its own); nothing already loaded is
  // touched. On a store error the tiers before it are flushed, the error is
  // returned, and the rest are not.
  Result<FlushResult> Flush(bool device, const std::vector<bool>& lower_tiers, bool all_namespaces = false);

  KvManagerStats stats() const;
  size_t num_requests() const { return requests_.size(); }
  const BlockPool& device_pool() const { return pool_; }

 private:
  struct Request {
    std::vector<int32_t> prompt;
    std::string salt;
    std::vector<BlockHash> chain;  // hashes of full blocks known so far
    std::vector<int32_t> table;
    std::vector<int> block_tier;   // source tier of each cached block
    bool prefix_taken = false;
    int32_t cached_blocks = 0;     // leading blocks served from cache
    int32_t device_hit_blocks = 0;
    int32_t loads_pending = 0;
    int32_t load_ok_until = 0;     // loads of blocks >= this failed
    int32_t committed_blocks = 0;  // blocks [0, this) are named or settled
    // Which incarnation of the id this is: the engine frees a request and adds
    // it again under the same id (preemption, prefetch release) while loads
    // of the old one may still be in flight; their completions must not count
    // against the new one (they drove loads_pending negative, or to 0 before
    // the new loads had landed, so stale KV was computed on).
    uint64_t epoch = 0;
  };
  enum class OpKind { kLoad, kWrite };
  struct Op {
    OpKind kind;
    int tier = 0;  // index into lowers_
    RequestId request;
    int32_t block_index = 0;  // in the request's chain (loads)
    BlockId block;
    BlockHash hash;
    int64_t start_nanos = 0;
    bool holds_block = true;  // holds a pool reference on `block` (not write-backs)
    int32_t staging = -1;     // staging buffer a write-back reads (-1: none)
    uint64_t request_epoch = 0;  // loads: Request::epoch at submit
  };
  struct AlignedFree {
    void operator()(uint8_t* p) const;
  };

  KvManager(const KvManagerOptions& options, BlockMemoryFn device_memory, std::vector<LowerTier> lowers,
            Clock* clock);
  int32_t MaxCachedBlocks(size_t prompt_tokens, size_t chain_blocks) const;
  size_t CountDeviceHits(std::span<const BlockHash> chain, size_t max_blocks) const;
  // Source tier index (into lowers_) of blocks [from, from + result.size()).
  std::vector<int> CountLowerHits(std::span<const BlockHash> chain, size_t from, size_t max_blocks) const;
  bool WorthLoading(const LowerTier& t, size_t blocks) const;
  Result<AllocOutcome> TakePrefix(RequestId id, Request& r, int32_t num_tokens);
  void SubmitLoad(RequestId id, Request& r, int32_t index, int tier);
  // Writes `block` (named `h`) to tier `tier` unless it is there or on its way.
  void SubmitWrite(int tier, BlockId block, const BlockHash& h);
  // A newly named full block: write-through tiers with admit_after == 0.
  void OnCommitted(BlockId block, const BlockHash& h);
  // A block served from cache (device hit or finished load from `source`,
  // -1 for device): counts the hit, admits it where the count now suffices,
  // and copies it to write-through tiers above `source` that lack it.
  void OnHit(BlockId block, const BlockHash& h, int source);
  void FinishLoads(Request& r);
  // The pool evicted blocks (recorded by its hook): write them back. Called
  // right after every pool_.Allocate, before anything writes the blocks.
  void WriteBackEvicted();
  // Lower tier `from` evicted `h` (bytes `data`): writes it to the
  // write-back tiers below `from` that lack it, through a staging copy.
  void OnLowerEvicted(size_t from, const BlockHash& h, std::span<const uint8_t> data);
  // Queues a write-back of `h` (bytes `data`, from staging buffer `staging`
  // or none) to lower tier `t`; counts it, and undoes the bookkeeping if the
  // store refuses.
  void SubmitWriteBack(size_t t, BlockId block, const BlockHash& h, std::span<const uint8_t> data, int32_t staging);
  // Whether lower tier `t` takes a write-back of `h` now: a write-back tier
  // that neither holds `h` nor has a write of it in flight, and (admit_after)
  // has seen enough hits of it; a deferral is counted.
  bool AdmitsWriteBack(size_t t, const BlockHash& h);
  // The staging copy shared by one block's write-backs: on first use takes a
  // buffer (-1 in *staging until then) and copies `src` (block_bytes long)
  // into it through the copy engine, waiting on the copy's fence (the source
  // is reused as soon as this returns). false, with tier `t`'s dropped
  // write-back counted, when no buffer is free or the copy is refused.
  bool StageOnce(size_t t, int32_t* staging, const Region& src, bool may_poll);
  // Registers the device pool and the lower stores' memory (constructor).
  Status RegisterSegments();
  // Returns a buffer StageOnce took if no submitted write holds it.
  void FreeIfUnused(int32_t staging);
  // A free staging buffer (allocating one under the bound, else polling the
  // stores once); -1 when none.
  // may_poll: poll the stores once when no buffer is free (not from inside
  // a store's callback).
  int32_t AcquireStaging(bool may_poll = true);
  void ReleaseStaging(int32_t staging);
  size_t PollStores();
  void Complete(const StoreCompletion& c);
  std::span<uint8_t> BlockSpan(BlockId id) const;

  const KvManagerOptions options_;
  const BlockMemoryFn memory_;
  SegmentTable segments_;  // before copy_, which reads it until destroyed
  SegmentId device_segment_;
  std::unique_ptr<CopyEngine> copy_;
  std::vector<CopyCompletion> copy_done_;  // reused by StageOnce
  const std::vector<LowerTier> lowers_;
  Clock* const clock_;
  BlockPool pool_;
  std::unordered_map<RequestId, Request> requests_;
  std::unordered_map<uint64_t, Op> ops_;
  std::vector<std::unordered_set<BlockHash, BlockHashHasher>> writes_in_flight_;  // per tier
  // Hits per hash, for admit_after; cleared when it grows past kMaxHitCounts.
  std::unordered_map<BlockHash, uint32_t, BlockHashHasher> hit_counts_;
  static constexpr size_t kMaxHitCounts = 1 << 20;
  uint64_t next_tag_ = 1;
  uint64_t next_epoch_ = 1;
  KvManagerStats stats_;
  std::vector<StoreCompletion> completions_;  // reused by Poll
  bool any_writeback_ = false;
  std::vector<std::pair<BlockId, BlockHash>> evicted_;  // by the pool's hook, until WriteBackEvicted
  size_t max_staging_ = 0;
  std::vector<std::unique_ptr<uint8_t[], AlignedFree>> staging_;
  std::vector<SegmentId> staging_segments_;  // staging_[i]'s segment
  std::vector<int32_t> staging_refs_;  // writes in flight per buffer
  std::vector<int32_t> free_staging_;
};

}  // namespace strata::kvcache
