// The exclusive write policy (WritePolicy::kExclusive): a block reaches the
// host tier only when the device evicts it; once a load brought it back to
// the device, the tier drops its copy (no block held twice), and the next
// device eviction writes it down again. The reloaded bytes are the ones
// computed.

#include <gtest/gtest.h>

#include <cstdio>

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
    for (int i = 0; i < 3; ++i)
      Run(first_id + static_cast<uint64_t>(i), Seq(29, 500 + 50 * i), 90 + i);
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

// Serial requests over shared prefixes: a device pool of D blocks above an
// exclusive host tier of H serves, request by request, exactly what one
// device pool of D + H serves (LRU both); so does the device above two
// exclusive tiers splitting H (a host and a disk), the second taking what
// the first drops. Write-backs into a full tier wait for the promotions out
// of the tiers, or it would evict its oldest blocks while the promoted ones
// still sit in it (with two tiers: until a request's last load, from either,
// is done, since its blocks leave their tiers only then).
TEST(KvExclusiveHierarchy, ServesAsOneFlatPoolOfTheTotalSize) {
  constexpr int32_t kDevice = 12, kHost = 36;
  struct Stack {
    std::vector<uint8_t> device;
    std::unique_ptr<HostStore> host, below;
    std::unique_ptr<KvManager> mgr;
  };
  ManualClock clock;
  auto make = [&clock](int32_t device_blocks, int32_t host_blocks, uint64_t staging_blocks = 64,
                       int32_t below_blocks = 0) {
    Stack s;
    s.device.assign(static_cast<size_t>(device_blocks) * kBlockBytes, 0);
    std::vector<LowerTier> tiers;
    for (auto [blocks, store] : {std::pair{host_blocks, &s.host}, std::pair{below_blocks, &s.below}}) {
      if (blocks == 0) continue;
      HostStoreOptions ho;
      ho.capacity_bytes = static_cast<uint64_t>(blocks) * kBlockBytes;
      ho.block_bytes = kBlockBytes;
      ho.pin = false;
      ho.eviction_policy = "lru";
      *store = std::move(HostStore::Create(ho)).value();
      tiers.push_back({store->get(), WritePolicy::kExclusive, 0, 0});
    }
    KvManagerOptions o;
    o.block_size = kBs;
    o.num_device_blocks = device_blocks;
    o.block_bytes = kBlockBytes;
    o.ns = NamespaceDigest("exclusive-test", "llama", "f16", kBs);
    o.load_policy = LoadPolicy::kAlways;
    o.eviction_policy = "lru";  // both: the flat pool's LRU is what the hierarchy reproduces
    o.writeback_staging_bytes = staging_blocks * kBlockBytes;
    uint8_t* base = s.device.data();
    auto mem = [base](BlockId id) { return base + id.value() * kBlockBytes; };
    s.mgr = std::move(KvManager::Create(o, mem, std::move(tiers), &clock)).value();
    return s;
  };
  // `few`: as `tiered` with 2 staging buffers: deferred write-backs cannot
  // all wait; they are written early (the tier evicts) rather than dropped.
  // `chain`: the host's share split into two exclusive tiers, the second
  // taking what the first drops (the device + host + disk shape).
  Stack tiered = make(kDevice, kHost), flat = make(kDevice + kHost, 0),
        few = make(kDevice, kHost, 2), chain = make(kDevice, kHost / 3, 64, kHost - kHost / 3);
  auto run = [](KvManager& m, uint64_t id, const std::vector<int32_t>& prompt) {
    EXPECT_TRUE(m.AddRequest(RequestId(id), prompt, {}).ok());
    auto a = m.Allocate(RequestId(id), static_cast<int32_t>(prompt.size()));
    EXPECT_TRUE(a.ok() && *a == AllocOutcome::kAllocated);
    for (int i = 0; i < 100 && !m.IsReady(RequestId(id)); ++i) m.Poll();
    EXPECT_TRUE(m.IsReady(RequestId(id)));
    const int32_t cached = m.CachedTokens(RequestId(id));
    EXPECT_TRUE(m.Commit(RequestId(id), prompt).ok());
    std::vector<int32_t> all = prompt;
    for (int k = 0; k < 9; ++k) {
      all.push_back(static_cast<int32_t>(id * 100 + k));
      auto b = m.Allocate(RequestId(id), static_cast<int32_t>(all.size()));
      EXPECT_TRUE(b.ok() && *b == AllocOutcome::kAllocated);
      EXPECT_TRUE(m.Commit(RequestId(id), all).ok());
      m.Poll();
    }
    m.Poll();
    m.Free(RequestId(id));
    return cached;
  };
  // Prompts: one of 4 shared heads (1-4 blocks), then a tail of 0-3 blocks
  // from a small alphabet (so tails repeat too), then a partial block; then
  // 9 generated tokens, committed one by one (their full blocks named too).
  uint64_t rng = 12345;
  auto next = [&rng](uint64_t n) {
    rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
    return (rng >> 33) % n;
  };
  int64_t served = 0, differ = 0, few_served = 0;
  for (uint64_t id = 1; id <= 3000; ++id) {
    const int head = static_cast<int>(next(4));
    std::vector<int32_t> prompt = Seq(4 * (1 + head), 1000 * head + 1);
    const int tail_blocks = static_cast<int>(next(4));
    for (int b = 0; b < tail_blocks; ++b) {
      const int32_t sym = static_cast<int32_t>(next(3));
      for (int k = 0; k < kBs; ++k) prompt.push_back(100000 + 10 * sym + k);
    }
    prompt.push_back(7);  // a partial block: every block above is cacheable
    const int32_t a = run(*tiered.mgr, id, prompt), b = run(*flat.mgr, id, prompt);
    const int32_t c = run(*chain.mgr, id, prompt);
    few_served += run(*few.mgr, id, prompt);
    served += b;
    if (a != b || c != b) {
      ++differ;
      ADD_FAILURE() << "request " << id << ": tiered served " << a << " tokens, chained " << c << ", flat " << b;
      if (differ > 5) break;
    }
  }
  EXPECT_GT(served, 0);
  EXPECT_GT(tiered.mgr->stats().tiers[0].promoted, 0u) << "the host tier was used";
  EXPECT_GT(chain.mgr->stats().tiers[1].promoted, 0u) << "the tier below the host was used";
  EXPECT_TRUE(chain.mgr->device_pool().CheckConsistency().ok());
  EXPECT_TRUE(tiered.mgr->device_pool().CheckConsistency().ok());
  EXPECT_EQ(tiered.mgr->stats().tiers[0].writebacks_dropped, 0u);
  EXPECT_GT(tiered.mgr->stats().tiers[0].writebacks_deferred, 0u);
  EXPECT_EQ(few.mgr->stats().tiers[0].writebacks_dropped, 0u);
  std::printf("served %lld, with 2 staging buffers %lld\n", static_cast<long long>(served),
              static_cast<long long>(few_served));
  EXPECT_GT(few_served, served * 9 / 10) << "few staging buffers: close to the flat pool still";
  EXPECT_TRUE(few.mgr->device_pool().CheckConsistency().ok());
}

}  // namespace
}  // namespace strata::kvcache
