#pragma once
// The KV cache's statistics as plain values: what the KV manager, the device
// pool and the lower tiers count, and what a cache flush removed. The engine
// reports them through its client interface (scheduler/engine_client.h), so
// the server reads them without linking the KV cache.
//
// Header-only (plain structs and constants). Thread-safety: plain values.

#include <array>
#include <cstdint>
#include <string>
#include <vector>

#include "kvcache/eviction_policy.h"
#include "kvcache/tier_kind.h"

namespace strata::kvcache {

struct BlockPoolStats {
  int32_t num_blocks = 0;
  int32_t in_use = 0;      // ref > 0
  int32_t free = 0;        // ref == 0, no hash
  int32_t cached = 0;      // ref == 0, hashed, evictable
  int32_t indexed = 0;     // blocks with a hash (in use or cached)
  uint64_t evictions = 0;  // cached blocks whose hash was dropped for reuse
  std::string eviction_policy;  // its name
  PolicyStats policy;           // its decisions
};

struct TierHits {
  uint64_t blocks = 0;
  uint64_t tokens = 0;
};

// Upper bounds (seconds) of the latency buckets LowerTierStats counts loads
// and writes in (submit → completion, Clock time); a last, open bucket
// takes the rest. Cumulative like Prometheus' le buckets only when summed.
inline constexpr std::array<double, 12> kTierLatencyBounds = {1e-4,   2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3,
                                                              1e-2,   2.5e-2, 5e-2, 0.1,  0.25,   1.0};
using TierLatencyCounts = std::array<uint64_t, kTierLatencyBounds.size() + 1>;  // per bucket, not cumulative

struct LowerTierStats {
  std::string name;              // LowerTier::name
  TierKind kind = TierKind::kHost;  // the store's kind()
  TierHits hits;                 // prefix blocks loaded from this tier (completed OK)
  uint64_t bytes_down = 0;       // device → this tier (writes completed OK)
  uint64_t bytes_up = 0;         // this tier → device (loads completed OK)
  uint64_t writes = 0;           // writes submitted (write-backs included)
  uint64_t writebacks = 0;       // write-backs submitted (evicted device blocks; kWriteBack)
  uint64_t writebacks_dropped = 0;  // evicted blocks not written back: no staging buffer free
  uint64_t promoted = 0;         // blocks an exclusive tier dropped after a load moved them up
  uint64_t writebacks_deferred = 0;  // exclusive: write-backs that waited for promotions out of the tier
  uint64_t admissions_deferred = 0;  // full blocks not written yet (admit_after)
  uint64_t writes_failed = 0;
  // Writes the tier declined without a fault (StoreCompletion::refused):
  // its admission said no, or every slot was busy with reads or writes.
  uint64_t writes_refused = 0;
  uint64_t loads_failed = 0;
  int64_t load_nanos = 0;
  int64_t write_nanos = 0;             // sum over completed writes of submit → completion
  TierLatencyCounts load_latency{};    // completed loads (OK or not) by latency bucket
  TierLatencyCounts write_latency{};   // completed writes (OK or not) by latency bucket
  uint64_t corrupt_blocks = 0;         // the store's StoreStats::corrupt_blocks (filled by stats())
  std::string eviction_policy;         // the store's StoreStats (filled by stats())
  PolicyStats policy;
};

struct KvManagerStats {
  uint64_t queries = 0;        // requests whose prefix was looked up (first Allocate)
  uint64_t query_tokens = 0;   // their prompt tokens
  TierHits device;             // prefix blocks shared from device
  // The next five sum over lower tiers; `tiers` has them per tier.
  TierHits lower;              // prefix blocks loaded from lower tiers (completed OK)
  uint64_t bytes_down = 0;     // device → lower tiers (writes completed OK)
  uint64_t bytes_up = 0;       // lower tiers → device (loads completed OK)
  uint64_t writes_failed = 0;
  uint64_t loads_failed = 0;
  int64_t load_nanos = 0;      // sum over loads of submit→completion (Clock time)
  BlockPoolStats device_pool;  // includes device evictions
  std::vector<LowerTierStats> tiers;  // per lower tier, in chain order
};

// What Flush() removed. `lower_blocks` is per lower tier, in chain order
// (blocks the tier held before minus after; 0 for tiers not flushed).
struct FlushResult {
  uint64_t device_blocks = 0;
  std::vector<uint64_t> lower_blocks;
};

}  // namespace strata::kvcache
