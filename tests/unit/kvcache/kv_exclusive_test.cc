// The exclusive write policy (WritePolicy::kExclusive): a block reaches the
// host tier only when the device evicts it; once a load brought it back to
// the device, the tier drops its copy (no block held twice), and the next
// device eviction writes it down again. The reloaded bytes are the ones
// computed.

#include <gtest/gtest.h>

#include "kvcache/host_store.h"
#include "kvcache/kv_manager.h"

namespace strata::kvcache {
namespace {

constexpr int kBs = 4;
constexpr uint64_t kBlockBytes = 64;
constexpr int32_t kDeviceBlocks = 8;

std::vector<int32_t> Seq(int n, int first) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[static_cast<size_t>(i)] = first + i;
  return t;
}

class KvExclusiveTest : public ::testing::Test {
 protected:
  void SetUp() override {
    device_.assign(kDeviceBlocks * kBlockBytes, 0);
    HostStoreOptions ho;
    ho.capacity_bytes = 32 * kBlockBytes;
    ho.block_bytes = kBlockBytes;
    ho.pin = false;
    host_ = std::move(HostStore::Create(ho)).value();
    KvManagerOptions o;
    o.block_size = kBs;
    o.num_device_blocks = kDeviceBlocks;
    o.block_bytes = kBlockBytes;
    o.ns = NamespaceDigest("exclusive-test", "llama", "f16", kBs);
    o.load_policy = LoadPolicy::kAlways;
    auto mem = [this](BlockId id) { return device_.data() + id.value() * kBlockBytes; };
    std::vector<LowerTier> tiers = {{host_.get(), WritePolicy::kExclusive, 0, 0}};
    mgr_ = std::move(KvManager::Create(o, mem, std::move(tiers), &clock_)).value();
  }

  // Runs a prompt: computed blocks get a pattern of (seed, position), loaded
  // ones are checked against it. Returns the tokens that came from cache.
  int32_t Run(uint64_t id, const std::vector<int32_t>& prompt, int seed) {
    EXPECT_TRUE(mgr_->AddRequest(RequestId(id), prompt, {}).ok());
    auto a = mgr_->Allocate(RequestId(id), static_cast<int32_t>(prompt.size()));
    EXPECT_TRUE(a.ok() && *a == AllocOutcome::kAllocated);
    mgr_->Poll();
    EXPECT_TRUE(mgr_->IsReady(RequestId(id)));
    const int32_t cached = mgr_->CachedTokens(RequestId(id));
    auto table = mgr_->BlockTable(RequestId(id));
    for (size_t b = 0; b < table.size(); ++b) {
      uint8_t* p = device_.data() + static_cast<size_t>(table[b]) * kBlockBytes;
      for (uint64_t k = 0; k < kBlockBytes; ++k) {
        const uint8_t want = static_cast<uint8_t>(seed * 31 + b * 7 + k);
        if (b < static_cast<size_t>(cached / kBs))
          EXPECT_EQ(p[k], want) << "cached block " << b << " byte " << k;
        else
          p[k] = want;
      }
    }
    EXPECT_TRUE(mgr_->Commit(RequestId(id), prompt).ok());
    mgr_->Poll();
    mgr_->Free(RequestId(id));
    return cached;
  }
  void Flood(uint64_t first_id) {
    for (int i = 0; i < 3; ++i) Run(first_id + static_cast<uint64_t>(i), Seq(29, 500 + 50 * i), 90 + i);
  }
  size_t HostHolds(const std::vector<int32_t>& prompt) {
    size_t n = 0;
    for (const BlockHash& h : HashPrefix(mgr_->options().ns, prompt, kBs)) n += host_->Contains(h);
    return n;
  }

  ManualClock clock_;
  std::vector<uint8_t> device_;
  std::unique_ptr<HostStore> host_;
  std::unique_ptr<KvManager> mgr_;
};

TEST_F(KvExclusiveTest, BlocksMoveDownOnEvictionAndUpOnHit) {
  const auto a = Seq(13, 1);  // 3 full blocks, 12 tokens cacheable
  EXPECT_EQ(Run(1, a, 5), 0);
  EXPECT_EQ(HostHolds(a), 0u) << "nothing goes down on commit";
  Flood(100);
  EXPECT_EQ(mgr_->Match(a, {}).device_tokens, 0);
  EXPECT_EQ(HostHolds(a), 3u) << "the device's evictions went down";

  EXPECT_EQ(Run(2, a, 5), 12);  // loaded from host, bytes checked
  EXPECT_EQ(mgr_->stats().lower.blocks, 3u);
  EXPECT_EQ(HostHolds(a), 0u) << "the loaded blocks left the host tier";
  EXPECT_EQ(mgr_->stats().tiers[0].promoted, 3u);
  EXPECT_EQ(mgr_->Match(a, {}).device_tokens, 12);

  Flood(200);
  EXPECT_EQ(HostHolds(a), 3u) << "evicted again: written down again";
  EXPECT_EQ(Run(3, a, 5), 12);
  EXPECT_TRUE(mgr_->device_pool().CheckConsistency().ok());
}

}  // namespace
}  // namespace strata::kvcache
