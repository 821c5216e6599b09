// The cluster KV index: ordering, gaps, duplicates, snapshots and
// incarnations, and longest-prefix answers.
#include "kvcache/cluster_index.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <set>

namespace strata::kvcache {
namespace {

using K = KvEvent::Kind;
using R = ClusterKvIndex::ApplyResult;

BlockHash H(int i) {
  BlockHash h;
  h.digest = Sha256Of(&i, sizeof(i));
  return h;
}

KvEventBatch Batch(const std::string& inst, const std::string& inc, uint64_t seq,
                   std::vector<std::tuple<K, int, TierKind>> events) {
  KvEventBatch b{inst, inc, seq, {}};
  for (auto [k, h, t] : events) b.events.push_back({k, H(h), t});
  return b;
}

std::vector<BlockHash> Chain(int n) {
  std::vector<BlockHash> c;
  for (int i = 0; i < n; ++i) c.push_back(H(i));
  return c;
}

TEST(ClusterKvIndex, LongestPrefixByInstanceAndTier) {
  ClusterKvIndex idx;
  // a holds blocks 0..3 (2 and 3 only on disk), b holds 0..1, c holds 1..2 (not 0).
  ASSERT_EQ(idx.Apply(Batch("a", "a1", 1,
                            {{K::kStored, 0, TierKind::kDevice},
                             {K::kStored, 1, TierKind::kHost},
                             {K::kStored, 2, TierKind::kDisk},
                             {K::kStored, 3, TierKind::kDisk},
                             {K::kStored, 1, TierKind::kDisk}})),
            R::kApplied);
  ASSERT_EQ(idx.Apply(Batch("b", "b1", 1, {{K::kStored, 0, TierKind::kHost}, {K::kStored, 1, TierKind::kHost}})),
            R::kApplied);
  ASSERT_EQ(idx.Apply(Batch("c", "c1", 1, {{K::kStored, 1, TierKind::kHost}, {K::kStored, 2, TierKind::kHost}})),
            R::kApplied);
  auto chain = Chain(5);
  auto holders = idx.LongestPrefix(chain);
  ASSERT_EQ(holders.size(), 2u) << "c lacks the first block";
  EXPECT_EQ(holders[0].instance, "a");
  EXPECT_EQ(holders[0].blocks, 4u);
  EXPECT_EQ(holders[0].tiers[1], MaskOf(TierKind::kHost) | MaskOf(TierKind::kDisk));
  EXPECT_EQ(holders[1].instance, "b");
  EXPECT_EQ(holders[1].blocks, 2u);
  // Removing one tier keeps the other; removing the last drops the block.
  ASSERT_EQ(idx.Apply(Batch("a", "a1", 6, {{K::kRemoved, 1, TierKind::kHost}})), R::kApplied);
  EXPECT_EQ(idx.Holds("a", H(1)), MaskOf(TierKind::kDisk));
  ASSERT_EQ(idx.Apply(Batch("a", "a1", 7, {{K::kRemoved, 1, TierKind::kDisk}})), R::kApplied);
  EXPECT_EQ(idx.Holds("a", H(1)), 0);
  holders = idx.LongestPrefix(chain);
  EXPECT_EQ(holders[0].instance, "b");
  EXPECT_EQ(holders[1].instance, "a");
  EXPECT_EQ(holders[1].blocks, 1u);
  EXPECT_TRUE(idx.LongestPrefix(std::vector<BlockHash>{H(99)}).empty());
  idx.RemoveInstance("b");
  EXPECT_EQ(idx.LongestPrefix(chain).size(), 1u);
}

TEST(ClusterKvIndex, DuplicatesAndOverlapsApplyOnce) {
  ClusterKvIndex idx;
  auto b1 = Batch("a", "x", 1, {{K::kStored, 0, TierKind::kHost}, {K::kStored, 1, TierKind::kHost}});
  EXPECT_EQ(idx.Apply(b1), R::kApplied);
  EXPECT_EQ(idx.Apply(b1), R::kDuplicate);
  // Overlapping: seq 2 (already applied) and 3 (new: removes block 0).
  auto b2 = Batch("a", "x", 2, {{K::kStored, 1, TierKind::kHost}, {K::kRemoved, 0, TierKind::kHost}});
  EXPECT_EQ(idx.Apply(b2), R::kApplied);
  EXPECT_EQ(idx.Holds("a", H(0)), 0);
  EXPECT_EQ(idx.Holds("a", H(1)), MaskOf(TierKind::kHost));
  EXPECT_EQ(idx.status().at("a").applied_seq, 3u);
}

TEST(ClusterKvIndex, ReorderedBatchesWaitForTheGap) {
  ClusterKvIndex idx;
  EXPECT_EQ(idx.Apply(Batch("a", "x", 1, {{K::kStored, 0, TierKind::kHost}})), R::kApplied);
  EXPECT_EQ(idx.Apply(Batch("a", "x", 3, {{K::kStored, 2, TierKind::kHost}})), R::kWaiting);
  EXPECT_EQ(idx.Holds("a", H(2)), 0) << "not applied before the gap is filled";
  EXPECT_EQ(idx.status().at("a").pending, 1u);
  EXPECT_EQ(idx.Apply(Batch("a", "x", 2, {{K::kStored, 1, TierKind::kHost}})), R::kApplied);
  EXPECT_EQ(idx.Holds("a", H(2)), MaskOf(TierKind::kHost));
  EXPECT_EQ(idx.status().at("a").applied_seq, 3u);
  EXPECT_EQ(idx.status().at("a").pending, 0u);
}

TEST(ClusterKvIndex, ALongGapNeedsASnapshot) {
  ClusterKvIndex idx;
  EXPECT_EQ(idx.Apply(Batch("a", "x", 1, {{K::kStored, 0, TierKind::kHost}})), R::kApplied);
  R last = R::kApplied;
  for (uint64_t s = 3; s < 3 + ClusterKvIndex::kMaxPending + 1; ++s) {
    last = idx.Apply(Batch("a", "x", s, {{K::kStored, static_cast<int>(s), TierKind::kHost}}));
  }
  EXPECT_EQ(last, R::kNeedSnapshot);
  EXPECT_TRUE(idx.status().at("a").needs_snapshot);
  // The snapshot as of seq 40; batches after it that were waiting apply.
  KvSnapshot snap{"a", "x", 40, {}};
  for (int i = 0; i <= 40; ++i) snap.blocks.push_back({H(i), TierKind::kHost});
  ASSERT_TRUE(idx.ApplySnapshot(snap));
  auto st = idx.status().at("a");
  EXPECT_FALSE(st.needs_snapshot);
  EXPECT_EQ(st.applied_seq, 3 + ClusterKvIndex::kMaxPending);
  EXPECT_EQ(idx.Holds("a", H(static_cast<int>(2 + ClusterKvIndex::kMaxPending))), MaskOf(TierKind::kHost));
}

TEST(ClusterKvIndex, ARestartDropsTheOldIncarnationAtOnce) {
  ClusterKvIndex idx;
  EXPECT_EQ(idx.Apply(Batch("a", "old", 1, {{K::kStored, 0, TierKind::kHost}, {K::kStored, 1, TierKind::kHost}})),
            R::kApplied);
  // The new process publishes from its seq 1: only what it says it holds.
  EXPECT_EQ(idx.Apply(Batch("a", "new", 1, {{K::kStored, 5, TierKind::kHost}})), R::kApplied);
  EXPECT_EQ(idx.Holds("a", H(0)), 0);
  EXPECT_EQ(idx.Holds("a", H(5)), MaskOf(TierKind::kHost));
  // A late batch or snapshot of the old process is ignored.
  EXPECT_EQ(idx.Apply(Batch("a", "old", 3, {{K::kStored, 0, TierKind::kHost}})), R::kStale);
  EXPECT_FALSE(idx.ApplySnapshot(KvSnapshot{"a", "old", 9, {{H(0), TierKind::kHost}}}));
  EXPECT_EQ(idx.Holds("a", H(0)), 0);
}

TEST(ClusterKvIndex, ASubscriberThatJoinedLateAsksForASnapshot) {
  ClusterKvIndex idx;
  EXPECT_EQ(idx.Apply(Batch("a", "one", 1, {{K::kStored, 0, TierKind::kHost}})), R::kApplied);
  // Restarted, and we first hear of it at seq 50: its state is unknown
  // until a snapshot (the subscriber asks when the gap lasts).
  EXPECT_EQ(idx.Apply(Batch("a", "two", 50, {{K::kStored, 7, TierKind::kHost}})), R::kWaiting);
  EXPECT_EQ(idx.status().at("a").pending, 1u);
  EXPECT_EQ(idx.Holds("a", H(0)), 0) << "never the old incarnation's blocks";
  EXPECT_EQ(idx.Holds("a", H(7)), 0) << "nor half a state";
  EXPECT_TRUE(idx.LongestPrefix(Chain(1)).empty());
  ASSERT_TRUE(idx.ApplySnapshot(KvSnapshot{"a", "two", 49, {{H(0), TierKind::kDisk}}}));
  EXPECT_EQ(idx.Holds("a", H(0)), MaskOf(TierKind::kDisk));
  EXPECT_EQ(idx.Holds("a", H(7)), MaskOf(TierKind::kHost)) << "the waiting batch after the snapshot";
}

// Random event streams, delivered with reordering and duplicates: once all
// are delivered the index equals the truth.
TEST(ClusterKvIndex, RandomDeliveryConvergesToTheTruth) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 20; ++trial) {
    ClusterKvIndex idx;
    std::map<std::string, std::set<std::pair<int, int>>> truth;
    std::vector<KvEventBatch> sent;
    for (std::string inst : {"a", "b", "c"}) {
      uint64_t seq = 1;
      for (int b = 0; b < 30; ++b) {
        KvEventBatch batch{inst, inst + "-1", seq, {}};
        int n = 1 + static_cast<int>(rng() % 5);
        for (int e = 0; e < n; ++e) {
          int h = static_cast<int>(rng() % 20);
          auto tier = static_cast<TierKind>(rng() % 3);
          bool store = rng() % 3 != 0;
          batch.events.push_back({store ? K::kStored : K::kRemoved, H(h), tier});
          if (store) {
            truth[inst].insert({h, static_cast<int>(tier)});
          } else {
            truth[inst].erase({h, static_cast<int>(tier)});
          }
        }
        seq += batch.events.size();
        sent.push_back(batch);
        if (rng() % 4 == 0) sent.push_back(batch);  // duplicate
      }
    }
    // Reorder locally (within a window smaller than kMaxPending).
    for (size_t i = 0; i + 1 < sent.size(); ++i) {
      if (rng() % 3 == 0) std::swap(sent[i], sent[i + 1]);
    }
    for (const auto& b : sent) {
      auto r = idx.Apply(b);
      ASSERT_NE(r, R::kNeedSnapshot);
      ASSERT_NE(r, R::kStale);
    }
    for (const auto& [name, st] : idx.status()) EXPECT_EQ(st.pending, 0u) << name;
    for (const auto& [inst, blocks] : truth) {
      for (int h = 0; h < 20; ++h) {
        TierMask want = 0;
        for (int t = 0; t < 3; ++t) {
          if (blocks.count({h, t})) want |= MaskOf(static_cast<TierKind>(t));
        }
        ASSERT_EQ(idx.Holds(inst, H(h)), want) << inst << " block " << h;
      }
    }
  }
}

}  // namespace
}  // namespace strata::kvcache
