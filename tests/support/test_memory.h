#pragma once
// Registered memory for tests that drive a BlockStore directly: stores read
// and write regions of a SegmentTable (kvcache/block_store.h), so a test's
// buffers are registered in one process-wide table first.
//
// Thread-safety: as SegmentTable; Region() is for one thread at a time.

#include <cstdint>
#include <span>

#include "common/memory_segment.h"
#include "kvcache/block_store.h"

namespace strata::testing {

// The process-wide table test stores attach to.
SegmentTable& TestSegments();

// The region of `bytes` (non-empty host memory) in `table` (default
// TestSegments(); a KV manager's own table for a store it attached): the
// segment already holding it, or a new one. Registrations of buffers freed
// since (a temporary's) that overlap it are dropped first.
Region RegionOf(std::span<const uint8_t> bytes, SegmentTable* table = nullptr);

// Attaches `store` to TestSegments(), first dropping RegionOf's
// registrations when the store's own memory overlaps one (a freed
// temporary's); aborts the test binary on failure. Returns `store`.
void AttachToTestSegments(kvcache::BlockStore* store);
// Stores `bytes` under `h` in `store` and waits for the write: for tests
// that fill a store before handing it to a KV manager (or one a manager
// attached: `bytes` are registered in the store's table). Attaches the
// store to TestSegments() for the write when it is not attached, and
// detaches it again. Returns the submission's or the completion's error.
Status StoreBlock(kvcache::BlockStore* store, const BlockHash& h, const Sha256Digest& ns,
                  std::span<const uint8_t> bytes);

template <typename Store>
Store* Attached(Store* store) {
  AttachToTestSegments(store);
  return store;
}

}  // namespace strata::testing
