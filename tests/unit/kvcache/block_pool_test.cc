// BlockPool: reference counts, free-before-cached reuse, LRU eviction order,
// the prefix index, and invariants under randomized operations.

#include "kvcache/block_pool.h"

#include <gtest/gtest.h>

#include <map>
#include <random>
#include <set>

namespace strata::kvcache {
namespace {

BlockHash H(int i) {
  BlockHash h;
  h.digest[0] = static_cast<uint8_t>(i);
  h.digest[1] = static_cast<uint8_t>(i >> 8);
  h.digest[31] = 0x5a;
  return h;
}

TEST(BlockPoolTest, AllocateIsAllOrNothing) {
  BlockPool pool(4);
  std::vector<BlockId> got;
  ASSERT_TRUE(pool.Allocate(3, &got));
  EXPECT_EQ(got.size(), 3u);
  EXPECT_FALSE(pool.Allocate(2, &got));  // only 1 left
  EXPECT_EQ(got.size(), 3u);
  EXPECT_EQ(pool.num_allocatable(), 1);
  ASSERT_TRUE(pool.Allocate(1, &got));
  std::set<uint32_t> ids;
  for (auto b : got) ids.insert(b.value());
  EXPECT_EQ(ids.size(), 4u);
  for (auto b : got) pool.Release(b);
  EXPECT_EQ(pool.num_allocatable(), 4);
  EXPECT_TRUE(pool.CheckConsistency().ok());
}

TEST(BlockPoolTest, CachedBlocksAreReusedLastAndLruFirst) {
  BlockPool pool(4);
  std::vector<BlockId> b;
  ASSERT_TRUE(pool.Allocate(4, &b));
  // A chain of three hashed blocks, released tail first; one unhashed block.
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(pool.Register(b[i], H(i)));
  pool.Release(b[2]);
  pool.Release(b[1]);
  pool.Release(b[0]);
  pool.Release(b[3]);
  EXPECT_EQ(pool.EvictionOrder(), (std::vector<BlockId>{b[2], b[1], b[0]}));
  EXPECT_EQ(pool.stats().cached, 3);
  EXPECT_EQ(pool.stats().free, 1);

  // The unhashed block goes first; nothing is evicted.
  std::vector<BlockId> a;
  ASSERT_TRUE(pool.Allocate(1, &a));
  EXPECT_EQ(a[0], b[3]);
  EXPECT_EQ(pool.stats().evictions, 0u);
  // Then the tail of the chain, whose hash leaves the index.
  ASSERT_TRUE(pool.Allocate(1, &a));
  EXPECT_EQ(a[1], b[2]);
  EXPECT_EQ(pool.stats().evictions, 1u);
  EXPECT_FALSE(pool.Lookup(H(2)).has_value());
  EXPECT_EQ(pool.Lookup(H(0)), b[0]);
  EXPECT_FALSE(pool.has_hash(a[1]));

  // A hit on the head takes it out of the LRU; the next victim is b[1].
  pool.Ref(b[0]);
  EXPECT_EQ(pool.EvictionOrder(), (std::vector<BlockId>{b[1]}));
  ASSERT_TRUE(pool.Allocate(1, &a));
  EXPECT_EQ(a[2], b[1]);
  EXPECT_FALSE(pool.Allocate(1, &a));  // b[0] is in use: never handed out
  EXPECT_TRUE(pool.CheckConsistency().ok());
}

TEST(BlockPoolTest, DuplicateRegistrationStaysPrivate) {
  BlockPool pool(2);
  std::vector<BlockId> b;
  ASSERT_TRUE(pool.Allocate(2, &b));
  ASSERT_TRUE(pool.Register(b[0], H(7)));
  EXPECT_FALSE(pool.Register(b[1], H(7)));
  EXPECT_FALSE(pool.has_hash(b[1]));
  EXPECT_EQ(pool.Lookup(H(7)), b[0]);
  pool.Release(b[1]);
  pool.Release(b[0]);
  EXPECT_EQ(pool.stats().free, 1);
  EXPECT_EQ(pool.stats().cached, 1);
  EXPECT_EQ(pool.EvictAllCached(), 1);
  EXPECT_FALSE(pool.Lookup(H(7)).has_value());
  EXPECT_TRUE(pool.CheckConsistency().ok());
}

// Random owners take, share, name and release blocks; a model of the expected
// ref counts is checked against the pool after every step.
TEST(BlockPoolTest, RandomizedInvariants) {
  std::mt19937 rng(1234);
  for (int round = 0; round < 20; ++round) {
    const int32_t n = 1 + static_cast<int32_t>(rng() % 8);
    BlockPool pool(n);
    std::vector<std::vector<BlockId>> owners(5);
    std::map<uint32_t, int> refs;
    int next_hash = 0;
    for (int step = 0; step < 2000; ++step) {
      auto& o = owners[rng() % owners.size()];
      switch (rng() % 4) {
        case 0: {  // allocate
          const int32_t k = static_cast<int32_t>(rng() % 3);
          const bool can = k <= pool.num_allocatable();
          std::vector<BlockId> got;
          ASSERT_EQ(pool.Allocate(k, &got), can);
          for (auto b : got) {
            ASSERT_EQ(refs[b.value()], 0) << "block in use handed out again";
            refs[b.value()] = 1;
            o.push_back(b);
          }
          break;
        }
        case 1: {  // name one of mine, then maybe share a hit
          if (o.empty()) break;
          BlockId b = o[rng() % o.size()];
          if (!pool.has_hash(b)) (void)pool.Register(b, H(next_hash++ % 64));
          if (auto hit = pool.Lookup(H(static_cast<int>(rng() % 64)))) {
            pool.Ref(*hit);
            ++refs[hit->value()];
            o.push_back(*hit);
          }
          break;
        }
        default: {  // release my newest
          if (o.empty()) break;
          pool.Release(o.back());
          --refs[o.back().value()];
          o.pop_back();
          break;
        }
      }
      for (auto& [id, r] : refs) ASSERT_EQ(pool.ref(BlockId(id)), r);
      ASSERT_TRUE(pool.CheckConsistency().ok()) << pool.CheckConsistency().ToString();
    }
    for (auto& o : owners)
      for (auto it = o.rbegin(); it != o.rend(); ++it) pool.Release(*it);
    EXPECT_EQ(pool.num_allocatable(), n);
    EXPECT_EQ(pool.stats().in_use, 0);
    EXPECT_TRUE(pool.CheckConsistency().ok());
  }
}

}  // namespace
}  // namespace strata::kvcache
