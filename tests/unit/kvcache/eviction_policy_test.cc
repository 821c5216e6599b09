// Eviction policies (kvcache/eviction_policy.h): each policy's invariants
// under randomized operations (driven directly and through BlockPool), the
// orders each one promises on small hand-checked cases, and keep_until.

#include "kvcache/eviction_policy.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>

#include "kvcache/block_pool.h"

namespace strata::kvcache {
namespace {

std::unique_ptr<EvictionPolicy> Make(const std::string& name, int32_t capacity) {
  auto p = MakeEvictionPolicy(name, capacity);
  EXPECT_TRUE(p.ok()) << p.error().ToString();
  return std::move(p).value();
}

BlockTraits Traits(uint64_t key, int32_t depth = -1, int32_t parent = -1) {
  BlockTraits t;
  t.key = key;
  t.depth = depth;
  t.parent = parent;
  return t;
}

BlockHash H(int i) {
  BlockHash h;
  h.digest[0] = static_cast<uint8_t>(i);
  h.digest[1] = static_cast<uint8_t>(i >> 8);
  h.digest[31] = 0xa5;
  return h;
}

TEST(EvictionPolicyTest, UnknownNameIsRefusedWithTheKnownOnes) {
  auto p = MakeEvictionPolicy("mru", 4);
  ASSERT_FALSE(p.ok());
  EXPECT_NE(p.error().message().find("mru"), std::string::npos);
  EXPECT_NE(p.error().message().find("s3fifo"), std::string::npos);
  EXPECT_FALSE(IsEvictionPolicy("mru"));
  for (const std::string& n : EvictionPolicyNames()) {
    EXPECT_TRUE(IsEvictionPolicy(n));
    auto q = MakeEvictionPolicy(n, 0);
    ASSERT_TRUE(q.ok());
    EXPECT_EQ((*q)->name(), n);
    EXPECT_EQ((*q)->Victim(), -1);
  }
}

class EachPolicyTest : public ::testing::TestWithParam<std::string> {};

// Random inserts (with random chain parents), hits, pins and unpins, removals
// and evictions. After every step: the policy's own audit, Victim() only
// ever names an evictable slot, and it names one whenever any slot is
// evictable; the count of evictable slots matches a model.
TEST_P(EachPolicyTest, RandomizedInvariants) {
  std::mt19937 rng(77);
  for (int round = 0; round < 10; ++round) {
    const int32_t cap = 1 + static_cast<int32_t>(rng() % 40);
    auto p = Make(GetParam(), cap);
    std::vector<int> state(static_cast<size_t>(cap), 0);  // 0 free, 1 evictable, 2 held not evictable
    uint64_t next_key = 1;
    int64_t now = 0;
    for (int step = 0; step < 3000; ++step) {
      now += 1000;
      p->SetNow(now);
      const int32_t slot = static_cast<int32_t>(rng() % static_cast<uint32_t>(cap));
      int& st = state[static_cast<size_t>(slot)];
      switch (rng() % 6) {
        case 0:
        case 1: {  // store into a free slot, or evict to make room
          int32_t target = slot;
          if (st != 0) {
            target = p->Victim();
            if (target < 0) break;
            ASSERT_EQ(state[static_cast<size_t>(target)], 1) << "victim " << target << " is not evictable";
            p->Erase(target, /*evicted=*/true);
            state[static_cast<size_t>(target)] = 0;
          }
          int32_t parent = static_cast<int32_t>(rng() % static_cast<uint32_t>(cap));
          if (state[static_cast<size_t>(parent)] == 0 || parent == target) parent = -1;
          BlockTraits t = Traits(next_key++ % 97, static_cast<int32_t>(rng() % 8), parent);
          t.chain_blocks = 8;
          if (rng() % 8 == 0) t.keep_until_nanos = now + static_cast<int64_t>(rng() % 20000);
          if (!p->Admit(t)) break;
          const bool evictable = rng() % 2 == 0;
          p->Insert(target, t, evictable);
          state[static_cast<size_t>(target)] = evictable ? 1 : 2;
          break;
        }
        case 2:
          if (st != 0) p->Access(slot);
          break;
        case 3:
          if (st != 0) {
            const bool e = st == 2;
            p->SetEvictable(slot, e);
            st = e ? 1 : 2;
          }
          break;
        case 4:
          if (st != 0 && rng() % 4 == 0) {
            p->Erase(slot, /*evicted=*/false);
            st = 0;
          }
          break;
        default: {
          const int32_t v = p->Victim();
          const bool any = std::count(state.begin(), state.end(), 1) > 0;
          ASSERT_EQ(v >= 0, any) << "Victim " << v << " while evictable slots exist: " << any;
          if (v >= 0) {
            ASSERT_EQ(state[static_cast<size_t>(v)], 1);
            p->Erase(v, /*evicted=*/true);
            state[static_cast<size_t>(v)] = 0;
          }
        }
      }
      ASSERT_EQ(p->num_evictable(), std::count(state.begin(), state.end(), 1));
      for (int32_t i = 0; i < cap; ++i) {
        ASSERT_EQ(p->held(i), state[static_cast<size_t>(i)] != 0);
        ASSERT_EQ(p->evictable(i), state[static_cast<size_t>(i)] == 1);
      }
      const Status c = p->CheckConsistency();
      ASSERT_TRUE(c.ok()) << GetParam() << " step " << step << ": " << c.ToString();
    }
    const PolicyStats& s = p->stats();
    EXPECT_GT(s.inserted, 0u);
    EXPECT_GT(s.evicted, 0u);
    EXPECT_LE(s.evicted_unused, s.evicted);
  }
}

// Through BlockPool: requests take chains of blocks (sharing prefixes),
// name them, release them tail first; the evict hook sees only blocks
// nobody references; the pool never hands out more than it has, and its
// audit (which includes the policy's) holds after every step.
TEST_P(EachPolicyTest, BlockPoolNeverEvictsReferencedBlocks) {
  std::mt19937 rng(5);
  const int32_t n = 24;
  BlockPool pool(n, Make(GetParam(), n));
  int evicted = 0;
  pool.set_evict_hook([&](BlockId id, const BlockHash&) {
    EXPECT_EQ(pool.ref(id), 0) << "evicted a referenced block";
    ++evicted;
  });
  struct Req {
    std::vector<BlockId> blocks;
  };
  std::vector<Req> running;
  for (int step = 0; step < 4000; ++step) {
    pool.SetNow(step);
    if (rng() % 3 != 0 || running.empty()) {  // a new request over chain `c`, length `len`
      const int c = static_cast<int>(rng() % 6), len = 1 + static_cast<int>(rng() % 6);
      Req r;
      bool ok = true;
      for (int k = 0; k < len && ok; ++k) {
        const BlockHash h = H(c * 16 + k);
        if (auto hit = pool.Lookup(h)) {
          pool.Ref(*hit);
          pool.Hit(*hit);
          r.blocks.push_back(*hit);
          continue;
        }
        std::vector<BlockId> got;
        if (!pool.Allocate(1, &got)) {
          ok = false;
          break;
        }
        BlockPool::RegisterHints hints;
        hints.depth = k;
        hints.chain_blocks = len;
        const BlockHash parent = H(c * 16 + k - 1);
        hints.parent = k > 0 ? &parent : nullptr;
        (void)pool.Register(got[0], h, hints);
        r.blocks.push_back(got[0]);
      }
      if (ok) {
        running.push_back(std::move(r));
      } else {
        for (auto b = r.blocks.rbegin(); b != r.blocks.rend(); ++b) pool.Release(*b);
      }
    } else {  // finish one: release tail first
      const size_t i = rng() % running.size();
      for (auto b = running[i].blocks.rbegin(); b != running[i].blocks.rend(); ++b) pool.Release(*b);
      running.erase(running.begin() + static_cast<std::ptrdiff_t>(i));
    }
    ASSERT_LE(pool.stats().in_use, n);
    const Status c = pool.CheckConsistency();
    ASSERT_TRUE(c.ok()) << GetParam() << " step " << step << ": " << c.ToString();
  }
  for (auto& r : running)
    for (auto b = r.blocks.rbegin(); b != r.blocks.rend(); ++b) pool.Release(*b);
  EXPECT_EQ(pool.stats().in_use, 0);
  EXPECT_GT(evicted, 0);
  EXPECT_EQ(pool.num_allocatable(), n);
  EXPECT_EQ(pool.EvictAllCached(), pool.stats().num_blocks - pool.stats().free);
  EXPECT_TRUE(pool.CheckConsistency().ok());
}

// A block some request asked to keep (keep_until in the future) goes only
// when nothing else is evictable, and competes normally once its time passed.
TEST_P(EachPolicyTest, KeptBlocksGoLast) {
  auto p = Make(GetParam(), 4);
  p->SetNow(100);
  BlockTraits kept = Traits(1);
  kept.keep_until_nanos = 1000;
  p->Insert(0, kept, true);
  p->Insert(1, Traits(2), true);
  p->Insert(2, Traits(3), true);
  for (int i = 0; i < 2; ++i) {
    const int32_t v = p->Victim();
    EXPECT_NE(v, 0);
    p->Erase(v, true);
  }
  EXPECT_EQ(p->Victim(), 0) << "only the kept block is left";
  p->Insert(1, Traits(4), true);
  p->Access(1);
  p->SetNow(2000);  // its time passed
  p->Access(1);
  const int32_t v = p->Victim();
  EXPECT_TRUE(v == 0 || v == 1);
  p->Erase(0, true);
  EXPECT_EQ(p->stats().evicted_expired, 1u);
  EXPECT_TRUE(p->CheckConsistency().ok());
}

// A prefix shared by requests running at the same time is a use too (the
// commonest hit): s3fifo then keeps it over blocks used once.
TEST(EvictionPolicyTest, HitsOnBlocksInUseCount) {
  BlockPool pool(4, Make("s3fifo", 4));
  std::vector<BlockId> a;
  ASSERT_TRUE(pool.Allocate(1, &a));
  ASSERT_TRUE(pool.Register(a[0], H(1)));
  const BlockId shared = *pool.Lookup(H(1));
  pool.Ref(shared);  // a second request takes it while the first still runs
  pool.Hit(shared);
  pool.Release(shared);
  pool.Release(a[0]);
  EXPECT_EQ(pool.policy().stats().hits, 1u);
  for (int i = 0; i < 12; ++i) {  // blocks used once, one after another
    std::vector<BlockId> b;
    ASSERT_TRUE(pool.Allocate(1, &b));
    ASSERT_TRUE(pool.Register(b[0], H(100 + i)));
    pool.Release(b[0]);
  }
  EXPECT_TRUE(pool.Lookup(H(1)).has_value()) << "the shared block survived the blocks used once";
  EXPECT_TRUE(pool.CheckConsistency().ok());
}

INSTANTIATE_TEST_SUITE_P(Policies, EachPolicyTest, ::testing::ValuesIn(EvictionPolicyNames()),
                         [](const auto& info) { return info.param; });

TEST(EvictionPolicyTest, LruEvictsTheLeastRecentlyUsed) {
  auto p = Make("lru", 3);
  for (int32_t i = 0; i < 3; ++i) p->Insert(i, Traits(static_cast<uint64_t>(i)), true);
  p->Access(0);  // 1 is now the oldest
  EXPECT_EQ(p->Victim(), 1);
  EXPECT_EQ(p->Order(), (std::vector<int32_t>{1, 2, 0}));
}

// leaf_lru: whatever the release order, a chain goes from its tail.
TEST(EvictionPolicyTest, LeafLruEvictsAChainTailFirstInAnyOrder) {
  auto p = Make("leaf_lru", 4);
  p->Insert(0, Traits(10, 0), false);
  p->Insert(1, Traits(11, 1, 0), false);
  p->Insert(2, Traits(12, 2, 1), false);
  p->Insert(3, Traits(20, 0), false);
  // Head released first (most LRU), tail last: plain LRU would evict the head.
  p->SetEvictable(0, true);
  p->SetEvictable(1, true);
  p->SetEvictable(2, true);
  p->SetEvictable(3, true);
  std::vector<int32_t> order;
  for (int32_t v = p->Victim(); v >= 0; v = p->Victim()) {
    order.push_back(v);
    p->Erase(v, true);
  }
  // 2 is the oldest leaf; then 1 becomes a leaf older than 3; then 0, then 3.
  EXPECT_EQ(order, (std::vector<int32_t>{2, 1, 0, 3}));

  auto lru = Make("lru", 4);
  lru->Insert(0, Traits(10, 0), true);
  lru->Insert(1, Traits(11, 1, 0), true);
  EXPECT_EQ(lru->Victim(), 0) << "lru does not protect the head";
}

// s3fifo: a block used again survives a scan of blocks used once.
TEST(EvictionPolicyTest, S3FifoKeepsAReusedBlockThroughAScan) {
  auto p = Make("s3fifo", 10);
  p->Insert(0, Traits(1000), true);
  p->Access(0);
  int32_t next = 1;
  for (uint64_t k = 0; k < 40; ++k) {
    int32_t slot = next < 10 ? next++ : -1;
    if (slot < 0) {
      slot = p->Victim();
      ASSERT_NE(slot, 0) << "the reused block was evicted by a scan";
      p->Erase(slot, true);
    }
    p->Insert(slot, Traits(k), true);
  }
  EXPECT_TRUE(p->held(0));
  auto lru = Make("lru", 10);
  lru->Insert(0, Traits(1000), true);
  lru->Access(0);
  for (int32_t s = 1; s < 10; ++s) lru->Insert(s, Traits(static_cast<uint64_t>(s)), true);
  EXPECT_EQ(lru->Victim(), 0) << "lru evicts it after one scan";
}

// freq: more uses outweigh recency; the evicted priority becomes the floor
// so an old favourite ages out.
TEST(EvictionPolicyTest, FreqKeepsTheMoreUsedBlock) {
  auto p = Make("freq", 3);
  p->Insert(0, Traits(1), true);
  p->Access(0);
  p->Access(0);
  p->Insert(1, Traits(2), true);
  p->Insert(2, Traits(3), true);
  EXPECT_EQ(p->Victim(), 1);
  p->Erase(1, true);
  EXPECT_EQ(p->Victim(), 2);
}

// The frequency history outlives eviction: a key seen before comes back
// with its count (used by freq, learned).
TEST(EvictionPolicyTest, FreqRemembersKeysAcrossEviction) {
  auto p = Make("freq", 2);
  for (int i = 0; i < 3; ++i) {  // key 7 stored and evicted three times
    p->Insert(0, Traits(7), true);
    p->Erase(0, true);
  }
  p->Insert(0, Traits(8), true);  // new key, inserted before 7 returns
  p->Insert(1, Traits(7), true);
  EXPECT_EQ(p->Victim(), 0) << "the key seen four times outranks a new one";
}

// learned: deterministic, and under a workload where one class of blocks is
// reused and another never is, it learns to evict the never-reused class
// first (as long as it has seen enough of both).
TEST(EvictionPolicyTest, LearnedPrefersEvictingBlocksOfANeverReusedClass) {
  const int32_t cap = 64;
  auto p = Make("learned", cap);
  std::vector<int> kind(cap, -1);  // 0 = from short prompts (reused), 1 = from long prompts (never reused)
  std::vector<int64_t> key_of(cap, -1);
  std::mt19937 rng(3);
  uint64_t fresh = 1 << 20;
  int evicted_reused = 0, evicted_never = 0;
  auto store = [&](uint64_t key, int k) {
    int32_t slot = -1;
    for (int32_t i = 0; i < cap && slot < 0; ++i)
      if (!p->held(i)) slot = i;
    if (slot < 0) {
      slot = p->Victim();
      ASSERT_GE(slot, 0);
      (kind[static_cast<size_t>(slot)] == 0 ? evicted_reused : evicted_never) += 1;
      p->Erase(slot, true);
    }
    BlockTraits t = Traits(key, 0);
    t.chain_blocks = k == 0 ? 2 : 64;
    p->Insert(slot, t, true);
    kind[static_cast<size_t>(slot)] = k;
    key_of[static_cast<size_t>(slot)] = static_cast<int64_t>(key);
  };
  for (int step = 0; step < 40000; ++step) {
    if (step == 20000) evicted_reused = evicted_never = 0;  // count once it has trained
    if (rng() % 2 == 0) {
      const uint64_t key = rng() % 48;  // a working set of 48 keys, used again and again
      int32_t slot = -1;
      for (int32_t i = 0; i < cap && slot < 0; ++i)
        if (p->held(i) && key_of[static_cast<size_t>(i)] == static_cast<int64_t>(key)) slot = i;
      if (slot >= 0) {
        p->Access(slot);
      } else {
        store(key, 0);
      }
    } else {
      store(fresh++, 1);  // a scan: never used again
    }
  }
  EXPECT_GT(evicted_never, 4 * evicted_reused) << "never-reused evicted " << evicted_never << ", reused "
                                               << evicted_reused;
  EXPECT_TRUE(p->CheckConsistency().ok());
}

}  // namespace
}  // namespace strata::kvcache
