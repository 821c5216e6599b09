#include "kvcache/hierarchy_policy.h"

#include <cassert>
#include <string>

#include "kvcache/lru_list.h"

namespace strata::kvcache {

// ------------------------------------------------------------------ views

// The device pool's policy: its own lru decides which block moves down;
// every event also reaches P.
class HierarchyDeviceView final : public EvictionPolicy {
 public:
  HierarchyDeviceView(std::shared_ptr<HierarchyPolicy> h, std::unique_ptr<EvictionPolicy> lru)
      : h_(std::move(h)), lru_(std::move(lru)) {}
  std::string_view name() const override { return h_->p_->name(); }
  bool Admit(const BlockTraits&) override { return true; }
  void Insert(int32_t slot, const BlockTraits& traits, bool evictable) override {
    lru_->Insert(slot, traits, evictable);
    h_->DeviceNamed(slot, traits);
    if (evictable) SetEvictable(slot, true);
  }
  void Access(int32_t slot) override {
    lru_->Access(slot);
    h_->DeviceUsed(slot);
  }
  void SetEvictable(int32_t slot, bool evictable) override {
    lru_->SetEvictable(slot, evictable);
    const int32_t e = h_->device_entry_[static_cast<size_t>(slot)];
    if (e >= 0) h_->p_->SetEvictable(e, evictable);
  }
  void Erase(int32_t slot, bool evicted) override {
    lru_->Erase(slot, evicted);
    h_->DeviceLeft(slot, evicted);
  }
  int32_t Victim() override { return lru_->Victim(); }
  void KeepUntil(int32_t slot, int64_t until_nanos) override {
    lru_->KeepUntil(slot, until_nanos);
    const int32_t e = h_->device_entry_[static_cast<size_t>(slot)];
    if (e >= 0) h_->p_->KeepUntil(e, until_nanos);
  }
  int64_t keep_until(int32_t slot) const override { return lru_->keep_until(slot); }
  bool held(int32_t slot) const override { return lru_->held(slot); }
  bool evictable(int32_t slot) const override { return lru_->evictable(slot); }
  int32_t num_evictable() const override { return lru_->num_evictable(); }
  std::vector<int32_t> Order() const override { return lru_->Order(); }
  const PolicyStats& stats() const override { return lru_->stats(); }
  Status CheckConsistency() const override {
    STRATA_RETURN_IF_ERROR(lru_->CheckConsistency());
    return h_->CheckConsistency();
  }
  void SetNow(int64_t now_nanos) override {
    lru_->SetNow(now_nanos);
    h_->p_->SetNow(now_nanos);
  }
  void SetAbove(int32_t, bool) override {}
  bool above(int32_t) const override { return false; }

 private:
  std::shared_ptr<HierarchyPolicy> h_;
  std::unique_ptr<EvictionPolicy> lru_;
};

// Lower tier i's policy. The last tier's victims are P's, among the blocks
// only it holds; a tier above another demotes its least recently stored or
// read block (the blocks below it are P's to rank).
class HierarchyTierView final : public EvictionPolicy {
 public:
  HierarchyTierView(std::shared_ptr<HierarchyPolicy> h, size_t tier, int32_t slots)
      : h_(std::move(h)),
        tier_(tier),
        last_(tier + 1 == h_->tiers_.size()),
        hits_since_stored_(static_cast<size_t>(slots), 0),
        fallback_(slots) {}
  std::string_view name() const override { return h_->p_->name(); }
  bool Admit(const BlockTraits& traits) override {
    const bool ok = h_->p_->Admit(traits);
    if (!ok) ++stats_.rejected;
    return ok;
  }
  void Insert(int32_t slot, const BlockTraits& traits, bool evictable) override {
    h_->TierStored(tier_, slot, traits, evictable);
    hits_since_stored_[static_cast<size_t>(slot)] = 0;
    num_evictable_ += evictable;
    if (evictable) fallback_.PushBack(slot);
    ++stats_.inserted;
  }
  // A read or a rewrite: counted here, not in P (the device counts the use
  // when it names the loaded block).
  void Access(int32_t slot) override {
    ++hits_since_stored_[static_cast<size_t>(slot)];
    ++stats_.hits;
    if (fallback_.Contains(slot)) fallback_.Touch(slot);
  }
  void SetEvictable(int32_t slot, bool evictable) override {
    const size_t u = static_cast<size_t>(slot);
    auto& t = tier();
    if (t.evictable[u] == evictable) return;
    num_evictable_ += evictable ? 1 : -1;
    t.evictable[u] = evictable;
    if (evictable) {
      fallback_.PushBack(slot);
    } else {
      fallback_.Remove(slot);
    }
    h_->SetPlace(t.entry[u]);
  }
  void Erase(int32_t slot, bool evicted) override {
    const size_t u = static_cast<size_t>(slot);
    if (tier().evictable[u]) --num_evictable_;
    if (fallback_.Contains(slot)) fallback_.Remove(slot);
    if (evicted) {
      ++stats_.evicted;
      if (hits_since_stored_[u] == 0) ++stats_.evicted_unused;
      const int32_t e = tier().entry[u];
      const int64_t keep = e < 0 ? 0 : h_->p_->keep_until(e);
      if (keep > 0) ++(keep <= now_ ? stats_.evicted_expired : stats_.evicted_kept);
    } else {
      ++stats_.removed;
    }
    h_->TierLeft(tier_, slot, evicted);
  }
  // The last tier: with copies_first, its least recently made copy of a
  // block held above that is not kept (cache_ttl_seconds); then P's victim
  // among the blocks only it holds. When every evictable block of it is
  // also held above (a write-through tier no larger than the tiers above),
  // and in a tier above another: the least recently stored or read block
  // that is not kept, else the least recently stored or read.
  int32_t Victim() override {
    if (last_) {
      for (int32_t i = h_->copies_.Front(); i != LruList::kNone; i = h_->copies_.Next(i))
        if (keep_until(i) <= now_) return i;
    }
    const int32_t e = last_ ? h_->p_->Victim() : -1;
    if (e < 0) {
      for (int32_t i = fallback_.Front(); i != LruList::kNone; i = fallback_.Next(i))
        if (keep_until(i) <= now_) return i;
      return fallback_.Front();
    }
    const int32_t slot = h_->entries_[static_cast<size_t>(e)].tier_slot[tier_];
    assert(slot >= 0 && tier().evictable[static_cast<size_t>(slot)]);
    return slot;
  }
  void KeepUntil(int32_t slot, int64_t until_nanos) override {
    const int32_t e = tier().entry[static_cast<size_t>(slot)];
    if (e >= 0) h_->p_->KeepUntil(e, until_nanos);
  }
  int64_t keep_until(int32_t slot) const override {
    const int32_t e = tier().entry[static_cast<size_t>(slot)];
    return e < 0 ? 0 : h_->p_->keep_until(e);
  }
  bool held(int32_t slot) const override { return tier().entry[static_cast<size_t>(slot)] >= 0; }
  bool evictable(int32_t slot) const override { return tier().evictable[static_cast<size_t>(slot)]; }
  int32_t num_evictable() const override { return num_evictable_; }
  std::vector<int32_t> Order() const override {
    std::vector<int32_t> out;
    if (!last_) {
      for (int32_t i = fallback_.Front(); i != LruList::kNone; i = fallback_.Next(i)) out.push_back(i);
      return out;
    }
    for (int32_t i = h_->copies_.Front(); i != LruList::kNone; i = h_->copies_.Next(i)) out.push_back(i);
    for (int32_t e : h_->p_->Order()) {
      const auto& x = h_->entries_[static_cast<size_t>(e)];
      const int32_t s = x.tier_slot[tier_];
      if (h_->Candidate(x) && tier().evictable[static_cast<size_t>(s)]) out.push_back(s);
    }
    return out;
  }
  const PolicyStats& stats() const override { return stats_; }
  Status CheckConsistency() const override { return h_->CheckConsistency(); }
  void SetNow(int64_t now_nanos) override {
    now_ = now_nanos;
    h_->p_->SetNow(now_nanos);
  }
  void SetAbove(int32_t, bool) override {}
  bool above(int32_t) const override { return false; }

 private:
  HierarchyPolicy::Tier& tier() { return h_->tiers_[tier_]; }
  const HierarchyPolicy::Tier& tier() const { return h_->tiers_[tier_]; }

  std::shared_ptr<HierarchyPolicy> h_;
  size_t tier_;
  bool last_;
  std::vector<uint32_t> hits_since_stored_;
  LruList fallback_;  // the evictable slots, least recently stored or read first
  int32_t num_evictable_ = 0;
  int64_t now_ = 0;
  PolicyStats stats_;
};

// ------------------------------------------------------------------- core

Result<std::shared_ptr<HierarchyPolicy>> HierarchyPolicy::Create(std::string_view name, int32_t device_slots,
                                                                 std::vector<int32_t> tier_slots, bool copies_first) {
  if (tier_slots.empty() || tier_slots.size() > kMaxTiers)
    return Status::InvalidArgument("hierarchy policy: 1 to " + std::to_string(kMaxTiers) + " lower tiers");
  // P's size is the tiers' (its ghost lists and histories scale with it, as
  // a flat cache's would), plus a little room for blocks in transit; when
  // more are in transit, NewEntry forgets them (their history only).
  int64_t cap = static_cast<int64_t>(device_slots) + 64;
  bool negative = device_slots < 0;
  for (int32_t t : tier_slots) {
    negative = negative || t < 0;
    cap += t;
  }
  if (negative) return Status::InvalidArgument("hierarchy policy: negative slot counts");
  if (cap > INT32_MAX) return Status::InvalidArgument("hierarchy policy: too many slots");
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<EvictionPolicy> p, MakeEvictionPolicy(name, static_cast<int32_t>(cap)));
  return std::shared_ptr<HierarchyPolicy>(
      new HierarchyPolicy(std::move(p), static_cast<int32_t>(cap), device_slots, tier_slots, copies_first));
}

HierarchyPolicy::HierarchyPolicy(std::unique_ptr<EvictionPolicy> p, int32_t entries, int32_t device_slots,
                                 const std::vector<int32_t>& tier_slots, bool copies_first)
    : p_(std::move(p)),
      device_entry_(static_cast<size_t>(device_slots), -1),
      copies_first_(copies_first),
      copies_(copies_first ? tier_slots.back() : 0) {
  for (int32_t t : tier_slots)
    tiers_.push_back(Tier{.entry = std::vector<int32_t>(static_cast<size_t>(t), -1),
                          .evictable = std::vector<bool>(static_cast<size_t>(t), false)});
  entries_.resize(static_cast<size_t>(entries));
  for (int32_t e = entries - 1; e >= 0; --e) free_entries_.push_back(e);
}

bool HierarchyPolicy::Candidate(const Entry& x) const {
  if (x.device_slot >= 0) return false;
  const size_t last = tiers_.size() - 1;
  for (size_t i = 0; i < last; ++i)
    if (x.tier_slot[i] >= 0) return false;
  return x.tier_slot[last] >= 0;
}

bool HierarchyPolicy::Held(const Entry& x) const {
  if (x.device_slot >= 0) return true;
  for (size_t i = 0; i < tiers_.size(); ++i)
    if (x.tier_slot[i] >= 0) return true;
  return false;
}

std::unique_ptr<EvictionPolicy> HierarchyPolicy::DeviceView() {
  assert(!device_view_made_);
  device_view_made_ = true;
  auto lru = std::move(MakeEvictionPolicy("lru", static_cast<int32_t>(device_entry_.size()))).value();
  return std::make_unique<HierarchyDeviceView>(shared_from_this(), std::move(lru));
}

std::unique_ptr<EvictionPolicy> HierarchyPolicy::TierView(size_t tier) {
  assert(tier < tiers_.size() && !tiers_[tier].view_made);
  tiers_[tier].view_made = true;
  return std::make_unique<HierarchyTierView>(shared_from_this(), tier,
                                             static_cast<int32_t>(tiers_[tier].entry.size()));
}

int32_t HierarchyPolicy::NewEntry(uint64_t key) {
  if (free_entries_.empty()) Settle([](uint64_t) { return false; });  // in transit too long: forgotten
  assert(!free_entries_.empty());  // device + tier blocks fit without the ones in transit
  const int32_t e = free_entries_.back();
  free_entries_.pop_back();
  Entry& x = entries_[static_cast<size_t>(e)];
  x = Entry{};
  x.key = key;
  x.used = true;
  by_key_.emplace(key, e);  // a colliding key keeps the older entry; this one is found by slot only
  return e;
}

void HierarchyPolicy::SetInTransit(int32_t e, bool in_transit) {
  Entry& x = entries_[static_cast<size_t>(e)];
  if (x.in_transit == in_transit) return;
  x.in_transit = in_transit;
  if (in_transit) {
    ++num_in_transit_;
    transit_.push_back(e);
  } else {
    --num_in_transit_;
  }
}

void HierarchyPolicy::FreeEntry(int32_t e, bool evicted) {
  SetInTransit(e, false);
  Entry& x = entries_[static_cast<size_t>(e)];
  p_->Erase(e, evicted);
  if (auto it = by_key_.find(x.key); it != by_key_.end() && it->second == e) by_key_.erase(it);
  x = Entry{};
  free_entries_.push_back(e);
}

void HierarchyPolicy::SetPlace(int32_t e) {
  if (e < 0) return;
  const Entry& x = entries_[static_cast<size_t>(e)];
  const bool candidate = Candidate(x);
  p_->SetAbove(e, !candidate);
  if (candidate) p_->SetEvictable(e, tiers_.back().evictable[static_cast<size_t>(x.tier_slot[tiers_.size() - 1])]);
  UpdateCopy(e);
}

void HierarchyPolicy::UpdateCopy(int32_t e) {
  if (!copies_first_ || e < 0) return;
  const Entry& x = entries_[static_cast<size_t>(e)];
  const int32_t s = x.tier_slot[tiers_.size() - 1];
  if (s < 0) return;
  const bool copy = tiers_.back().evictable[static_cast<size_t>(s)] && !Candidate(x);
  if (copy && !copies_.Contains(s)) copies_.PushBack(s);
  if (!copy && copies_.Contains(s)) copies_.Remove(s);
}

BlockTraits HierarchyPolicy::Translate(const BlockTraits& traits, const std::vector<int32_t>& slot_entry) const {
  BlockTraits t = traits;
  t.parent = traits.parent >= 0 && static_cast<size_t>(traits.parent) < slot_entry.size()
                 ? slot_entry[static_cast<size_t>(traits.parent)]
                 : -1;
  return t;
}

void HierarchyPolicy::DeviceNamed(int32_t device_slot, const BlockTraits& traits) {
  int32_t e = -1;
  if (auto it = by_key_.find(traits.key); it != by_key_.end() && entries_[static_cast<size_t>(it->second)].device_slot < 0)
    e = it->second;
  if (e >= 0) {  // loaded from the tier, or recomputed while in transit: a use
    Entry& x = entries_[static_cast<size_t>(e)];
    x.device_slot = device_slot;
    SetInTransit(e, false);
    p_->SetEvictable(e, false);  // referenced, as the device block is
    p_->Access(e);
    if (traits.keep_until_nanos > 0) p_->KeepUntil(e, traits.keep_until_nanos);
  } else {
    e = NewEntry(traits.key);
    entries_[static_cast<size_t>(e)].device_slot = device_slot;
    p_->Insert(e, Translate(traits, device_entry_), /*evictable=*/false);
  }
  p_->SetAbove(e, true);
  device_entry_[static_cast<size_t>(device_slot)] = e;
  UpdateCopy(e);
}

void HierarchyPolicy::DeviceUsed(int32_t device_slot) {
  const int32_t e = device_entry_[static_cast<size_t>(device_slot)];
  if (e >= 0) p_->Access(e);
}

void HierarchyPolicy::DeviceLeft(int32_t device_slot, bool evicted) {
  const int32_t e = device_entry_[static_cast<size_t>(device_slot)];
  device_entry_[static_cast<size_t>(device_slot)] = -1;
  if (e < 0) return;
  Entry& x = entries_[static_cast<size_t>(e)];
  x.device_slot = -1;
  if (Held(x)) {
    SetPlace(e);  // a tier's copy: a candidate now if in the last tier only
  } else if (evicted) {
    SetInTransit(e, true);  // demoted: its write-back comes, or Settle forgets it
    p_->SetEvictable(e, true);
  } else {
    FreeEntry(e, /*evicted=*/false);  // flushed
  }
}

void HierarchyPolicy::TierStored(size_t tier, int32_t tier_slot, const BlockTraits& traits, bool evictable) {
  const size_t u = static_cast<size_t>(tier_slot);
  Tier& t = tiers_[tier];
  int32_t e = -1;
  if (auto it = by_key_.find(traits.key);
      it != by_key_.end() && entries_[static_cast<size_t>(it->second)].tier_slot[tier] < 0)
    e = it->second;
  if (e < 0) {  // written down before the device named it (write-through of a tier above), or a collision
    e = NewEntry(traits.key);
    p_->Insert(e, Translate(traits, t.entry), /*evictable=*/false);
  }
  Entry& x = entries_[static_cast<size_t>(e)];
  x.tier_slot[tier] = tier_slot;
  SetInTransit(e, false);
  t.entry[u] = e;
  t.evictable[u] = evictable;
  if (traits.keep_until_nanos > 0) p_->KeepUntil(e, traits.keep_until_nanos);
  SetPlace(e);
}

void HierarchyPolicy::TierLeft(size_t tier, int32_t tier_slot, bool evicted) {
  const size_t u = static_cast<size_t>(tier_slot);
  Tier& t = tiers_[tier];
  const int32_t e = t.entry[u];
  t.entry[u] = -1;
  t.evictable[u] = false;
  if (copies_first_ && tier + 1 == tiers_.size() && copies_.Contains(tier_slot)) copies_.Remove(tier_slot);
  if (e < 0) return;
  Entry& x = entries_[static_cast<size_t>(e)];
  x.tier_slot[tier] = -1;
  if (Held(x)) {  // promoted (the device holds it, with its history), or a copy elsewhere
    SetPlace(e);
  } else if (evicted && tier + 1 < tiers_.size()) {
    SetInTransit(e, true);  // demoted: its write into a tier below may come, or Settle forgets it
    p_->SetAbove(e, true);
  } else {
    FreeEntry(e, evicted);
  }
}

void HierarchyPolicy::KeepCopies() {
  copies_first_ = false;
  while (copies_.Front() != LruList::kNone) copies_.PopFront();
}

void HierarchyPolicy::Settle(const std::function<bool(uint64_t key)>& write_pending) {
  if (num_in_transit_ == 0) {
    transit_.clear();
    return;
  }
  std::vector<int32_t> list;
  list.swap(transit_);
  for (int32_t e : list) {
    Entry& x = entries_[static_cast<size_t>(e)];
    if (!x.used || !x.in_transit) continue;  // stored, named again, or freed since
    if (write_pending(x.key)) {
      x.in_transit = false;  // listed again below, once
      --num_in_transit_;
      SetInTransit(e, true);
    } else {
      FreeEntry(e, /*evicted=*/true);
    }
  }
}

Status HierarchyPolicy::CheckConsistency() const {
  auto bad = [](const std::string& m) { return Status::Internal("hierarchy policy: " + m); };
  for (size_t d = 0; d < device_entry_.size(); ++d) {
    const int32_t e = device_entry_[d];
    if (e >= 0 && entries_[static_cast<size_t>(e)].device_slot != static_cast<int32_t>(d))
      return bad("device slot " + std::to_string(d) + " and its entry disagree");
  }
  for (size_t i = 0; i < tiers_.size(); ++i) {
    for (size_t t = 0; t < tiers_[i].entry.size(); ++t) {
      const int32_t e = tiers_[i].entry[t];
      if (e >= 0 && entries_[static_cast<size_t>(e)].tier_slot[i] != static_cast<int32_t>(t))
        return bad("tier " + std::to_string(i) + " slot " + std::to_string(t) + " and its entry disagree");
    }
  }
  size_t used = 0;
  const size_t last = tiers_.size() - 1;
  for (size_t i = 0; i < entries_.size(); ++i) {
    const Entry& x = entries_[i];
    const int32_t e = static_cast<int32_t>(i);
    if (x.used != p_->held(e)) return bad("entry " + std::to_string(i) + ": P disagrees on whether it is held");
    if (!x.used) continue;
    ++used;
    if (!Held(x) && !x.in_transit) return bad("entry " + std::to_string(i) + " is nowhere");
    const bool candidate = Candidate(x);
    if (p_->above(e) == candidate) return bad("entry " + std::to_string(i) + " has the wrong place in P");
    if (candidate && p_->evictable(e) != tiers_[last].evictable[static_cast<size_t>(x.tier_slot[last])])
      return bad("entry " + std::to_string(i) + ": P and the tier disagree on whether it is evictable");
    if (copies_first_ && x.tier_slot[last] >= 0) {
      const int32_t s = x.tier_slot[last];
      if (copies_.Contains(s) != (!candidate && tiers_[last].evictable[static_cast<size_t>(s)]))
        return bad("entry " + std::to_string(i) + ": the last tier's list of copies is wrong");
    }
  }
  if (used + free_entries_.size() != entries_.size()) return bad("entries lost");
  size_t transit = 0;
  for (const Entry& x : entries_) transit += x.used && x.in_transit;
  if (transit != num_in_transit_) return bad("the count of blocks in transit is wrong");
  return p_->CheckConsistency();
}

}  // namespace strata::kvcache
