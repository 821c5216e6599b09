// KvManager::WriteDown (a graceful stop, kv.stop_write_down_seconds): a full
// write-through disk under the one policy holds what no tier above holds, so
// the blocks the device and the host tier hold (the hottest) would be lost
// at a restart; written down, a reopened disk serves them, with the bytes
// they had, and keeps the most valuable when they do not all fit.

#include <gtest/gtest.h>

#include <chrono>
#include <thread>

#include "kvcache/disk_store.h"
#include "kvcache/host_store.h"
#include "kvcache/kv_manager.h"
#include "tests/support/test_env.h"

namespace strata::kvcache {
namespace {

constexpr int kBs = 4;
constexpr uint64_t kBytes = 4096;  // the disk store's minimum block

// One full block and one token more: the full block is named, the partial
// one freed unnamed.
std::vector<int32_t> Prompt(int k) {
  std::vector<int32_t> p;
  for (int i = 0; i < kBs; ++i) p.push_back(100 * k + i);
  p.push_back(7);
  return p;
}
uint8_t Fill(int k) { return static_cast<uint8_t>(k * 7 + 1); }

KvManagerOptions Options(int32_t device_blocks, const std::string& policy) {
  KvManagerOptions o;
  o.block_size = kBs;
  o.num_device_blocks = device_blocks;
  o.block_bytes = kBytes;
  o.ns = NamespaceDigest("write-down-test", "llama", "f16", kBs);
  o.load_policy = LoadPolicy::kAlways;
  o.eviction_policy = policy;
  return o;
}

std::unique_ptr<DiskStore> OpenDisk(const std::string& dir, int32_t blocks, const std::string& policy) {
  DiskStoreOptions d;
  d.directory = dir;
  d.block_bytes = kBytes;
  d.capacity_bytes = static_cast<uint64_t>(blocks) * kBytes;
  d.slab_file_bytes = d.capacity_bytes;
  d.grow_bytes = d.capacity_bytes;
  d.eviction_policy = policy;
  auto opened = DiskStore::Open(d);
  EXPECT_TRUE(opened.ok()) << opened.error().ToString();
  return opened.ok() ? std::move(opened).value() : nullptr;
}

// Every write the manager submitted to tier `t` has landed or failed.
void Settle(KvManager& m, size_t t) {
  auto pending = [&] {
    const auto s = m.stats().tiers[t];
    return s.bytes_down / kBytes + s.writes_failed + s.writes_refused < s.writes;
  };
  for (int i = 0; i < 20000 && pending(); ++i) {
    m.Poll();
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
}

// Runs prompt k to the end; a computed block's bytes are set to Fill(k), a
// cached one's are checked to be Fill(k). Returns the cached tokens.
int32_t RunPrompt(KvManager& m, std::vector<uint8_t>& device, uint64_t id, int k) {
  const auto prompt = Prompt(k);
  EXPECT_TRUE(m.AddRequest(RequestId(id), prompt, {}).ok());
  auto a = m.Allocate(RequestId(id), static_cast<int32_t>(prompt.size()));
  EXPECT_TRUE(a.ok() && *a == AllocOutcome::kAllocated);
  for (int i = 0; i < 20000 && !m.IsReady(RequestId(id)); ++i) {
    m.Poll();
    std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  EXPECT_TRUE(m.IsReady(RequestId(id)));
  const int32_t cached = m.CachedTokens(RequestId(id));
  const BlockId b0 = BlockId(static_cast<uint32_t>(m.BlockTable(RequestId(id))[0]));
  uint8_t* bytes = device.data() + b0.value() * kBytes;
  if (cached > 0) {
    int bad = 0;
    for (uint64_t i = 0; i < kBytes; ++i) bad += bytes[i] != Fill(k);
    EXPECT_EQ(bad, 0) << "prompt " << k << ": the cached block's bytes are not the ones computed";
  } else {
    std::fill(bytes, bytes + kBytes, Fill(k));
  }
  EXPECT_TRUE(m.Commit(RequestId(id), prompt).ok());
  m.Poll();
  m.Free(RequestId(id));
  m.Poll();
  return cached;
}

struct Stack {
  ManualClock clock;
  std::vector<uint8_t> device;
  std::unique_ptr<HostStore> host;
  std::unique_ptr<DiskStore> disk;
  std::unique_ptr<KvManager> mgr;
};

// Device 4 blocks, an exclusive host tier of 2, a write-through disk of
// `disk_blocks`, one policy over the three; prompts 1..20 once each.
std::unique_ptr<Stack> RunTwenty(const std::string& dir, int32_t disk_blocks, const std::string& policy) {
  auto s = std::make_unique<Stack>();
  s->device.assign(4 * kBytes, 0);
  HostStoreOptions ho;
  ho.capacity_bytes = 2 * kBytes;
  ho.block_bytes = kBytes;
  ho.pin = false;
  ho.eviction_policy = policy;
  s->host = std::move(HostStore::Create(ho)).value();
  s->disk = OpenDisk(dir, disk_blocks, policy);
  if (!s->disk) return nullptr;
  uint8_t* base = s->device.data();
  auto mem = [base](BlockId id) { return base + id.value() * kBytes; };
  std::vector<LowerTier> tiers = {{s->host.get(), WritePolicy::kExclusive, 0, 0},
                                  {s->disk.get(), WritePolicy::kWriteThrough, 0, 0}};
  s->mgr = std::move(KvManager::Create(Options(4, policy), mem, std::move(tiers), &s->clock)).value();
  for (int k = 1; k <= 20; ++k) {
    EXPECT_EQ(RunPrompt(*s->mgr, s->device, static_cast<uint64_t>(k), k), 0);
    Settle(*s->mgr, 1);  // the same order every run
  }
  return s;
}

bool DiskHolds(const DiskStore& disk, int k) {
  const KvManagerOptions o = Options(4, "lru");
  return disk.CountPrefix(HashPrefix(o.ns, Prompt(k), kBs, {})) == 1;
}

// Which of prompts 1..20 the device or the host tier holds now.
std::vector<int> HeldAbove(const Stack& s) {
  std::vector<int> out;
  for (int k = 1; k <= 20; ++k) {
    const auto chain = HashPrefix(s.mgr->options().ns, Prompt(k), kBs, {});
    if (s.mgr->Match(Prompt(k), {}).device_tokens > 0 || s.host->CountPrefix(chain) > 0) out.push_back(k);
  }
  return out;
}

// A restarted server: a fresh device of 4 blocks over the reopened disk alone.
struct Restarted {
  ManualClock clock;
  std::vector<uint8_t> device = std::vector<uint8_t>(4 * kBytes, 0);
  std::unique_ptr<KvManager> mgr;
};
std::unique_ptr<Restarted> Restart(DiskStore* disk, const std::string& policy) {
  auto r = std::make_unique<Restarted>();
  uint8_t* base = r->device.data();
  auto mem = [base](BlockId id) { return base + id.value() * kBytes; };
  std::vector<LowerTier> tiers = {{disk, WritePolicy::kWriteThrough, 0, 0}};
  r->mgr = std::move(KvManager::Create(Options(4, policy), mem, std::move(tiers), &r->clock)).value();
  return r;
}

TEST(KvWriteDownTest, AFullDiskTakesWhatTheDeviceAndHostHold) {
  for (const std::string policy : {"s3fifo", "lru"}) {
    SCOPED_TRACE(policy);
    const std::string dir = testing::MakeDirectIoTempDir("strata-write-down-");
    ASSERT_FALSE(dir.empty()) << "no filesystem here takes O_DIRECT";
    auto s = RunTwenty(dir + "/disk", 8, policy);
    ASSERT_NE(s, nullptr);
    const std::vector<int> above = HeldAbove(*s);
    ASSERT_EQ(above, (std::vector<int>{16, 17, 18, 19, 20})) << "device 18-20 (one block free), host 16-17";
    int missing = 0;
    for (int k : above) missing += !DiskHolds(*s->disk, k);
    ASSERT_GE(missing, 4) << "the full disk gave up its copies of what the tiers above hold";

    const WriteDownResult w = s->mgr->WriteDown(60);
    EXPECT_EQ(w.tier, 1);
    EXPECT_EQ(w.kept, 5u);
    EXPECT_EQ(w.already + w.written, 5u);
    EXPECT_EQ(w.written, static_cast<uint64_t>(missing));
    EXPECT_EQ(w.failed + w.refused + w.not_submitted, 0u);
    EXPECT_EQ(s->host->pinned_slots(), 0u) << "the host's blocks are unpinned once written";
    EXPECT_EQ(s->disk->stats().blocks, 8u);
    const Status c = s->mgr->device_pool().CheckConsistency();
    EXPECT_TRUE(c.ok()) << c.message();

    // A restart: only the disk remains, and it serves every block that was above.
    s->mgr.reset();
    s->disk.reset();
    auto disk = OpenDisk(dir + "/disk", 8, policy);
    ASSERT_NE(disk, nullptr);
    for (int k : above) EXPECT_TRUE(DiskHolds(*disk, k)) << "prompt " << k;
    auto r = Restart(disk.get(), policy);
    EXPECT_EQ(RunPrompt(*r->mgr, r->device, 100, 20), kBs) << "the hottest prompt loads from the disk, bytes checked";
    EXPECT_EQ(RunPrompt(*r->mgr, r->device, 101, 16), kBs) << "so does the host's coldest";
    EXPECT_EQ(r->mgr->stats().tiers[0].loads_failed, 0u);
  }
}

// More above than the disk has slots: it keeps the most valuable, the
// device's blocks before the host's.
TEST(KvWriteDownTest, ASmallDiskKeepsTheMostValuable) {
  for (const std::string policy : {"s3fifo", "lru"}) {
    SCOPED_TRACE(policy);
    const std::string dir = testing::MakeDirectIoTempDir("strata-write-down-");
    ASSERT_FALSE(dir.empty()) << "no filesystem here takes O_DIRECT";
    auto s = RunTwenty(dir + "/disk", 4, policy);
    ASSERT_NE(s, nullptr);
    ASSERT_EQ(HeldAbove(*s), (std::vector<int>{16, 17, 18, 19, 20}));
    const WriteDownResult w = s->mgr->WriteDown(60);
    EXPECT_EQ(w.kept, 4u);
    EXPECT_EQ(w.failed + w.refused + w.not_submitted, 0u);
    EXPECT_EQ(s->disk->stats().blocks, 4u);
    for (int k = 17; k <= 20; ++k) EXPECT_TRUE(DiskHolds(*s->disk, k)) << "prompt " << k;
    EXPECT_FALSE(DiskHolds(*s->disk, 16)) << "the host's least recent block is the one left out";
    EXPECT_EQ(s->host->pinned_slots(), 0u);
  }
}

// The disk's persisted recency follows the ranking: after a restart (lru
// resumes that order) new blocks evict the disk's own blocks first, then
// the host's (16, 17), and keep the device's (18-20). Written the most
// valuable first and not refreshed, 20 and 19 would have been the least
// recent blocks written, and gone first.
TEST(KvWriteDownTest, ARestartEvictsTheLeastValuableFirst) {
  const std::string dir = testing::MakeDirectIoTempDir("strata-write-down-");
  ASSERT_FALSE(dir.empty()) << "no filesystem here takes O_DIRECT";
  auto s = RunTwenty(dir + "/disk", 8, "lru");
  ASSERT_NE(s, nullptr);
  const WriteDownResult w = s->mgr->WriteDown(60);
  EXPECT_EQ(w.kept, 5u);
  s->mgr.reset();
  s->disk.reset();
  auto disk = OpenDisk(dir + "/disk", 8, "lru");
  ASSERT_NE(disk, nullptr);
  auto r = Restart(disk.get(), "lru");
  // 7 new blocks, written through; the disk, the last tier of one policy
  // with the device, also gives up its copies of what the device holds
  // (the newest prompts) before its other blocks.
  for (int k = 21; k <= 27; ++k) {
    EXPECT_EQ(RunPrompt(*r->mgr, r->device, static_cast<uint64_t>(k), k), 0);
    Settle(*r->mgr, 0);
  }
  std::string held;
  for (int k = 1; k <= 27; ++k)
    if (DiskHolds(*disk, k)) held += std::to_string(k) + " ";
  SCOPED_TRACE("the disk holds prompts " + held);
  for (int k = 18; k <= 20; ++k) EXPECT_TRUE(DiskHolds(*disk, k)) << "prompt " << k;
  for (int k = 1; k <= 17; ++k) EXPECT_FALSE(DiskHolds(*disk, k)) << "prompt " << k;
}

// Nothing to do without a disk tier, or with no time.
TEST(KvWriteDownTest, NoDiskTierOrNoTimeDoesNothing) {
  ManualClock clock;
  std::vector<uint8_t> device(4 * kBytes, 0);
  uint8_t* base = device.data();
  auto mem = [base](BlockId id) { return base + id.value() * kBytes; };
  HostStoreOptions ho;
  ho.capacity_bytes = 2 * kBytes;
  ho.block_bytes = kBytes;
  ho.pin = false;
  auto host = std::move(HostStore::Create(ho)).value();
  std::vector<LowerTier> tiers = {{host.get(), WritePolicy::kExclusive, 0, 0}};
  auto mgr = std::move(KvManager::Create(Options(4, "s3fifo"), mem, std::move(tiers), &clock)).value();
  for (int k = 1; k <= 6; ++k) RunPrompt(*mgr, device, static_cast<uint64_t>(k), k);
  const uint64_t writes = mgr->stats().tiers[0].writes;
  EXPECT_EQ(mgr->WriteDown(60).tier, -1);
  EXPECT_EQ(mgr->stats().tiers[0].writes, writes);

  const std::string dir = testing::MakeDirectIoTempDir("strata-write-down-");
  ASSERT_FALSE(dir.empty()) << "no filesystem here takes O_DIRECT";
  auto s = RunTwenty(dir + "/disk", 8, "s3fifo");
  ASSERT_NE(s, nullptr);
  const uint64_t disk_writes = s->mgr->stats().tiers[1].writes;
  const WriteDownResult w = s->mgr->WriteDown(0);
  EXPECT_EQ(w.tier, -1);
  EXPECT_EQ(w.written, 0u);
  EXPECT_EQ(s->mgr->stats().tiers[1].writes, disk_writes);
}

}  // namespace
}  // namespace strata::kvcache
