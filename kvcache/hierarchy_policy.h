#pragma once
// One eviction policy over the device pool and the lower tiers below it
// (issue 22; any write policy: exclusive, write-back, write-through): the
// tiers rank their blocks as one flat cache would, so a policy's gains
// over LRU (s3fifo, freq, learned) carry into the hierarchy.
//
// With per-tier policies a block demoted from the device arrives at the host
// tier as new: its uses on the device, and its place in the policy (S3-FIFO's
// small or main queue, GreedyDual's priority), are lost. Here one policy P,
// of capacity device + every tier's slots (and a little room for blocks in
// transit), ranks every block the tiers hold:
//   - a block the device names enters P, "held above" (SetAbove): ranked,
//     its uses counted, never P's victim;
//   - the device still demotes its least recently used block (its own lru
//     over its slots: the device's decision is which block moves down, not
//     which block leaves the cache); so does every lower tier but the last
//     (its own lru over its slots: a host tier above a disk tier);
//   - a demoted block keeps its entry when a tier below stores it (in the
//     last tier the entry becomes a candidate), and when it is promoted;
//   - the last tier evicts P's victim among the blocks only it holds: in an
//     exclusive chain, the one block that leaves the hierarchy. Created
//     with `copies_first` (a write-through or write-back last tier; a
//     write-through one is then also handed the blocks the level above
//     drops that it lacks), it first evicts its copies of blocks a
//     tier above or the device holds, the one that became a copy longest
//     ago first: a copy costs nothing to drop while the block is above,
//     and comes back down when the level above drops it; so the last tier
//     holds what no tier above does, as an exclusive one, and still takes
//     every block when it is computed (docs/simulator.md, "Write-through
//     in the one policy").
// With `lru` in an exclusive hierarchy this is the same cache as before
// (every tier demotes in last-use order, which is P's order); with the
// others it is the flat policy of the total size, less what the upper
// tiers hold. Without copies_first, a last tier that holds copies of
// blocks above evicts those (least recently stored
// or read first, kept ones last) only when it holds nothing else.
//
// A block a tier drops that no tier holds and whose write into a tier
// below may come (queued, deferred or dropped) is in transit: held above,
// no tier's. Settle() forgets those whose write will not come.
//
// The views: DeviceView() is the BlockPool's policy (Insert = Register, Access
// = a prefix hit, Erase = eviction or flush); TierView(i) is lower tier i's
// (a HostStore, a DiskStore or the simulator's SimStore, through
// BlockStore::ReplaceEvictionPolicy), i = 0 the tier right below the
// device. Uses are counted once, on the device: the tiers' reads precede a
// load the device then names (a use there).
//
// Ownership: the views share the HierarchyPolicy (shared_ptr); the KvManager
// keeps one to call Settle.
// Thread-safety: none; the engine loop drives the pool, the tiers and Settle.

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "kvcache/eviction_policy.h"
#include "kvcache/lru_list.h"

namespace strata::kvcache {

class HierarchyPolicy : public std::enable_shared_from_this<HierarchyPolicy> {
 public:
  // The most lower tiers one policy spans.
  static constexpr size_t kMaxTiers = 4;

  // P is MakeEvictionPolicy(name, ...) over the device's and the tiers'
  // slots; tier_slots[i] is lower tier i's (i = 0 right below the device).
  // InvalidArgument for an unknown name, negative sizes, no tier or more
  // than kMaxTiers.
  static Result<std::shared_ptr<HierarchyPolicy>> Create(std::string_view name, int32_t device_slots,
                                                         std::vector<int32_t> tier_slots,
                                                         bool copies_first = false);
  // One lower tier.
  static Result<std::shared_ptr<HierarchyPolicy>> Create(std::string_view name, int32_t device_slots,
                                                         int32_t tier_slots) {
    return Create(name, device_slots, std::vector<int32_t>{tier_slots});
  }

  // The device pool's policy: lru over `device_slots` for demotion, and P.
  // Call once.
  std::unique_ptr<EvictionPolicy> DeviceView();
  // Lower tier i's policy over its tier_slots[i]: P's victims for the last
  // tier, its own lru for the others. Call once per tier.
  std::unique_ptr<EvictionPolicy> TierView(size_t tier = 0);
  size_t num_tiers() const { return tiers_.size(); }

  // Forgets the blocks in transit for which `write_pending(key)` is false
  // (their write-back was dropped or failed). Cheap when none is in transit.
  void Settle(const std::function<bool(uint64_t key)>& write_pending);
  // From now on the last tier keeps its copies of blocks held above: it
  // evicts P's victim among the blocks only it holds first, and a copy
  // (least recently stored or read first) only when it holds nothing else,
  // as without copies_first. A graceful stop calls it before writing the
  // device's and upper tiers' blocks into the last tier
  // (TierMover::WriteDown): those copies are then what a restart keeps.
  // Idempotent.
  void KeepCopies();
  // Blocks in transit now.
  size_t in_transit() const { return num_in_transit_; }
  const EvictionPolicy& policy() const { return *p_; }
  // Audits the entries against both views' slots and P. For tests.
  Status CheckConsistency() const;

 private:
  friend class HierarchyDeviceView;
  friend class HierarchyTierView;
  // `entries`: P's capacity (Create says why it is what it is).
  HierarchyPolicy(std::unique_ptr<EvictionPolicy> p, int32_t entries, int32_t device_slots,
                  const std::vector<int32_t>& tier_slots, bool copies_first);

  struct Entry {
    Entry() { tier_slot.fill(-1); }
    uint64_t key = 0;
    int32_t device_slot = -1;                   // -1: not on the device
    std::array<int32_t, kMaxTiers> tier_slot;  // per lower tier; -1: not in it
    bool in_transit = false;
    bool used = false;
  };
  struct Tier {
    std::vector<int32_t> entry;   // slot → entry (-1)
    std::vector<bool> evictable;  // the tier's own evictable state per slot
    bool view_made = false;
  };
  // The device named a block (slot `device_slot`): a new entry, or a use of
  // the entry its key has (loaded from the tier, recomputed while in transit).
  void DeviceNamed(int32_t device_slot, const BlockTraits& traits);
  void DeviceUsed(int32_t device_slot);
  void DeviceLeft(int32_t device_slot, bool evicted);
  void TierStored(size_t tier, int32_t tier_slot, const BlockTraits& traits, bool evictable);
  void TierLeft(size_t tier, int32_t tier_slot, bool evicted);
  // P may evict it: in the last tier only (not on the device, in no tier above).
  bool Candidate(const Entry& x) const;
  // Held by the device or by any tier.
  bool Held(const Entry& x) const;
  int32_t NewEntry(uint64_t key);
  void FreeEntry(int32_t e, bool evicted);
  void SetPlace(int32_t e);  // P's above flag from where the entry is, and UpdateCopy
  // copies_first: whether the entry's last-tier slot is an evictable copy
  // of a block held above, in copies_ (least recently made one first).
  void UpdateCopy(int32_t e);
  BlockTraits Translate(const BlockTraits& traits, const std::vector<int32_t>& slot_entry) const;

  std::unique_ptr<EvictionPolicy> p_;
  std::vector<Entry> entries_;
  std::vector<int32_t> free_entries_;
  std::unordered_map<uint64_t, int32_t> by_key_;
  std::vector<int32_t> device_entry_;  // device slot → entry (-1)
  std::vector<Tier> tiers_;             // the lower tiers, nearest first
  std::vector<int32_t> transit_;       // entries in transit (may hold stale ones: checked)
  size_t num_in_transit_ = 0;
  void SetInTransit(int32_t e, bool in_transit);
  bool device_view_made_ = false;
  bool copies_first_ = false;
  LruList copies_;  // copies_first: the last tier's evictable slots whose block is held above
};

}  // namespace strata::kvcache
