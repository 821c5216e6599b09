// One eviction policy over the device pool and the tiers below it
// (kvcache/hierarchy_policy.h): a block keeps its place in the policy when
// it moves between the tiers, the last tier evicts only blocks no tier
// above holds, and through the KvManager a policy's scan resistance
// survives the moves down, to a host tier and on to a real disk tier
// (which per-tier policies lost).

#include "kvcache/hierarchy_policy.h"

#include <gtest/gtest.h>

#include <chrono>
#include <set>
#include <thread>

#include "kvcache/disk_store.h"
#include "kvcache/host_store.h"
#include "kvcache/kv_manager.h"
#include "tests/support/test_env.h"

namespace strata::kvcache {
namespace {

BlockTraits Key(uint64_t key) {
  BlockTraits t;
  t.key = key;
  return t;
}

void ExpectConsistent(const HierarchyPolicy& h) {
  const Status s = h.CheckConsistency();
  EXPECT_TRUE(s.ok()) << s.message();
}

TEST(HierarchyPolicyTest, ABlockKeepsItsEntryDownAndUp) {
  auto h = std::move(HierarchyPolicy::Create("lru", 2, 3)).value();
  auto device = h->DeviceView();
  auto tier = h->TierView();
  // Named on the device, used, released.
  device->Insert(0, Key(11), /*evictable=*/false);
  device->Access(0);
  device->SetEvictable(0, true);
  ExpectConsistent(*h);
  EXPECT_EQ(h->policy().stats().inserted, 1u);
  EXPECT_EQ(tier->Victim(), -1) << "a block the device holds is never the tier's victim";

  // Demoted: in transit until the tier stores it, then the same entry.
  device->Erase(0, /*evicted=*/true);
  EXPECT_EQ(h->in_transit(), 1u);
  ExpectConsistent(*h);
  tier->Insert(2, Key(11), /*evictable=*/true);
  EXPECT_EQ(h->in_transit(), 0u);
  EXPECT_EQ(h->policy().stats().inserted, 1u) << "the demoted block kept its entry";
  EXPECT_EQ(h->policy().stats().hits, 1u) << "and its use on the device";
  EXPECT_EQ(tier->Victim(), 2);
  ExpectConsistent(*h);

  // Promoted: the device names it (a use), then the tier drops its copy.
  device->Insert(1, Key(11), false);
  EXPECT_EQ(h->policy().stats().hits, 2u);
  EXPECT_EQ(tier->Victim(), 2) << "every block of the tier is on the device too: a copy goes first";
  tier->Insert(0, Key(13), true);
  EXPECT_EQ(tier->Victim(), 0) << "a block only the tier holds goes before any copy";
  tier->Erase(0, /*evicted=*/true);
  tier->Erase(2, /*evicted=*/false);
  EXPECT_EQ(h->policy().stats().removed, 0u) << "the entry stays: the device holds the block";
  EXPECT_EQ(h->policy().stats().evicted, 1u);  // 13
  ExpectConsistent(*h);

  // Demoted again, but no write comes: Settle forgets it as an eviction.
  device->SetEvictable(1, true);
  device->Erase(1, /*evicted=*/true);
  h->Settle([](uint64_t key) { return key == 11; });
  EXPECT_EQ(h->in_transit(), 1u) << "its write is still pending";
  h->Settle([](uint64_t) { return false; });
  EXPECT_EQ(h->in_transit(), 0u);
  EXPECT_EQ(h->policy().stats().evicted, 2u);
  EXPECT_EQ(h->policy().stats().inserted, 2u);
  ExpectConsistent(*h);

  // A flush on the device drops a block only it holds.
  device->Insert(0, Key(12), false);
  device->SetEvictable(0, true);
  device->Erase(0, /*evicted=*/false);
  EXPECT_EQ(h->policy().stats().removed, 1u);
  EXPECT_EQ(h->policy().num_evictable(), 0);
  ExpectConsistent(*h);
}

TEST(HierarchyPolicyTest, TheTierSkipsBlocksTheDeviceHoldsInPlace) {
  // s3fifo: the oldest block of the small FIFO is on the device; the tier's
  // victim is the next one, and the device's block keeps its place.
  auto h = std::move(HierarchyPolicy::Create("s3fifo", 4, 8)).value();
  auto device = h->DeviceView();
  auto tier = h->TierView();
  device->Insert(0, Key(1), false);
  device->SetEvictable(0, true);
  for (int32_t k = 0; k < 3; ++k) tier->Insert(k, Key(static_cast<uint64_t>(10 + k)), true);
  EXPECT_EQ(tier->Victim(), 0);
  EXPECT_EQ(tier->Order(), (std::vector<int32_t>{0, 1, 2}));
  tier->Erase(0, /*evicted=*/true);
  device->Erase(0, /*evicted=*/true);
  tier->Insert(0, Key(1), true);  // the device's block arrives: still ahead of the others
  EXPECT_EQ(tier->Victim(), 0);
  ExpectConsistent(*h);
  // Pinned in the tier (a peer reads it): not a victim.
  tier->SetEvictable(0, false);
  EXPECT_EQ(tier->Victim(), 1);
  EXPECT_EQ(tier->num_evictable(), 2);
  ExpectConsistent(*h);
}

// Device, host and disk views of one policy: a block keeps its one entry
// all the way down; the host (above another tier) demotes its least
// recently stored or read block; the disk evicts P's victim among the
// blocks only it holds, never one the host also holds.
TEST(HierarchyPolicyTest, ThreeTiersShareOneEntryPerBlock) {
  auto h = std::move(HierarchyPolicy::Create("lru", 2, std::vector<int32_t>{2, 3})).value();
  ASSERT_EQ(h->num_tiers(), 2u);
  auto device = h->DeviceView();
  auto host = h->TierView(0);
  auto disk = h->TierView(1);
  device->Insert(0, Key(21), false);
  device->Access(0);
  device->SetEvictable(0, true);
  device->Erase(0, /*evicted=*/true);  // demoted to the host
  host->Insert(1, Key(21), true);
  device->Insert(0, Key(22), false);
  device->SetEvictable(0, true);
  device->Erase(0, /*evicted=*/true);
  host->Insert(0, Key(22), true);
  ExpectConsistent(*h);
  EXPECT_EQ(host->Victim(), 1) << "the host demotes its least recently stored block";
  EXPECT_EQ(disk->Victim(), -1);
  host->Access(1);  // read: now 22 is the older one
  EXPECT_EQ(host->Victim(), 0);
  host->Erase(0, /*evicted=*/true);
  EXPECT_EQ(h->in_transit(), 1u) << "on its way to the disk";
  disk->Insert(2, Key(22), true);
  EXPECT_EQ(h->in_transit(), 0u);
  EXPECT_EQ(h->policy().stats().inserted, 2u) << "one entry per block, whichever tier holds it";
  EXPECT_EQ(disk->Victim(), 2);
  // A copy of a host block on the disk (write-through): not the disk's victim
  // while the disk holds a block only it holds.
  disk->Insert(0, Key(21), true);
  EXPECT_EQ(disk->Victim(), 2);
  EXPECT_EQ(disk->Order(), (std::vector<int32_t>{2}));
  ExpectConsistent(*h);
  host->Erase(1, /*evicted=*/true);  // the disk's copy is all that is left: a candidate
  EXPECT_EQ(h->in_transit(), 0u);
  EXPECT_EQ(disk->Order().size(), 2u);
  ExpectConsistent(*h);
  disk->Erase(2, /*evicted=*/true);
  disk->Erase(0, /*evicted=*/true);
  EXPECT_EQ(h->policy().stats().evicted, 2u);
  EXPECT_EQ(h->policy().num_evictable(), 0);
  ExpectConsistent(*h);
  // A host eviction whose write to the disk never comes is forgotten.
  device->Insert(1, Key(23), false);
  device->SetEvictable(1, true);
  device->Erase(1, true);
  host->Insert(0, Key(23), true);
  host->Erase(0, true);
  EXPECT_EQ(h->in_transit(), 1u);
  h->Settle([](uint64_t) { return false; });
  EXPECT_EQ(h->in_transit(), 0u);
  EXPECT_EQ(h->policy().stats().evicted, 3u);
  ExpectConsistent(*h);
  EXPECT_FALSE(HierarchyPolicy::Create("lru", 2, std::vector<int32_t>{}).ok());
  EXPECT_FALSE(HierarchyPolicy::Create("lru", 2, std::vector<int32_t>{1, 1, 1, 1, 1}).ok());
}

// A write-through last tier (copies_first): it evicts its copies of blocks
// a tier above or the device holds before any block only it holds, least
// recently made copy first; a copy whose block leaves the tiers above is a
// block only it holds (P ranks it).
TEST(HierarchyPolicyTest, AWriteThroughLastTierDropsItsCopiesFirst) {
  auto h = std::move(HierarchyPolicy::Create("lru", 2, std::vector<int32_t>{2, 3}, /*copies_first=*/true)).value();
  auto device = h->DeviceView();
  auto host = h->TierView(0);
  auto disk = h->TierView(1);
  // 31: on the disk only (the host dropped it). 32: on the device and, as
  // written through, on the disk. 33: in the host and on the disk.
  device->Insert(0, Key(31), false);
  disk->Insert(0, Key(31), true);
  device->SetEvictable(0, true);
  device->Erase(0, /*evicted=*/true);
  device->Insert(0, Key(32), false);
  disk->Insert(1, Key(32), true);
  device->Insert(1, Key(33), false);
  disk->Insert(2, Key(33), true);
  device->SetEvictable(1, true);
  device->Erase(1, /*evicted=*/true);
  host->Insert(0, Key(33), true);
  ExpectConsistent(*h);
  EXPECT_EQ(disk->Victim(), 1) << "the oldest copy of a block held above goes first";
  EXPECT_EQ(disk->Order(), (std::vector<int32_t>{1, 2, 0}));
  disk->SetEvictable(1, false);  // being read
  EXPECT_EQ(disk->Victim(), 2);
  ExpectConsistent(*h);
  disk->SetEvictable(1, true);
  host->Erase(0, /*evicted=*/true);  // 33 now only on the disk: P's to rank
  EXPECT_EQ(disk->Order(), (std::vector<int32_t>{1, 0, 2}));
  ExpectConsistent(*h);
  disk->Erase(1, /*evicted=*/true);
  EXPECT_EQ(disk->Victim(), 0) << "no copies left: P's victim among the blocks only the disk holds";
  ExpectConsistent(*h);
  // The device drops 32, the disk took it back (its write-back).
  device->SetEvictable(0, true);
  device->Erase(0, /*evicted=*/true);
  EXPECT_EQ(h->in_transit(), 1u);
  disk->Insert(1, Key(32), true);
  EXPECT_EQ(h->in_transit(), 0u);
  EXPECT_EQ(disk->Order(), (std::vector<int32_t>{0, 2, 1}));
  ExpectConsistent(*h);
}

constexpr int kBs = 4;
constexpr uint64_t kBlockBytes = 64;


std::vector<int32_t> Seq(int n, int first) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[static_cast<size_t>(i)] = first + i;
  return t;
}

struct Stack {
  ManualClock clock;
  std::vector<uint8_t> device;
  std::unique_ptr<HostStore> host;
  std::unique_ptr<HostStore> third;  // a second host store below the first, or none
  std::unique_ptr<KvManager> mgr;
};

// third_blocks > 0: a third tier (a host store standing in for a disk) below
// the host, with write policy third_write.
std::unique_ptr<Stack> MakeStack(const std::string& policy, int32_t device_blocks, int32_t host_blocks,
                                 WritePolicy write, int32_t third_blocks = 0,
                                 WritePolicy third_write = WritePolicy::kWriteThrough) {
  auto s = std::make_unique<Stack>();
  s->device.assign(static_cast<size_t>(device_blocks) * kBlockBytes, 0);
  HostStoreOptions ho;
  ho.capacity_bytes = static_cast<uint64_t>(host_blocks) * kBlockBytes;
  ho.block_bytes = kBlockBytes;
  ho.pin = false;
  ho.eviction_policy = policy;
  s->host = std::move(HostStore::Create(ho)).value();
  if (third_blocks > 0) {
    ho.capacity_bytes = static_cast<uint64_t>(third_blocks) * kBlockBytes;
    s->third = std::move(HostStore::Create(ho)).value();
  }
  KvManagerOptions o;
  o.block_size = kBs;
  o.num_device_blocks = device_blocks;
  o.block_bytes = kBlockBytes;
  o.ns = NamespaceDigest("hierarchy-test", "llama", "f16", kBs);
  o.load_policy = LoadPolicy::kAlways;
  o.eviction_policy = policy;
  uint8_t* base = s->device.data();
  auto mem = [base](BlockId id) { return base + id.value() * kBlockBytes; };
  std::vector<LowerTier> tiers = {{s->host.get(), write, 0, 0}};
  if (s->third) tiers.push_back({s->third.get(), third_write, 0, 0});
  s->mgr = std::move(KvManager::Create(o, mem, std::move(tiers), &s->clock)).value();
  return s;
}

int32_t RunOnce(KvManager& m, uint64_t id, const std::vector<int32_t>& prompt) {
  EXPECT_TRUE(m.AddRequest(RequestId(id), prompt, {}).ok());
  auto a = m.Allocate(RequestId(id), static_cast<int32_t>(prompt.size()));
  EXPECT_TRUE(a.ok() && *a == AllocOutcome::kAllocated);
  for (int i = 0; i < 20000 && !m.IsReady(RequestId(id)); ++i) {  // a disk load takes real time
    m.Poll();
    if (i >= 100) std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  EXPECT_TRUE(m.IsReady(RequestId(id)));
  const int32_t cached = m.CachedTokens(RequestId(id));
  EXPECT_TRUE(m.Commit(RequestId(id), prompt).ok());
  m.Poll();
  m.Free(RequestId(id));
  m.Poll();
  return cached;
}

// A prompt used three times, then a scan of one-use prompts larger than the
// whole hierarchy, then the prompt again. S3-FIFO keeps the reused blocks
// (they were hit, so they leave its small FIFO for the main one) although
// they went down to the host tier in between; LRU loses them to the scan.
// Per-tier policies lost them too: the host tier saw each demoted block as
// new.
TEST(HierarchyPolicyTest, ScanResistanceCarriesIntoTheHost) {
  for (const std::string policy : {"s3fifo", "lru"}) {
    SCOPED_TRACE(policy);
    auto s = MakeStack(policy, /*device_blocks=*/4, /*host_blocks=*/12, WritePolicy::kExclusive);
    const auto hot = Seq(9, 1);  // 2 full blocks and a partial one
    EXPECT_EQ(RunOnce(*s->mgr, 1, hot), 0);
    EXPECT_EQ(RunOnce(*s->mgr, 2, hot), 8);
    EXPECT_EQ(RunOnce(*s->mgr, 3, hot), 8);
    for (uint64_t k = 0; k < 10; ++k) RunOnce(*s->mgr, 10 + k, Seq(9, 1000 + 100 * static_cast<int>(k)));
    EXPECT_EQ(s->mgr->Match(hot, {}).device_tokens, 0) << "the scan went through the device";
    EXPECT_EQ(RunOnce(*s->mgr, 4, hot), policy == "s3fifo" ? 8 : 0);
    const Status c = s->mgr->device_pool().CheckConsistency();
    EXPECT_TRUE(c.ok()) << c.message();
  }
}

// A write-back host tier that makes room for the device's evictions must
// not evict the blocks the request evicting them is about to load: the
// request pins them until its loads are submitted. Device 2 blocks, host 2:
// B and C go down to the host, then D evicts into the full host while B is
// loaded back; unpinned, B was the host's least recently used block, its
// load failed and it was recomputed.
TEST(HierarchyPolicyTest, AWriteBackTierKeepsWhatTheRequestLoads) {
  for (const std::string policy : {"lru", "s3fifo"}) {
    SCOPED_TRACE(policy);
    auto s = MakeStack(policy, /*device_blocks=*/2, /*host_blocks=*/2, WritePolicy::kWriteBack);
    auto prompt = [](int k) {
      auto p = Seq(kBs, 100 * k);
      p.push_back(7);
      return p;
    };
    for (int k : {1, 2, 3, 4}) EXPECT_EQ(RunOnce(*s->mgr, static_cast<uint64_t>(k), prompt(k)), 0);
    ASSERT_EQ(s->host->stats().blocks, 2u);
    ASSERT_EQ(s->host->CountPrefix(HashPrefix(s->mgr->options().ns, prompt(2), kBs, {})), 1u);
    EXPECT_EQ(RunOnce(*s->mgr, 5, prompt(2)), kBs) << "B loaded from the host";
    EXPECT_EQ(s->mgr->stats().tiers[0].loads_failed, 0u);
    EXPECT_EQ(s->host->stats().blocks, 2u);
    EXPECT_EQ(s->mgr->device_pool().stats().in_use, 0);
  }
}

// The same through three tiers: device 4, exclusive host 2, a real
// exclusive disk tier 8 blocks. The reused prompt's blocks go down to the
// disk during the scan; S3-FIFO keeps them there (the disk ranks them with
// the history they gathered on the device), LRU does not. With the policy
// over device and host only, the disk's own policy took them as new blocks
// and the scan evicted one (4 of the 8 tokens served).
TEST(HierarchyPolicyTest, ScanResistanceCarriesDownToTheDisk) {
  constexpr uint64_t kDiskBlockBytes = 4096;  // the disk store's minimum
  for (const std::string policy : {"s3fifo", "lru"}) {
    SCOPED_TRACE(policy);
    const std::string dir = testing::MakeDirectIoTempDir("strata-hier-");
    ASSERT_FALSE(dir.empty()) << "no filesystem here takes O_DIRECT";
    ManualClock clock;
    std::vector<uint8_t> device(4 * kDiskBlockBytes, 0);
    HostStoreOptions ho;
    ho.capacity_bytes = 2 * kDiskBlockBytes;
    ho.block_bytes = kDiskBlockBytes;
    ho.pin = false;
    ho.eviction_policy = policy;
    auto host = std::move(HostStore::Create(ho)).value();
    DiskStoreOptions dopt;
    dopt.directory = dir + "/disk";
    dopt.block_bytes = kDiskBlockBytes;
    dopt.capacity_bytes = 8 * kDiskBlockBytes;
    dopt.slab_file_bytes = 8 * kDiskBlockBytes;
    dopt.grow_bytes = 8 * kDiskBlockBytes;
    dopt.eviction_policy = policy;
    auto opened = DiskStore::Open(dopt);
    ASSERT_TRUE(opened.ok()) << opened.error().ToString();
    auto disk = std::move(opened).value();
    KvManagerOptions o;
    o.block_size = kBs;
    o.num_device_blocks = 4;
    o.block_bytes = kDiskBlockBytes;
    o.ns = NamespaceDigest("hierarchy-test", "llama", "f16", kBs);
    o.load_policy = LoadPolicy::kAlways;
    o.eviction_policy = policy;
    uint8_t* base = device.data();
    auto mem = [base](BlockId id) { return base + id.value() * kDiskBlockBytes; };
    std::vector<LowerTier> tiers = {{host.get(), WritePolicy::kExclusive, 0, 0},
                                    {disk.get(), WritePolicy::kExclusive, 0, 0}};
    auto mgr = std::move(KvManager::Create(o, mem, std::move(tiers), &clock)).value();
    // Each request waits for the disk's writes, so the order is the same every run.
    auto settle = [&] {
      auto pending = [&] {
        const auto t = mgr->stats().tiers[1];
        return t.bytes_down / kDiskBlockBytes + t.writes_failed < t.writes;
      };
      for (int i = 0; i < 5000 && pending(); ++i) {
        mgr->Poll();
        std::this_thread::sleep_for(std::chrono::microseconds(200));
      }
    };
    const auto hot = Seq(9, 1);
    EXPECT_EQ(RunOnce(*mgr, 1, hot), 0);
    EXPECT_EQ(RunOnce(*mgr, 2, hot), 8);
    EXPECT_EQ(RunOnce(*mgr, 3, hot), 8);
    for (uint64_t k = 0; k < 10; ++k) {
      RunOnce(*mgr, 10 + k, Seq(9, 1000 + 100 * static_cast<int>(k)));
      settle();
    }
    EXPECT_EQ(mgr->Match(hot, {}).device_tokens, 0) << "the scan went through the device";
    EXPECT_EQ(host->CountPrefix(HashPrefix(o.ns, hot, kBs, {})), 0u) << "and through the host";
    EXPECT_EQ(RunOnce(*mgr, 4, hot), policy == "s3fifo" ? 8 : 0);
    if (policy == "s3fifo") {
      EXPECT_EQ(mgr->stats().tiers[1].hits.blocks, 2u) << "loaded from the disk";
    }
    const Status c = mgr->device_pool().CheckConsistency();
    EXPECT_TRUE(c.ok()) << c.message();
  }
}

// Device 2 blocks, an exclusive host tier of 2 and a write-through third
// tier of 4 (a host store standing in for the disk), 20 one-block prompts
// used once each. The third tier takes every block when computed, drops
// its copies of what the device and host hold first, and takes back what
// the host drops: the tiers hold the last 6 prompts, not the 4 an
// inclusive third tier held, and the oldest loads back.
TEST(HierarchyPolicyTest, AWriteThroughThirdTierHoldsWhatTheTiersAboveDrop) {
  for (const std::string policy : {"lru", "s3fifo"}) {
    SCOPED_TRACE(policy);
    auto s = MakeStack(policy, /*device_blocks=*/2, /*host_blocks=*/2, WritePolicy::kExclusive,
                       /*third_blocks=*/4, WritePolicy::kWriteThrough);
    KvManager* mgr = s->mgr.get();
    HostStore* host = s->host.get();
    HostStore* third = s->third.get();
    const KvManagerOptions& o = mgr->options();
    auto prompt = [](int k) {
      auto p = Seq(kBs, 100 * k);
      p.push_back(7);
      return p;
    };
    for (int k = 1; k <= 20; ++k) EXPECT_EQ(RunOnce(*mgr, static_cast<uint64_t>(k), prompt(k)), 0);
    int held = 0, twice = 0, oldest = 21;
    for (int k = 1; k <= 20; ++k) {
      const auto chain = HashPrefix(o.ns, prompt(k), kBs, {});
      const int places = (mgr->Match(prompt(k), {}).device_tokens > 0) +
                         static_cast<int>(host->CountPrefix(chain)) + static_cast<int>(third->CountPrefix(chain));
      held += places > 0;
      twice += places > 1;
      if (places > 0) oldest = std::min(oldest, k);
    }
    // 15..20: the device's one cached block (20, also on the third tier:
    // written through when computed, and no slot was needed since), the
    // host's 2 and the third tier's 3 others. Inclusive, as before: 17..20.
    EXPECT_EQ(held, 6);
    EXPECT_EQ(oldest, 15);
    EXPECT_EQ(twice, 1) << "only the copy of the block computed last";
    EXPECT_EQ(third->stats().blocks, 4u);
    EXPECT_GT(mgr->stats().tiers[1].writebacks, 0u) << "the host's drops went down";
    EXPECT_EQ(RunOnce(*mgr, 100, prompt(oldest)), kBs) << "the oldest held prompt loads back";
    EXPECT_EQ(mgr->stats().tiers[1].loads_failed + mgr->stats().tiers[0].loads_failed, 0u);
    const Status c = mgr->device_pool().CheckConsistency();
    EXPECT_TRUE(c.ok()) << c.message();
  }
}

// Random prompts over shared heads, for every policy and write policy: the
// pool, the tier and the shared policy stay consistent after every request,
// the tier never holds more than its slots, nothing stays in transit, and
// loaded blocks are the ones computed (the bytes are checked).
TEST(HierarchyPolicyTest, RandomizedInvariants) {
  struct Config {
    WritePolicy host;
    int32_t third_blocks;
    WritePolicy third;
  };
  const Config configs[] = {{WritePolicy::kExclusive, 0, WritePolicy::kNone},
                            {WritePolicy::kWriteThrough, 0, WritePolicy::kNone},
                            {WritePolicy::kWriteBack, 0, WritePolicy::kNone},
                            {WritePolicy::kExclusive, 12, WritePolicy::kWriteThrough},
                            {WritePolicy::kExclusive, 12, WritePolicy::kWriteBack},
                            {WritePolicy::kWriteThrough, 12, WritePolicy::kWriteThrough}};
  for (const std::string& policy : EvictionPolicyNames()) {
    for (const Config& cfg : configs) {
      const WritePolicy write = cfg.host;
      SCOPED_TRACE(policy + " write policy " + std::to_string(static_cast<int>(write)) + ", third tier " +
                   std::to_string(cfg.third_blocks) + " " + std::to_string(static_cast<int>(cfg.third)));
      auto s = MakeStack(policy, 6, 10, write, cfg.third_blocks, cfg.third);
      uint64_t rng = 99;
      auto next = [&rng](uint64_t n) {
        rng = rng * 6364136223846793005ULL + 1442695040888963407ULL;
        return (rng >> 33) % n;
      };
      int64_t served = 0;
      for (uint64_t id = 1; id <= 400; ++id) {
        const int head = static_cast<int>(next(5));
        std::vector<int32_t> prompt = Seq(4 * (1 + head % 3), 1000 * head + 1);
        const int tail = static_cast<int>(next(3));
        for (int b = 0; b < tail; ++b) {
          const int32_t sym = static_cast<int32_t>(next(4));
          for (int k = 0; k < kBs; ++k) prompt.push_back(100000 + 10 * sym + k);
        }
        prompt.push_back(7);
        KvManager& m = *s->mgr;
        EXPECT_TRUE(m.AddRequest(RequestId(id), prompt, {}).ok());
        auto a = m.Allocate(RequestId(id), static_cast<int32_t>(prompt.size()));
        ASSERT_TRUE(a.ok() && *a == AllocOutcome::kAllocated);
        for (int i = 0; i < 100 && !m.IsReady(RequestId(id)); ++i) m.Poll();
        ASSERT_TRUE(m.IsReady(RequestId(id)));
        const int32_t cached = m.CachedTokens(RequestId(id));
        served += cached;
        // Block contents are a function of the chain position's tokens: a
        // loaded block must carry what was computed for it.
        auto table = m.BlockTable(RequestId(id));
        for (size_t b = 0; b < table.size(); ++b) {
          uint8_t* p = s->device.data() + static_cast<size_t>(table[b]) * kBlockBytes;
          const uint8_t want = static_cast<uint8_t>(prompt[std::min(prompt.size() - 1, b * kBs)] * 13 + b);
          if (b < static_cast<size_t>(cached / kBs)) {
            ASSERT_EQ(p[0], want) << "request " << id << " block " << b;
          } else {
            p[0] = want;
          }
        }
        EXPECT_TRUE(m.Commit(RequestId(id), prompt).ok());
        m.Poll();
        m.Free(RequestId(id));
        m.Poll();
        const Status c = m.device_pool().CheckConsistency();
        ASSERT_TRUE(c.ok()) << "request " << id << ": " << c.message();
        ASSERT_TRUE(s->host->policy().CheckConsistency().ok());
        ASSERT_LE(s->host->stats().blocks, 10u);
        if (s->third) {
          const Status t = s->third->policy().CheckConsistency();
          ASSERT_TRUE(t.ok()) << "request " << id << ": " << t.message();
          ASSERT_LE(s->third->stats().blocks, 12u);
        }
      }
      EXPECT_GT(served, 0);
      EXPECT_EQ(s->mgr->device_pool().stats().in_use, 0);
    }
  }
}

}  // namespace
}  // namespace strata::kvcache
