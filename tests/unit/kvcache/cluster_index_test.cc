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

// Incarnation names sort with their start: "a1" < "a2"; the epoch is the
// name's last digit (tests use at most 9 restarts).
uint64_t EpochOf(const std::string& inc) { return inc.empty() ? 0 : static_cast<uint64_t>(inc.back()); }

KvEventBatch Batch(const std::string& inst, const std::string& inc, uint64_t seq,
                   std::vector<std::tuple<K, int, TierKind>> events) {
  KvEventBatch b{inst, inc, EpochOf(inc), seq, {}};
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
  auto b1 = Batch("a", "x1", 1, {{K::kStored, 0, TierKind::kHost}, {K::kStored, 1, TierKind::kHost}});
  EXPECT_EQ(idx.Apply(b1), R::kApplied);
  EXPECT_EQ(idx.Apply(b1), R::kDuplicate);
  // Overlapping: seq 2 (already applied) and 3 (new: removes block 0).
  auto b2 = Batch("a", "x1", 2, {{K::kStored, 1, TierKind::kHost}, {K::kRemoved, 0, TierKind::kHost}});
  EXPECT_EQ(idx.Apply(b2), R::kApplied);
  EXPECT_EQ(idx.Holds("a", H(0)), 0);
  EXPECT_EQ(idx.Holds("a", H(1)), MaskOf(TierKind::kHost));
  EXPECT_EQ(idx.status().at("a").applied_seq, 3u);
}

TEST(ClusterKvIndex, ReorderedBatchesWaitForTheGap) {
  ClusterKvIndex idx;
  EXPECT_EQ(idx.Apply(Batch("a", "x1", 1, {{K::kStored, 0, TierKind::kHost}})), R::kApplied);
  EXPECT_EQ(idx.Apply(Batch("a", "x1", 3, {{K::kStored, 2, TierKind::kHost}})), R::kWaiting);
  EXPECT_EQ(idx.Holds("a", H(2)), 0) << "not applied before the gap is filled";
  EXPECT_EQ(idx.status().at("a").pending, 1u);
  EXPECT_EQ(idx.Apply(Batch("a", "x1", 2, {{K::kStored, 1, TierKind::kHost}})), R::kApplied);
  EXPECT_EQ(idx.Holds("a", H(2)), MaskOf(TierKind::kHost));
  EXPECT_EQ(idx.status().at("a").applied_seq, 3u);
  EXPECT_EQ(idx.status().at("a").pending, 0u);
}

TEST(ClusterKvIndex, ALongGapNeedsASnapshot) {
  ClusterKvIndex idx;
  EXPECT_EQ(idx.Apply(Batch("a", "x1", 1, {{K::kStored, 0, TierKind::kHost}})), R::kApplied);
  R last = R::kApplied;
  for (uint64_t s = 3; s < 3 + ClusterKvIndex::kMaxPending + 1; ++s) {
    last = idx.Apply(Batch("a", "x1", s, {{K::kStored, static_cast<int>(s), TierKind::kHost}}));
  }
  EXPECT_EQ(last, R::kNeedSnapshot);
  EXPECT_TRUE(idx.status().at("a").needs_snapshot);
  // The snapshot as of the seq before the newest batch; that batch (kept
  // while waiting) applies after it.
  const uint64_t newest = 2 + ClusterKvIndex::kMaxPending + 1;
  KvSnapshot snap{"a", "x1", EpochOf("x1"), newest - 1, {}};
  for (int i = 0; i < static_cast<int>(newest); ++i) snap.blocks.push_back({H(i), TierKind::kHost});
  ASSERT_TRUE(idx.ApplySnapshot(snap));
  auto st = idx.status().at("a");
  EXPECT_FALSE(st.needs_snapshot);
  EXPECT_EQ(st.applied_seq, newest);
  EXPECT_EQ(idx.Holds("a", H(static_cast<int>(newest))), MaskOf(TierKind::kHost));
  EXPECT_EQ(idx.Holds("a", H(1)), MaskOf(TierKind::kHost)) << "from the snapshot";
}

TEST(ClusterKvIndex, ARestartDropsTheOldIncarnationAtOnce) {
  ClusterKvIndex idx;
  EXPECT_EQ(idx.Apply(Batch("a", "inc1", 1, {{K::kStored, 0, TierKind::kHost}, {K::kStored, 1, TierKind::kHost}})),
            R::kApplied);
  // The new process publishes from its seq 1: only what it says it holds.
  EXPECT_EQ(idx.Apply(Batch("a", "inc2", 1, {{K::kStored, 5, TierKind::kHost}})), R::kApplied);
  EXPECT_EQ(idx.Holds("a", H(0)), 0);
  EXPECT_EQ(idx.Holds("a", H(5)), MaskOf(TierKind::kHost));
  // A late batch or snapshot of the old process is ignored.
  EXPECT_EQ(idx.Apply(Batch("a", "inc1", 3, {{K::kStored, 0, TierKind::kHost}})), R::kStale);
  EXPECT_FALSE(idx.ApplySnapshot(KvSnapshot{"a", "inc1", EpochOf("inc1"), 9, {{H(0), TierKind::kHost}}}));
  EXPECT_EQ(idx.Holds("a", H(0)), 0);
}

TEST(ClusterKvIndex, ASubscriberThatJoinedLateAsksForASnapshot) {
  ClusterKvIndex idx;
  EXPECT_EQ(idx.Apply(Batch("a", "run1", 1, {{K::kStored, 0, TierKind::kHost}})), R::kApplied);
  // Restarted, and we first hear of it at seq 50: its state is unknown
  // until a snapshot (the subscriber asks when the gap lasts).
  EXPECT_EQ(idx.Apply(Batch("a", "run2", 50, {{K::kStored, 7, TierKind::kHost}})), R::kWaiting);
  EXPECT_EQ(idx.status().at("a").pending, 1u);
  EXPECT_EQ(idx.Holds("a", H(0)), 0) << "never the old incarnation's blocks";
  EXPECT_EQ(idx.Holds("a", H(7)), 0) << "nor half a state";
  EXPECT_TRUE(idx.LongestPrefix(Chain(1)).empty());
  ASSERT_TRUE(idx.ApplySnapshot(KvSnapshot{"a", "run2", EpochOf("run2"), 49, {{H(0), TierKind::kDisk}}}));
  EXPECT_EQ(idx.Holds("a", H(0)), MaskOf(TierKind::kDisk));
  EXPECT_EQ(idx.Holds("a", H(7)), MaskOf(TierKind::kHost)) << "the waiting batch after the snapshot";
}

TEST(ClusterKvIndex, LateTrafficOfAnOlderIncarnationNeverWins) {
  ClusterKvIndex idx;
  // A subscriber that joined after a restart hears the new process first.
  EXPECT_EQ(idx.Apply(Batch("a", "p2", 1, {{K::kStored, 5, TierKind::kHost}})), R::kApplied);
  EXPECT_EQ(idx.Apply(Batch("a", "p1", 1, {{K::kStored, 0, TierKind::kHost}})), R::kStale);
  EXPECT_FALSE(idx.ApplySnapshot(KvSnapshot{"a", "p1", EpochOf("p1"), 3, {{H(0), TierKind::kHost}}}));
  EXPECT_EQ(idx.Holds("a", H(0)), 0);
  EXPECT_EQ(idx.Holds("a", H(5)), MaskOf(TierKind::kHost));
  EXPECT_EQ(idx.Apply(Batch("a", "p2", 2, {{K::kStored, 6, TierKind::kHost}})), R::kApplied);
}

TEST(ClusterKvIndex, AnOlderSnapshotDoesNotRollBack) {
  ClusterKvIndex idx;
  EXPECT_EQ(idx.Apply(Batch("a", "x1", 1, {{K::kStored, 0, TierKind::kHost}})), R::kApplied);
  EXPECT_EQ(idx.Apply(Batch("a", "x1", 2, {{K::kRemoved, 0, TierKind::kHost}})), R::kApplied);
  EXPECT_FALSE(idx.ApplySnapshot(KvSnapshot{"a", "x1", EpochOf("x1"), 1, {{H(0), TierKind::kHost}}}));
  EXPECT_EQ(idx.Holds("a", H(0)), 0);
  EXPECT_EQ(idx.Apply(Batch("a", "x1", 3, {{K::kStored, 1, TierKind::kHost}})), R::kApplied);
}

TEST(ClusterKvIndex, ARemovedInstanceStaysGoneUntilANewIncarnation) {
  ClusterKvIndex idx;
  EXPECT_EQ(idx.Apply(Batch("a", "x1", 1, {{K::kStored, 0, TierKind::kHost}})), R::kApplied);
  idx.RemoveInstance("a");
  EXPECT_EQ(idx.Holds("a", H(0)), 0);
  EXPECT_EQ(idx.Apply(Batch("a", "x1", 2, {{K::kStored, 1, TierKind::kHost}})), R::kStale) << "late traffic";
  EXPECT_FALSE(idx.ApplySnapshot(KvSnapshot{"a", "x1", EpochOf("x1"), 5, {{H(1), TierKind::kHost}}}));
  EXPECT_TRUE(idx.LongestPrefix(Chain(2)).empty());
  EXPECT_EQ(idx.status().count("a"), 0u);
  EXPECT_EQ(idx.Apply(Batch("a", "x2", 1, {{K::kStored, 1, TierKind::kHost}})), R::kApplied) << "restarted";
  EXPECT_EQ(idx.Holds("a", H(1)), MaskOf(TierKind::kHost));
}

TEST(ClusterKvIndex, AReadmittedIncarnationTakesASnapshotAgain) {
  ClusterKvIndex idx;
  EXPECT_EQ(idx.Apply(Batch("a", "x1", 1, {{K::kStored, 0, TierKind::kHost}})), R::kApplied);
  idx.RemoveInstance("a");
  idx.Readmit("a", "x0");  // another incarnation: nothing changes
  EXPECT_FALSE(idx.ApplySnapshot(KvSnapshot{"a", "x1", EpochOf("x1"), 5, {{H(1), TierKind::kHost}}}));
  idx.Readmit("a", "x1");  // listed again (it was only unreachable)
  EXPECT_TRUE(idx.ApplySnapshot(KvSnapshot{"a", "x1", EpochOf("x1"), 5, {{H(1), TierKind::kHost}}}));
  EXPECT_EQ(idx.Holds("a", H(1)), MaskOf(TierKind::kHost));
  EXPECT_EQ(idx.Holds("a", H(0)), 0);
  EXPECT_EQ(idx.Apply(Batch("a", "x1", 6, {{K::kStored, 2, TierKind::kHost}})), R::kApplied);
}

TEST(ClusterKvIndex, WhileASnapshotIsAwaitedTheNewestBatchesAreKept) {
  ClusterKvIndex idx;
  EXPECT_EQ(idx.Apply(Batch("a", "x1", 1, {{K::kStored, 0, TierKind::kHost}})), R::kApplied);
  uint64_t s = 3;
  for (; s < 3 + ClusterKvIndex::kMaxPending; ++s) {
    idx.Apply(Batch("a", "x1", s, {{K::kStored, static_cast<int>(s), TierKind::kHost}}));
  }
  EXPECT_EQ(idx.Apply(Batch("a", "x1", s, {{K::kStored, static_cast<int>(s), TierKind::kHost}})), R::kNeedSnapshot);
  // Traffic continues while the snapshot (as of s) is in flight.
  for (uint64_t t = s + 1; t < s + 10; ++t) {
    EXPECT_EQ(idx.Apply(Batch("a", "x1", t, {{K::kStored, static_cast<int>(t), TierKind::kHost}})),
              R::kNeedSnapshot);
  }
  ASSERT_TRUE(idx.ApplySnapshot(KvSnapshot{"a", "x1", EpochOf("x1"), s, {{H(0), TierKind::kHost}}}));
  EXPECT_EQ(idx.status().at("a").applied_seq, s + 9) << "the batches after the snapshot applied";
  EXPECT_EQ(idx.status().at("a").pending, 0u);
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
        KvEventBatch batch{inst, inst + "-1", 1, seq, {}};
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
    // The prefix answers (another map) agree with what each instance holds.
    for (int h = 0; h < 20; ++h) {
      std::vector<BlockHash> one{H(h)};
      std::set<std::string> listed;
      for (const auto& holder : idx.LongestPrefix(one)) {
        listed.insert(holder.instance);
        EXPECT_EQ(holder.tiers[0], idx.Holds(holder.instance, H(h)));
      }
      for (std::string inst : {"a", "b", "c"}) EXPECT_EQ(listed.count(inst) == 1, idx.Holds(inst, H(h)) != 0);
    }
  }
}

}  // namespace
}  // namespace strata::kvcache
