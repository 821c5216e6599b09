#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <memory>
#include <numeric>
#include <thread>
#include <vector>

#include "common/config.h"
#include "common/sha256.h"
#include "common/strong_id.h"
#include "common/thread_pool.h"

namespace strata {
namespace {

TEST(Sha256Test, KnownVectors) {
  // FIPS 180-2 examples.
  EXPECT_EQ(ToHex(Sha256Of("abc", 3)), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(ToHex(Sha256Of("", 0)), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  Sha256 h;
  h.Update("ab");
  h.Update("c");
  EXPECT_EQ(ToHex(h.Finish()), ToHex(Sha256Of("abc", 3)));
}

TEST(StrongIdTest, DistinctTypesCompare) {
  BlockId a(3), b(4);
  EXPECT_LT(a, b);
  EXPECT_EQ(a, BlockId(3));
  static_assert(!std::is_convertible_v<BlockId, RequestId>);
  EXPECT_EQ(std::hash<BlockId>()(a), std::hash<uint32_t>()(3));
}

TEST(ThreadPoolTest, RunsEveryTaskOnce) {
  ThreadPool pool(3);
  for (int round = 0; round < 200; ++round) {
    std::vector<std::atomic<int>> hits(97);
    pool.Run(97, [&](int t) { hits[t].fetch_add(1); });
    for (auto& h : hits) ASSERT_EQ(h.load(), 1);
  }
}

TEST(ThreadPoolTest, ParallelForCoversRangeExactly) {
  ThreadPool pool(2);
  for (size_t n : {0u, 1u, 5u, 1000u}) {
    std::vector<int> v(n, 0);
    pool.ParallelFor(n, 3, [&](size_t b, size_t e) {
      for (size_t i = b; i < e; ++i) v[i] += 1;
    });
    EXPECT_EQ(std::accumulate(v.begin(), v.end(), 0), static_cast<int>(n));
  }
}

// Back-to-back jobs with the spinning hand-off and with sleep-only waking,
// with uneven tasks so workers and caller finish in either order, and jobs
// whose caller-owned function dies right after Run returns (a worker still
// inside the old job would touch it).
TEST(ThreadPoolTest, ManyShortJobsSpinningAndSleeping) {
  for (int spin : {0, 50, 200}) {
    ThreadPool pool(3, spin);
    EXPECT_EQ(pool.spin_micros(), spin);
    int64_t expect = 0;
    std::atomic<int64_t> sum{0};
    for (int round = 0; round < 3000; ++round) {
      const int n = 1 + round % 7;
      auto fn = std::make_unique<std::function<void(int)>>([&sum, round](int t) {
        if ((round + t) % 5 == 0) std::this_thread::sleep_for(std::chrono::microseconds(20));
        sum.fetch_add(t + 1);
      });
      pool.Run(n, *fn);
      fn.reset();
      expect += static_cast<int64_t>(n) * (n + 1) / 2;
      ASSERT_EQ(sum.load(), expect) << "spin " << spin << " round " << round;
    }
    // Idle long enough for workers to stop spinning and sleep, then wake them.
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
    pool.Run(4, [&](int t) { sum.fetch_add(t); });
    EXPECT_EQ(sum.load(), expect + 6);
  }
}

TEST(ThreadPoolTest, DestroyWhileWorkersSpin) {
  for (int i = 0; i < 50; ++i) {
    ThreadPool pool(2, 100000);
    std::atomic<int> n{0};
    pool.Run(2, [&](int) { n.fetch_add(1); });
    EXPECT_EQ(n.load(), 2);
  }  // destructor must wake the spinning worker promptly
}

TEST(ThreadPoolTest, NestedCallsRunInline) {
  ThreadPool pool(2);
  std::atomic<int> total{0};
  pool.Run(4, [&](int) { pool.Run(3, [&](int) { total.fetch_add(1); }); });
  EXPECT_EQ(total.load(), 12);
}

TEST(ConfigTest, TypedGettersAndErrorsNameTheKey) {
  auto c = Config::Parse("kv:\n  block_size: 32\n  dtype: f16\n  host_bytes: 4G\nengine:\n  threads: two\n", "t.yaml");
  ASSERT_TRUE(c) << c.error().ToString();
  EXPECT_EQ(*c->GetInt("kv.block_size", 16), 32);
  EXPECT_EQ(*c->GetInt("kv.missing", 16), 16);
  EXPECT_EQ(*c->GetString("kv.dtype", ""), "f16");
  EXPECT_EQ(*c->GetBytes("kv.host_bytes", 0), 4ull << 30);
  auto bad = c->GetInt("engine.threads", 0);
  ASSERT_FALSE(bad);
  EXPECT_NE(bad.error().message().find("engine.threads"), std::string::npos);
  Status unknown = c->CheckKnownKeys({"kv.block_size", "kv.dtype", "kv.host_bytes"});
  EXPECT_NE(unknown.message().find("unknown key 'engine.threads'"), std::string::npos) << unknown.message();
  EXPECT_FALSE(Config::Parse("a: [1, 2", "broken.yaml"));
}

TEST(ConfigTest, MapListsGiveEachElementItsOwnOrigin) {
  auto c = Config::Parse("kv:\n  tiers:\n    - {kind: host, bytes: 1G}\n    - kind: disk\n      bytes: x\n", "t.yaml");
  ASSERT_TRUE(c.ok());
  auto list = c->GetMapList("kv.tiers");
  ASSERT_TRUE(list.ok()) << list.error().ToString();
  ASSERT_EQ(list->size(), 2u);
  EXPECT_EQ((*list)[0].GetString("kind", "").value(), "host");
  EXPECT_EQ((*list)[0].GetBytes("bytes", 0).value(), 1ull << 30);
  EXPECT_EQ((*list)[1].origin(), "t.yaml: kv.tiers[1]");
  auto bad = (*list)[1].GetBytes("bytes", 0);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.error().message().find("t.yaml: kv.tiers[1]"), std::string::npos) << bad.error().message();
  // The list is one leaf key; absent is an empty list.
  auto leaves = c->LeafKeys();
  EXPECT_EQ(leaves, std::vector<std::string>{"kv.tiers"});
  EXPECT_TRUE(c->GetMapList("kv.other")->empty());
  // Not a list, or an element that is not a mapping: errors naming the key.
  auto scalar = Config::Parse("kv:\n  tiers: 3\n", "s.yaml");
  ASSERT_TRUE(scalar.ok());
  auto e = scalar->GetMapList("kv.tiers");
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.error().message().find("'kv.tiers' must be a list of mappings"), std::string::npos);
  auto plain = Config::Parse("kv:\n  tiers: [host, disk]\n", "p.yaml");
  ASSERT_TRUE(plain.ok());
  e = plain->GetMapList("kv.tiers");
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.error().message().find("kv.tiers[0] must be a mapping"), std::string::npos) << e.error().message();
}

TEST(ConfigTest, ByteSizes) {
  EXPECT_EQ(*ParseByteSize("512K"), 512u << 10);
  EXPECT_EQ(*ParseByteSize("64M"), 64u << 20);
  EXPECT_EQ(*ParseByteSize("1GiB"), 1u << 30);
  EXPECT_EQ(*ParseByteSize("123"), 123u);
  EXPECT_EQ(*ParseByteSize("0"), 0u);
  EXPECT_FALSE(ParseByteSize("12X"));
  EXPECT_FALSE(ParseByteSize("G"));
  EXPECT_FALSE(ParseByteSize("99999999999999999999"));
  EXPECT_FALSE(ParseByteSize("17179869184T"));
}

}  // namespace
}  // namespace strata
