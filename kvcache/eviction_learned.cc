// The "learned" eviction policy (kvcache/eviction_policy.h): Belady's rule
// approximated: a block's age weighted by its class's learned chance of reuse.
#include <algorithm>
#include <array>
#include <deque>
#include <string>
#include <tuple>
#include <unordered_map>

#include "kvcache/eviction_policy_core.h"

namespace strata::kvcache::policy_internal {
namespace {

class LearnedPolicy final : public PolicyCore {
 public:
  static constexpr int kSeenClasses = 4;    // earlier uses of the key: 0, 1, 2-3, 4+
  static constexpr int kLengthClasses = 8;  // prompt blocks: unknown, 1, 2-3, 4-7, ..., 64+
  static constexpr int kTailClasses = 4;    // blocks after it in its prompt: unknown/0, 1, 2-3, 4+
  static constexpr int kClasses = kSeenClasses * kLengthClasses * kTailClasses;
  static constexpr int kSamples = 64;
  static constexpr double kDecay = 0.9;  // histogram weight kept per retraining

  explicit LearnedPolicy(int32_t capacity)
      : PolicyCore(capacity), pos_(static_cast<size_t>(std::max(capacity, 0)), -1) {
    // The horizon: a reuse later than 16 × capacity ticks (about three per
    // block stored) after the last use counts as "never".
    horizon_ticks_ = 16 * static_cast<uint64_t>(std::max(capacity, 16));
    retrain_every_ = std::max<uint64_t>(1024, static_cast<uint64_t>(std::max(capacity, 1)));
    // Prior: uses come soon after the last one, and a few never; so until
    // trained, the oldest block is the farthest (LRU).
    reuse_.fill(0.1);  // prior: every class alike, so LRU until trained
    never_.fill(0.1);
    Retrain(/*decay=*/false);
  }
  std::string_view name() const override { return "learned"; }

 protected:
  void OnInsert(int32_t slot) override {
    // A miss on a key evicted lately: its reuse distance is learned too.
    auto g = ghost_.find(s(slot).key);
    if (g != ghost_.end()) {
      const uint64_t age = tick() - g->second.last;
      if (age < horizon_ticks_) reuse_[g->second.cls] += 1;
      ghost_.erase(g);
    }
    ExpireGhosts();
  }
  void OnAccess(int32_t slot) override {
    reuse_[Class(slot)] += 1;
    Count();
  }
  void OnErase(int32_t slot, bool evicted, bool) override {
    if (!evicted) return;
    ghost_[s(slot).key] = Ghost{s(slot).last, static_cast<uint16_t>(Class(slot))};
    ghost_fifo_.emplace_back(s(slot).key, s(slot).last);
    Count();
  }
  void Enter(int32_t slot) override { Add(slot, s(slot).children == 0 ? leaves_ : inner_); }
  void Leave(int32_t slot) override { Remove(slot, s(slot).children == 0 ? leaves_ : inner_); }
  void LeafChanged(int32_t slot) override {
    // children just changed between 0 and some: it moves between the lists
    if (s(slot).children == 0) {
      Remove(slot, inner_);
      Add(slot, leaves_);
    } else {
      Remove(slot, leaves_);
      Add(slot, inner_);
    }
  }
  int32_t Pick() override {
    for (std::vector<int32_t>* from : {&leaves_, &inner_}) {
      const size_t n = from->size();
      if (n == 0) continue;
      const bool all = n <= static_cast<size_t>(kSamples);
      int32_t best = -1;
      Score best_score{};
      auto consider = [&](int32_t slot) {
        if (!pickable(slot)) return;
        const Score sc = ScoreOf(slot);
        if (best < 0 || sc > best_score) best = slot, best_score = sc;
      };
      for (size_t k = 0; k < (all ? n : static_cast<size_t>(kSamples)); ++k) consider(all ? (*from)[k] : (*from)[Next() % n]);
      if (best < 0 && !all)  // every sample is held above (SetAbove): look at all of them
        for (int32_t slot : *from) consider(slot);
      if (best >= 0) return best;
    }
    return -1;
  }
  std::vector<int32_t> PolicyOrder() const override {
    std::vector<std::pair<Score, int32_t>> v;
    for (int32_t slot : leaves_) v.emplace_back(ScoreOf(slot), slot);
    std::sort(v.begin(), v.end(), [](const auto& a, const auto& b) { return a > b; });
    std::vector<std::pair<Score, int32_t>> w;
    for (int32_t slot : inner_) w.emplace_back(ScoreOf(slot), slot);
    std::sort(w.begin(), w.end(), [](const auto& a, const auto& b) { return a > b; });
    std::vector<int32_t> out;
    for (const auto& e : v) out.push_back(e.second);
    for (const auto& e : w) out.push_back(e.second);
    return out;
  }
  int32_t policy_size() const override { return static_cast<int32_t>(leaves_.size() + inner_.size()); }
  Status CheckPolicy() const override {
    for (const auto* list : {&leaves_, &inner_})
      for (size_t i = 0; i < list->size(); ++i) {
        const int32_t slot = (*list)[i];
        if (pos_[static_cast<size_t>(slot)] != static_cast<int32_t>(i)) return Status::Internal("learned: bad position");
        if ((s(slot).children == 0) != (list == &leaves_)) return Status::Internal("learned: leaf in the wrong list");
      }
    return Status::Ok();
  }

 private:
  struct Ghost {
    uint64_t last = 0;
    uint16_t cls = 0;
  };
  // (age ÷ P(reuse | class), age): the largest is evicted. With every class
  // alike this is LRU; a class that is rarely used again ages faster.
  using Score = std::tuple<double, uint64_t>;
  Score ScoreOf(int32_t slot) const {
    const uint64_t age = tick() - s(slot).last;
    const size_t c = Class(slot);
    return {static_cast<double>(age + 1) / reuse_prob_[c], age};
  }
  static int Log2Bucket(int64_t v, int buckets) {  // 0 → 0, 1 → 1, 2-3 → 2, ...
    if (v <= 0 || buckets <= 1) return 0;
    int b = 1;
    while (v > 1 && b < buckets - 1) v >>= 1, ++b;
    return b;
  }
  size_t Class(int32_t slot) const {
    const Slot& x = s(slot);
    const int seen = Log2Bucket(x.seen > 0 ? x.seen - 1 : 0, kSeenClasses);
    const int len = x.chain_blocks < 0 ? 0 : Log2Bucket(x.chain_blocks, kLengthClasses);
    const int tail = x.chain_blocks < 0 || x.depth < 0 ? 0 : Log2Bucket(x.chain_blocks - 1 - x.depth, kTailClasses);
    return static_cast<size_t>((seen * kLengthClasses + len) * kTailClasses + tail);
  }
  void Add(int32_t slot, std::vector<int32_t>& list) {
    pos_[static_cast<size_t>(slot)] = static_cast<int32_t>(list.size());
    list.push_back(slot);
  }
  void Remove(int32_t slot, std::vector<int32_t>& list) {
    const int32_t p = pos_[static_cast<size_t>(slot)];
    const int32_t moved = list.back();
    list[static_cast<size_t>(p)] = moved;
    pos_[static_cast<size_t>(moved)] = p;
    list.pop_back();
    pos_[static_cast<size_t>(slot)] = -1;
  }
  uint64_t Next() {  // xorshift64*: deterministic sampling
    rng_ ^= rng_ >> 12;
    rng_ ^= rng_ << 25;
    rng_ ^= rng_ >> 27;
    return rng_ * 2685821657736338717ULL;
  }
  void ExpireGhosts() {
    while (!ghost_fifo_.empty() && tick() - ghost_fifo_.front().second >= horizon_ticks_) {
      auto g = ghost_.find(ghost_fifo_.front().first);
      if (g != ghost_.end() && g->second.last == ghost_fifo_.front().second) {
        never_[g->second.cls] += 1;  // not used again within the horizon
        ghost_.erase(g);
      }
      ghost_fifo_.pop_front();
    }
  }
  void Count() {
    if (++events_ % retrain_every_ == 0) Retrain(/*decay=*/true);
  }
  // reuse_prob_[c]: how likely a class-c block is used again within the
  // horizon, from the uses and "nevers" seen (a prior of half a use and half
  // a never); then the counts decay so the estimate follows the workload.
  void Retrain(bool decay) {
    for (size_t c = 0; c < kClasses; ++c) {
      reuse_prob_[c] = std::max(0.01, (reuse_[c] + 0.5) / (reuse_[c] + never_[c] + 1.0));
      if (decay) {
        reuse_[c] *= kDecay;
        never_[c] *= kDecay;
      }
    }
  }

  std::vector<int32_t> leaves_, inner_;  // slots in the policy, by whether successors are cached
  std::vector<int32_t> pos_;             // slot → index in its list, or -1
  std::array<double, kClasses> reuse_{};  // uses seen per class (hits, and misses on ghost keys), decayed
  std::array<double, kClasses> never_{};
  std::array<double, kClasses> reuse_prob_{};  // P(used again within the horizon), floored
  std::unordered_map<uint64_t, Ghost> ghost_;             // evicted keys → last use, class
  std::deque<std::pair<uint64_t, uint64_t>> ghost_fifo_;  // (key, last use), oldest first
  uint64_t horizon_ticks_ = 0;
  uint64_t retrain_every_ = 1024;
  uint64_t events_ = 0;
  uint64_t rng_ = 0x9E3779B97F4A7C15ULL;
};

}  // namespace

std::unique_ptr<EvictionPolicy> MakeLearned(int32_t capacity) { return std::make_unique<LearnedPolicy>(capacity); }

}  // namespace strata::kvcache::policy_internal
