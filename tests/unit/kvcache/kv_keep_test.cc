// cache_ttl_seconds through the KV manager (AddRequest's keep_seconds): a
// request's blocks survive, in the device pool and in the host tier, a flood
// of other requests that evicts everything else, and compete normally once
// their time has passed; without the ask the same flood evicts them.

#include <gtest/gtest.h>

#include "kvcache/host_store.h"
#include "kvcache/kv_manager.h"

namespace strata::kvcache {
namespace {

constexpr int kBs = 4;
constexpr uint64_t kBlockBytes = 64;

std::vector<int32_t> Seq(int n, int first) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[static_cast<size_t>(i)] = first + i;
  return t;
}

struct Stack {
  explicit Stack(const std::string& policy) : device(16 * kBlockBytes, 0) {
    HostStoreOptions ho;
    ho.capacity_bytes = 6 * kBlockBytes;
    ho.block_bytes = kBlockBytes;
    ho.pin = false;
    ho.eviction_policy = policy;
    host = std::move(HostStore::Create(ho)).value();
    KvManagerOptions o;
    o.block_size = kBs;
    o.num_device_blocks = 16;
    o.block_bytes = kBlockBytes;
    o.ns = NamespaceDigest("keep-test", "llama", "f16", kBs);
    o.load_policy = LoadPolicy::kAlways;
    o.eviction_policy = policy;
    auto mem = [this](BlockId id) { return device.data() + id.value() * kBlockBytes; };
    mgr = std::move(KvManager::Create(o, mem, host.get(), &clock)).value();
  }
  void Run(uint64_t id, const std::vector<int32_t>& prompt, double keep_seconds = 0) {
    ASSERT_TRUE(mgr->AddRequest(RequestId(id), prompt, {}, nullptr, keep_seconds).ok());
    auto a = mgr->Allocate(RequestId(id), static_cast<int32_t>(prompt.size()));
    ASSERT_TRUE(a.ok());
    ASSERT_EQ(*a, AllocOutcome::kAllocated);
    mgr->Poll();
    ASSERT_TRUE(mgr->Commit(RequestId(id), prompt).ok());
    mgr->Poll();
    mgr->Free(RequestId(id));
  }
  // Requests of 5 full blocks each, all different: every cached block not
  // kept is evicted from the device and from the host tier. `twice`: each
  // prompt runs twice, so its blocks are reused too (scan-resistant
  // policies keep reused blocks over blocks used once).
  void Flood(uint64_t first_id, bool twice = false) {
    for (int i = 0; i < 8; ++i)
      for (int k = 0; k < (twice ? 2 : 1); ++k)
        Run(first_id + static_cast<uint64_t>(2 * i + k), Seq(21, 1000 + 100 * i + static_cast<int>(first_id)));
  }
  ManualClock clock;
  std::vector<uint8_t> device;
  std::unique_ptr<HostStore> host;
  std::unique_ptr<KvManager> mgr;
};

class KvKeepTest : public ::testing::TestWithParam<std::string> {};

TEST_P(KvKeepTest, KeptPrefixSurvivesAFloodUntilItsTimePasses) {
  const auto a = Seq(13, 1);  // 3 full blocks; 12 tokens may come from cache
  {
    Stack plain(GetParam());
    plain.Run(1, a);
    plain.Flood(100);
    EXPECT_EQ(plain.mgr->Match(a, {}).device_tokens, 0) << "the flood evicts an unkept prefix";
  }
  Stack s(GetParam());
  s.Run(1, a, /*keep_seconds=*/10);
  s.clock.Advance(1'000'000'000);
  s.Flood(100);
  PrefixMatch m = s.mgr->Match(a, {});
  EXPECT_EQ(m.device_tokens, 12) << "kept on the device";
  EXPECT_GE(s.host->policy().stats().evicted, 10u) << "the host tier evicted the flood's blocks";
  const BlockHash first = HashPrefix(s.mgr->options().ns, a, kBs)[0];
  EXPECT_TRUE(s.host->Contains(first)) << "kept in the host tier too";
  EXPECT_GT(s.mgr->device_pool().stats().policy.inserted, 0u);

  // Reused later: the ask is renewed from that use.
  s.clock.Advance(8'000'000'000);
  s.Run(2, a, /*keep_seconds=*/10);
  EXPECT_EQ(s.mgr->stats().device.tokens, 12u);
  s.clock.Advance(5'000'000'000);  // 14 s after the first use, 5 s after the second
  s.Flood(200);
  EXPECT_EQ(s.mgr->Match(a, {}).device_tokens, 12);

  // Its time passed: the next flood takes it like any other block.
  s.clock.Advance(20'000'000'000);
  s.Flood(300, /*twice=*/true);
  s.Flood(400, /*twice=*/true);
  EXPECT_EQ(s.mgr->Match(a, {}).device_tokens, 0);
  EXPECT_GT(s.mgr->device_pool().stats().policy.evicted_expired, 0u);
  EXPECT_TRUE(s.mgr->device_pool().CheckConsistency().ok());
}

TEST(KvKeepTest, AddRequestRefusesABadKeep) {
  Stack s("lru");
  EXPECT_FALSE(s.mgr->AddRequest(RequestId(1), Seq(8, 1), {}, nullptr, -1).ok());
  EXPECT_FALSE(s.mgr->AddRequest(RequestId(2), Seq(8, 1), {}, nullptr, 1e12).ok());
}

INSTANTIATE_TEST_SUITE_P(Policies, KvKeepTest, ::testing::ValuesIn(EvictionPolicyNames()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace strata::kvcache
