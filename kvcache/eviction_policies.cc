// s3fifo and freq (kvcache/eviction_policy.h says what each does).
#include <algorithm>
#include <array>
#include <cmath>
#include <deque>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>

#include "kvcache/eviction_policy_core.h"
#include "kvcache/lru_list.h"

namespace strata::kvcache::policy_internal {
namespace {

// ---------------------------------------------------------------- S3-FIFO

class S3FifoPolicy final : public PolicyCore {
 public:
  explicit S3FifoPolicy(int32_t capacity)
      : PolicyCore(capacity),
        small_(capacity < 0 ? 0 : capacity),
        main_(capacity < 0 ? 0 : capacity),
        freq_(static_cast<size_t>(capacity < 0 ? 0 : capacity), 0),
        in_main_(static_cast<size_t>(capacity < 0 ? 0 : capacity), false) {}
  std::string_view name() const override { return "s3fifo"; }

 protected:
  void OnInsert(int32_t slot) override {
    const size_t u = static_cast<size_t>(slot);
    freq_[u] = 0;
    auto g = ghost_count_.find(s(slot).key);
    in_main_[u] = g != ghost_count_.end();  // evicted from the small FIFO lately: straight to main
  }
  void OnAccess(int32_t slot) override {
    uint8_t& f = freq_[static_cast<size_t>(slot)];
    if (f < 3) ++f;
  }
  void OnErase(int32_t slot, bool evicted, bool) override {
    if (evicted && !in_main_[static_cast<size_t>(slot)]) Remember(s(slot).key);
  }
  void Enter(int32_t slot) override { queue(slot).PushBack(slot); }
  void Leave(int32_t slot) override { queue(slot).Remove(slot); }
  int32_t Pick() override {
    for (;;) {
      const int32_t total = small_.size() + main_.size();
      if (total == 0) return -1;
      const int32_t small_target = std::max<int32_t>(1, total / 10);
      // Slots held above (SetAbove) keep their places and count toward the
      // sizes, as in one flat cache; only the others are candidates.
      const int32_t hs = FirstPickable(small_);
      const int32_t hm = FirstPickable(main_);
      if (hs == LruList::kNone && hm == LruList::kNone) return -1;
      if (hs != LruList::kNone && (small_.size() >= small_target || hm == LruList::kNone)) {
        const size_t u = static_cast<size_t>(hs);
        if (freq_[u] == 0) return hs;  // not used since stored: out (to the ghost list)
        small_.Remove(hs);
        in_main_[u] = true;
        freq_[u] = 0;
        main_.PushBack(hs);
        continue;
      }
      uint8_t& f = freq_[static_cast<size_t>(hm)];
      if (f == 0) return hm;
      --f;  // second chance
      main_.Touch(hm);
    }
  }
  std::vector<int32_t> PolicyOrder() const override {
    std::vector<int32_t> out;
    for (int32_t i = small_.Front(); i != LruList::kNone; i = small_.Next(i)) out.push_back(i);
    for (int32_t i = main_.Front(); i != LruList::kNone; i = main_.Next(i)) out.push_back(i);
    return out;
  }
  int32_t policy_size() const override { return small_.size() + main_.size(); }

 private:
  LruList& queue(int32_t slot) { return in_main_[static_cast<size_t>(slot)] ? main_ : small_; }
  void Remember(uint64_t key) {
    ghost_.push_back(key);
    ++ghost_count_[key];
    while (ghost_.size() > static_cast<size_t>(std::max(1, capacity()))) {
      auto it = ghost_count_.find(ghost_.front());
      if (--it->second == 0) ghost_count_.erase(it);
      ghost_.pop_front();
    }
  }

  LruList small_, main_;
  std::vector<uint8_t> freq_;
  std::vector<bool> in_main_;
  std::deque<uint64_t> ghost_;
  std::unordered_map<uint64_t, int32_t> ghost_count_;
};

// ------------------------------------------------------------------- freq

// GreedyDual over value 1 + hits: priority = inflation + value at the last
// use; the victim is the lowest priority (leaves first, then the least
// recent), and the inflation rises to the victim's priority, so what is not
// used ages out.
class FreqPolicy final : public PolicyCore {
 public:
  explicit FreqPolicy(int32_t capacity)
      : PolicyCore(capacity), prio_(static_cast<size_t>(capacity < 0 ? 0 : capacity), 0.0) {}
  std::string_view name() const override { return "freq"; }

 protected:
  using Key = std::tuple<double, int, uint64_t, int32_t>;  // (priority, inner, last, slot)
  Key key(int32_t slot) const {
    return {prio_[static_cast<size_t>(slot)], s(slot).children > 0 ? 1 : 0, s(slot).last, slot};
  }
  void Enter(int32_t slot) override {
    prio_[static_cast<size_t>(slot)] = inflation_ + static_cast<double>(s(slot).seen);
    set_.insert(key(slot));
  }
  void Leave(int32_t slot) override { set_.erase(key(slot)); }
  void Touched(int32_t slot, uint64_t old_last) override {
    set_.erase({prio_[static_cast<size_t>(slot)], s(slot).children > 0 ? 1 : 0, old_last, slot});
    Enter(slot);
  }
  void LeafChanged(int32_t slot) override {
    set_.erase({prio_[static_cast<size_t>(slot)], s(slot).children > 0 ? 0 : 1, s(slot).last, slot});
    set_.insert(key(slot));
  }
  void OnInsert(int32_t slot) override { prio_[static_cast<size_t>(slot)] = 0; }
  void OnErase(int32_t slot, bool evicted, bool was_in_policy) override {
    // Only a priority the slot had in the set (a kept block never entered it).
    if (evicted && was_in_policy) inflation_ = std::max(inflation_, prio_[static_cast<size_t>(slot)]);
  }
  int32_t Pick() override {
    for (const Key& k : set_)
      if (pickable(std::get<3>(k))) return std::get<3>(k);
    return -1;
  }
  std::vector<int32_t> PolicyOrder() const override {
    std::vector<int32_t> out;
    for (const Key& k : set_) out.push_back(std::get<3>(k));
    return out;
  }
  int32_t policy_size() const override { return static_cast<int32_t>(set_.size()); }
  Status CheckPolicy() const override {
    for (const Key& k : set_)
      if (k != key(std::get<3>(k))) return Status::Internal("freq: stale entry for slot " + std::to_string(std::get<3>(k)));
    return Status::Ok();
  }

 private:
  std::vector<double> prio_;
  std::set<Key> set_;
  double inflation_ = 0;
};

}  // namespace

std::unique_ptr<EvictionPolicy> MakeS3Fifo(int32_t capacity) { return std::make_unique<S3FifoPolicy>(capacity); }
std::unique_ptr<EvictionPolicy> MakeFreq(int32_t capacity) { return std::make_unique<FreqPolicy>(capacity); }

}  // namespace strata::kvcache::policy_internal
