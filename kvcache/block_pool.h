#pragma once
// The device tier's block pool: reference counts and the prefix index over the
// N blocks of the KV pool the backend computes on (ForwardEngine's pool, later
// GPU HBM). Metadata only: it never touches block bytes, so the simulator can
// run it over pools far larger than memory.
//
// States of a block:
//   in use    ref > 0. Never handed out again, never evicted, never rewritten
//             by anyone but its owners.
//   free      ref == 0, no hash: holds nothing worth keeping; reused first.
//   cached    ref == 0, has a hash: evictable; the pool's eviction policy
//             (kvcache/eviction_policy.h; LRU by default: least recently
//             released first) picks which cached block is reused next, and
//             then its hash leaves the prefix index (an eviction).
// A block in use may also have a hash (a full block registered by Register()).
//
// Chains: every user of a block also holds all of its ancestors in the chain
// (a request's prefix), and requests release their blocks tail first
// (KvManager::Free does), so a chain's tail always enters the LRU before its
// head and is evicted first (lru; leaf_lru promises it for any order).
//
// Eviction hook: set_evict_hook(fn) has Allocate() call fn(id, hash) for
// every cached block it evicts, just before the block is handed out (its
// bytes still hold the evicted contents; the hook must not call back into the
// pool, except const queries such as keep_until). EvictAllCached (operator flush) does not call it: a flush discards.
//
// Thread-safety: none; one thread (the engine loop) owns the pool.

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <unordered_map>
#include <vector>

#include "common/sha256.h"
#include "common/status.h"
#include "common/strong_id.h"
#include "kvcache/block_hash.h"
#include "kvcache/kv_stats.h"
#include "kvcache/eviction_policy.h"

namespace strata::kvcache {

class BlockPool {
 public:
  using EvictHook = std::function<void(BlockId, const BlockHash&)>;

  // REQUIRES: num_blocks >= 0. `policy` null = lru; else one made for
  // num_blocks slots (MakeEvictionPolicy).
  explicit BlockPool(int32_t num_blocks, std::unique_ptr<EvictionPolicy> policy = nullptr);

  // See the top of this file; an empty function removes the hook.
  void set_evict_hook(EvictHook hook) { evict_hook_ = std::move(hook); }
  // Called with (hash, true) when a block enters the prefix index
  // (Register) and (hash, false) when it leaves it (eviction, flush): what
  // the cluster index is told (kvcache/kv_event_log.h). Must not call back
  // into the pool. An empty function removes it.
  using ChangeHook = std::function<void(const BlockHash&, bool named)>;
  void set_change_hook(ChangeHook hook) { change_hook_ = std::move(hook); }
  // Every hash in the prefix index now (unordered).
  std::vector<BlockHash> Hashes() const;

  int32_t num_blocks() const { return static_cast<int32_t>(ref_.size()); }
  // Blocks Allocate() can hand out now (free + cached).
  int32_t num_allocatable() const { return static_cast<int32_t>(free_.size()) + policy_->num_evictable(); }
  BlockPoolStats stats() const;

  // Appends `n` blocks to `out`, each with ref 1 and no hash: free blocks
  // first, then cached ones the policy picks (evicting them). All or
  // nothing: returns false and changes nothing when fewer than n are
  // allocatable ("not now").
  [[nodiscard]] bool Allocate(int32_t n, std::vector<BlockId>* out);

  // The block holding `h`, if any (in use or cached). Does not touch it.
  std::optional<BlockId> Lookup(const BlockHash& h) const;

  // Takes a reference. A cached block stops being evictable. Not a hit for
  // the policy by itself (the mover takes references too): see Hit.
  // REQUIRES: id < num_blocks(), and the block is in use or cached.
  void Ref(BlockId id);
  // A request reuses block `id` from the prefix index (in use by others or
  // cached): the policy counts a use. REQUIRES: has_hash(id).
  void Hit(BlockId id) { policy_->Access(static_cast<int32_t>(id.value())); }
  // Drops a reference; at zero the block becomes cached (evictable) if it
  // has a hash, else free. REQUIRES: ref(id) > 0.
  void Release(BlockId id);

  // Names the contents of an in-use block: it enters the prefix index. Returns
  // false (and leaves the block unnamed) when another block already holds `h`
  // (two requests computed the same block; the later copy stays private).
  // `hints` tell the policy where the block sits: its position in the chain,
  // the chain's previous block (when this pool names it), how long the
  // request asked it to be kept.
  // REQUIRES: ref(id) > 0 and the block has no hash yet.
  struct RegisterHints {
    int32_t depth = -1;
    int32_t chain_blocks = -1;  // full blocks of the request's prompt
    const BlockHash* parent = nullptr;
    int64_t keep_until_nanos = 0;
  };
  [[nodiscard]] bool Register(BlockId id, const BlockHash& h, const RegisterHints& hints);
  [[nodiscard]] bool Register(BlockId id, const BlockHash& h) { return Register(id, h, RegisterHints{}); }

  const EvictionPolicy& policy() const { return *policy_; }
  // A request that reused block `id` asks it kept until `until_nanos`
  // (cache_ttl_seconds; never lowers an earlier ask). REQUIRES: has_hash(id).
  void KeepUntil(BlockId id, int64_t until_nanos) {
    policy_->KeepUntil(static_cast<int32_t>(id.value()), until_nanos);
  }
  int64_t keep_until(BlockId id) const { return policy_->keep_until(static_cast<int32_t>(id.value())); }
  // Sets the time keep_until is compared with (kvcache::Clock nanoseconds).
  void SetNow(int64_t now_nanos) { policy_->SetNow(now_nanos); }

  int32_t ref(BlockId id) const { return ref_[id.value()]; }
  bool has_hash(BlockId id) const { return hashed_[id.value()]; }
  const BlockHash& hash(BlockId id) const { return hash_[id.value()]; }

  // Drops the hashes of all cached blocks (they become free). Blocks in use
  // keep theirs. Returns how many were dropped (counted as evictions).
  int32_t EvictAllCached();

  // The cached blocks in eviction order (front = next victim). O(cached);
  // for `strata cache` diagnostics and tests.
  std::vector<BlockId> EvictionOrder() const;
  // Audits every invariant above (ref counts vs lists vs index). O(N); for
  // tests and debug checks.
  Status CheckConsistency() const;

 private:
  void DropHash(int32_t i);

  std::vector<int32_t> ref_;
  std::vector<bool> hashed_;
  std::vector<BlockHash> hash_;
  std::vector<int32_t> free_;  // stack of free (unhashed, unreferenced) blocks
  std::unique_ptr<EvictionPolicy> policy_;  // over the cached blocks
  std::unordered_map<BlockHash, int32_t, BlockHashHasher> index_;
  uint64_t evictions_ = 0;
  EvictHook evict_hook_;
  ChangeHook change_hook_;
};

}  // namespace strata::kvcache
