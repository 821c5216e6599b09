// TierMover over device memory that is not host-addressable (what a GPU
// backend hands the KV manager): no store ever sees the device segment;
// loads read into a staging buffer and complete only once the copy engine
// has moved the bytes into the device block; write-throughs copy the block
// out first; with no staging buffer free a load fails and is counted, never
// blocks; a mover destroyed with staged loads in flight reports them and
// undoes its registrations. The copy engine here stands for a GPU's copy
// stream: it copies only when the test runs it (or a fence is waited on),
// so "not before the copy" is observable.

#include <gtest/gtest.h>

#include <cstring>
#include <deque>

#include "kvcache/host_store.h"
#include "kvcache/tier_mover.h"
#include "tests/support/test_memory.h"

namespace strata::kvcache {
namespace {

constexpr int kBs = 4;
constexpr uint64_t kBlockBytes = 64;
constexpr int32_t kDeviceBlocks = 4;

BlockHash Hash(int i) {
  return HashPrefix(NamespaceDigest("w", "llama", "f16", kBs), std::vector<int32_t>(4, i), kBs)[0];
}

// Copies between any registered segments, device ones included (here device
// memory is a host buffer registered as kDevice), but only in RunPending()
// or Wait(): like a copy stream the test can hold back.
class DeferredDeviceCopy final : public CopyEngine {
 public:
  explicit DeferredDeviceCopy(const SegmentTable* t) : t_(t) {}
  std::string_view name() const override { return "deferred device copy"; }
  Status Submit(const Region& dst, const Region& src, uint64_t tag) override {
    STRATA_RETURN_IF_ERROR(t_->Check(dst));
    STRATA_RETURN_IF_ERROR(t_->Check(src));
    if (dst.length != src.length) return Status::InvalidArgument("lengths differ");
    pending_.push_back({dst, src, tag, ++submitted_, fail_next});
    fail_next = false;
    return Status::Ok();
  }
  CopyFence Fence() override { return {submitted_}; }
  bool Reached(CopyFence f) const override { return f.seq <= completed_; }
  void Wait(CopyFence f) override {
    while (!Reached(f)) RunOne();
  }
  size_t Poll(std::vector<CopyCompletion>* out) override {
    const size_t n = done_.size();
    out->insert(out->end(), done_.begin(), done_.end());
    done_.clear();
    return n;
  }
  void RunPending() {
    while (!pending_.empty()) RunOne();
  }
  size_t pending() const { return pending_.size(); }
  uint64_t submitted() const { return submitted_; }
  bool fail_next = false;  // the next copy submitted completes with an error, copying nothing

 private:
  struct Job {
    Region dst, src;
    uint64_t tag, seq;
    bool fail;
  };
  uint8_t* At(const Region& r) const { return t_->Get(r.segment)->base + r.offset; }
  void RunOne() {
    const Job j = pending_.front();
    pending_.pop_front();
    if (!j.fail) std::memcpy(At(j.dst), At(j.src), j.dst.length);
    completed_ = j.seq;
    done_.push_back({j.tag, j.fail ? Status::IoError("copy", "fake GPU", EIO) : Status::Ok()});
  }
  const SegmentTable* t_;
  std::deque<Job> pending_;
  std::vector<CopyCompletion> done_;
  uint64_t submitted_ = 0, completed_ = 0;
};

struct DeviceRig {
  explicit DeviceRig(uint64_t staging_bytes = 64ull << 20, bool two_tiers = false)
      : pool(kDeviceBlocks), device(kDeviceBlocks * kBlockBytes, 0), copy(&table) {
    store = std::move(HostStore::Create({16 * kBlockBytes, kBlockBytes, false})).value();
    store2 = std::move(HostStore::Create({16 * kBlockBytes, kBlockBytes, false})).value();
    segment = table.Register(SegmentKind::kDevice, device.data(), device.size(), "fake GPU KV pool").value();
    KvManagerOptions o;
    o.block_size = kBs;
    o.num_device_blocks = kDeviceBlocks;
    o.block_bytes = kBlockBytes;
    o.ns = NamespaceDigest("w", "llama", "f16", kBs);
    o.load_policy = LoadPolicy::kAlways;
    o.writeback_staging_bytes = staging_bytes;
    LowerTier t;
    t.store = store.get();
    t.name = "host";
    std::vector<LowerTier> tiers = {t};
    if (two_tiers) {
      t.store = store2.get();
      t.name = "host2";
      tiers.push_back(t);
    }
    auto m = TierMover::Create(o, DeviceKv{&table, segment, &copy}, tiers, &pool, &clock,
                               [this](const LoadDone& d) { done.push_back(d); });
    EXPECT_TRUE(m.ok()) << m.error().ToString();
    mover = std::move(m).value();
  }
  uint8_t At(BlockId b) const { return device[b.value() * kBlockBytes]; }
  BlockId Fresh() {
    std::vector<BlockId> got;
    EXPECT_TRUE(pool.Allocate(1, &got));
    return got[0];
  }
  void Stored(const BlockHash& h, uint8_t fill) {
    std::vector<uint8_t> bytes(kBlockBytes, fill);
    ASSERT_TRUE(testing::StoreBlock(store.get(), h, NamespaceDigest("w", "llama", "f16", kBs), bytes).ok());
  }
  ManualClock clock;
  BlockPool pool;
  std::vector<uint8_t> device;
  SegmentTable table;
  DeferredDeviceCopy copy;
  SegmentId segment;
  std::unique_ptr<HostStore> store, store2;
  std::vector<LoadDone> done;
  std::unique_ptr<TierMover> mover;  // destroyed first
};

TEST(TierMoverDevice, AStagedLoadCompletesOnlyOnceItsCopyLanded) {
  DeviceRig r;
  ASSERT_TRUE(r.mover->stages_device());
  r.Stored(Hash(1), 0x5A);
  const BlockId b = r.Fresh();
  ASSERT_TRUE(r.mover->SubmitLoad(0, b, Hash(1), RequestId(7), 3, 0).ok());
  r.mover->Poll();  // the store's read into staging is done; the copy waits
  EXPECT_TRUE(r.done.empty());
  EXPECT_EQ(r.copy.pending(), 1u);
  EXPECT_EQ(r.At(b), 0);
  EXPECT_EQ(r.mover->ops_in_flight(), 1u);
  r.copy.RunPending();
  r.mover->Poll();
  ASSERT_EQ(r.done.size(), 1u);
  EXPECT_TRUE(r.done[0].ok);
  EXPECT_EQ(r.done[0].request, RequestId(7));
  EXPECT_EQ(r.done[0].epoch, 3u);
  EXPECT_EQ(r.At(b), 0x5A);
  EXPECT_EQ(std::count(r.device.begin() + b.value() * kBlockBytes, r.device.begin() + (b.value() + 1) * kBlockBytes,
                       0x5A),
            static_cast<long>(kBlockBytes));
  EXPECT_EQ(r.pool.ref(b), 1);  // the load's own reference is gone
  EXPECT_EQ(r.mover->ops_in_flight(), 0u);
  KvManagerStats s;
  r.mover->FillStats(&s);
  EXPECT_EQ(s.bytes_up, kBlockBytes);
}

TEST(TierMoverDevice, StoresNeverSeeDeviceMemory) {
  DeviceRig r;
  // A store asked directly to read into the device segment refuses: it
  // cannot address it. The mover never asks (the load above went through
  // staging).
  r.Stored(Hash(1), 1);
  const Status s = r.store->SubmitRead(Hash(1), Region{r.segment, 0, kBlockBytes}, 1);
  EXPECT_EQ(s.code(), StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("not host-addressable"), std::string::npos) << s.ToString();
}

TEST(TierMoverDevice, AWriteThroughCopiesTheBlockOutFirst) {
  DeviceRig r;
  const BlockId b = r.Fresh();
  std::fill_n(r.device.begin() + b.value() * kBlockBytes, kBlockBytes, 0x33);
  ASSERT_TRUE(r.pool.Register(b, Hash(2)));
  r.mover->OnCommitted(b, Hash(2));
  // The copy was waited on inside OnCommitted, and the block is not held:
  // the store reads the staging buffer.
  EXPECT_EQ(r.copy.pending(), 0u);
  EXPECT_EQ(r.pool.ref(b), 1);
  std::fill_n(r.device.begin() + b.value() * kBlockBytes, kBlockBytes, 0xEE);  // reused at once
  while (r.mover->ops_in_flight() > 0) r.mover->Poll();
  ASSERT_TRUE(r.store->Contains(Hash(2)));
  const BlockId back = r.Fresh();
  ASSERT_TRUE(r.mover->SubmitLoad(0, back, Hash(2), RequestId(1), 1, 0).ok());
  r.mover->Poll();
  r.copy.RunPending();
  r.mover->Poll();
  ASSERT_EQ(r.done.size(), 1u);
  EXPECT_EQ(r.At(back), 0x33);
  KvManagerStats s;
  r.mover->FillStats(&s);
  EXPECT_EQ(s.bytes_down, kBlockBytes);
}

TEST(TierMoverDevice, NoStagingBufferFreeFailsTheLoadWithoutBlocking) {
  DeviceRig r(/*staging_bytes=*/kBlockBytes);  // one staging buffer
  r.Stored(Hash(1), 1);
  r.Stored(Hash(2), 2);
  const BlockId a = r.Fresh(), b = r.Fresh();
  ASSERT_TRUE(r.mover->SubmitLoad(0, a, Hash(1), RequestId(1), 1, 0).ok());
  const Status s = r.mover->SubmitLoad(0, b, Hash(2), RequestId(2), 1, 0);
  EXPECT_EQ(s.code(), StatusCode::kResourceExhausted) << s.ToString();
  EXPECT_EQ(r.pool.ref(b), 1);  // nothing held for the refused load
  KvManagerStats st;
  r.mover->FillStats(&st);
  EXPECT_EQ(st.loads_failed, 1u);
  r.mover->Poll();
  r.copy.RunPending();
  r.mover->Poll();
  ASSERT_EQ(r.done.size(), 1u);
  EXPECT_EQ(r.At(a), 1);
  // The buffer is free again: the second load now goes through.
  ASSERT_TRUE(r.mover->SubmitLoad(0, b, Hash(2), RequestId(2), 2, 0).ok());
  r.mover->Poll();
  r.copy.RunPending();
  r.mover->Poll();
  ASSERT_EQ(r.done.size(), 2u);
  EXPECT_EQ(r.At(b), 2);
}

TEST(TierMoverDevice, DestroyedWithStagedLoadsInFlightReportsThemAndUnregisters) {
  DeviceRig r;
  r.Stored(Hash(1), 1);
  r.Stored(Hash(2), 2);
  const BlockId a = r.Fresh(), b = r.Fresh();
  // Registered now: the device pool, the host tier's arena, the test's
  // buffers (testing::StoreBlock).
  const size_t before = r.table.size();
  ASSERT_TRUE(r.mover->SubmitLoad(0, a, Hash(1), RequestId(1), 1, 0).ok());
  r.mover->Poll();  // a: copy pending
  ASSERT_TRUE(r.mover->SubmitLoad(0, b, Hash(2), RequestId(2), 1, 0).ok());  // b: read not polled
  EXPECT_EQ(r.table.size(), before + 2);  // + 2 staging buffers
  r.mover.reset();
  ASSERT_EQ(r.done.size(), 2u);  // each load reported once
  EXPECT_EQ(r.pool.ref(a), 1);
  EXPECT_EQ(r.pool.ref(b), 1);
  EXPECT_EQ(r.table.size(), before - 1);  // staging unregistered, the store detached (its arena)
  EXPECT_EQ(r.store->segments(), nullptr);
}

TEST(TierMoverDevice, OneStagingCopyServesEveryWriteThroughTier) {
  DeviceRig r(64ull << 20, /*two_tiers=*/true);
  const BlockId b = r.Fresh();
  std::fill_n(r.device.begin() + b.value() * kBlockBytes, kBlockBytes, 0x44);
  ASSERT_TRUE(r.pool.Register(b, Hash(3)));
  r.mover->OnCommitted(b, Hash(3));
  EXPECT_EQ(r.copy.submitted(), 1u);
  while (r.mover->ops_in_flight() > 0) r.mover->Poll();
  EXPECT_TRUE(r.store->Contains(Hash(3)));
  EXPECT_TRUE(r.store2->Contains(Hash(3)));
}

TEST(TierMoverDevice, AFailedStagingCopyStoresNothing) {
  DeviceRig r;
  const BlockId b = r.Fresh();
  std::fill_n(r.device.begin() + b.value() * kBlockBytes, kBlockBytes, 0x55);
  ASSERT_TRUE(r.pool.Register(b, Hash(4)));
  r.copy.fail_next = true;  // the staging buffer would keep other bytes
  r.mover->OnCommitted(b, Hash(4));
  while (r.mover->ops_in_flight() > 0) r.mover->Poll();
  EXPECT_FALSE(r.store->Contains(Hash(4)));
  KvManagerStats s;
  r.mover->FillStats(&s);
  EXPECT_EQ(s.tiers[0].writes_failed, 1u);
  EXPECT_EQ(s.bytes_down, 0u);
  // The buffer went back: the next commit is staged and stored.
  r.mover->OnCommitted(b, Hash(4));
  while (r.mover->ops_in_flight() > 0) r.mover->Poll();
  EXPECT_TRUE(r.store->Contains(Hash(4)));
}

TEST(TierMoverDevice, ACopyOfAnotherUserOfTheEngineIsIgnored) {
  DeviceRig r;
  r.Stored(Hash(1), 0x66);
  const BlockId b = r.Fresh(), other = r.Fresh();
  ASSERT_TRUE(r.mover->SubmitLoad(0, b, Hash(1), RequestId(1), 1, 0).ok());
  r.mover->Poll();
  // Someone else copies between device blocks on the same engine, with
  // tags the mover never gave out and one it did (1: the load's).
  const Region src{r.segment, b.value() * kBlockBytes, kBlockBytes};
  const Region dst{r.segment, other.value() * kBlockBytes, kBlockBytes};
  for (uint64_t tag : {uint64_t{999}, uint64_t{1}}) ASSERT_TRUE(r.copy.Submit(dst, src, tag).ok());
  r.copy.RunPending();
  r.mover->Poll();
  ASSERT_EQ(r.done.size(), 1u);  // the load finished once
  EXPECT_TRUE(r.done[0].ok);
  EXPECT_EQ(r.At(b), 0x66);
  EXPECT_EQ(r.mover->ops_in_flight(), 0u);
  EXPECT_EQ(r.pool.ref(b), 1);
}

}  // namespace
}  // namespace strata::kvcache
