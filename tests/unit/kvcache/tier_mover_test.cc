// TierMover driven directly, over its own BlockPool and plain device memory:
// write-through on commit and a load back (bytes identical, the load's
// completion reported with its request and epoch, every pool reference
// returned), write-back of evicted blocks through staging (the staged bytes
// are the ones before the block was reused), a failed load reported, and
// lookup along two tiers. Staging exhaustion needs a store that holds its
// completions back: kv_manager_writeback_test covers it. The KvManager tests
// (kv_manager_*_test, kv_tier_chain_test) cover the same through the
// manager.

#include "kvcache/tier_mover.h"

#include <gtest/gtest.h>

#include "tests/support/test_memory.h"

#include "kvcache/host_store.h"

namespace strata::kvcache {
namespace {

constexpr int kBs = 4;
constexpr uint64_t kBlockBytes = 64;
constexpr int32_t kDeviceBlocks = 4;

BlockHash Hash(int i) {
  const auto chain = HashPrefix(NamespaceDigest("w", "llama", "f16", kBs), std::vector<int32_t>(4, i), kBs);
  return chain[0];
}

struct MoverRig {
  MoverRig(WritePolicy policy, uint64_t staging_bytes = 64ull << 20, size_t tiers = 1)
      : pool(kDeviceBlocks), bytes(kDeviceBlocks * kBlockBytes) {
    std::vector<LowerTier> lowers;
    for (size_t i = 0; i < tiers; ++i) {
      stores.push_back(std::move(HostStore::Create({16 * kBlockBytes, kBlockBytes, false})).value());
      LowerTier t;
      t.store = stores.back().get();
      t.write_policy = policy;
      t.name = "t" + std::to_string(i);
      lowers.push_back(t);
    }
    KvManagerOptions o;
    o.block_size = kBs;
    o.num_device_blocks = kDeviceBlocks;
    o.block_bytes = kBlockBytes;
    o.ns = NamespaceDigest("w", "llama", "f16", kBs);
    o.load_policy = LoadPolicy::kAlways;
    o.writeback_staging_bytes = staging_bytes;
    auto m = TierMover::Create(o, [this](BlockId id) { return bytes.data() + id.value() * kBlockBytes; },
                               std::move(lowers), &pool, &clock, [this](const LoadDone& d) { done.push_back(d); });
    EXPECT_TRUE(m.ok()) << m.error().ToString();
    mover = std::move(m).value();
  }
  // Allocates a block, fills it with `fill` and names it `h`.
  BlockId Put(const BlockHash& h, uint8_t fill) {
    std::vector<BlockId> got;
    EXPECT_TRUE(pool.Allocate(1, &got));
    mover->WriteBackEvicted();
    std::fill_n(bytes.begin() + got[0].value() * kBlockBytes, kBlockBytes, fill);
    EXPECT_TRUE(pool.Register(got[0], h));
    return got[0];
  }
  uint8_t At(BlockId b) const { return bytes[b.value() * kBlockBytes]; }
  void Drain() {
    while (mover->ops_in_flight() > 0) mover->Poll();
  }
  ManualClock clock;
  BlockPool pool;
  std::vector<uint8_t> bytes;
  std::vector<std::unique_ptr<HostStore>> stores;
  std::vector<LoadDone> done;
  std::unique_ptr<TierMover> mover;
};

TEST(TierMover, WriteThroughOnCommitThenLoadBackIdentical) {
  MoverRig r(WritePolicy::kWriteThrough);
  const BlockHash h = Hash(1);
  const BlockId b = r.Put(h, 0x5A);
  r.mover->OnCommitted(b, h);
  EXPECT_EQ(r.pool.ref(b), 2);  // the request's and the write's
  r.Drain();
  EXPECT_EQ(r.pool.ref(b), 1);
  EXPECT_TRUE(r.stores[0]->Contains(h));
  r.pool.Release(b);

  const std::vector<BlockHash> chain = {h, Hash(2)};
  EXPECT_EQ(r.mover->LowerHits(chain, 0, 2), (std::vector<int>{0}));
  std::vector<BlockId> dst;
  ASSERT_TRUE(r.pool.Allocate(1, &dst));
  std::fill_n(r.bytes.begin() + dst[0].value() * kBlockBytes, kBlockBytes, 0);
  ASSERT_TRUE(r.mover->SubmitLoad(0, dst[0], h, RequestId(7), 3, 0).ok());
  r.Drain();
  ASSERT_EQ(r.done.size(), 1u);
  EXPECT_EQ(r.done[0].request, RequestId(7));
  EXPECT_EQ(r.done[0].epoch, 3u);
  EXPECT_TRUE(r.done[0].ok);
  EXPECT_EQ(r.At(dst[0]), 0x5A);
  EXPECT_EQ(r.pool.ref(dst[0]), 1);  // the load's own reference is gone
  r.mover->CountLoadHit(0);
  KvManagerStats s;
  r.mover->FillStats(&s);
  EXPECT_EQ(s.tiers[0].hits.blocks, 1u);
  EXPECT_EQ(s.bytes_down, kBlockBytes);
  EXPECT_EQ(s.bytes_up, kBlockBytes);
  EXPECT_EQ(s.tiers[0].name, "t0");
}

TEST(TierMover, AFailedLoadIsReportedAndCounted) {
  MoverRig r(WritePolicy::kWriteThrough);
  std::vector<BlockId> dst;
  ASSERT_TRUE(r.pool.Allocate(1, &dst));
  // Not in the store: the read completes with an error.
  ASSERT_TRUE(r.mover->SubmitLoad(0, dst[0], Hash(9), RequestId(1), 1, 2).ok());
  r.Drain();
  ASSERT_EQ(r.done.size(), 1u);
  EXPECT_FALSE(r.done[0].ok);
  EXPECT_EQ(r.done[0].block_index, 2);
  KvManagerStats s;
  r.mover->FillStats(&s);
  EXPECT_EQ(s.loads_failed, 1u);
  EXPECT_EQ(r.pool.ref(dst[0]), 1);
}

TEST(TierMover, WriteBackStagesEvictedBlocksBeforeTheyAreReused) {
  MoverRig r(WritePolicy::kWriteBack);
  std::vector<BlockId> first;
  for (int i = 0; i < kDeviceBlocks; ++i) first.push_back(r.Put(Hash(i), static_cast<uint8_t>(0x10 + i)));
  for (BlockId b : first) r.pool.Release(b);  // cached, evictable
  EXPECT_EQ(r.stores[0]->stats().blocks, 0u);  // nothing written at commit
  // Reusing every block evicts them all; each is staged and written back,
  // then overwritten at once with other bytes.
  std::vector<BlockId> again;
  ASSERT_TRUE(r.pool.Allocate(kDeviceBlocks, &again));
  r.mover->WriteBackEvicted();
  std::fill(r.bytes.begin(), r.bytes.end(), 0xEE);
  r.Drain();
  EXPECT_EQ(r.stores[0]->stats().blocks, static_cast<uint64_t>(kDeviceBlocks));
  // The device pool, the store's arena and the staging buffers are
  // registered segments: one buffer per write-back in flight at once (the
  // store's completions were polled only after the four evictions).
  EXPECT_EQ(r.mover->segments().size(), 2u + kDeviceBlocks);
  for (int i = 0; i < kDeviceBlocks; ++i) {
    std::vector<uint8_t> back(kBlockBytes);
    ASSERT_TRUE(r.stores[0]->SubmitRead(Hash(i), testing::RegionOf(back, &r.mover->segments()), 99).ok());
    std::vector<StoreCompletion> c;
    r.stores[0]->Drain(&c);
    EXPECT_EQ(back, std::vector<uint8_t>(kBlockBytes, static_cast<uint8_t>(0x10 + i))) << i;
  }
  KvManagerStats s;
  r.mover->FillStats(&s);
  EXPECT_EQ(s.tiers[0].writebacks, static_cast<uint64_t>(kDeviceBlocks));
  EXPECT_EQ(s.tiers[0].writebacks_dropped, 0u);
}

TEST(TierMover, LookupWalksTheChainFromTheTopTier) {
  MoverRig r(WritePolicy::kWriteThrough, 64ull << 20, 2);
  std::vector<uint8_t> block(kBlockBytes, 1);
  const Sha256Digest ns = NamespaceDigest("w", "llama", "f16", kBs);
  std::vector<StoreCompletion> c;
  // Block 0 in both tiers, block 1 only in the lower one, block 2 nowhere.
  for (auto* s : {r.stores[0].get(), r.stores[1].get()}) ASSERT_TRUE(s->SubmitWrite(Hash(0), ns, testing::RegionOf(block, &r.mover->segments()), 1).ok());
  ASSERT_TRUE(r.stores[1]->SubmitWrite(Hash(1), ns, testing::RegionOf(block, &r.mover->segments()), 2).ok());
  r.stores[0]->Drain(&c);
  r.stores[1]->Drain(&c);
  const std::vector<BlockHash> chain = {Hash(0), Hash(1), Hash(2)};
  EXPECT_EQ(r.mover->LowerHits(chain, 0, 3), (std::vector<int>{0, 1}));
  EXPECT_EQ(r.mover->LowerHits(chain, 1, 3), (std::vector<int>{1}));
  EXPECT_EQ(r.mover->LowerHits(chain, 0, 1), (std::vector<int>{0}));
}

}  // namespace
}  // namespace strata::kvcache
