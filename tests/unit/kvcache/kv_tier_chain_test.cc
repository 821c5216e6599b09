// KvManager over a chain of two lower tiers (both HostStores here, standing in
// for host and disk): lookup device → tier 0 → tier 1, loads from whichever
// tier holds each block, promotion into the upper tier, admission to the
// lower tier only after N hits, per-tier statistics.

#include <gtest/gtest.h>

#include "kvcache/host_store.h"
#include "kvcache/kv_manager.h"

namespace strata::kvcache {
namespace {

constexpr int kBs = 4;
constexpr uint64_t kBlockBytes = 32;

std::vector<int32_t> Seq(int n, int first) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[static_cast<size_t>(i)] = first + i;
  return t;
}

struct Chain {
  Chain(int32_t device_blocks, uint32_t admit_after)
      : bytes(static_cast<size_t>(device_blocks) * kBlockBytes) {
    upper = std::move(HostStore::Create({64 * kBlockBytes, kBlockBytes, false})).value();
    lower = std::move(HostStore::Create({64 * kBlockBytes, kBlockBytes, false})).value();
    KvManagerOptions o;
    o.block_size = kBs;
    o.num_device_blocks = device_blocks;
    o.block_bytes = kBlockBytes;
    o.ns = NamespaceDigest("w", "llama", "f16", kBs);
    o.load_policy = LoadPolicy::kAlways;
    std::vector<LowerTier> tiers = {{upper.get(), WritePolicy::kWriteThrough, 0, 0},
                                    {lower.get(), WritePolicy::kWriteThrough, admit_after, 0}};
    mgr = std::move(KvManager::Create(
                        o, [this](BlockId id) { return bytes.data() + id.value() * kBlockBytes; },
                        std::move(tiers), &clock))
              .value();
    ns = o.ns;
  }
  // Runs a request over `prompt`, filling computed blocks with a pattern.
  std::vector<int> Run(uint64_t id, const std::vector<int32_t>& prompt) {
    const RequestId rid(id);
    EXPECT_TRUE(mgr->AddRequest(rid, prompt, {}).ok());
    EXPECT_EQ(*mgr->Allocate(rid, static_cast<int32_t>(prompt.size())), AllocOutcome::kAllocated);
    while (!mgr->IsReady(rid)) mgr->Poll();
    auto table = mgr->BlockTable(rid);
    for (size_t b = static_cast<size_t>(mgr->CachedTokens(rid) / kBs); b < table.size(); ++b)
      for (uint64_t k = 0; k < kBlockBytes; ++k)
        bytes[static_cast<size_t>(table[b]) * kBlockBytes + k] = static_cast<uint8_t>(b * 31 + k);
    auto tiers = mgr->CachedBlockTiers(rid);
    EXPECT_TRUE(mgr->Commit(rid, prompt).ok());
    mgr->Poll();
    mgr->Free(rid);
    mgr->Poll();
    return tiers;
  }
  // Takes every device block once, so nothing stays cached in device.
  void EvictDevice(int32_t device_blocks) {
    std::vector<int32_t> filler(static_cast<size_t>(device_blocks * kBs), 7);
    ASSERT_TRUE(mgr->AddRequest(RequestId(999), filler, {}).ok());
    ASSERT_EQ(*mgr->Allocate(RequestId(999), device_blocks * kBs), AllocOutcome::kAllocated);
    mgr->Free(RequestId(999));
    std::fill(bytes.begin(), bytes.end(), 0xAB);
  }
  ManualClock clock;
  std::vector<uint8_t> bytes;
  std::unique_ptr<HostStore> upper, lower;
  std::unique_ptr<KvManager> mgr;
  Sha256Digest ns;
};

TEST(KvTierChainTest, WriteThroughReachesEveryTierAndLoadsComeFromTheUpper) {
  Chain c(8, 0);
  auto p = Seq(13, 50);  // 3 full blocks
  c.Run(1, p);
  EXPECT_EQ(c.upper->stats().blocks, 3u);
  EXPECT_EQ(c.lower->stats().blocks, 3u);
  c.EvictDevice(8);
  auto m = c.mgr->Match(p, {});
  EXPECT_EQ(m.device_tokens, 0);
  ASSERT_EQ(m.lower_tier_tokens.size(), 2u);
  EXPECT_EQ(m.lower_tier_tokens[0], 12);
  EXPECT_EQ(m.lower_tier_tokens[1], 0);
  auto tiers = c.Run(2, p);
  EXPECT_EQ(tiers, (std::vector<int>{1, 1, 1}));
  auto s = c.mgr->stats();
  EXPECT_EQ(s.tiers[0].hits.blocks, 3u);
  EXPECT_EQ(s.tiers[1].hits.blocks, 0u);
  EXPECT_EQ(s.lower.blocks, 3u);
}

TEST(KvTierChainTest, BlocksMissingAboveComeFromBelowAndArePromoted) {
  Chain c(8, 0);
  auto p = Seq(13, 50);
  c.Run(1, p);
  const auto chain = HashPrefix(c.ns, p, kBs);
  // Keep the expected bytes of block 2 to check the round trip through tier 1.
  c.EvictDevice(8);
  ASSERT_TRUE(c.upper->Remove(chain[2]).ok());
  auto m = c.mgr->Match(p, {});
  EXPECT_EQ(m.lower_tier_tokens[0], 8);
  EXPECT_EQ(m.lower_tier_tokens[1], 4);
  EXPECT_EQ(m.lower_tokens, 12);

  const RequestId rid(2);
  ASSERT_TRUE(c.mgr->AddRequest(rid, p, {}).ok());
  ASSERT_EQ(*c.mgr->Allocate(rid, 13), AllocOutcome::kAllocated);
  while (!c.mgr->IsReady(rid)) c.mgr->Poll();
  EXPECT_EQ(c.mgr->CachedTokens(rid), 12);
  EXPECT_EQ(c.mgr->CachedBlockTiers(rid), (std::vector<int>{1, 1, 2}));
  EXPECT_EQ(c.mgr->tier_name(0), "device");
  const auto table = c.mgr->BlockTable(rid);
  for (size_t b = 0; b < 3; ++b)
    for (uint64_t k = 0; k < kBlockBytes; ++k)
      ASSERT_EQ(c.bytes[static_cast<size_t>(table[b]) * kBlockBytes + k],
                static_cast<uint8_t>(b * 31 + k))
          << "block " << b;
  c.mgr->Poll();
  EXPECT_TRUE(c.upper->Contains(chain[2]));  // promoted on the way up
  c.mgr->Free(rid);
  auto s = c.mgr->stats();
  EXPECT_EQ(s.tiers[0].hits.blocks, 2u);
  EXPECT_EQ(s.tiers[1].hits.blocks, 1u);
  EXPECT_EQ(s.tiers[1].bytes_up, kBlockBytes);
}

TEST(KvTierChainTest, LowerTierAdmitsOnlyAfterNHits) {
  Chain c(8, 2);
  auto p = Seq(9, 10);  // 2 full blocks
  c.Run(1, p);
  EXPECT_EQ(c.upper->stats().blocks, 2u);
  EXPECT_EQ(c.lower->stats().blocks, 0u);
  EXPECT_EQ(c.mgr->stats().tiers[1].admissions_deferred, 2u);
  EXPECT_EQ(c.Run(2, p), (std::vector<int>{0, 0}));  // hit 1, from device
  EXPECT_EQ(c.lower->stats().blocks, 0u);
  c.Run(3, p);  // hit 2: admitted
  EXPECT_EQ(c.lower->stats().blocks, 2u);
  EXPECT_EQ(c.mgr->stats().tiers[1].bytes_down, 2 * kBlockBytes);
}

TEST(KvTierChainTest, NeverPolicyLoadsNothingButStillWrites) {
  Chain c(8, 0);
  auto p = Seq(9, 10);
  c.Run(1, p);
  c.EvictDevice(8);
  // A manager sharing the stores (and so the segment table they are
  // attached to; metadata-only, no device segment) with kNever sees no
  // lower hits.
  KvManagerOptions o = c.mgr->options();
  o.load_policy = LoadPolicy::kNever;
  CpuCopyEngine copy(&c.mgr->segments());
  auto never = std::move(KvManager::Create(o, DeviceKv{&c.mgr->segments(), SegmentId(), &copy},
                                           std::vector<LowerTier>{{c.upper.get()}, {c.lower.get()}}, &c.clock))
                   .value();
  EXPECT_EQ(never->Match(p, {}).lower_tokens, 0);
  EXPECT_EQ(c.mgr->Match(p, {}).lower_tokens, 8);
}

TEST(KvTierChainTest, NullStoreIsRejected) {
  ManualClock clock;
  KvManagerOptions o;
  auto r = KvManager::Create(o, nullptr, std::vector<LowerTier>{{nullptr}}, &clock);
  EXPECT_FALSE(r.ok());
}

}  // namespace
}  // namespace strata::kvcache
