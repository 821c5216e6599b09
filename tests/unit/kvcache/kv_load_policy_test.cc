// The `auto` load policy's decision with injected rates: a lower-tier hit is
// loaded when moving its bytes takes less time than recomputing its tokens,
// recomputed otherwise (and at equality), and loaded when either rate is
// unknown (0). Decided per tier along the chain: once a tier's run of hits is
// not worth loading, the rest of the prompt is recomputed. `always` and
// `never` ignore the rates. No clock or machine measurement is involved, so
// these answers do not depend on the machine's load (the e2e tests pin
// `--kv-load-policy always` wherever they assert a tier).

#include <gtest/gtest.h>

#include "tests/support/test_memory.h"

#include "kvcache/host_store.h"
#include "kvcache/kv_manager.h"

namespace strata::kvcache {
namespace {

constexpr int kBs = 4;
constexpr uint64_t kBlockBytes = 32;
// At this read rate a block loads in exactly the time its tokens recompute
// at kRecompute tokens/s: 32 B / 8000 B/s = 4 tokens / 1000 tokens/s = 4 ms.
constexpr double kRecompute = 1000;
constexpr double kBreakEven = kRecompute * static_cast<double>(kBlockBytes) / kBs;

std::vector<int32_t> Prompt() {  // 3 full blocks and one more token
  std::vector<int32_t> t(13);
  for (size_t i = 0; i < t.size(); ++i) t[i] = static_cast<int32_t>(100 + i);
  return t;
}

// Two lower tiers holding the prompt's first `upper_blocks` blocks in the
// upper one and all of them in the lower one; device empty.
struct Tiers {
  explicit Tiers(size_t upper_blocks) {
    upper = std::move(HostStore::Create({64 * kBlockBytes, kBlockBytes, false})).value();
    lower = std::move(HostStore::Create({64 * kBlockBytes, kBlockBytes, false})).value();
    ns = NamespaceDigest("w", "llama", "f16", kBs);
    const auto chain = HashPrefix(ns, Prompt(), kBs);
    std::vector<uint8_t> block(kBlockBytes, 7);
    for (size_t b = 0; b < chain.size(); ++b) {
      if (b < upper_blocks) Put(upper.get(), chain[b], block);
      Put(lower.get(), chain[b], block);
    }
  }
  void Put(HostStore* s, const BlockHash& h, std::span<const uint8_t> bytes) {
    const Status st = testing::StoreBlock(s, h, ns, bytes);
    ASSERT_TRUE(st.ok()) << st.ToString();
  }
  // The match of a manager with these rates (0 = unknown), and what it
  // estimates loading it takes (KvManager::EstimateLoadSeconds).
  PrefixMatch Match(LoadPolicy policy, double recompute, double upper_rate, double lower_rate,
                    double* load_seconds = nullptr) {
    KvManagerOptions o;
    o.block_size = kBs;
    o.num_device_blocks = 8;
    o.block_bytes = kBlockBytes;
    o.ns = ns;
    o.load_policy = policy;
    o.recompute_tokens_per_s = recompute;
    std::vector<LowerTier> t = {{upper.get(), WritePolicy::kWriteThrough, 0, upper_rate},
                                {lower.get(), WritePolicy::kWriteThrough, 0, lower_rate}};
    auto mgr = std::move(KvManager::Create(o, nullptr, std::move(t), &clock)).value();
    PrefixMatch m = mgr->Match(Prompt(), {});
    if (load_seconds != nullptr) *load_seconds = mgr->EstimateLoadSeconds(m);
    return m;
  }
  ManualClock clock;
  std::unique_ptr<HostStore> upper, lower;
  Sha256Digest ns;
};

TEST(KvLoadPolicy, AutoLoadsWhenMovingBeatsRecomputing) {
  Tiers t(3);
  const PrefixMatch m = t.Match(LoadPolicy::kAuto, kRecompute, kBreakEven * 2, kBreakEven * 2);
  EXPECT_EQ(m.device_tokens, 0);
  EXPECT_EQ(m.lower_tokens, 12);
  EXPECT_EQ(m.lower_tier_tokens, (std::vector<int32_t>{12, 0}));
}

// What a router adds to a prediction for a lower-tier hit: each tier's
// blocks at that tier's rate; a tier whose rate is unknown counts nothing.
TEST(KvLoadPolicy, EstimatedLoadTimeIsEachTiersBlocksAtItsRate) {
  Tiers t(1);  // block 0 in the upper tier, blocks 1 and 2 only in the lower
  double secs = -1;
  PrefixMatch m = t.Match(LoadPolicy::kAlways, 0, 3200, 6400, &secs);
  EXPECT_EQ(m.lower_tier_tokens, (std::vector<int32_t>{4, 8}));
  EXPECT_DOUBLE_EQ(secs, 32.0 / 3200 + 64.0 / 6400);
  m = t.Match(LoadPolicy::kAlways, 0, 3200, 0, &secs);
  EXPECT_DOUBLE_EQ(secs, 32.0 / 3200);
  Tiers none(0);
  m = none.Match(LoadPolicy::kNever, 0, 3200, 6400, &secs);
  EXPECT_EQ(m.lower_tokens, 0);
  EXPECT_EQ(secs, 0.0);
}

TEST(KvLoadPolicy, AutoRecomputesWhenLoadingIsSlower) {
  Tiers t(3);
  const PrefixMatch m = t.Match(LoadPolicy::kAuto, kRecompute, kBreakEven / 2, kBreakEven / 2);
  EXPECT_EQ(m.lower_tokens, 0);
  EXPECT_EQ(m.total(), 0);
}

TEST(KvLoadPolicy, AutoRecomputesAtTheBreakEvenPointAndLoadsJustAboveIt) {
  Tiers t(3);
  EXPECT_EQ(t.Match(LoadPolicy::kAuto, kRecompute, kBreakEven, kBreakEven).lower_tokens, 0);
  EXPECT_EQ(t.Match(LoadPolicy::kAuto, kRecompute, kBreakEven * 1.001, kBreakEven * 1.001).lower_tokens, 12);
  EXPECT_EQ(t.Match(LoadPolicy::kAuto, kRecompute, kBreakEven * 0.999, kBreakEven * 0.999).lower_tokens, 0);
}

TEST(KvLoadPolicy, AutoLoadsWhenARateIsUnknown) {
  Tiers t(3);
  EXPECT_EQ(t.Match(LoadPolicy::kAuto, 0, kBreakEven / 2, kBreakEven / 2).lower_tokens, 12);  // recompute unknown
  EXPECT_EQ(t.Match(LoadPolicy::kAuto, kRecompute, 0, 0).lower_tokens, 12);  // tier rate unknown
  EXPECT_EQ(t.Match(LoadPolicy::kAuto, 0, 0, 0).lower_tokens, 12);
}

TEST(KvLoadPolicy, AutoDecidesPerTierAlongTheChain) {
  // Blocks 0-1 in the fast upper tier, block 2 only in the slow lower one:
  // the upper run is loaded, the rest recomputed.
  Tiers t(2);
  PrefixMatch m = t.Match(LoadPolicy::kAuto, kRecompute, kBreakEven * 4, kBreakEven / 4);
  EXPECT_EQ(m.lower_tier_tokens, (std::vector<int32_t>{8, 0}));
  // A slow upper tier stops the chain even where the lower tier is fast:
  // the decision is taken on the first tier that holds the next blocks.
  m = t.Match(LoadPolicy::kAuto, kRecompute, kBreakEven / 4, kBreakEven * 4);
  EXPECT_EQ(m.lower_tokens, 0);
  // Both fast: 8 tokens from the upper tier, 4 from the lower.
  m = t.Match(LoadPolicy::kAuto, kRecompute, kBreakEven * 4, kBreakEven * 4);
  EXPECT_EQ(m.lower_tier_tokens, (std::vector<int32_t>{8, 4}));
}

TEST(KvLoadPolicy, AlwaysAndNeverIgnoreTheRates) {
  Tiers t(3);
  EXPECT_EQ(t.Match(LoadPolicy::kAlways, kRecompute, kBreakEven / 100, kBreakEven / 100).lower_tokens, 12);
  EXPECT_EQ(t.Match(LoadPolicy::kNever, kRecompute, kBreakEven * 100, kBreakEven * 100).lower_tokens, 0);
  EXPECT_EQ(t.Match(LoadPolicy::kNever, 0, 0, 0).lower_tokens, 0);
}

}  // namespace
}  // namespace strata::kvcache
