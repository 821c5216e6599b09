#pragma once
// A tier below the device pool that stores whole KV blocks by hash: host DRAM,
// local disk, later remote nodes. One block = every layer's K and V for
// `block_size` tokens in the block-major layout, so a block moves as one
// buffer. All I/O is asynchronous: Submit* queues work and returns at once;
// the engine loop calls Poll() between steps and never blocks on I/O.
//
// Identity: a block is named by its chained BlockHash (DESIGN.md decision 2),
// which already folds in the model namespace; stores also record the
// namespace digest so that flush-by-namespace and the disk index's foreign
// namespace check work.
//
// Thread-safety: a store is driven by one thread (the mover); Contains and
// CountPrefix may be called from that same thread only.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/memory_segment.h"
#include "common/sha256.h"
#include "common/status.h"
#include "kvcache/eviction_policy.h"
#include "kvcache/tier_kind.h"

namespace strata::kvcache {

struct StoreCompletion {
  uint64_t tag = 0;  // the caller's tag from Submit*
  Status status;     // OK, or why the block is a miss / was not stored
  // A write the store declined, nothing having failed: its admission policy
  // said no, or every slot was busy with reads or writes in flight (status
  // says which, kResourceExhausted). The block is not stored; callers count
  // it apart from failed writes.
  bool refused = false;
};

struct StoreStats {
  uint64_t capacity_bytes = 0;
  uint64_t used_bytes = 0;
  uint64_t blocks = 0;
  uint64_t evictions = 0;
  uint64_t corrupt_blocks = 0;  // checksum mismatch, truncated slab, bad index entry
  uint64_t write_errors = 0;    // ENOSPC, EIO, ...
  std::string eviction_policy;  // kvcache/eviction_policy.h name; empty for tiers that evict nothing (remote)
  PolicyStats policy;           // its decisions (a store without a policy object fills what it counts)
};

class BlockStore {
 public:
  // Unregisters the store's own segments (as Detach, without the hook).
  virtual ~BlockStore();
  virtual std::string_view name() const = 0;  // "host", "disk", ...
  // What memory the store keeps blocks in (the API and metrics report
  // tiers by kind: kvcache/tier_kind.h).
  virtual TierKind kind() const = 0;
  // Memory: a store reads and writes regions (segment, offset, length) of
  // memory registered in a SegmentTable (common/memory_segment.h), never
  // bare pointers, so that device memory, pinned buffers or a peer's
  // registered memory can be named the same way. Attach binds the store to
  // the table its callers' regions are in and registers the store's own
  // memory there (the host tier's slot arena, the disk tier's bounce
  // buffers and its slab files as a kFile segment); Detach (or destroying
  // the store) unregisters them. REQUIRES: the table outlives the
  // attachment; a store is attached to one table at a time
  // (InvalidArgument otherwise).
  Status Attach(SegmentTable* segments);
  void Detach();
  SegmentTable* segments() const { return segments_; }
  // What this store registered at Attach, in order; empty when detached.
  const std::vector<SegmentId>& own_segments() const { return own_segments_; }
  virtual StoreStats stats() const = 0;

  virtual bool Contains(const BlockHash& h) const = 0;
  // How many leading hashes of `chain` the store holds (a prefix stops at the
  // first miss).
  virtual size_t CountPrefix(std::span<const BlockHash> chain) const = 0;

  // CountPrefix asked asynchronously, for a store whose index is not in
  // this process (a remote tier): the question is queued and its answer
  // comes from PollCountPrefix, tagged. A store whose index is local answers
  // at once: this default queues CountPrefix's answer for the next poll.
  // `chain` is valid only during the call: a store that answers later copies
  // what it needs (the asker may forget the question meanwhile).
  struct PrefixAnswer {
    uint64_t tag = 0;
    size_t blocks = 0;
  };
  virtual void SubmitCountPrefix(std::span<const BlockHash> chain, uint64_t tag) {
    answers_.push_back({tag, CountPrefix(chain)});
  }
  // Appends the answers ready now to `out`; returns how many. Never blocks.
  virtual size_t PollCountPrefix(std::vector<PrefixAnswer>* out) {
    const size_t n = answers_.size();
    out->insert(out->end(), answers_.begin(), answers_.end());
    answers_.clear();
    return n;
  }

  // Queues a copy of region `src` (block_bytes long, in the attached table)
  // under `h`. The store copies or finishes with `src` before the completion
  // for `tag` is polled; the caller keeps it registered and unchanged until
  // then. Storing an existing hash completes OK at once. A store that is
  // full evicts by its policy (LRU); one that cannot store completes with an
  // error (the block simply is not there later), marked `refused` when the
  // reason is room (every slot busy) or admission rather than a fault. A region the store cannot
  // reach (unregistered, out of bounds, the wrong length, memory of a kind
  // it cannot address such as device memory) is refused at once with an
  // error naming it, nothing queued. A queued write that Remove or Flush
  // overtakes completes with kCancelled (not a failure: the block was
  // wanted gone). Metadata-only stores take an empty Region{} (length 0)
  // and move no bytes.
  virtual Status SubmitWrite(const BlockHash& h, const Sha256Digest& ns, const Region& src, uint64_t tag) = 0;
  // Queues a read of `h` into region `dst` (block_bytes long, registered and
  // untouched by others until the completion is polled). A missing, corrupt
  // or foreign block completes with an error and leaves no partial data
  // considered valid. Refusals as SubmitWrite.
  virtual Status SubmitRead(const BlockHash& h, const Region& dst, uint64_t tag) = 0;
  // Appends finished operations to `out`; returns how many. Never blocks.
  virtual size_t Poll(std::vector<StoreCompletion>* out) = 0;
  // Blocks until every submitted operation has completed (shutdown, tests).
  virtual void Drain(std::vector<StoreCompletion>* out) = 0;

  // Called by a store that evicts a block to make room (its LRU policy),
  // with the region of its own registered memory the block's bytes are in
  // (Region{} in metadata-only stores), before they are overwritten; the
  // listener must copy what it needs before returning and must not call back
  // into this store. The KV manager uses it to pass host evictions on to a
  // write-back disk tier. Stores without eviction ignore it.
  using EvictionListener = std::function<void(const BlockHash& h, const Region& data)>;
  virtual void SetEvictionListener(EvictionListener listener) { (void)listener; }

  virtual Status Remove(const BlockHash& h) = 0;
  // Removes every block of namespace `ns` (all when ns is null).
  virtual Status Flush(const Sha256Digest* ns) = 0;

  // Change listener (the cluster index's publisher, kvcache/kv_event_log.h):
  // called on the driving thread with (hash, true) when a block becomes
  // readable in the store and (hash, false) when it stops being (evicted,
  // removed, flushed, found corrupt). Installing it first reports every
  // block held now as stored. Must not call back into the store. Stores
  // that cannot report changes (a remote tier) never call it.
  using ChangeListener = std::function<void(const BlockHash& h, bool stored)>;
  void SetChangeListener(ChangeListener listener);

  // Serving blocks to peers (the cluster pool's holder side). Where a held
  // block's bytes are: a region of the store's own registered memory and the
  // XXH3-64 checksum of those bytes taken when the block was stored.
  // Stores whose bytes are not in addressable memory (disk, remote) answer
  // nullopt.
  struct BlockLocation {
    Region region;
    uint64_t checksum = 0;
  };
  virtual std::optional<BlockLocation> Locate(const BlockHash& h) const {
    (void)h;
    return std::nullopt;
  }
  // Pins a held block: until the matching Unpin it is neither evicted nor
  // moved (a Remove or Flush meanwhile drops it from the index, but its
  // bytes stay untouched until the last Unpin). False when not held or the
  // store cannot pin. Pins nest.
  virtual bool Pin(const BlockHash& h) {
    (void)h;
    return false;
  }
  virtual void Unpin(const BlockHash& h) { (void)h; }
  // Every block held now, the one the store would evict next first (blocks
  // it may not evict now, pinned ones, last): a graceful stop writes the
  // tiers above a disk down in this order (TierMover::WriteDown). Default:
  // none (stores whose bytes a caller cannot Locate).
  virtual std::vector<BlockHash> HeldInEvictionOrder() const { return {}; }
  // A use of held block `h` that is not a read: its recency moves to now
  // (persisted where the store keeps recency across restarts, the disk
  // tier). A graceful stop refreshes what it keeps in the disk, the least
  // valuable first, so that a restart evicts in that order. False when not
  // held. Default: nothing (false).
  virtual bool Refresh(const BlockHash& h) {
    (void)h;
    return false;
  }
  // A request asked `h` kept for `nanos` from now (its cache_ttl_seconds;
  // a duration, as the store may run on its own clock): the store evicts
  // other blocks first until then. Called after SubmitWrite(h) or a read of
  // h; a store whose writes complete later remembers it for when the block
  // arrives. Never shortens an earlier ask. Default: ignored (stores that
  // evict nothing).
  virtual void KeepFor(const BlockHash& h, int64_t nanos) {
    (void)h;
    (void)nanos;
  }

  // A read rate measured from this store's own recent reads (bytes/s), for
  // the `auto` load policy; 0 = none measured (the configured estimate
  // stands).
  virtual double measured_read_bytes_per_s() const { return 0; }

  // Replaces the store's eviction policy with make(slots, name), where
  // `slots` is the store's slot count and `name` its current policy's (the
  // KvManager hands the lower tiers their views of the hierarchy's policy:
  // kvcache/hierarchy_policy.h). An error make returns is returned, and the
  // policy is kept. Host and simulated tiers: only while the store holds
  // nothing; a disk tier also when it holds blocks (they enter the new
  // policy in the old one's order). Unsupported otherwise, and (the
  // default) for a store whose policy cannot be replaced.
  using PolicyFactory =
      std::function<Result<std::unique_ptr<EvictionPolicy>>(int32_t slots, std::string_view name)>;
  virtual Status ReplaceEvictionPolicy(const PolicyFactory& make) {
    (void)make;
    return Status::Unsupported(std::string(name()) + " tier: its eviction policy cannot be replaced");
  }

 protected:
  BlockStore() = default;
  BlockStore(const BlockStore&) = delete;
  BlockStore& operator=(const BlockStore&) = delete;
  // Registers the store's own memory through Own() (called by Attach; the
  // default registers nothing).
  virtual Status RegisterMemory() { return Status::Ok(); }
  // Called by Detach before the store's own segments are unregistered (a
  // store wrapping another detaches the inner one here). Not called by the
  // base destructor's Detach, when the derived part is gone.
  virtual void UnregisterMemory() {}
  // For stores that report changes (see SetChangeListener).
  void NotifyChanged(const BlockHash& h, bool stored) const {
    if (change_listener_) change_listener_(h, stored);
  }
  // Every block held now, for SetChangeListener's first report (default:
  // none).
  virtual std::vector<BlockHash> HeldBlocks() const { return {}; }
  // Registers [base, base + size) of `kind` in the attached table as the
  // store's; returns its id.
  Result<SegmentId> Own(SegmentKind kind, uint8_t* base, uint64_t size, std::string name);
  // The host bytes of `r` for a block operation of `length` bytes: empty for
  // an empty region when `allow_empty` (metadata-only stores); else the
  // region must be in the attached table, `length` long and
  // host-addressable. Errors name the store and the region.
  Result<std::span<uint8_t>> HostBytes(const Region& r, uint64_t length, bool allow_empty) const;

 private:
  std::vector<PrefixAnswer> answers_;  // the default SubmitCountPrefix's
  ChangeListener change_listener_;
  SegmentTable* segments_ = nullptr;
  std::vector<SegmentId> own_segments_;
};

}  // namespace strata::kvcache
