#pragma once
// Eviction and admission policies of the KV cache (issue 22): which cached
// block a full tier gives up, and whether a lower tier stores a block at
// all. One policy object serves one tier: the device BlockPool and each
// lower BlockStore (HostStore, the simulator's SimStore) hold one, so
// `strata serve` and `strata bench simulate` run the same code.
//
// The tier owns the slots (dense indices [0, capacity)) and tells the policy
// what happens to them:
//   Insert      a slot now holds a named block (evictable or not yet)
//   Access      a hit on a held block (a lookup that reuses it, a read, a
//               rewrite of a held hash)
//   SetEvictable a held block becomes evictable (the device pool: its last
//               reference dropped; a store: unpinned) or stops being so
//               (referenced again, pinned)
//   Erase       the slot no longer holds the block: evicted (after Victim)
//               or removed (flush, Remove, a failed write)
// and asks Victim() for the evictable slot to give up next. Victim never
// returns a slot that is not evictable (referenced or pinned blocks are
// never evicted) and does not erase it: the tier evicts, then calls Erase.
//
// Policies (names as in kv.eviction_policy):
//   lru        least recently used (released, read or written); the
//              default. A request's blocks are released tail first, so a
//              chain's tail is evicted before its head.
//   leaf_lru   least recently used among blocks none of whose chain
//              successors is cached (radix-tree leaves): a chain is
//              evicted from its tail, always. Needs BlockTraits::parent;
//              without it (unknown parents) it is lru.
//   s3fifo     S3-FIFO (Yang et al., SOSP'23): new blocks enter a small
//              FIFO (10% of the evictable blocks); those hit again move to
//              a main FIFO with a 2-bit use counter (second chance); a block
//              evicted from the small FIFO is remembered in a ghost list of
//              keys, and comes back straight into the main FIFO.
//   freq       frequency and recency over the prefix tree: GreedyDual with
//              value 1 + hits (a hit on a block is a hit on every block
//              before it in its chain, so heads accumulate the subtree's
//              hits); ties by recency, leaves before their parents.
//   learned    a reuse predictor trained online from the tier's own
//              history, in the spirit of "learning relaxed Belady" (Song
//              et al., NSDI'20) and LHD (Beckmann et al., NSDI'18). Blocks
//              are classed by features: uses of their key so far (a
//              frequency sketch that outlives eviction), the length of the
//              prompt they came from, and their distance from its end. Per
//              class the policy learns how likely a block is to be used
//              again within a horizon (16 × capacity ticks): from hits, and
//              from misses on keys it evicted lately (a ghost list, so
//              reuses after the eviction are seen too); keys not used
//              again within the horizon count as never. The victim is the
//              block with the largest age ÷ P(reuse | class), among a
//              sample of 64 evictable leaves (blocks whose chain
//              successors are not cached): LRU when every class is alike,
//              and a class rarely used again ages faster.
// No constant comes from a particular trace: sizes scale with the tier's
// capacity.
//
// Thread-safety: none; the tier's owner thread drives its policy.

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace strata::kvcache {

// What a tier knows about a block when it stores it.
struct BlockTraits {
  uint64_t key = 0;     // a 64-bit digest of the block hash (ghost lists)
  int32_t depth = -1;   // position in its chain (0 = the first block); -1 = unknown
  int32_t parent = -1;  // slot of the chain's previous block in this tier; -1 = none or unknown
  int32_t chain_blocks = -1;  // full blocks of the prompt it came from; -1 = unknown
  // Set by a request that asked its prefix to be kept (cache_ttl_seconds):
  // Clock nanoseconds until which the block is preferred over every block
  // without one; 0 = none.
  int64_t keep_until_nanos = 0;
};

// Counts of a policy's decisions since it was made.
struct PolicyStats {
  uint64_t inserted = 0;  // blocks stored
  uint64_t rejected = 0;  // Admit() said no
  uint64_t hits = 0;      // Access calls
  uint64_t evicted = 0;   // Erase(evicted = true)
  uint64_t removed = 0;   // Erase(evicted = false)
  uint64_t evicted_unused = 0;   // evicted without a hit since stored
  uint64_t evicted_expired = 0;  // evicted after its keep_until passed (cache_ttl_seconds)
  uint64_t evicted_kept = 0;     // evicted before its keep_until: nothing else was evictable
};

class EvictionPolicy {
 public:
  virtual ~EvictionPolicy() = default;
  virtual std::string_view name() const = 0;

  // Whether a lower tier should store a block it does not hold (true =
  // store). Counted in stats().rejected when false.
  virtual bool Admit(const BlockTraits& traits) = 0;
  // REQUIRES: slot in [0, capacity), not held.
  virtual void Insert(int32_t slot, const BlockTraits& traits, bool evictable) = 0;
  // REQUIRES: slot held.
  virtual void Access(int32_t slot) = 0;
  // REQUIRES: slot held. Setting the current state again does nothing.
  virtual void SetEvictable(int32_t slot, bool evictable) = 0;
  // REQUIRES: slot held. It is no longer held afterwards.
  virtual void Erase(int32_t slot, bool evicted) = 0;
  // The evictable slot to evict next, or -1 when none is evictable.
  virtual int32_t Victim() = 0;
  // Raises the slot's keep_until to `until_nanos` (never lowers it): a
  // request reused the block and asked it kept. REQUIRES: slot held.
  virtual void KeepUntil(int32_t slot, int64_t until_nanos) = 0;
  virtual int64_t keep_until(int32_t slot) const = 0;  // 0 for a slot not held

  virtual bool held(int32_t slot) const = 0;
  virtual bool evictable(int32_t slot) const = 0;
  virtual int32_t num_evictable() const = 0;
  // Evictable slots, the next victim first (sampled policies: by their
  // current score; ties and sampling make it approximate). O(n log n).
  virtual std::vector<int32_t> Order() const = 0;
  virtual const PolicyStats& stats() const = 0;
  // Audits the policy's own lists against its slot states. For tests.
  virtual Status CheckConsistency() const = 0;

  // The time keep_until_nanos is compared with (kvcache::Clock
  // nanoseconds); the tier sets it before it asks for victims. A block kept
  // until a later time is evicted only when no other block is evictable.
  virtual void SetNow(int64_t now_nanos) = 0;

  // The block is held by a tier above the ones this policy evicts from (a
  // policy over a whole hierarchy, kvcache/hierarchy_policy.h: the device
  // holds it). It keeps its place in the ranking and its uses count, but
  // Victim never returns it. REQUIRES: slot held. Setting the current state
  // again does nothing.
  virtual void SetAbove(int32_t slot, bool above) = 0;
  virtual bool above(int32_t slot) const = 0;  // false for a slot not held
};

// The default of kv.eviction_policy, of every tier, and of the simulator:
// the one policy measured at least as good as lru on the shared trace at
// every size, flat and in every hierarchy (docs/simulator.md).
inline constexpr const char* kDefaultEvictionPolicy = "s3fifo";

// "lru", "leaf_lru", "s3fifo", "freq", "learned".
const std::vector<std::string>& EvictionPolicyNames();
bool IsEvictionPolicy(std::string_view name);
// A policy for a tier of `capacity` slots. InvalidArgument for an unknown
// name (the message lists the known ones).
Result<std::unique_ptr<EvictionPolicy>> MakeEvictionPolicy(std::string_view name, int32_t capacity);

}  // namespace strata::kvcache
