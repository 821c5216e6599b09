// The offline references of the prefix cache (issue 22): LRU and Belady MIN
// hit ratios of one flat cache, against hand-computed answers on small
// traces (chain units, prefix stops, bypass), and their order on the shared
// trace (MIN >= LRU, both <= the ideal, more capacity never fewer hits).

#include "bench/cache_reference.h"

#include <gtest/gtest.h>

#include "tests/support/test_env.h"

namespace strata::bench {
namespace {

std::vector<TraceRequest> Trace(std::vector<std::vector<int64_t>> ids) {
  std::vector<TraceRequest> t;
  for (auto& i : ids) {
    TraceRequest r;
    r.input_length = static_cast<int32_t>(512 * i.size());
    r.output_length = 1;
    r.hash_ids = std::move(i);
    t.push_back(std::move(r));
  }
  return t;
}

TEST(CacheReferenceTest, ChainUnitsFollowPrefixesNotRawIds) {
  auto c = ChainUnits(Trace({{1, 2}, {3, 2}, {1, 2, 4}}));
  ASSERT_EQ(c.size(), 3u);
  EXPECT_EQ(c[0], (std::vector<uint64_t>{1, 2}));
  EXPECT_EQ(c[1], (std::vector<uint64_t>{3, 4})) << "id 2 after 3 is another unit than after 1";
  EXPECT_EQ(c[2], (std::vector<uint64_t>{1, 2, 5}));
  // So the second request hits nothing although id 2 is cached.
  EXPECT_EQ(LruReference(c, 100).hit_ids, 2u);
}

TEST(CacheReferenceTest, HandComputedLruAndBelady) {
  // Units: [1]=a, [1,2]=b, [1,3]=c. Requests: (a b) (a c) (a b); 2 units.
  const auto c = ChainUnits(Trace({{1, 2}, {1, 3}, {1, 2}}));
  // LRU: after 1: b, a (a most recent). Request 2 serves a (c misses); c
  // evicts b. Request 3 serves a, then b misses: the prefix stops there.
  const ReferenceHits lru = LruReference(c, 2);
  EXPECT_EQ(lru.total_ids, 6u);
  EXPECT_EQ(lru.hit_ids, 2u);
  // MIN: c is never used again, so it bypasses; request 3 serves a and b.
  const ReferenceHits min = BeladyReference(c, 2);
  EXPECT_EQ(min.hit_ids, 3u);
  // Nothing cached, nothing served; unbounded: the ideal (a, a b).
  EXPECT_EQ(LruReference(c, 0).hit_ids, 0u);
  EXPECT_EQ(BeladyReference(c, 0).hit_ids, 0u);
  EXPECT_EQ(LruReference(c, 100).hit_ids, 3u);
  EXPECT_EQ(BeladyReference(c, 100).hit_ids, 3u);
}

TEST(CacheReferenceTest, TheTailOfAChainGoesFirstAndServingStopsAtIt) {
  // Capacity 2; (x y), (z), (z), (x y). LRU: z evicts y (the tail is the
  // least recent), so the last request is served x and stops at y: 1 + 1.
  // MIN: z (next use 3) replaces y (next use 5); then z is never used
  // again and leaves; the last request is served x only: also 1 + 1 (and
  // bypassing z instead would give 0 + 2: no better).
  const auto c = ChainUnits(Trace({{1, 2}, {9}, {9}, {1, 2}}));
  EXPECT_EQ(LruReference(c, 2).hit_ids, 2u);
  EXPECT_EQ(BeladyReference(c, 2).hit_ids, 2u);
  // With room for all three, both serve z once and x y once: 3.
  EXPECT_EQ(LruReference(c, 3).hit_ids, 3u);
  EXPECT_EQ(BeladyReference(c, 3).hit_ids, 3u);
}

TEST(CacheReferenceTest, OnTheSharedTraceMinBeatsLruAndCapacityNeverHurts) {
  auto t = LoadTrace(testing::SharedDir() + "/traces/synthetic_trace.jsonl");
  ASSERT_TRUE(t.ok()) << t.error().ToString();
  const auto c = ChainUnits(*t);
  const double ideal = IdealHitRatio(*t).ratio();
  double last_lru = 0, last_min = 0;
  for (uint64_t cap : {2000u, 5000u, 10000u, 20000u, 1000000u}) {
    const double lru = LruReference(c, cap).ratio(), min = BeladyReference(c, cap).ratio();
    EXPECT_GE(min, lru) << cap;
    EXPECT_LE(min, ideal + 1e-12) << cap;
    EXPECT_GE(lru, last_lru) << cap;
    EXPECT_GE(min, last_min) << cap;
    last_lru = lru;
    last_min = min;
  }
  EXPECT_DOUBLE_EQ(last_lru, ideal) << "a cache holding everything is the ideal";
  EXPECT_DOUBLE_EQ(last_min, ideal);
}

}  // namespace
}  // namespace strata::bench
