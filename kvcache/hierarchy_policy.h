#pragma once
// One eviction policy over the device pool and the host tier below it
// (issue 22; any write policy: exclusive, write-back, write-through): the
// two tiers rank their blocks as one flat cache would, so a policy's gains
// over LRU (s3fifo, freq, learned) carry into the hierarchy.
//
// With per-tier policies a block demoted from the device arrives at the host
// tier as new: its uses on the device, and its place in the policy (S3-FIFO's
// small or main queue, GreedyDual's priority), are lost. Here one policy P,
// of capacity device + tier slots (and a little room for blocks in transit), ranks
// every block the two tiers hold:
//   - a block the device names enters P, "held above" (SetAbove): ranked,
//     its uses counted, never P's victim;
//   - the device still demotes its least recently used block (its own lru
//     over its slots: the device's decision is which block moves down, not
//     which block leaves the cache);
//   - the demoted block keeps its entry when the tier stores it (the entry
//     becomes a candidate), and when it is promoted back to the device;
//   - the tier evicts P's victim among the blocks only it holds: the one
//     block that leaves the hierarchy.
// With `lru` in an exclusive hierarchy this is the same cache as before
// (the device demotes in last-use order, which is P's order); with the
// others it is the flat policy of the total size, less what the device
// pins. Under write-through a tier may hold copies of device blocks: it
// evicts those (least recently stored or read first, kept ones last) only
// when it holds nothing else.
//
// A block the device evicts and the tier has not stored yet (its write-back
// is queued, deferred or dropped) is in transit: held above, neither tier's.
// Settle() forgets those whose write will not come.
//
// The views: DeviceView() is the BlockPool's policy (Insert = Register, Access
// = a prefix hit, Erase = eviction or flush); TierView() is the tier's (a
// HostStore or the simulator's SimStore, through BlockStore::
// ReplaceEvictionPolicy). Uses are counted once, on the device: the tier's
// reads precede a load the device then names (a use there).
//
// Ownership: the views share the HierarchyPolicy (shared_ptr); the KvManager
// keeps one to call Settle.
// Thread-safety: none; the engine loop drives the pool, the tier and Settle.

#include <cstdint>
#include <functional>
#include <memory>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "kvcache/eviction_policy.h"

namespace strata::kvcache {

class HierarchyPolicy : public std::enable_shared_from_this<HierarchyPolicy> {
 public:
  // P is MakeEvictionPolicy(name, ...) over the device's and the tier's
  // slots. InvalidArgument for an unknown name or negative sizes.
  static Result<std::shared_ptr<HierarchyPolicy>> Create(std::string_view name, int32_t device_slots,
                                                         int32_t tier_slots);

  // The device pool's policy: lru over `device_slots` for demotion, and P.
  // Call once.
  std::unique_ptr<EvictionPolicy> DeviceView();
  // The tier's policy over its `tier_slots`. Call once.
  std::unique_ptr<EvictionPolicy> TierView();

  // Forgets the blocks in transit for which `write_pending(key)` is false
  // (their write-back was dropped or failed). Cheap when none is in transit.
  void Settle(const std::function<bool(uint64_t key)>& write_pending);
  // Blocks in transit now.
  size_t in_transit() const { return num_in_transit_; }
  const EvictionPolicy& policy() const { return *p_; }
  // Audits the entries against both views' slots and P. For tests.
  Status CheckConsistency() const;

 private:
  friend class HierarchyDeviceView;
  friend class HierarchyTierView;
  // `entries`: P's capacity (Create says why it is what it is).
  HierarchyPolicy(std::unique_ptr<EvictionPolicy> p, int32_t entries, int32_t device_slots, int32_t tier_slots);

  struct Entry {
    uint64_t key = 0;
    int32_t device_slot = -1;  // -1: not on the device
    int32_t tier_slot = -1;    // -1: not in the tier
    bool in_transit = false;
    bool used = false;
  };
  // The device named a block (slot `device_slot`): a new entry, or a use of
  // the entry its key has (loaded from the tier, recomputed while in transit).
  void DeviceNamed(int32_t device_slot, const BlockTraits& traits);
  void DeviceUsed(int32_t device_slot);
  void DeviceLeft(int32_t device_slot, bool evicted);
  void TierStored(int32_t tier_slot, const BlockTraits& traits, bool evictable);
  void TierLeft(int32_t tier_slot, bool evicted);
  int32_t NewEntry(uint64_t key);
  void FreeEntry(int32_t e, bool evicted);
  void SetPlace(int32_t e);  // P's above flag from where the entry is
  BlockTraits Translate(const BlockTraits& traits, const std::vector<int32_t>& slot_entry) const;

  std::unique_ptr<EvictionPolicy> p_;
  std::vector<Entry> entries_;
  std::vector<int32_t> free_entries_;
  std::unordered_map<uint64_t, int32_t> by_key_;
  std::vector<int32_t> device_entry_;  // device slot → entry (-1)
  std::vector<int32_t> tier_entry_;    // tier slot → entry (-1)
  std::vector<bool> tier_evictable_;   // the tier's own evictable state per slot
  std::vector<int32_t> transit_;       // entries in transit (may hold stale ones: checked)
  size_t num_in_transit_ = 0;
  void SetInTransit(int32_t e, bool in_transit);
  bool device_view_made_ = false, tier_view_made_ = false;
};

}  // namespace strata::kvcache
