#pragma once
// Offline references for the prefix cache (issue 22): the hit ratio one flat
// cache of a given size would reach on a trace, with LRU and with Belady's
// MIN (evict the unit whose next use is farthest in the future; an offline
// optimum of the evictions, computed over the same accesses), in serial
// order and with the semantics of the simulator's hit_ratio_blocks: a
// request's hash id is served only when it and every id before it are
// cached when the request arrives.
//
// A cache unit is one prefix chain node: hash id k of a request together
// with every id before it (equal ids after different prefixes are
// different units, as block hashes are chained). After a request is
// served, all its units are in the cache: LRU touches them tail first, so
// the head of a chain is the most recent (as the engine frees a request's
// blocks tail first); MIN keeps a unit only when its next use is nearer
// than the farthest one cached (it may bypass).
//
// Thread-safety: pure functions.

#include <cstdint>
#include <vector>

#include "bench/trace.h"

namespace strata::bench {

// Each request's hash ids as chain units (trie node numbers, 1-based).
std::vector<std::vector<uint64_t>> ChainUnits(const std::vector<TraceRequest>& trace);

struct ReferenceHits {
  uint64_t hit_ids = 0, total_ids = 0;
  double ratio() const { return total_ids == 0 ? 0.0 : static_cast<double>(hit_ids) / static_cast<double>(total_ids); }
};

// `capacity`: units the flat cache holds (0: nothing is ever served).
ReferenceHits LruReference(const std::vector<std::vector<uint64_t>>& chains, uint64_t capacity);
ReferenceHits BeladyReference(const std::vector<std::vector<uint64_t>>& chains, uint64_t capacity);

}  // namespace strata::bench
