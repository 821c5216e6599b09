#pragma once
// StagingBuffers: the tier mover's host buffers of one block each
// (4096-aligned for O_DIRECT), allocated on first need up to a maximum and
// registered in the segment table as "staging N", so copies and stores can
// name them by region. A buffer is taken (Acquire), used by one or more
// operations (Ref / Release), and free again when its last use is released
// (or when it was taken and never used: PutBack).
//
// Ownership: owns the buffers; unregisters and frees them when destroyed.
// The table outlives this.
//
// Thread-safety: none; the mover's thread.

#include <cstdint>
#include <memory>
#include <vector>

#include "common/memory_segment.h"

namespace strata::kvcache {

class StagingBuffers {
 public:
  StagingBuffers(SegmentTable* segments, uint64_t block_bytes, size_t max_buffers);
  ~StagingBuffers();
  StagingBuffers(const StagingBuffers&) = delete;
  StagingBuffers& operator=(const StagingBuffers&) = delete;

  // A free buffer (allocating one while fewer than max exist), or -1.
  int32_t Acquire();
  void Ref(int32_t i) { ++refs_[static_cast<size_t>(i)]; }
  // Undoes a Ref whose use never started (the buffer stays taken: PutBack
  // frees it once no use is left).
  void Unref(int32_t i) { --refs_[static_cast<size_t>(i)]; }
  // Drops one use; at none the buffer is free again. -1 is ignored.
  void Release(int32_t i);
  // Frees a buffer that was acquired but has no use (-1 is ignored).
  void PutBack(int32_t i);
  Region region(int32_t i) const { return {segments_ids_[static_cast<size_t>(i)], 0, block_bytes_}; }
  size_t allocated() const { return buffers_.size(); }
  bool none_free() const { return free_.empty() && buffers_.size() >= max_; }
  void set_max(size_t max_buffers) { max_ = max_buffers; }

 private:
  struct AlignedFree {
    void operator()(uint8_t* p) const;
  };
  SegmentTable* const segments_;
  const uint64_t block_bytes_;
  size_t max_;
  std::vector<std::unique_ptr<uint8_t[], AlignedFree>> buffers_;
  std::vector<SegmentId> segments_ids_;  // buffers_[i]'s segment
  std::vector<int32_t> refs_;            // uses per buffer
  std::vector<int32_t> free_;
};

}  // namespace strata::kvcache
