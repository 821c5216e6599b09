// KvManager over a fake device memory and the host tier: sharing, salts,
// "not now", tail-first eviction, device→host→device byte identity, failed
// loads, metadata-only mode, and pool invariants under random traffic.

#include "kvcache/kv_manager.h"

#include <gtest/gtest.h>

#include "tests/support/test_memory.h"

#include <numeric>

#include <map>
#include <random>
#include <set>

#include "kvcache/host_store.h"

namespace strata::kvcache {
namespace {

constexpr int kBs = 4;
constexpr uint64_t kBlockBytes = 32;

// A device pool of plain memory.
struct FakeDevice {
  explicit FakeDevice(int32_t n) : bytes(static_cast<size_t>(n) * kBlockBytes, 0) {}
  BlockMemoryFn fn() {
    return [this](BlockId id) { return bytes.data() + id.value() * kBlockBytes; };
  }
  std::vector<uint8_t> Block(int32_t id) const {
    auto* p = bytes.data() + static_cast<size_t>(id) * kBlockBytes;
    return {p, p + kBlockBytes};
  }
  std::vector<uint8_t> bytes;
};

// Forwards to a HostStore but fails reads of chosen hashes (decorator; no
// hooks in production code).
class FailingReads final : public BlockStore {
 public:
  explicit FailingReads(BlockStore* inner) : inner_(inner) {}
  std::set<std::string> fail;  // hex digests
  std::string_view name() const override { return "failing"; }
  TierKind kind() const override { return TierKind::kHost; }
  StoreStats stats() const override { return inner_->stats(); }
  bool Contains(const BlockHash& h) const override { return inner_->Contains(h); }
  size_t CountPrefix(std::span<const BlockHash> c) const override { return inner_->CountPrefix(c); }
  Status SubmitWrite(const BlockHash& h, const Sha256Digest& ns, const Region& d, uint64_t tag) override {
    return inner_->SubmitWrite(h, ns, d, tag);
  }
  Status SubmitRead(const BlockHash& h, const Region& dst, uint64_t tag) override {
    if (fail.contains(ToHex(h.digest))) {
      if (auto bytes = segments()->Resolve(dst); bytes.ok())
        std::fill(bytes->begin(), bytes->end(), 0xEE);  // garbage that must never be served
      failed_.push_back({tag, Status::Corrupt("injected")});
      return Status::Ok();
    }
    return inner_->SubmitRead(h, dst, tag);
  }
  size_t Poll(std::vector<StoreCompletion>* out) override {
    size_t n = inner_->Poll(out) + failed_.size();
    for (auto& c : failed_) out->push_back(c);
    failed_.clear();
    return n;
  }
  void Drain(std::vector<StoreCompletion>* out) override { (void)Poll(out); }
  Status Remove(const BlockHash& h) override { return inner_->Remove(h); }
  Status Flush(const Sha256Digest* ns) override { return inner_->Flush(ns); }
  // The inner store's memory is in the table this one is attached to.
  Status RegisterMemory() override { return inner_->Attach(segments()); }
  void UnregisterMemory() override { inner_->Detach(); }

 private:
  BlockStore* inner_;
  std::vector<StoreCompletion> failed_;
};

std::vector<int32_t> Seq(int n, int first) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[static_cast<size_t>(i)] = first + i;
  return t;
}

KvManagerOptions Options(int32_t blocks) {
  KvManagerOptions o;
  o.block_size = kBs;
  o.num_device_blocks = blocks;
  o.block_bytes = kBlockBytes;
  o.ns = NamespaceDigest("test-weights", "llama", "f16", kBs);
  o.load_policy = LoadPolicy::kAlways;
  return o;
}

struct Fixture {
  Fixture(int32_t device_blocks, uint64_t host_blocks, BlockStore* wrap = nullptr)
      : device(device_blocks) {
    host = std::move(HostStore::Create({host_blocks * kBlockBytes, kBlockBytes, false})).value();
    mgr = std::move(KvManager::Create(Options(device_blocks), device.fn(), host.get(), &clock)).value();
  }
  // Adds, allocates the prompt, "computes" it (writes a pattern into every
  // computed block) and commits it.
  void Run(uint64_t id, const std::vector<int32_t>& prompt, std::string_view salt = {}) {
    ASSERT_TRUE(mgr->AddRequest(RequestId(id), prompt, salt).ok());
    auto a = mgr->Allocate(RequestId(id), static_cast<int32_t>(prompt.size()));
    ASSERT_TRUE(a.ok());
    ASSERT_EQ(*a, AllocOutcome::kAllocated);
    mgr->Poll();
    ASSERT_TRUE(mgr->IsReady(RequestId(id)));
    auto table = mgr->BlockTable(RequestId(id));
    for (size_t b = static_cast<size_t>(mgr->CachedTokens(RequestId(id)) / kBs); b < table.size(); ++b)
      for (uint64_t k = 0; k < kBlockBytes; ++k)
        device.bytes[static_cast<size_t>(table[b]) * kBlockBytes + k] = static_cast<uint8_t>(id * 13 + b * 7 + k);
    ASSERT_TRUE(mgr->Commit(RequestId(id), prompt).ok());
    mgr->Poll();
  }
  ManualClock clock;
  FakeDevice device;
  std::unique_ptr<HostStore> host;
  std::unique_ptr<KvManager> mgr;
};

TEST(KvManagerTest, CommonPrefixSharesDeviceBlocks) {
  Fixture f(16, 16);
  auto a = Seq(14, 100), b = Seq(14, 100);
  b[13] = 9;  // same 3 full blocks, different last token
  f.Run(1, a);
  EXPECT_EQ(f.mgr->Match(b, {}).device_tokens, 12);
  f.Run(2, b);
  auto ta = f.mgr->BlockTable(RequestId(1)), tb = f.mgr->BlockTable(RequestId(2));
  for (int i = 0; i < 3; ++i) EXPECT_EQ(ta[i], tb[i]);
  EXPECT_NE(ta[3], tb[3]);
  EXPECT_EQ(f.mgr->CachedTokens(RequestId(2)), 12);
  EXPECT_EQ(f.mgr->stats().device.blocks, 3u);
  EXPECT_EQ(f.mgr->stats().device.tokens, 12u);
  EXPECT_EQ(f.mgr->device_pool().ref(BlockId(static_cast<uint32_t>(ta[0]))), 2);
  EXPECT_EQ(f.mgr->stats().queries, 2u);
}

TEST(KvManagerTest, LastTokenIsAlwaysComputed) {
  Fixture f(16, 16);
  auto a = Seq(12, 5);  // exactly 3 full blocks
  f.Run(1, a);
  // The same prompt again: only 2 blocks (8 tokens) may come from cache.
  EXPECT_EQ(f.mgr->Match(a, {}).total(), 8);
  f.Run(2, a);
  EXPECT_EQ(f.mgr->CachedTokens(RequestId(2)), 8);
}

TEST(KvManagerTest, SaltPreventsSharing) {
  Fixture f(16, 16);
  auto a = Seq(14, 100);
  f.Run(1, a, "alice");
  EXPECT_EQ(f.mgr->Match(a, "bob").total(), 0);
  f.Run(2, a, "bob");
  EXPECT_EQ(f.mgr->stats().device.blocks, 0u);
  std::set<int32_t> ids;
  for (auto id : {1, 2})
    for (int32_t b : f.mgr->BlockTable(RequestId(id))) EXPECT_TRUE(ids.insert(b).second);
  EXPECT_EQ(f.mgr->Match(a, "alice").device_tokens, 12);
}

TEST(KvManagerTest, NotNowChangesNothing) {
  Fixture f(4, 0);
  ASSERT_TRUE(f.mgr->AddRequest(RequestId(1), Seq(10, 0), {}).ok());
  auto a = f.mgr->Allocate(RequestId(1), 17);  // 5 blocks > 4
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(*a, AllocOutcome::kNotNow);
  EXPECT_TRUE(f.mgr->BlockTable(RequestId(1)).empty());
  EXPECT_EQ(f.mgr->device_pool().num_allocatable(), 4);
  EXPECT_EQ(*f.mgr->Allocate(RequestId(1), 10), AllocOutcome::kAllocated);
  EXPECT_EQ(f.mgr->BlockTable(RequestId(1)).size(), 3u);
  EXPECT_EQ(*f.mgr->Allocate(RequestId(1), 17), AllocOutcome::kNotNow);
  EXPECT_EQ(f.mgr->BlockTable(RequestId(1)).size(), 3u);
  EXPECT_FALSE(f.mgr->Allocate(RequestId(9), 1).ok());  // unknown id is an error
  EXPECT_FALSE(f.mgr->AddRequest(RequestId(1), Seq(3, 0), {}).ok());
}

TEST(KvManagerTest, FreedChainTailEvictedFirst) {
  Fixture f(8, 0);
  f.Run(1, Seq(14, 0));  // 3 full blocks + 1 partial
  std::vector<int32_t> t(f.mgr->BlockTable(RequestId(1)).begin(), f.mgr->BlockTable(RequestId(1)).end());
  f.mgr->Free(RequestId(1));
  auto order = f.mgr->device_pool().EvictionOrder();
  ASSERT_EQ(order.size(), 3u);
  EXPECT_EQ(order[0].value(), static_cast<uint32_t>(t[2]));
  EXPECT_EQ(order[2].value(), static_cast<uint32_t>(t[0]));
  // Needing 6 of 8 blocks evicts only the tail (free ones go first).
  ASSERT_TRUE(f.mgr->AddRequest(RequestId(2), Seq(20, 500), {}).ok());
  ASSERT_EQ(*f.mgr->Allocate(RequestId(2), 24), AllocOutcome::kAllocated);
  EXPECT_EQ(f.mgr->stats().device_pool.evictions, 1u);
  EXPECT_EQ(f.mgr->Match(Seq(14, 0), {}).device_tokens, 8);
}

TEST(KvManagerTest, DeviceHostDeviceIsBitwiseIdentical) {
  Fixture f(6, 16);
  auto a = Seq(14, 100);
  f.Run(1, a);
  std::vector<std::vector<uint8_t>> sent;
  for (int i = 0; i < 3; ++i) sent.push_back(f.device.Block(f.mgr->BlockTable(RequestId(1))[i]));
  EXPECT_EQ(f.mgr->stats().bytes_down, 3 * kBlockBytes);  // write-through of full blocks
  f.mgr->Free(RequestId(1));
  // Evict every device copy and scribble over the pool.
  f.Run(2, Seq(24, 900));
  f.mgr->Free(RequestId(2));
  std::fill(f.device.bytes.begin(), f.device.bytes.end(), 0xAB);
  EXPECT_EQ(f.mgr->Match(a, {}).device_tokens, 0);
  EXPECT_EQ(f.mgr->Match(a, {}).lower_tokens, 12);

  ASSERT_TRUE(f.mgr->AddRequest(RequestId(3), a, {}).ok());
  f.clock.Advance(5);
  ASSERT_EQ(*f.mgr->Allocate(RequestId(3), 14), AllocOutcome::kAllocated);
  EXPECT_FALSE(f.mgr->IsReady(RequestId(3)));
  f.clock.Advance(100);
  EXPECT_EQ(f.mgr->Poll(), 3u);
  ASSERT_TRUE(f.mgr->IsReady(RequestId(3)));
  EXPECT_EQ(f.mgr->CachedTokens(RequestId(3)), 12);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(f.device.Block(f.mgr->BlockTable(RequestId(3))[i]), sent[static_cast<size_t>(i)]);
  auto s = f.mgr->stats();
  EXPECT_EQ(s.lower.blocks, 3u);
  EXPECT_EQ(s.lower.tokens, 12u);
  EXPECT_EQ(s.bytes_up, 3 * kBlockBytes);
  EXPECT_EQ(s.load_nanos, 300);
  // Each load took 100 ns of clock time: all three in the first latency
  // bucket (<= 100 us), none elsewhere; every completed write was counted.
  ASSERT_EQ(s.tiers.size(), 1u);
  EXPECT_EQ(s.tiers[0].load_latency[0], 3u);
  EXPECT_EQ(std::accumulate(s.tiers[0].load_latency.begin(), s.tiers[0].load_latency.end(), uint64_t{0}), 3u);
  EXPECT_GE(std::accumulate(s.tiers[0].write_latency.begin(), s.tiers[0].write_latency.end(), uint64_t{0}), 3u);
  // Loaded blocks are named again: a fourth request hits them in device.
  EXPECT_EQ(f.mgr->Match(a, {}).device_tokens, 12);
}

TEST(KvManagerTest, FailedLoadIsRecomputedNeverServed) {
  ManualClock clock;
  FakeDevice device(8);
  auto host = std::move(HostStore::Create({16 * kBlockBytes, kBlockBytes, false})).value();
  FailingReads lower(host.get());
  auto mgr = std::move(KvManager::Create(Options(8), device.fn(), &lower, &clock)).value();
  auto a = Seq(14, 100);
  ASSERT_TRUE(mgr->AddRequest(RequestId(1), a, {}).ok());
  ASSERT_EQ(*mgr->Allocate(RequestId(1), 14), AllocOutcome::kAllocated);
  ASSERT_TRUE(mgr->Commit(RequestId(1), a).ok());
  mgr->Poll();
  mgr->Free(RequestId(1));
  ASSERT_EQ(mgr->Match(Seq(20, 0), {}).total(), 0);
  ASSERT_TRUE(mgr->AddRequest(RequestId(2), Seq(32, 7000), {}).ok());
  ASSERT_EQ(*mgr->Allocate(RequestId(2), 32), AllocOutcome::kAllocated);  // evicts all
  mgr->Free(RequestId(2));
  auto chain = HashPrefix(Options(8).ns, a, kBs);
  lower.fail.insert(ToHex(chain[1].digest));
  ASSERT_TRUE(mgr->AddRequest(RequestId(3), a, {}).ok());
  ASSERT_EQ(*mgr->Allocate(RequestId(3), 14), AllocOutcome::kAllocated);
  mgr->Poll();
  ASSERT_TRUE(mgr->IsReady(RequestId(3)));
  EXPECT_EQ(mgr->CachedTokens(RequestId(3)), 4);  // only block 0 is usable
  EXPECT_EQ(mgr->stats().loads_failed, 1u);
  EXPECT_EQ(mgr->stats().lower.blocks, 1u);
  // Block 1 (garbage) and block 2 (after the failure) are not named.
  EXPECT_EQ(mgr->Match(a, {}).device_tokens, 4);
  mgr->Free(RequestId(3));
  EXPECT_EQ(mgr->device_pool().stats().in_use, 0);
}

TEST(KvManagerTest, FreeWhileLoadingKeepsBlockUntilCompletion) {
  Fixture f(8, 16);
  auto a = Seq(14, 100);
  f.Run(1, a);
  f.mgr->Free(RequestId(1));
  f.Run(2, Seq(32, 7000));
  f.mgr->Free(RequestId(2));
  ASSERT_TRUE(f.mgr->AddRequest(RequestId(3), a, {}).ok());
  ASSERT_EQ(*f.mgr->Allocate(RequestId(3), 14), AllocOutcome::kAllocated);
  f.mgr->Free(RequestId(3));
  EXPECT_EQ(f.mgr->device_pool().stats().in_use, 3);  // held by the 3 loads
  f.mgr->Poll();
  EXPECT_EQ(f.mgr->device_pool().stats().in_use, 0);
  EXPECT_EQ(f.mgr->device_pool().num_allocatable(), 8);
  EXPECT_TRUE(f.mgr->device_pool().CheckConsistency().ok());
}

TEST(KvManagerTest, MetadataOnlyRunsTheSamePolicy) {
  ManualClock clock;
  auto host = std::move(HostStore::Create({1 << 20, 1024, /*metadata_only=*/true})).value();
  KvManagerOptions o = Options(4);
  o.block_bytes = 1024;
  auto mgr = std::move(KvManager::Create(o, nullptr, host.get(), &clock)).value();
  auto a = Seq(14, 1);
  ASSERT_TRUE(mgr->AddRequest(RequestId(1), a, {}).ok());
  ASSERT_EQ(*mgr->Allocate(RequestId(1), 14), AllocOutcome::kAllocated);
  ASSERT_TRUE(mgr->Commit(RequestId(1), a).ok());
  mgr->Poll();
  mgr->Free(RequestId(1));
  ASSERT_TRUE(mgr->AddRequest(RequestId(2), Seq(16, 50), {}).ok());
  ASSERT_EQ(*mgr->Allocate(RequestId(2), 16), AllocOutcome::kAllocated);
  mgr->Free(RequestId(2));
  ASSERT_TRUE(mgr->AddRequest(RequestId(3), a, {}).ok());
  ASSERT_EQ(*mgr->Allocate(RequestId(3), 14), AllocOutcome::kAllocated);
  mgr->Poll();
  EXPECT_EQ(mgr->CachedTokens(RequestId(3)), 12);
  EXPECT_EQ(mgr->stats().lower.blocks, 3u);
  EXPECT_EQ(mgr->stats().bytes_up, 3 * 1024u);
}

// Random requests over a few shared prefixes and a tiny pool: every block
// handed out twice is a named shared block with matching ref counts, the pool
// stays consistent, and everything returns when all requests are freed.
TEST(KvManagerTest, RandomizedPoolInvariants) {
  std::mt19937 rng(42);
  for (int round = 0; round < 10; ++round) {
    const int32_t blocks = 6 + static_cast<int32_t>(rng() % 6);
    Fixture f(blocks, 1 + rng() % 8);
    std::vector<std::vector<int32_t>> bases;
    for (int i = 0; i < 3; ++i) bases.push_back(Seq(24, 1000 * i));
    struct Live { uint64_t id; std::vector<int32_t> tokens; size_t done; };
    std::vector<Live> live;
    uint64_t next_id = 1;
    for (int step = 0; step < 400; ++step) {
      const int op = static_cast<int>(rng() % 4);
      if (op == 0 || live.empty()) {
        auto p = bases[rng() % bases.size()];
        p.resize(2 + rng() % 22);
        if (rng() % 3 == 0) p.back() = 77777;
        const uint64_t id = next_id++;
        ASSERT_TRUE(f.mgr->AddRequest(RequestId(id), p, rng() % 5 == 0 ? "s" : "").ok());
        auto a = f.mgr->Allocate(RequestId(id), static_cast<int32_t>(p.size()));
        ASSERT_TRUE(a.ok());
        if (*a == AllocOutcome::kNotNow) {
          f.mgr->Free(RequestId(id));
        } else {
          live.push_back({id, p, 0});
        }
      } else if (op == 1) {
        f.mgr->Poll();
        auto& l = live[rng() % live.size()];
        if (!f.mgr->IsReady(RequestId(l.id))) continue;
        l.done = std::max<size_t>(l.done, static_cast<size_t>(f.mgr->CachedTokens(RequestId(l.id))));
        l.done = std::min(l.tokens.size(), l.done + 1 + rng() % 8);
        ASSERT_TRUE(f.mgr->Commit(RequestId(l.id), std::span<const int32_t>(l.tokens).first(l.done)).ok());
      } else if (op == 2) {
        auto& l = live[rng() % live.size()];
        const int32_t want = static_cast<int32_t>(l.tokens.size() + rng() % 9);
        if (f.mgr->Allocate(RequestId(l.id), want).ok() && f.mgr->IsReady(RequestId(l.id))) {
          if (static_cast<size_t>(want) > l.tokens.size() &&
              f.mgr->BlockTable(RequestId(l.id)).size() * kBs >= static_cast<size_t>(want)) {
            for (int32_t k = static_cast<int32_t>(l.tokens.size()); k < want; ++k) l.tokens.push_back(k * 3);
          }
        }
      } else {
        const size_t k = rng() % live.size();
        f.mgr->Free(RequestId(live[k].id));
        live.erase(live.begin() + static_cast<std::ptrdiff_t>(k));
      }
      // Invariants, after completions are in (no op then holds a ref).
      f.mgr->Poll();
      const BlockPool& pool = f.mgr->device_pool();
      ASSERT_TRUE(pool.CheckConsistency().ok()) << pool.CheckConsistency().ToString();
      std::map<int32_t, int> owners;
      for (auto& l : live)
        for (int32_t b : f.mgr->BlockTable(RequestId(l.id))) ++owners[b];
      for (auto& [b, n] : owners) {
        const BlockId id(static_cast<uint32_t>(b));
        ASSERT_EQ(pool.ref(id), n) << "block " << b;
        if (n > 1) {
          ASSERT_TRUE(pool.has_hash(id)) << "unnamed block " << b << " handed out twice";
        }
      }
    }
    for (auto& l : live) f.mgr->Free(RequestId(l.id));
    f.mgr->Poll();
    EXPECT_EQ(f.mgr->num_requests(), 0u);
    EXPECT_EQ(f.mgr->device_pool().stats().in_use, 0);
    EXPECT_EQ(f.mgr->device_pool().num_allocatable(), blocks);
    EXPECT_TRUE(f.mgr->device_pool().CheckConsistency().ok());
  }
}

}  // namespace
}  // namespace strata::kvcache

namespace strata::kvcache {
namespace {

// The manager moves bytes by segment and offset: the device blocks are one
// registered segment, and so is the host tier's arena; device memory that
// is not one contiguous range is refused at Create.
TEST(KvManagerSegmentsTest, DeviceBlocksAndTheHostArenaAreRegisteredSegments) {
  Fixture f(8, 16);
  const SegmentTable& t = f.mgr->segments();
  const auto dev = t.Get(f.mgr->device_segment());
  ASSERT_TRUE(dev.has_value());
  EXPECT_EQ(dev->base, f.device.bytes.data());
  EXPECT_EQ(dev->size, 8 * kBlockBytes);
  EXPECT_EQ(dev->kind, SegmentKind::kHost);  // the CPU backend's pool is host memory
  EXPECT_EQ(t.size(), 2u);                   // device pool + host arena
  ASSERT_EQ(f.host->own_segments().size(), 1u);  // the store registered its arena when attached
  const auto arena = t.Get(f.host->own_segments()[0]);
  ASSERT_TRUE(arena.has_value());
  EXPECT_EQ(arena->size, 16 * kBlockBytes);
  EXPECT_TRUE(t.Locate(arena->base + kBlockBytes, kBlockBytes).ok());

  ManualClock clock;
  std::vector<uint8_t> a(4 * kBlockBytes), b(4 * kBlockBytes);
  BlockMemoryFn scattered = [&](BlockId id) {
    return (id.value() % 2 == 0 ? a.data() : b.data()) + (id.value() / 2) * kBlockBytes;
  };
  auto r = KvManager::Create(Options(8), scattered, nullptr, &clock);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("contiguous"), std::string::npos) << r.error().message();
}

}  // namespace
}  // namespace strata::kvcache

namespace strata::kvcache {
namespace {

// A manager destroyed while a request's loads are still in flight (no Poll,
// no Free) drains them without touching what it is tearing down.
TEST(KvManagerSegmentsTest, DestroyedWithLoadsInFlight) {
  auto f = std::make_unique<Fixture>(8, 16);
  const auto p = std::vector<int32_t>{1, 2, 3, 4, 5, 6, 7, 8, 9};
  f->Run(1, p);
  f->mgr->Free(RequestId(1));
  ASSERT_TRUE(f->mgr->Flush(true, {}).ok());  // now on host only
  ASSERT_TRUE(f->mgr->AddRequest(RequestId(2), p, {}).ok());
  ASSERT_EQ(*f->mgr->Allocate(RequestId(2), 9), AllocOutcome::kAllocated);
  ASSERT_FALSE(f->mgr->IsReady(RequestId(2)));  // its two loads wait for Poll
  f->mgr.reset();
  SUCCEED();
}

}  // namespace
}  // namespace strata::kvcache
