// The publishing side of the cluster index, and the two together over a
// lossy channel: the index ends exactly equal to what each instance holds.
#include "kvcache/kv_event_log.h"

#include <gtest/gtest.h>

#include <random>

namespace strata::kvcache {
namespace {

BlockHash H(int i) {
  BlockHash h;
  h.digest = Sha256Of(&i, sizeof(i));
  return h;
}

TEST(KvEventLog, AStepCarriesItsNetChange) {
  KvEventLog log("a", "a1", 1);
  log.Stored(H(1), TierKind::kDevice);
  log.Stored(H(2), TierKind::kHost);
  log.Removed(H(2), TierKind::kHost);  // stored and removed in one step: nothing
  auto b = log.Flush();
  ASSERT_TRUE(b.has_value());
  ASSERT_EQ(b->events.size(), 1u);
  EXPECT_EQ(b->seq_first, 1u);
  EXPECT_EQ(b->events[0].kind, KvEvent::Kind::kStored);
  // Removed then stored again in one step: no change either.
  log.Removed(H(1), TierKind::kDevice);
  log.Stored(H(1), TierKind::kDevice);
  EXPECT_FALSE(log.Flush().has_value());
  log.Removed(H(1), TierKind::kDevice);
  log.Removed(H(9), TierKind::kDisk);  // never stored: nothing to say
  b = log.Flush();
  ASSERT_TRUE(b.has_value());
  ASSERT_EQ(b->events.size(), 1u);
  EXPECT_EQ(b->seq_first, 2u);
  EXPECT_EQ(log.last_seq(), 2u);
  EXPECT_TRUE(log.Snapshot().blocks.empty());
}

TEST(KvEventLog, SinceAnswersFromKeptBatchesOrSaysSnapshot) {
  KvEventLog log("a", "a1", 1, /*keep_batches=*/2);
  for (int i = 0; i < 4; ++i) {
    log.Stored(H(i), TierKind::kHost);
    ASSERT_TRUE(log.Flush().has_value());
  }
  auto recent = log.Since(2);
  ASSERT_TRUE(recent.has_value());
  ASSERT_EQ(recent->size(), 2u);
  EXPECT_EQ((*recent)[0].seq_first, 3u);
  EXPECT_TRUE(log.Since(4)->empty());
  EXPECT_FALSE(log.Since(1).has_value()) << "batch 2 is no longer kept";
  KvSnapshot s = log.Snapshot();
  EXPECT_EQ(s.seq, 4u);
  EXPECT_EQ(s.blocks.size(), 4u);
}

// Three instances publish random changes step by step through a channel
// that drops, duplicates and reorders batches; one restarts midway. The
// subscriber catches up with Since() or a snapshot when the index asks or a
// gap lasts. At the end the index holds exactly what each instance holds.
TEST(KvEventLog, TheIndexConvergesExactlyOverALossyChannel) {
  std::mt19937 rng(11);
  ClusterKvIndex idx;
  std::vector<std::unique_ptr<KvEventLog>> logs;
  std::vector<std::string> names = {"a", "b", "c"};
  for (auto& n : names) logs.push_back(std::make_unique<KvEventLog>(n, n + "-1", 1, 8));
  std::vector<std::map<std::pair<int, int>, bool>> truth(3);  // (block, tier) held
  std::vector<KvEventBatch> channel;
  int snapshots = 0, resent = 0;

  auto catch_up = [&](size_t i) {
    auto st = idx.status();
    uint64_t applied = st.count(names[i]) ? st.at(names[i]).applied_seq : 0;
    auto since = logs[i]->Since(applied);
    if (since && (st.count(names[i]) == 0 || !st.at(names[i]).needs_snapshot)) {
      for (const auto& b : *since) resent += idx.Apply(b) == ClusterKvIndex::ApplyResult::kApplied;
    }
    st = idx.status();
    if (!since || (st.count(names[i]) && (st.at(names[i]).needs_snapshot || st.at(names[i]).pending > 0))) {
      ASSERT_TRUE(idx.ApplySnapshot(logs[i]->Snapshot()));
      ++snapshots;
    }
  };

  for (int step = 0; step < 300; ++step) {
    for (size_t i = 0; i < logs.size(); ++i) {
      if (step == 150 && i == 1) {  // b restarts: a new process, nothing held
        logs[i] = std::make_unique<KvEventLog>("b", "b-2", 2, 8);
        truth[i].clear();
      }
      int n = static_cast<int>(rng() % 4);
      for (int e = 0; e < n; ++e) {
        int h = static_cast<int>(rng() % 30);
        int t = static_cast<int>(rng() % 3);
        bool store = rng() % 3 != 0;
        if (store) {
          logs[i]->Stored(H(h), static_cast<TierKind>(t));
          truth[i][{h, t}] = true;
        } else {
          logs[i]->Removed(H(h), static_cast<TierKind>(t));
          truth[i].erase({h, t});
        }
      }
      if (auto b = logs[i]->Flush()) {
        unsigned r = rng() % 10;
        if (r == 0) continue;  // dropped
        channel.push_back(*b);
        if (r == 1) channel.push_back(*b);  // duplicated
      }
    }
    // Deliver, sometimes swapping neighbours.
    if (channel.size() > 1 && rng() % 3 == 0) std::swap(channel[0], channel[1]);
    for (const auto& b : channel) {
      size_t i = static_cast<size_t>(std::find(names.begin(), names.end(), b.instance) - names.begin());
      if (idx.Apply(b) == ClusterKvIndex::ApplyResult::kNeedSnapshot) catch_up(i);
    }
    channel.clear();
    // A gap that lasts some steps: catch up (sometimes within the 8 kept
    // batches, sometimes after: a snapshot).
    if (rng() % 8 == 0) {
      for (size_t i = 0; i < logs.size(); ++i) catch_up(i);
    }
  }
  for (size_t i = 0; i < logs.size(); ++i) catch_up(i);
  EXPECT_GT(resent, 0) << "some gaps were filled from kept batches";
  EXPECT_GT(snapshots, 0) << "some needed a snapshot";
  for (size_t i = 0; i < logs.size(); ++i) {
    for (int h = 0; h < 30; ++h) {
      TierMask want = 0;
      for (int t = 0; t < 3; ++t) {
        if (truth[i].count({h, t})) want |= MaskOf(static_cast<TierKind>(t));
      }
      ASSERT_EQ(idx.Holds(names[i], H(h)), want) << names[i] << " block " << h;
    }
  }
}

}  // namespace
}  // namespace strata::kvcache
