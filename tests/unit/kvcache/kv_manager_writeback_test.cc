// KvManager write-back tiers (WritePolicy::kWriteBack): a committed block is
// not copied down; it is copied when the device pool evicts it, through a
// staging buffer, to a real HostStore and to a real DiskStore (O_DIRECT,
// io_uring) in a temp dir, and reloads bitwise identical although the device
// block was overwritten at once. A block the tier holds is not rewritten; the
// staging bound drops (and counts) write-backs; a block goes down to one
// tier only, the nearest that should take it (write-back tiers form a chain).

#include <fcntl.h>
#include <gtest/gtest.h>

#include "tests/support/test_env.h"
#include "tests/support/test_memory.h"
#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <thread>

#include "kvcache/disk_store.h"
#include "kvcache/host_store.h"
#include "kvcache/kv_manager.h"

namespace strata::kvcache {
namespace {

constexpr int kBs = 4;
constexpr uint64_t kBlockBytes = 4096;  // the disk store's minimum
constexpr int32_t kDeviceBlocks = 8;

std::vector<int32_t> Seq(int n, int first) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[static_cast<size_t>(i)] = first + i;
  return t;
}

uint8_t Pattern(int seed, size_t block, uint64_t k) { return static_cast<uint8_t>(seed * 7 + block * 31 + k * 13); }

// A temp dir on a filesystem with O_DIRECT (testing::MakeDirectIoTempDir),
// removed when the test ends.
class TempDir {
 public:
  TempDir() : path_(testing::MakeDirectIoTempDir("strata-wb-")) {}
  ~TempDir() {
    std::error_code ec;
    if (!path_.empty()) std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// A real HostStore whose completions are held back until Release(): stands
// for a slow lower tier, so the staging buffers stay busy deterministically.
class HeldStore final : public BlockStore {
 public:
  explicit HeldStore(std::unique_ptr<HostStore> inner) : inner_(std::move(inner)) {}
  std::string_view name() const override { return "held"; }
  TierKind kind() const override { return TierKind::kHost; }
  StoreStats stats() const override { return inner_->stats(); }
  bool Contains(const BlockHash& h) const override { return inner_->Contains(h); }
  size_t CountPrefix(std::span<const BlockHash> chain) const override { return inner_->CountPrefix(chain); }
  Status SubmitWrite(const BlockHash& h, const Sha256Digest& ns, const Region& data, uint64_t tag) override {
    return inner_->SubmitWrite(h, ns, data, tag);
  }
  Status SubmitRead(const BlockHash& h, const Region& dst, uint64_t tag) override {
    return inner_->SubmitRead(h, dst, tag);
  }
  size_t Poll(std::vector<StoreCompletion>* out) override {
    if (held_) return 0;
    return inner_->Poll(out);
  }
  void Drain(std::vector<StoreCompletion>* out) override { inner_->Drain(out); }
  Status Remove(const BlockHash& h) override { return inner_->Remove(h); }
  Status Flush(const Sha256Digest* ns) override { return inner_->Flush(ns); }
  // The inner store's memory is in the table this one is attached to.
  Status RegisterMemory() override { return inner_->Attach(segments()); }
  void UnregisterMemory() override { inner_->Detach(); }
  void Release() { held_ = false; }

 private:
  std::unique_ptr<HostStore> inner_;
  bool held_ = true;
};

struct Rig {
  explicit Rig(std::vector<LowerTier> tiers, uint64_t staging_bytes = 64ull << 20)
      : bytes(static_cast<size_t>(kDeviceBlocks) * kBlockBytes) {
    KvManagerOptions o;
    o.block_size = kBs;
    o.num_device_blocks = kDeviceBlocks;
    o.block_bytes = kBlockBytes;
    o.ns = NamespaceDigest("w", "llama", "f16", kBs);
    o.load_policy = LoadPolicy::kAlways;
    o.writeback_staging_bytes = staging_bytes;
    auto m = KvManager::Create(o, [this](BlockId id) { return bytes.data() + id.value() * kBlockBytes; },
                               std::move(tiers), &clock);
    EXPECT_TRUE(m.ok()) << m.error().ToString();
    mgr = std::move(m).value();
  }
  uint8_t* block(int32_t id) { return bytes.data() + static_cast<size_t>(id) * kBlockBytes; }
  // Runs a request over `prompt`; computed blocks get Pattern(seed, ...).
  // Returns the source tier of each cached block.
  std::vector<int> Run(uint64_t id, const std::vector<int32_t>& prompt, int seed) {
    const RequestId rid(id);
    EXPECT_TRUE(mgr->AddRequest(rid, prompt, {}).ok());
    EXPECT_EQ(*mgr->Allocate(rid, static_cast<int32_t>(prompt.size())), AllocOutcome::kAllocated);
    for (int i = 0; i < 100000 && !mgr->IsReady(rid); ++i) {
      mgr->Poll();
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    EXPECT_TRUE(mgr->IsReady(rid));
    auto table = mgr->BlockTable(rid);
    for (size_t b = static_cast<size_t>(mgr->CachedTokens(rid) / kBs); b < table.size(); ++b)
      for (uint64_t k = 0; k < kBlockBytes; ++k) block(table[b])[k] = Pattern(seed, b, k);
    auto tiers = mgr->CachedBlockTiers(rid);
    // The cached blocks hold what was computed for them (seed of the first run).
    for (size_t b = 0; b < tiers.size(); ++b)
      for (uint64_t k = 0; k < kBlockBytes; ++k)
        if (block(table[b])[k] != Pattern(first_seed, b, k)) {
          ADD_FAILURE() << "cached block " << b << " differs at byte " << k;
          k = kBlockBytes, b = tiers.size();
        }
    EXPECT_TRUE(mgr->Commit(rid, prompt).ok());
    mgr->Poll();
    mgr->Free(rid);
    mgr->Poll();
    return tiers;
  }
  // Takes every device block at once (evicting all cached ones), overwrites
  // them all, and gives them back unnamed.
  void EvictDevice() {
    std::vector<int32_t> filler(static_cast<size_t>(kDeviceBlocks * kBs), 7);
    const RequestId rid(999);
    ASSERT_TRUE(mgr->AddRequest(rid, filler, {}).ok());
    ASSERT_EQ(*mgr->Allocate(rid, kDeviceBlocks * kBs), AllocOutcome::kAllocated);
    std::fill(bytes.begin(), bytes.end(), 0xAB);  // new KV lands at once
    mgr->Free(rid);
  }
  // Polls until tier `t` has completed `n` writes OK (bounded).
  void AwaitBytesDown(size_t t, uint64_t n) {
    for (int i = 0; i < 100000 && mgr->stats().tiers[t].bytes_down < n * kBlockBytes; ++i) {
      mgr->Poll();
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
    ASSERT_EQ(mgr->stats().tiers[t].bytes_down, n * kBlockBytes);
  }
  int first_seed = 1;
  ManualClock clock;
  std::vector<uint8_t> bytes;
  std::unique_ptr<KvManager> mgr;
};

std::unique_ptr<HostStore> Host(uint64_t blocks = 64) {
  return std::move(HostStore::Create({blocks * kBlockBytes, kBlockBytes, false})).value();
}

std::unique_ptr<DiskStore> Disk(const std::string& dir) {
  DiskStoreOptions o;
  o.directory = dir + "/store";
  o.block_bytes = kBlockBytes;
  o.capacity_bytes = 64 * kBlockBytes;
  o.slab_file_bytes = 16 * kBlockBytes;
  o.grow_bytes = 4 * kBlockBytes;
  o.queue_depth = 1;  // later writes wait in the store, reading `data` only when they start
  auto r = DiskStore::Open(o);
  EXPECT_TRUE(r.ok()) << r.error().ToString();
  return r.ok() ? std::move(r).value() : nullptr;
}

TEST(KvManagerWriteBackTest, HostGetsBlocksOnEvictionNotOnCommitAndReloadsThemIdentical) {
  auto host = Host();
  Rig rig({{host.get(), WritePolicy::kWriteBack, 0, 0}});
  const auto p = Seq(13, 50);  // 3 full blocks
  EXPECT_TRUE(rig.Run(1, p, 1).empty());
  EXPECT_EQ(host->stats().blocks, 0u) << "write-back must not copy at commit";
  EXPECT_EQ(rig.mgr->stats().tiers[0].writebacks, 0u);

  rig.EvictDevice();
  rig.mgr->Poll();
  auto s = rig.mgr->stats();
  EXPECT_EQ(s.device_pool.evictions, 3u);
  EXPECT_EQ(s.tiers[0].writebacks, 3u);
  EXPECT_EQ(s.tiers[0].writebacks_dropped, 0u);
  EXPECT_EQ(s.tiers[0].bytes_down, 3 * kBlockBytes);
  EXPECT_EQ(host->stats().blocks, 3u);

  // Device blocks now hold 0xAB; the reload must bring back the first run's bytes.
  EXPECT_EQ(rig.Run(2, p, 2), (std::vector<int>{1, 1, 1}));
  EXPECT_EQ(rig.mgr->stats().tiers[0].hits.blocks, 3u);
}

TEST(KvManagerWriteBackTest, DiskGetsBlocksOnEvictionThroughStagingAndReloadsThemIdentical) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty()) << "no O_DIRECT filesystem for the temp dir";
  auto disk = Disk(dir.path());
  ASSERT_NE(disk, nullptr);
  Rig rig({{disk.get(), WritePolicy::kWriteBack, 0, 0}});
  const auto p = Seq(13, 50);
  rig.Run(1, p, 1);
  EXPECT_EQ(rig.mgr->stats().tiers[0].writes, 0u);
  // The evicted blocks are overwritten before the disk writes can finish:
  // only the staging copy keeps the write-back correct.
  rig.EvictDevice();
  EXPECT_EQ(rig.mgr->stats().tiers[0].writebacks, 3u);
  rig.AwaitBytesDown(0, 3);
  EXPECT_EQ(disk->stats().blocks, 3u);
  EXPECT_EQ(rig.Run(2, p, 2), (std::vector<int>{1, 1, 1}));
  auto s = rig.mgr->stats();
  EXPECT_EQ(s.tiers[0].hits.blocks, 3u);
  EXPECT_EQ(s.tiers[0].loads_failed, 0u);
  EXPECT_EQ(disk->stats().corrupt_blocks, 0u);
}

TEST(KvManagerWriteBackTest, BlockAlreadyInTheTierIsNotRewritten) {
  auto host = Host();
  Rig rig({{host.get(), WritePolicy::kWriteBack, 0, 0}});
  const auto p = Seq(13, 50);
  rig.Run(1, p, 1);
  rig.EvictDevice();
  rig.mgr->Poll();
  EXPECT_EQ(rig.mgr->stats().tiers[0].writebacks, 3u);
  EXPECT_EQ(rig.Run(2, p, 2), (std::vector<int>{1, 1, 1}));  // cached on device again
  rig.EvictDevice();                                          // evicted again; host still holds them
  rig.mgr->Poll();
  auto s = rig.mgr->stats();
  EXPECT_EQ(s.device_pool.evictions, 6u);
  EXPECT_EQ(s.tiers[0].writebacks, 3u);
  EXPECT_EQ(s.tiers[0].writes, 3u);
}

TEST(KvManagerWriteBackTest, StagingBoundDropsAndCountsInsteadOfBlocking) {
  HeldStore held(Host());
  Rig rig({{&held, WritePolicy::kWriteBack, 0, 0}}, 2 * kBlockBytes);  // two staging buffers
  const auto p = Seq(13, 50);
  rig.Run(1, p, 1);
  rig.EvictDevice();  // 3 evictions, both buffers busy (completions held)
  auto s = rig.mgr->stats();
  EXPECT_EQ(s.tiers[0].writebacks, 2u);
  EXPECT_EQ(s.tiers[0].writebacks_dropped, 1u);
  EXPECT_EQ(held.stats().blocks, 2u);

  // Once the writes complete, the buffers are reused.
  held.Release();
  rig.mgr->Poll();
  EXPECT_EQ(rig.mgr->stats().tiers[0].bytes_down, 2 * kBlockBytes);
  rig.first_seed = 3;
  const auto q = Seq(9, 500);  // 2 more blocks
  rig.Run(2, q, 3);
  rig.EvictDevice();
  rig.mgr->Poll();
  s = rig.mgr->stats();
  EXPECT_EQ(s.tiers[0].writebacks, 4u);
  EXPECT_EQ(s.tiers[0].writebacks_dropped, 1u);
  EXPECT_EQ(s.tiers[0].bytes_down, 4 * kBlockBytes);
}

// A device eviction goes down to the nearest tier that should take it: the
// write-through host already holds the blocks, so the write-back disk gets
// nothing until the host drops them (next test).
TEST(KvManagerWriteBackTest, ADeviceEvictionTheHostHoldsIsNotWrittenToTheDisk) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  auto host = Host();
  auto disk = Disk(dir.path());
  ASSERT_NE(disk, nullptr);
  Rig rig({{host.get(), WritePolicy::kWriteThrough, 0, 0}, {disk.get(), WritePolicy::kWriteBack, 0, 0}});
  const auto p = Seq(13, 50);
  rig.Run(1, p, 1);
  auto s = rig.mgr->stats();
  EXPECT_EQ(host->stats().blocks, 3u) << "write-through copies at commit";
  EXPECT_EQ(s.tiers[0].writes, 3u);
  EXPECT_EQ(s.tiers[1].writes, 0u);
  rig.EvictDevice();
  rig.mgr->Poll();
  s = rig.mgr->stats();
  EXPECT_EQ(s.tiers[0].writebacks, 0u);
  EXPECT_EQ(s.tiers[0].writes, 3u);
  EXPECT_EQ(s.tiers[1].writebacks, 0u) << "the host holds them: the disk would hold copies";
  EXPECT_EQ(disk->stats().blocks, 0u);
  EXPECT_EQ(rig.Run(2, p, 2), (std::vector<int>{1, 1, 1}));
}

// Two write-back tiers form a chain: the device's evictions go to the host
// only, the host's evictions to the disk, so no block is held twice and
// every block is still served, bitwise as computed.
TEST(KvManagerWriteBackTest, WriteBackTiersFormAChainEachTakingWhatTheLevelAboveDrops) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty());
  auto host = Host(2);
  auto disk = Disk(dir.path());
  ASSERT_NE(disk, nullptr);
  Rig rig({{host.get(), WritePolicy::kWriteBack, 0, 0}, {disk.get(), WritePolicy::kWriteBack, 0, 0}});
  const auto p = Seq(13, 50);
  rig.Run(1, p, 1);
  EXPECT_EQ(rig.mgr->stats().tiers[0].writes, 0u) << "write-back: nothing at commit";
  rig.EvictDevice();
  rig.AwaitBytesDown(1, 1);
  auto s = rig.mgr->stats();
  EXPECT_EQ(s.tiers[0].writebacks, 3u);
  EXPECT_EQ(s.tiers[1].writebacks, 1u) << "only the block the 2-slot host dropped";
  EXPECT_EQ(host->stats().blocks, 2u);
  EXPECT_EQ(host->stats().evictions, 1u);
  EXPECT_EQ(disk->stats().blocks, 1u);
  const auto tiers = rig.Run(2, p, 2);
  ASSERT_EQ(tiers.size(), 3u);
  EXPECT_EQ(std::count(tiers.begin(), tiers.end(), 1), 2) << "two blocks from the host";
  EXPECT_EQ(std::count(tiers.begin(), tiers.end(), 2), 1) << "one from the disk";
  EXPECT_EQ(rig.mgr->stats().tiers[1].loads_failed, 0u);
}

}  // namespace
}  // namespace strata::kvcache

namespace strata::kvcache {
namespace {

// Host (write-through, 2 slots) above a write-back disk: the block the host
// evicts to make room goes down to disk (through a staging copy, since the
// host slot is overwritten at once), so nothing the host drops is lost.
TEST(KvManagerWriteBackTest, HostEvictionsGoDownToAWriteBackDisk) {
  TempDir dir;
  ASSERT_FALSE(dir.path().empty()) << "no O_DIRECT filesystem for the temp dir";
  auto host = Host(2);
  auto disk = Disk(dir.path());
  ASSERT_NE(disk, nullptr);
  Rig rig({{host.get(), WritePolicy::kWriteThrough, 0, 0}, {disk.get(), WritePolicy::kWriteBack, 0, 0}});
  const auto p = Seq(13, 50);  // 3 full blocks: the third host write evicts the first
  rig.Run(1, p, 1);
  EXPECT_EQ(host->stats().blocks, 2u);
  EXPECT_EQ(host->stats().evictions, 1u);
  EXPECT_EQ(rig.mgr->stats().tiers[1].writebacks, 1u) << "the host's eviction went to disk";
  rig.AwaitBytesDown(1, 1);
  // The device evicts all three: the host holds two, the disk the third, so
  // none is written again.
  rig.EvictDevice();
  rig.mgr->Poll();
  EXPECT_EQ(rig.mgr->stats().tiers[1].writebacks, 1u);
  EXPECT_EQ(disk->stats().blocks, 1u);
  // Block 0 from the disk, the rest from the host, bitwise as computed.
  EXPECT_EQ(rig.Run(2, p, 2), (std::vector<int>{2, 1, 1}));
  auto s = rig.mgr->stats();
  EXPECT_EQ(s.tiers[1].hits.blocks, 1u);
  EXPECT_EQ(s.tiers[1].loads_failed, 0u);
  EXPECT_EQ(disk->stats().corrupt_blocks, 0u);
}

}  // namespace
}  // namespace strata::kvcache
