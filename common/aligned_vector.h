#pragma once
// std::vector storage aligned to a cache line (64 bytes), for buffers that
// SIMD kernels stream through: a 64-byte vector load from a 16-byte aligned
// address (what malloc returns) spans two cache lines, and a one-token matrix
// product that loads its x that way ran 4-9% slower (docs/PERFORMANCE.md,
// "Column panels").

#include <cstddef>
#include <new>
#include <vector>

namespace strata {

template <class T>
struct CacheLineAllocator {
  using value_type = T;
  static constexpr std::align_val_t kAlign{64};

  CacheLineAllocator() = default;
  template <class U>
  CacheLineAllocator(const CacheLineAllocator<U>&) noexcept {}  // NOLINT(google-explicit-constructor)

  T* allocate(size_t n) { return static_cast<T*>(::operator new(n * sizeof(T), kAlign)); }
  void deallocate(T* p, size_t) noexcept { ::operator delete(p, kAlign); }

  template <class U>
  bool operator==(const CacheLineAllocator<U>&) const noexcept {
    return true;
  }
};

template <class T>
using CacheAlignedVector = std::vector<T, CacheLineAllocator<T>>;

}  // namespace strata
