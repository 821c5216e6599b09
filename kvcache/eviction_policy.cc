#include "kvcache/eviction_policy.h"

#include <algorithm>
#include <cassert>
#include <string>

#include "kvcache/eviction_policy_core.h"
#include "kvcache/lru_list.h"

namespace strata::kvcache {
namespace policy_internal {

PolicyCore::PolicyCore(int32_t capacity) : slots_(static_cast<size_t>(capacity < 0 ? 0 : capacity)) {
  const size_t want = 4 * std::max<size_t>(slots_.size(), 64);
  sketch_width_ = 1;
  while (sketch_width_ < want) sketch_width_ <<= 1;
  sketch_.assign(4 * sketch_width_, 0);
  reset_every_ = 10 * std::max<uint64_t>(slots_.size(), 64);
}

size_t PolicyCore::SketchIndex(uint64_t key, int row) const {
  uint64_t h = key + 0x9E3779B97F4A7C15ULL * static_cast<uint64_t>(row + 1);
  h ^= h >> 31;
  h *= 0xBF58476D1CE4E5B9ULL;
  h ^= h >> 29;
  return static_cast<size_t>(row) * sketch_width_ + static_cast<size_t>(h & (sketch_width_ - 1));
}

uint32_t PolicyCore::Frequency(uint64_t key) const {
  uint32_t f = 15;
  for (int r = 0; r < 4; ++r) f = std::min<uint32_t>(f, sketch_[SketchIndex(key, r)]);
  return f;
}

void PolicyCore::Record(uint64_t key) {
  const uint32_t f = Frequency(key);
  for (int r = 0; r < 4; ++r) {  // conservative update: only the counters at the minimum grow
    uint8_t& c = sketch_[SketchIndex(key, r)];
    if (c == f && c < 15) ++c;
  }
  if (++records_ % reset_every_ == 0)
    for (uint8_t& c : sketch_) c = static_cast<uint8_t>(c >> 1);
}

bool PolicyCore::Admit(const BlockTraits& traits) {
  const bool ok = AdmitBlock(traits);
  if (!ok) ++stats_.rejected;
  return ok;
}

void PolicyCore::ChildCount(int32_t parent, uint32_t parent_gen, int delta) {
  if (parent < 0 || parent >= capacity()) return;
  Slot& p = m(parent);
  if (!p.held || p.gen != parent_gen) return;  // the parent left; its slot may hold another block now
  const bool was_leaf = p.children == 0;
  p.children += delta;
  assert(p.children >= 0);
  if (p.in_policy && was_leaf != (p.children == 0)) LeafChanged(parent);
}

void PolicyCore::Insert(int32_t slot, const BlockTraits& traits, bool evictable) {
  Slot& x = m(slot);
  assert(!x.held);
  const uint32_t gen = x.gen + 1;
  x = Slot{};
  x.held = true;
  x.gen = gen;
  x.depth = traits.depth;
  x.chain_blocks = traits.chain_blocks;
  x.key = traits.key;
  x.keep_until = traits.keep_until_nanos;
  x.had_keep = traits.keep_until_nanos > 0;
  x.last = ++tick_;
  Record(traits.key);
  x.seen = Frequency(traits.key);
  if (traits.parent >= 0 && traits.parent < capacity() && traits.parent != slot && s(traits.parent).held) {
    x.parent = traits.parent;
    x.parent_gen = s(traits.parent).gen;
    ChildCount(x.parent, x.parent_gen, +1);
  }
  ++stats_.inserted;
  OnInsert(slot);
  if (evictable) SetEvictable(slot, true);
}

void PolicyCore::Access(int32_t slot) {
  Slot& x = m(slot);
  assert(x.held);
  ++stats_.hits;
  OnAccess(slot);
  const uint64_t old_last = x.last;
  Record(x.key);
  ++x.seen;
  ++x.hits;
  x.last = ++tick_;
  if (x.in_policy) Touched(slot, old_last);
  if (x.kept) {  // its key in kept_ has the last use in it
    kept_.erase({x.keep_until, old_last, slot});
    kept_.emplace(x.keep_until, x.last, slot);
  }
}

void PolicyCore::Park(int32_t slot) {
  Slot& x = m(slot);
  if (x.keep_until > now_) {
    x.kept = true;
    kept_.emplace(x.keep_until, x.last, slot);
  } else {
    x.in_policy = true;
    Enter(slot);
  }
}

void PolicyCore::Unpark(int32_t slot) {
  Slot& x = m(slot);
  if (x.in_policy) {
    Leave(slot);
    x.in_policy = false;
  }
  if (x.kept) {
    kept_.erase({x.keep_until, x.last, slot});
    x.kept = false;
  }
}

void PolicyCore::SetEvictable(int32_t slot, bool evictable) {
  Slot& x = m(slot);
  assert(x.held);
  if (x.evictable == evictable) return;
  x.evictable = evictable;
  if (evictable) {
    x.last = ++tick_;  // released or unpinned: a use
    ++num_evictable_;
    Park(slot);
  } else {
    --num_evictable_;
    Unpark(slot);
  }
}

void PolicyCore::Erase(int32_t slot, bool evicted) {
  Slot& x = m(slot);
  assert(x.held);
  const bool was_in_policy = x.in_policy;
  if (x.evictable) {
    --num_evictable_;
    Unpark(slot);
    x.evictable = false;
  }
  OnErase(slot, evicted, was_in_policy);
  if (evicted) {
    ++stats_.evicted;
    if (x.hits == 0) ++stats_.evicted_unused;
    if (x.had_keep) ++(x.keep_until <= now_ ? stats_.evicted_expired : stats_.evicted_kept);
  } else {
    ++stats_.removed;
  }
  ChildCount(x.parent, x.parent_gen, -1);
  const uint32_t gen = x.gen;
  x = Slot{};
  x.gen = gen;
}

void PolicyCore::KeepUntil(int32_t slot, int64_t until_nanos) {
  Slot& x = m(slot);
  assert(x.held);
  if (until_nanos <= x.keep_until) return;
  const bool parked = x.evictable;
  if (parked) Unpark(slot);
  x.keep_until = until_nanos;
  x.had_keep = true;
  if (parked) Park(slot);
}

void PolicyCore::ExpireKept() {
  if (kept_.empty() || std::get<0>(*kept_.begin()) > now_) return;
  // Every expired slot enters the policy in the order of its last use, as
  // if released then: a chain's tail (released first) ahead of its head.
  std::vector<std::pair<uint64_t, int32_t>> expired;
  while (!kept_.empty() && std::get<0>(*kept_.begin()) <= now_) {
    expired.emplace_back(std::get<1>(*kept_.begin()), std::get<2>(*kept_.begin()));
    kept_.erase(kept_.begin());
  }
  std::sort(expired.begin(), expired.end());
  for (const auto& [last, slot] : expired) {
    Slot& x = m(slot);
    x.kept = false;
    x.in_policy = true;
    Enter(slot);
  }
}

int32_t PolicyCore::Victim() {
  ExpireKept();
  const int32_t v = Pick();
  if (v >= 0) return v;
  for (const auto& k : kept_)  // only kept blocks left: the soonest to expire
    if (pickable(std::get<2>(k))) return std::get<2>(k);
  return -1;
}

void PolicyCore::SetAbove(int32_t slot, bool above) {
  assert(s(slot).held);
  m(slot).above = above;
}

std::vector<int32_t> PolicyCore::Order() const {
  std::vector<int32_t> out = PolicyOrder();
  for (const auto& [until, last, slot] : kept_) out.push_back(slot);
  return out;
}

Status PolicyCore::CheckConsistency() const {
  int32_t evictable = 0, in_policy = 0, kept = 0;
  std::vector<int32_t> children(slots_.size(), 0);
  for (int32_t i = 0; i < capacity(); ++i) {
    const Slot& x = s(i);
    const std::string b = "slot " + std::to_string(i);
    if (!x.held && (x.evictable || x.in_policy || x.kept)) return Status::Internal(b + " is listed but not held");
    if (x.evictable != (x.in_policy || x.kept)) return Status::Internal(b + ": evictable but in no list, or listed but not evictable");
    if (x.in_policy && x.kept) return Status::Internal(b + " is both kept and in the policy");
    evictable += x.evictable;
    in_policy += x.in_policy;
    kept += x.kept;
    if (x.held && x.parent >= 0 && s(x.parent).held && s(x.parent).gen == x.parent_gen) ++children[static_cast<size_t>(x.parent)];
  }
  for (int32_t i = 0; i < capacity(); ++i) {
    if (s(i).held && s(i).children != children[static_cast<size_t>(i)])
      return Status::Internal("slot " + std::to_string(i) + " counts " + std::to_string(s(i).children) +
                              " children, holds " + std::to_string(children[static_cast<size_t>(i)]));
  }
  if (evictable != num_evictable_) return Status::Internal("evictable count is off");
  if (kept != static_cast<int32_t>(kept_.size())) return Status::Internal("kept list is off");
  if (in_policy != policy_size())
    return Status::Internal(std::string(name()) + " lists " + std::to_string(policy_size()) + " slots, " +
                            std::to_string(in_policy) + " are in it");
  for (int32_t slot : PolicyOrder()) {
    if (slot < 0 || slot >= capacity() || !s(slot).in_policy)
      return Status::Internal(std::string(name()) + " lists slot " + std::to_string(slot) + " that is not in it");
  }
  return CheckPolicy();
}

namespace {

// Least recently used (released, read or written).
class LruPolicy final : public PolicyCore {
 public:
  explicit LruPolicy(int32_t capacity) : PolicyCore(capacity), lru_(capacity < 0 ? 0 : capacity) {}
  std::string_view name() const override { return "lru"; }

 protected:
  void Enter(int32_t slot) override { lru_.PushBack(slot); }
  void Leave(int32_t slot) override { lru_.Remove(slot); }
  void Touched(int32_t slot, uint64_t) override { lru_.Touch(slot); }
  int32_t Pick() override { return FirstPickable(lru_); }
  std::vector<int32_t> PolicyOrder() const override {
    std::vector<int32_t> out;
    out.reserve(static_cast<size_t>(lru_.size()));
    for (int32_t i = lru_.Front(); i != LruList::kNone; i = lru_.Next(i)) out.push_back(i);
    return out;
  }
  int32_t policy_size() const override { return lru_.size(); }

 private:
  LruList lru_;
};

// Least recently used among leaves; inner blocks only when no leaf is
// evictable (a pinned successor).
class LeafLruPolicy final : public PolicyCore {
 public:
  explicit LeafLruPolicy(int32_t capacity) : PolicyCore(capacity) {}
  std::string_view name() const override { return "leaf_lru"; }

 protected:
  using Key = std::pair<uint64_t, int32_t>;
  std::set<Key>& set_of(int32_t slot) { return s(slot).children == 0 ? leaves_ : inner_; }
  void Enter(int32_t slot) override { set_of(slot).emplace(s(slot).last, slot); }
  void Leave(int32_t slot) override {
    if (leaves_.erase({s(slot).last, slot}) == 0) inner_.erase({s(slot).last, slot});
  }
  void Touched(int32_t slot, uint64_t old_last) override {
    if (leaves_.erase({old_last, slot}) == 0) inner_.erase({old_last, slot});
    Enter(slot);
  }
  void LeafChanged(int32_t slot) override {
    // children just changed: the slot is in the other set
    std::set<Key>& now = set_of(slot);
    std::set<Key>& before = &now == &leaves_ ? inner_ : leaves_;
    before.erase({s(slot).last, slot});
    now.emplace(s(slot).last, slot);
  }
  int32_t Pick() override {
    for (const std::set<Key>* set : {&leaves_, &inner_})
      for (const Key& k : *set)
        if (pickable(k.second)) return k.second;
    return -1;
  }
  std::vector<int32_t> PolicyOrder() const override {
    std::vector<int32_t> out;
    for (const Key& k : leaves_) out.push_back(k.second);
    for (const Key& k : inner_) out.push_back(k.second);
    return out;
  }
  int32_t policy_size() const override { return static_cast<int32_t>(leaves_.size() + inner_.size()); }
  Status CheckPolicy() const override {
    for (const Key& k : leaves_)
      if (s(k.second).children != 0 || s(k.second).last != k.first) return Status::Internal("leaf_lru: bad leaf entry");
    for (const Key& k : inner_)
      if (s(k.second).children == 0 || s(k.second).last != k.first) return Status::Internal("leaf_lru: bad inner entry");
    return Status::Ok();
  }

 private:
  std::set<Key> leaves_, inner_;
};

}  // namespace

std::unique_ptr<EvictionPolicy> MakeS3Fifo(int32_t capacity);
std::unique_ptr<EvictionPolicy> MakeFreq(int32_t capacity);
std::unique_ptr<EvictionPolicy> MakeLearned(int32_t capacity);

}  // namespace policy_internal

const std::vector<std::string>& EvictionPolicyNames() {
  static const std::vector<std::string> kNames = {"lru", "leaf_lru", "s3fifo", "freq", "learned"};
  return kNames;
}

bool IsEvictionPolicy(std::string_view name) {
  for (const std::string& n : EvictionPolicyNames())
    if (n == name) return true;
  return false;
}

Result<std::unique_ptr<EvictionPolicy>> MakeEvictionPolicy(std::string_view name, int32_t capacity) {
  using namespace policy_internal;
  if (name == "lru") return std::unique_ptr<EvictionPolicy>(new LruPolicy(capacity));
  if (name == "leaf_lru") return std::unique_ptr<EvictionPolicy>(new LeafLruPolicy(capacity));
  if (name == "s3fifo") return MakeS3Fifo(capacity);
  if (name == "freq") return MakeFreq(capacity);
  if (name == "learned") return MakeLearned(capacity);
  std::string known;
  for (const std::string& n : EvictionPolicyNames()) known += (known.empty() ? "" : ", ") + n;
  return Status::InvalidArgument("unknown eviction policy \"" + std::string(name) + "\" (known: " + known + ")");
}

}  // namespace strata::kvcache
