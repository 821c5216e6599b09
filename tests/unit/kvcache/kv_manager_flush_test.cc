// KvManager::Flush (the operator's `strata cache flush`) over a real host
// tier and a real disk tier: cached prefixes disappear from every flushed
// tier, blocks held by a running request survive and keep working, tiers not
// named are left alone, and other namespaces on a shared disk are kept.

#include <fcntl.h>
#include <gtest/gtest.h>

#include "tests/support/test_memory.h"
#include <unistd.h>

#include <filesystem>
#include <string>

#include "kvcache/disk_store.h"
#include "kvcache/host_store.h"
#include "kvcache/kv_manager.h"

namespace strata::kvcache {
namespace {

constexpr int kBs = 4;
constexpr uint64_t kBlockBytes = 4096;  // the disk tier's minimum
constexpr int32_t kDeviceBlocks = 16;

std::vector<int32_t> Seq(int n, int first) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[static_cast<size_t>(i)] = first + i;
  return t;
}

// A temp dir on a filesystem with O_DIRECT (/var/tmp, /tmp, else the cwd).
std::string MakeDirectDir() {
  for (const char* base : {"/var/tmp", "/tmp", "."}) {
    std::string tmpl = std::string(base) + "/strata-flush-XXXXXX";
    if (mkdtemp(tmpl.data()) == nullptr) continue;
    const std::string probe = tmpl + "/probe";
    const int fd = open(probe.c_str(), O_RDWR | O_CREAT | O_DIRECT, 0644);
    if (fd >= 0) {
      close(fd);
      unlink(probe.c_str());
      return tmpl;
    }
    std::filesystem::remove_all(tmpl);
  }
  return {};
}

class KvManagerFlushTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeDirectDir();
    ASSERT_FALSE(dir_.empty()) << "no directory with O_DIRECT";
    ns_ = NamespaceDigest("weights", "llama", "f16", kBs);
    host_ = std::move(HostStore::Create({64 * kBlockBytes, kBlockBytes, false})).value();
    disk_ = OpenDisk();
    ASSERT_NE(disk_, nullptr);
    memory_.assign(static_cast<size_t>(kDeviceBlocks) * kBlockBytes, 0);
    KvManagerOptions o;
    o.block_size = kBs;
    o.num_device_blocks = kDeviceBlocks;
    o.block_bytes = kBlockBytes;
    o.ns = ns_;
    o.load_policy = LoadPolicy::kAlways;
    std::vector<LowerTier> tiers = {{host_.get(), WritePolicy::kWriteThrough, 0, 0},
                                    {disk_.get(), WritePolicy::kWriteThrough, 0, 0}};
    auto m = KvManager::Create(
        o, [this](BlockId id) { return memory_.data() + id.value() * kBlockBytes; },
        std::move(tiers), &clock_);
    ASSERT_TRUE(m.ok()) << m.error().ToString();
    mgr_ = std::move(m).value();
  }
  void TearDown() override {
    mgr_.reset();
    disk_.reset();
    std::error_code ec;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
  }

  std::unique_ptr<DiskStore> OpenDisk() {
    DiskStoreOptions o;
    o.directory = dir_ + "/disk";
    o.block_bytes = kBlockBytes;
    o.capacity_bytes = 64 * kBlockBytes;
    o.slab_file_bytes = 16 * kBlockBytes;
    o.grow_bytes = 4 * kBlockBytes;
    o.reserve_bytes = 0;
    o.queue_depth = 8;
    auto r = DiskStore::Open(o);
    EXPECT_TRUE(r.ok()) << r.error().ToString();
    return r.ok() ? std::move(r).value() : nullptr;
  }

  // Waits (polling) until every tier holds `blocks` blocks of writes.
  void SettleWrites() {
    for (int i = 0;
         i < 10000 && (mgr_->Poll() > 0 || disk_->stats().blocks < host_->stats().blocks); ++i) {
      usleep(100);
    }
  }

  // Admits a request over `prompt`, fills computed blocks, commits it. Keeps
  // it open (the caller frees it) so its blocks stay referenced.
  void Open(uint64_t id, const std::vector<int32_t>& prompt) {
    const RequestId rid(id);
    ASSERT_TRUE(mgr_->AddRequest(rid, prompt, {}).ok());
    auto a = mgr_->Allocate(rid, static_cast<int32_t>(prompt.size()));
    ASSERT_TRUE(a.ok());
    ASSERT_EQ(*a, AllocOutcome::kAllocated);
    for (int i = 0; i < 10000 && !mgr_->IsReady(rid); ++i) {
      mgr_->Poll();
      usleep(100);
    }
    ASSERT_TRUE(mgr_->IsReady(rid));
    auto table = mgr_->BlockTable(rid);
    for (size_t b = static_cast<size_t>(mgr_->CachedTokens(rid) / kBs); b < table.size(); ++b)
      std::fill_n(memory_.data() + static_cast<size_t>(table[b]) * kBlockBytes, kBlockBytes,
                  static_cast<uint8_t>(id * 16 + b));
    ASSERT_TRUE(mgr_->Commit(rid, prompt).ok());
  }
  void Run(uint64_t id, const std::vector<int32_t>& prompt) {
    Open(id, prompt);
    mgr_->Free(RequestId(id));
    SettleWrites();
  }

  std::string dir_;
  Sha256Digest ns_{};
  ManualClock clock_;
  std::vector<uint8_t> memory_;
  std::unique_ptr<HostStore> host_;
  std::unique_ptr<DiskStore> disk_;
  std::unique_ptr<KvManager> mgr_;
};

TEST_F(KvManagerFlushTest, FlushAllLeavesNothingToMatch) {
  const auto p = Seq(13, 100);  // 3 full blocks; at most 12 tokens cached
  Run(1, p);
  ASSERT_EQ(host_->stats().blocks, 3u);
  ASSERT_EQ(disk_->stats().blocks, 3u);
  ASSERT_EQ(mgr_->Match(p, {}).device_tokens, 12);

  auto r = mgr_->Flush(true, {true, true});
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  EXPECT_EQ(r->device_blocks, 3u);
  ASSERT_EQ(r->lower_blocks.size(), 2u);
  EXPECT_EQ(r->lower_blocks[0], 3u);
  EXPECT_EQ(r->lower_blocks[1], 3u);
  const PrefixMatch m = mgr_->Match(p, {});
  EXPECT_EQ(m.total(), 0);
  EXPECT_EQ(host_->stats().blocks, 0u);
  EXPECT_EQ(disk_->stats().blocks, 0u);
  EXPECT_TRUE(mgr_->device_pool().CheckConsistency().ok());
  EXPECT_EQ(mgr_->device_pool().stats().cached, 0);

  // The next request with that prompt computes it all again (no hit).
  Open(2, p);
  EXPECT_EQ(mgr_->CachedTokens(RequestId(2)), 0);
  mgr_->Free(RequestId(2));
}

TEST_F(KvManagerFlushTest, BlocksInUseSurviveAndKeepWorking) {
  const auto held = Seq(13, 200);
  const auto idle = Seq(9, 500);
  Run(1, idle);   // cached, unreferenced
  Open(2, held);  // referenced by a running request
  SettleWrites();
  const auto table_before = std::vector<int32_t>(mgr_->BlockTable(RequestId(2)).begin(),
                                                 mgr_->BlockTable(RequestId(2)).end());

  auto r = mgr_->Flush(true, {true, true});
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  EXPECT_EQ(r->device_blocks, 2u);  // idle's two blocks; held's four are in use
  EXPECT_EQ(mgr_->Match(idle, {}).total(), 0);
  // The running request's blocks are untouched: same table, still indexed.
  EXPECT_EQ(std::vector<int32_t>(mgr_->BlockTable(RequestId(2)).begin(),
                                 mgr_->BlockTable(RequestId(2)).end()),
            table_before);
  EXPECT_EQ(mgr_->Match(held, {}).device_tokens, 12);
  EXPECT_EQ(mgr_->device_pool().stats().in_use, 4);

  // It keeps decoding: more positions, another full block committed, freed.
  auto tokens = held;
  for (int i = 0; i < 4; ++i) tokens.push_back(900 + i);
  auto a = mgr_->Allocate(RequestId(2), static_cast<int32_t>(tokens.size()));
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*a, AllocOutcome::kAllocated);
  EXPECT_TRUE(mgr_->Commit(RequestId(2), tokens).ok());
  mgr_->Free(RequestId(2));
  SettleWrites();
  EXPECT_TRUE(mgr_->device_pool().CheckConsistency().ok());
  EXPECT_EQ(mgr_->device_pool().stats().in_use, 0);
  // Its prefix is still served from device after the flush.
  EXPECT_EQ(mgr_->Match(tokens, {}).device_tokens, 16);
}

TEST_F(KvManagerFlushTest, OnlyTheNamedTiersAreFlushed) {
  const auto p = Seq(9, 300);  // 2 full blocks
  Run(1, p);
  auto r = mgr_->Flush(false, {true, false});  // host only
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  EXPECT_EQ(r->device_blocks, 0u);
  EXPECT_EQ(r->lower_blocks[0], 2u);
  EXPECT_EQ(r->lower_blocks[1], 0u);
  EXPECT_EQ(host_->stats().blocks, 0u);
  EXPECT_EQ(disk_->stats().blocks, 2u);
  EXPECT_EQ(mgr_->Match(p, {}).device_tokens, 8);

  // Device gone too: the prefix now comes from disk.
  ASSERT_TRUE(mgr_->Flush(true, {}).ok());
  PrefixMatch m = mgr_->Match(p, {});
  EXPECT_EQ(m.device_tokens, 0);
  ASSERT_EQ(m.lower_tier_tokens.size(), 2u);
  EXPECT_EQ(m.lower_tier_tokens[0], 0);
  EXPECT_EQ(m.lower_tier_tokens[1], 8);
}

// An operator's flush that overtakes queued disk writes cancels them; a
// cancelled write is not a failed one (strata_kv_tier_write_failures_total
// counts only writes that could not be done).
TEST_F(KvManagerFlushTest, WritesAFlushOvertakesAreCancelledNotFailed) {
  const auto p = Seq(13, 600);  // 3 full blocks
  Open(1, p);                   // committed: the writes are queued, not yet polled
  mgr_->Free(RequestId(1));
  auto r = mgr_->Flush(false, {false, true});
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  for (int i = 0; i < 10000 && mgr_->device_pool().stats().in_use > 0; ++i) {
    mgr_->Poll();
    usleep(100);
  }
  KvManagerStats s = mgr_->stats();
  ASSERT_EQ(s.tiers.size(), 2u);
  EXPECT_EQ(s.tiers[1].writes, 3u);
  EXPECT_EQ(s.writes_failed, 0u);
  EXPECT_EQ(s.tiers[1].writes_failed, 0u);
  EXPECT_EQ(disk_->stats().blocks, 0u) << "a cancelled write must not land";
  EXPECT_EQ(host_->stats().blocks, 3u);
}

TEST_F(KvManagerFlushTest, OtherNamespacesOnTheDiskAreKeptUnlessAllAreAsked) {
  const auto p = Seq(9, 400);
  Run(1, p);
  // A block of another model, written straight to the disk tier.
  Sha256Digest other{};
  other.fill(0x5A);
  BlockHash foreign;
  foreign.digest = Sha256Of("foreign", 7);
  std::vector<uint8_t> data(kBlockBytes, 0x11);
  ASSERT_TRUE(disk_->SubmitWrite(foreign, other, testing::RegionOf(data, &mgr_->segments()), 777).ok());
  std::vector<StoreCompletion> done;
  disk_->Drain(&done);
  ASSERT_EQ(disk_->stats().blocks, 3u);

  auto r = mgr_->Flush(false, {false, true});
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  EXPECT_EQ(r->lower_blocks[1], 2u);
  EXPECT_TRUE(disk_->Contains(foreign));

  r = mgr_->Flush(false, {false, true}, /*all_namespaces=*/true);
  ASSERT_TRUE(r.ok()) << r.error().ToString();
  EXPECT_EQ(r->lower_blocks[1], 1u);
  EXPECT_FALSE(disk_->Contains(foreign));
}

}  // namespace
}  // namespace strata::kvcache
