#pragma once
// KvManager: the narrow interface the scheduler and generation use to get KV
// blocks (DESIGN.md: "blocks, or not now"). Behind it: the device BlockPool
// with its prefix index, and an ordered chain of lower tiers (host DRAM, then
// disk; any BlockStore) that receive full blocks by write-through (or, per
// tier, only after a block was hit N times) and serve prefix hits by
// asynchronous loads into device blocks.
//
// The manager keeps requests, prefix matching and device allocation; its
// TierMover (kvcache/tier_mover.h) owns the lower tiers: lookup along the
// chain, loads, write-through and write-back (LowerTier::write_policy),
// staging, the eviction listener and the per-tier statistics. Lookup: device
// first; from the first block the device lacks, the mover's LowerHits (a
// prefix may come partly from host and partly from disk). Operator flush
// (Flush) discards without writing back.
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
// Device memory: the backend's pool as a DeviceKv (a segment, its table
// and copy engine), or a BlockMemoryFn over a plain buffer (tests, tools).
// Metadata-only mode: with no device memory function, no bytes move (the
// lower tier should then be metadata-only too); the same policy runs, for the
// cluster simulator. Time comes from the injected Clock.
//
// Thread-safety: none. One thread (the engine loop) calls everything; the
// lower tier is driven from that thread too (BlockStore's rule).

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "common/strong_id.h"
#include "kvcache/block_hash.h"
#include "kvcache/block_pool.h"
#include "kvcache/block_store.h"
#include "kvcache/clock.h"
#include "kvcache/kv_event_log.h"
#include "kvcache/kv_types.h"
#include "kvcache/tier_mover.h"

namespace strata::kvcache {

class KvManager {
 public:
  // `lowers` (may be empty: device only; no null stores) and `clock` must
  // outlive the manager. REQUIRES: block_size > 0, num_device_blocks >= 0;
  // block_bytes > 0 when `device_memory` is set. options.write_policy and
  // options.lower_read_bytes_per_s are ignored here (per tier in LowerTier).
  // The device pool as the backend allocated it (kv_types.h: DeviceKv); the
  // stores are attached to its segment table.
  static Result<std::unique_ptr<KvManager>> Create(const KvManagerOptions& options, DeviceKv device,
                                                   std::vector<LowerTier> lowers, Clock* clock);
  // The BlockMemoryFn convenience (kv_types.h).
  static Result<std::unique_ptr<KvManager>> Create(const KvManagerOptions& options,
                                                   BlockMemoryFn device_memory,
                                                   std::vector<LowerTier> lowers, Clock* clock);
  // One lower tier (may be null: device only) with options.write_policy,
  // admission on first commit and options.lower_read_bytes_per_s.
  static Result<std::unique_ptr<KvManager>> Create(const KvManagerOptions& options,
                                                   BlockMemoryFn device_memory,
                                                   BlockStore* lower, Clock* clock);
  // Waits for (drains) the lower tiers' outstanding operations; requests
  // still tracked, loading or not, are simply dropped.
  ~KvManager();
  KvManager(const KvManager&) = delete;
  KvManager& operator=(const KvManager&) = delete;

  const KvManagerOptions& options() const { return options_; }

  // Pure query (no state change, no stats): how much of `prompt` would hit now.
  PrefixMatch Match(std::span<const int32_t> prompt, std::string_view cache_salt) const;
  // Seconds to bring `m`'s lower-tier blocks into the device pool at each
  // tier's read rate (TierMover::ReadBytesPerS), one tier after another;
  // a tier whose rate is unknown counts 0. Device hits cost nothing.
  double EstimateLoadSeconds(const PrefixMatch& m) const;

  // Match asked asynchronously, for waiting requests: device hits are
  // counted when the answer is taken; the lower tiers are asked through the
  // mover (TierMover::SubmitLookup), so a tier whose index is remote never
  // blocks the engine. With local tiers only, the answer is ready at once.
  // `deadline_nanos` is Clock time: past it, an unanswered lookup counts as
  // a lower-tier miss.
  uint64_t SubmitLookup(std::span<const int32_t> prompt, std::string_view cache_salt, int64_t deadline_nanos);
  // kPending: nothing in *out. kDone / kExpired: *out is the match (lower
  // part empty when expired; all empty for an unknown or already taken id),
  // and the lookup is forgotten.
  LookupState TakeLookup(uint64_t id, PrefixMatch* out);
  void CancelLookup(uint64_t id);

  // Tokens the request's first Allocate would take from cache now: device
  // hits counted now, then the lower hits of AddRequest's `looked_up` (or of
  // the tiers, asked now, without one). After the first Allocate:
  // CachedTokens. 0 for an unknown id.
  int32_t PrefixTokens(RequestId id) const;

  // Starts tracking a request. InvalidArgument if `id` is already tracked or
  // the prompt is empty.
  // `looked_up`: a match of this prompt taken from a lookup (TakeLookup);
  // the first Allocate then loads the lower blocks it names instead of
  // asking the tiers again (a block gone since fails its load and is
  // recomputed, as any failed load).
  // `keep_seconds` > 0 (the request's cache_ttl_seconds): every block the
  // request names or reuses is kept, in each tier it reaches, for at least
  // that long after (its eviction policy takes other blocks first).
  Status AddRequest(RequestId id, std::span<const int32_t> prompt, std::string_view cache_salt,
                    const PrefixMatch* looked_up = nullptr, double keep_seconds = 0);

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
  size_t num_lower_tiers() const { return mover_->num_tiers(); }
  // Lower-tier operations (loads and writes) submitted and not yet handled
  // by Poll(). A device block stays referenced, and so out of the reach of
  // Flush(), while a write-back from it is in flight.
  size_t ops_in_flight() const { return mover_->ops_in_flight(); }
  // Lower tier i's store (for usage figures; its stats() is safe to read
  // from the engine thread).
  const BlockStore& lower_store(size_t i) const { return *mover_->tier(i).store; }
  // The memory the manager moves bytes between, registered as segments: the
  // device pool (device_segment()), each lower store's own memory
  // (BlockStore::Attach), and the mover's staging buffers.
  const SegmentTable& segments() const { return mover_->segments(); }
  // Others (a transfer engine, a test's buffers) may register memory there.
  SegmentTable& segments() { return mover_->segments(); }
  SegmentId device_segment() const { return mover_->device_segment(); }

  // `tokens`: every token whose KV is now in the request's blocks (prompt
  // prefix, then generated ones), in order. REQUIRES: IsReady(id), tokens
  // start with the prompt given to AddRequest (or a prefix of it), and the
  // block table covers tokens.size() positions (else InvalidArgument).
  Status Commit(RequestId id, std::span<const int32_t> tokens);

  // Releases the request's blocks (tail first). Loads still in flight keep
  // their blocks until they complete. Unknown ids are ignored.
  void Free(RequestId id);

  // Handles finished lower-tier operations. Never blocks. Returns how many.
  // With an event log, also closes the step's events into one batch.
  size_t Poll();

  // Publishes this manager's blocks to the cluster index (issue 18;
  // kvcache/kv_event_log.h): every block named in the device pool or
  // stored in a lower tier that reports changes (host, disk) is recorded as
  // `stored` in that tier's kind, and as `removed` when it leaves; blocks
  // held now are recorded at once. Poll() flushes the events of the step
  // as one batch. Null detaches. `log` outlives the manager or is detached
  // first.
  void SetEventLog(KvEventLog* log);
  // Lower tier i's store, for the cluster pool's holder side (Locate, Pin:
  // engine thread only).
  BlockStore* mutable_lower_store(size_t i) { return mover_->tier(i).store; }
  // Reads lower tier i's block `hash` into host region `dst` (TierMover::
  // SubmitStage): the holder stages disk-only blocks for peers.
  Status SubmitStage(size_t i, const BlockHash& hash, const Region& dst, TierMover::StageDoneFn done) {
    return mover_->SubmitStage(static_cast<int>(i), hash, dst, std::move(done));
  }

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

  // Graceful stop (kv.stop_write_down_seconds): writes what the device pool
  // and the tiers above the last disk tier hold into that disk, so a
  // restart finds the hottest blocks (TierMover::WriteDown says how).
  // Blocking, at most `max_seconds`; nothing without a disk tier. REQUIRES:
  // the engine has stopped (no Allocate, Commit or Reserve any more); the
  // manager is destroyed next.
  WriteDownResult WriteDown(double max_seconds) { return mover_->WriteDown(max_seconds); }

  // --- Blocks a peer fills (prefill/decode disaggregation, issue 19) ---
  // A decode instance reserves device blocks for a prompt whose KV another
  // instance computes and writes into them (the transfer engine), then
  // names them, so that the continuation request it runs next finds them as
  // device hits. Every block of a reservation stays referenced (never
  // evicted, reused or flushed) until ReleaseReservation or expiry.
  struct Reservation {
    // One per prompt block that can come from cache ((prompt - 1) /
    // block_size, as for a request), in chain order, and their hashes.
    std::vector<BlockId> blocks;
    std::vector<BlockHash> chain;
    // Leading blocks this pool already names (an earlier turn): shared, not
    // to be sent. The peer writes blocks [held_blocks, blocks.size()).
    int32_t held_blocks = 0;
  };
  // kNotNow: the pool cannot supply the blocks now (nothing changed).
  // InvalidArgument: `id` taken, empty prompt. `expires_nanos` (Clock time):
  // past it, ExpireReservations frees the reservation.
  Result<AllocOutcome> Reserve(uint64_t id, std::span<const int32_t> prompt, std::string_view cache_salt,
                               int64_t expires_nanos, Reservation* out);
  // The peer's writes of blocks [held_blocks, held_blocks + filled) landed
  // (checked): names them (a block whose hash another block names by now
  // stays private) and queues their write-through; the blocks after are
  // freed now, unnamed. The reservation keeps its references. Errors:
  // NotFound, InvalidArgument (filled out of range, completed twice).
  Status CompleteReservation(uint64_t id, int32_t filled);
  // Drops the reservation's references (its continuation took its own, or
  // it is abandoned: unnamed blocks become free). Unknown ids are ignored.
  void ReleaseReservation(uint64_t id);
  // Releases the reservations whose expiry passed; returns how many.
  size_t ExpireReservations();
  size_t num_reservations() const { return reservations_.size(); }
  // Reservation `id` as Reserve answered it (null when unknown); valid
  // until the next call that changes reservations.
  const Reservation* reservation(uint64_t id) const {
    auto it = reservations_.find(id);
    return it == reservations_.end() ? nullptr : &it->second.r;
  }

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
    // From AddRequest's `looked_up`: the lower hits' sources from block
    // hint_from on (has_hint false: ask the mover at the first Allocate).
    bool has_hint = false;
    int32_t hint_from = 0;
    std::vector<int> hint;
    int64_t keep_nanos = 0;  // how long its blocks are kept after each use (cache_ttl_seconds); 0 = no ask
  };
  // Clock time until which the request's blocks are kept if used now (0: no ask).
  int64_t KeepUntil(const Request& r) const { return r.keep_nanos > 0 ? clock_->NowNanos() + r.keep_nanos : 0; }
  // What the pool's policy is told of block k of the request when it is named.
  BlockPool::RegisterHints Hints(const Request& r, size_t k) const {
    BlockPool::RegisterHints h;
    h.depth = static_cast<int32_t>(k);
    h.chain_blocks = static_cast<int32_t>(r.prompt.size() / static_cast<size_t>(options_.block_size));
    h.parent = k > 0 ? &r.chain[k - 1] : nullptr;
    h.keep_until_nanos = KeepUntil(r);
    return h;
  }
  struct PendingLookup {
    std::vector<BlockHash> chain;
    size_t max_blocks = 0;
    size_t device_blocks = 0;  // device hits when submitted (the lower walk starts there)
    uint64_t mover_id = 0;
  };

  KvManager(const KvManagerOptions& options, Clock* clock, std::unique_ptr<EvictionPolicy> device_policy);
  int32_t MaxCachedBlocks(size_t prompt_tokens, size_t chain_blocks) const;
  size_t CountDeviceHits(std::span<const BlockHash> chain, size_t max_blocks) const;
  Result<AllocOutcome> TakePrefix(RequestId id, Request& r, int32_t num_tokens);
  // A load the mover finished: settles the request's prefix when it was the last.
  void OnLoadDone(const LoadDone& d);
  void FinishLoads(Request& r);
  // Lower sources found from block `from` on, as seen from `device` device
  // hits now: shifted when the device gained blocks since, none when it
  // lost some (the chain would have a gap).
  static std::vector<int> Rebase(size_t from, std::vector<int> src, size_t device);

  const KvManagerOptions options_;
  Clock* const clock_;
  BlockPool pool_;
  std::unordered_map<RequestId, Request> requests_;
  uint64_t next_epoch_ = 1;
  std::unordered_map<uint64_t, PendingLookup> lookups_;
  uint64_t next_lookup_ = 1;
  struct Reserved {
    Reservation r;
    size_t prompt_tokens = 0;
    int64_t expires_nanos = 0;
    bool completed = false;
  };
  std::unordered_map<uint64_t, Reserved> reservations_;  // kv_reservation.cc
  KvManagerStats stats_;  // queries, device and lower hits (the mover keeps the rest)
  KvEventLog* events_ = nullptr;
  // Destroyed first (see ~KvManager): its drain reports loads into requests_.
  // The policy the pool shares with an exclusive first lower tier, if any.
  std::shared_ptr<HierarchyPolicy> hierarchy_;
  std::unique_ptr<TierMover> mover_;
};

}  // namespace strata::kvcache
