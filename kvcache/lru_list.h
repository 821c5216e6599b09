#pragma once
// An intrusive doubly-linked LRU list over dense int32 indices [0, capacity):
// O(1) push to the back (most recently used), remove from anywhere, and pop
// from the front (least recently used). The links live in two flat arrays, so
// nothing is allocated after construction (vLLM's free-block queue idea).
//
// Thread-safety: none; the owner serialises access.

#include <cassert>
#include <cstdint>
#include <vector>

namespace strata::kvcache {

class LruList {
 public:
  static constexpr int32_t kNone = -1;

  explicit LruList(int32_t capacity)
      : prev_(static_cast<size_t>(capacity), kNone),
        next_(static_cast<size_t>(capacity), kNone),
        linked_(static_cast<size_t>(capacity), false) {}

  int32_t size() const { return size_; }
  bool empty() const { return size_ == 0; }
  bool Contains(int32_t i) const { return linked_[static_cast<size_t>(i)]; }
  // Least recently used, or kNone when empty.
  int32_t Front() const { return head_; }
  int32_t Next(int32_t i) const { return next_[static_cast<size_t>(i)]; }

  // REQUIRES: !Contains(i).
  void PushBack(int32_t i) {
    assert(!Contains(i));
    const size_t u = static_cast<size_t>(i);
    prev_[u] = tail_;
    next_[u] = kNone;
    if (tail_ != kNone) next_[static_cast<size_t>(tail_)] = i;
    else head_ = i;
    tail_ = i;
    linked_[u] = true;
    ++size_;
  }

  // REQUIRES: Contains(i).
  void Remove(int32_t i) {
    assert(Contains(i));
    const size_t u = static_cast<size_t>(i);
    if (prev_[u] != kNone) next_[static_cast<size_t>(prev_[u])] = next_[u];
    else head_ = next_[u];
    if (next_[u] != kNone) prev_[static_cast<size_t>(next_[u])] = prev_[u];
    else tail_ = prev_[u];
    prev_[u] = next_[u] = kNone;
    linked_[u] = false;
    --size_;
  }

  // Moves i to the back (most recently used). REQUIRES: Contains(i).
  void Touch(int32_t i) {
    Remove(i);
    PushBack(i);
  }

  // Removes and returns the front, or kNone when empty.
  int32_t PopFront() {
    const int32_t i = head_;
    if (i != kNone) Remove(i);
    return i;
  }

 private:
  std::vector<int32_t> prev_;
  std::vector<int32_t> next_;
  std::vector<bool> linked_;
  int32_t head_ = kNone;
  int32_t tail_ = kNone;
  int32_t size_ = 0;
};

}  // namespace strata::kvcache
