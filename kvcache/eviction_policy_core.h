#pragma once
// The bookkeeping every eviction policy shares (internal to
// kvcache/eviction_policy*.cc): slot states, chain links, kept blocks
// (keep_until), statistics. A policy derives from PolicyCore and keeps its
// own structure over the slots "in the policy" (evictable and not kept),
// told through the hooks below.
//
// Thread-safety: none (EvictionPolicy's rule).

#include <cstdint>
#include <set>
#include <tuple>
#include <utility>
#include <vector>

#include "kvcache/eviction_policy.h"
#include "kvcache/lru_list.h"

namespace strata::kvcache::policy_internal {

class PolicyCore : public EvictionPolicy {
 public:
  explicit PolicyCore(int32_t capacity);

  bool Admit(const BlockTraits& traits) final;
  void Insert(int32_t slot, const BlockTraits& traits, bool evictable) final;
  void Access(int32_t slot) final;
  void SetEvictable(int32_t slot, bool evictable) final;
  void Erase(int32_t slot, bool evicted) final;
  int32_t Victim() final;
  void KeepUntil(int32_t slot, int64_t until_nanos) final;
  int64_t keep_until(int32_t slot) const final { return s(slot).held ? s(slot).keep_until : 0; }

  bool held(int32_t slot) const final { return s(slot).held; }
  bool evictable(int32_t slot) const final { return s(slot).evictable; }
  int32_t num_evictable() const final { return num_evictable_; }
  std::vector<int32_t> Order() const final;
  const PolicyStats& stats() const final { return stats_; }
  Status CheckConsistency() const final;
  void SetNow(int64_t now_nanos) final { now_ = now_nanos; }
  void SetAbove(int32_t slot, bool above) final;
  bool above(int32_t slot) const final { return s(slot).held && s(slot).above; }

 protected:
  struct Slot {
    bool held = false;
    bool evictable = false;
    bool in_policy = false;  // evictable and not kept: the derived policy holds it
    bool kept = false;       // evictable, keep_until in the future
    bool had_keep = false;
    bool above = false;      // SetAbove: ranked, never the victim
    int32_t depth = -1;
    int32_t chain_blocks = -1;
    int32_t parent = -1;
    uint32_t parent_gen = 0;
    int32_t children = 0;  // held slots whose parent this is
    uint32_t gen = 0;      // bumped at every Insert
    uint32_t hits = 0;  // accesses since stored
    uint32_t seen = 0;  // uses of its key, before and while held (the frequency history, aged)
    uint64_t key = 0;
    uint64_t last = 0;  // tick of the last insert, access or release
    int64_t keep_until = 0;
  };
  const Slot& s(int32_t slot) const { return slots_[static_cast<size_t>(slot)]; }
  int32_t capacity() const { return static_cast<int32_t>(slots_.size()); }
  uint64_t tick() const { return tick_; }
  // Estimated uses of `key` in the recent history (stores and hits, held or
  // not), from a count-min sketch of 4-bit counters halved every
  // 10 × capacity records (TinyLFU's aging).
  uint32_t Frequency(uint64_t key) const;
  // Whether Pick may return the slot (not held above: SetAbove). Every Pick
  // skips the slots it may not return, leaving them in place.
  bool pickable(int32_t slot) const { return !s(slot).above; }
  // The first slot of `list` from its front that Pick may return, or
  // LruList::kNone.
  int32_t FirstPickable(const LruList& list) const {
    int32_t i = list.Front();
    while (i != LruList::kNone && !pickable(i)) i = list.Next(i);
    return i;
  }

  // The slot entered the policy (evictable; its `last` is current) / left
  // it (before Erase, or referenced/pinned again).
  virtual void Enter(int32_t slot) = 0;
  virtual void Leave(int32_t slot) = 0;
  // A hit on a slot in the policy; `last` and `hits` are already updated,
  // `old_last` is what last was before.
  virtual void Touched(int32_t slot, uint64_t old_last) { (void)slot, (void)old_last; }
  // Whether the slot has held children changed (0 ↔ some) while in the policy.
  virtual void LeafChanged(int32_t slot) { (void)slot; }
  // Every Access, in or out of the policy, before hits and last change.
  virtual void OnAccess(int32_t slot) { (void)slot; }
  virtual void OnInsert(int32_t slot) { (void)slot; }
  // Before the slot's state is cleared (and after Leave when it was in the
  // policy: `was_in_policy`; false for a kept or not evictable slot).
  virtual void OnErase(int32_t slot, bool evicted, bool was_in_policy) { (void)slot, (void)evicted, (void)was_in_policy; }
  virtual bool AdmitBlock(const BlockTraits& traits) { (void)traits; return true; }
  // A victim among the slots in the policy that are pickable, or -1 when
  // it holds none.
  virtual int32_t Pick() = 0;
  // The slots in the policy, next victim first.
  virtual std::vector<int32_t> PolicyOrder() const = 0;
  virtual int32_t policy_size() const = 0;
  virtual Status CheckPolicy() const { return Status::Ok(); }

 private:
  Slot& m(int32_t slot) { return slots_[static_cast<size_t>(slot)]; }
  void Park(int32_t slot);    // evictable: into the policy or kept
  void Unpark(int32_t slot);  // out of both
  void ExpireKept();
  void ChildCount(int32_t parent, uint32_t parent_gen, int delta);
  void Record(uint64_t key);
  size_t SketchIndex(uint64_t key, int row) const;

  std::vector<Slot> slots_;
  // Kept slots by (keep_until, last use, slot): the soonest to expire first,
  // and within one request's chain (one keep_until) its tail first.
  std::set<std::tuple<int64_t, uint64_t, int32_t>> kept_;
  int32_t num_evictable_ = 0;
  uint64_t tick_ = 0;
  int64_t now_ = 0;
  PolicyStats stats_;
  std::vector<uint8_t> sketch_;  // 4 rows of sketch_width_ counters
  size_t sketch_width_ = 0;      // a power of two
  uint64_t records_ = 0, reset_every_ = 0;
};

}  // namespace strata::kvcache::policy_internal
