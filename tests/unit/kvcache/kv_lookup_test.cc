// Asynchronous lookup (KvManager::SubmitLookup / TakeLookup over
// TierMover::SubmitLookup and BlockStore::SubmitCountPrefix): its answers
// equal Match's on random chains over two tiers; a tier whose index answers
// late leaves the lookup pending, and past its deadline the lookup is a
// miss, not a hang (a late answer is then ignored); a looked-up match handed
// to AddRequest drives the loads, and a block gone since is recomputed.

#include <gtest/gtest.h>

#include "tests/support/test_memory.h"

#include <algorithm>
#include <deque>
#include <random>

#include "kvcache/host_store.h"
#include "kvcache/kv_manager.h"

namespace strata::kvcache {
namespace {

constexpr int kBs = 4;
constexpr uint64_t kBlockBytes = 32;
constexpr int32_t kDeviceBlocks = 16;

// A HostStore whose index answers SubmitCountPrefix only when told to:
// stands in for a tier whose index is on another machine.
class SlowIndexStore final : public BlockStore {
 public:
  explicit SlowIndexStore(std::unique_ptr<HostStore> inner) : inner_(std::move(inner)) {}
  std::string_view name() const override { return "slow"; }
  TierKind kind() const override { return TierKind::kHost; }
  StoreStats stats() const override { return inner_->stats(); }
  bool Contains(const BlockHash& h) const override { return inner_->Contains(h); }
  size_t CountPrefix(std::span<const BlockHash> chain) const override { return inner_->CountPrefix(chain); }
  void SubmitCountPrefix(std::span<const BlockHash> chain, uint64_t tag) override {
    questions_.push_back({tag, std::vector<BlockHash>(chain.begin(), chain.end())});
  }
  size_t PollCountPrefix(std::vector<PrefixAnswer>* out) override {
    size_t n = 0;
    while (answerable_ > 0 && !questions_.empty()) {
      out->push_back({questions_.front().first, inner_->CountPrefix(questions_.front().second)});
      questions_.pop_front();
      --answerable_;
      ++n;
    }
    return n;
  }
  Status SubmitWrite(const BlockHash& h, const Sha256Digest& ns, const Region& data, uint64_t tag) override {
    return inner_->SubmitWrite(h, ns, data, tag);
  }
  Status SubmitRead(const BlockHash& h, const Region& dst, uint64_t tag) override {
    return inner_->SubmitRead(h, dst, tag);
  }
  size_t Poll(std::vector<StoreCompletion>* out) override { return inner_->Poll(out); }
  void Drain(std::vector<StoreCompletion>* out) override { inner_->Drain(out); }
  Status Remove(const BlockHash& h) override { return inner_->Remove(h); }
  Status Flush(const Sha256Digest* ns) override { return inner_->Flush(ns); }
  // The inner store's memory is in the table this one is attached to.
  Status RegisterMemory() override { return inner_->Attach(segments()); }
  void UnregisterMemory() override { inner_->Detach(); }

  void Answer(size_t n) { answerable_ += n; }
  size_t questions() const { return questions_.size(); }
  HostStore& inner() { return *inner_; }

 private:
  std::unique_ptr<HostStore> inner_;
  std::deque<std::pair<uint64_t, std::vector<BlockHash>>> questions_;
  size_t answerable_ = 0;
};

Sha256Digest Ns() { return NamespaceDigest("w", "llama", "f16", kBs); }

std::vector<int32_t> Prompt(int blocks, int seed) {
  std::vector<int32_t> p(static_cast<size_t>(blocks * kBs + 1));
  for (size_t i = 0; i < p.size(); ++i) p[i] = static_cast<int32_t>(seed * 1000 + i);
  return p;
}

void Put(BlockStore* s, const BlockHash& h) {
  std::vector<uint8_t> bytes(kBlockBytes, static_cast<uint8_t>(h.digest[0]));
  const Status st = testing::StoreBlock(s, h, Ns(), bytes);
  ASSERT_TRUE(st.ok()) << st.ToString();
}

struct Rig {
  explicit Rig(bool slow_lower = false) : device(kDeviceBlocks * kBlockBytes) {
    upper = std::move(HostStore::Create({64 * kBlockBytes, kBlockBytes, false})).value();
    auto inner = std::move(HostStore::Create({64 * kBlockBytes, kBlockBytes, false})).value();
    slow = std::make_unique<SlowIndexStore>(std::move(inner));
    if (!slow_lower) slow->Answer(1u << 30);  // answers every question at once
    KvManagerOptions o;
    o.block_size = kBs;
    o.num_device_blocks = kDeviceBlocks;
    o.block_bytes = kBlockBytes;
    o.ns = Ns();
    o.load_policy = LoadPolicy::kAlways;
    std::vector<LowerTier> tiers(2);
    tiers[0].store = upper.get();
    tiers[1].store = slow.get();
    mgr = std::move(KvManager::Create(o, [this](BlockId id) { return device.data() + id.value() * kBlockBytes; },
                                      std::move(tiers), &clock))
              .value();
  }
  ManualClock clock;
  std::vector<uint8_t> device;
  std::unique_ptr<HostStore> upper;
  std::unique_ptr<SlowIndexStore> slow;
  std::unique_ptr<KvManager> mgr;
};

TEST(KvLookup, AnswersEqualMatchOnRandomChains) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    Rig r;
    const int blocks = 1 + static_cast<int>(rng() % 8);
    const auto prompt = Prompt(blocks, trial);
    const auto chain = HashPrefix(Ns(), prompt, kBs);
    for (const auto& h : chain) {
      if (rng() % 2) Put(r.upper.get(), h);
      if (rng() % 3) Put(&r.slow->inner(), h);
    }
    // Some leading blocks on the device too.
    const int on_device = std::min(blocks, static_cast<int>(rng() % 3));
    if (on_device > 0) {
      const auto head = std::vector<int32_t>(prompt.begin(), prompt.begin() + on_device * kBs + 1);
      ASSERT_TRUE(r.mgr->AddRequest(RequestId(1), head, {}).ok());
      ASSERT_EQ(*r.mgr->Allocate(RequestId(1), static_cast<int32_t>(head.size())), AllocOutcome::kAllocated);
      while (!r.mgr->IsReady(RequestId(1))) r.mgr->Poll();
      ASSERT_TRUE(r.mgr->Commit(RequestId(1), head).ok());
      r.mgr->Free(RequestId(1));
      r.mgr->Poll();
    }
    const PrefixMatch want = r.mgr->Match(prompt, {});
    const uint64_t id = r.mgr->SubmitLookup(prompt, {}, /*deadline_nanos=*/0);
    PrefixMatch got;
    ASSERT_EQ(r.mgr->TakeLookup(id, &got), LookupState::kDone) << trial;  // local answers: done at once
    EXPECT_EQ(got.device_tokens, want.device_tokens) << trial;
    EXPECT_EQ(got.lower_tokens, want.lower_tokens) << trial;
    EXPECT_EQ(got.lower_tier_tokens, want.lower_tier_tokens) << trial;
    EXPECT_EQ(got.lower_sources, want.lower_sources) << trial;
    EXPECT_EQ(r.mgr->TakeLookup(id, &got), LookupState::kExpired);  // forgotten once taken
  }
}

TEST(KvLookup, ALateIndexLeavesTheLookupPendingUntilItAnswers) {
  Rig r(/*slow_lower=*/true);
  const auto prompt = Prompt(4, 1);
  const auto chain = HashPrefix(Ns(), prompt, kBs);
  Put(r.upper.get(), chain[0]);
  for (const auto& h : chain) Put(&r.slow->inner(), h);
  const uint64_t id = r.mgr->SubmitLookup(prompt, {}, /*deadline_nanos=*/1'000'000);
  PrefixMatch m;
  EXPECT_EQ(r.mgr->TakeLookup(id, &m), LookupState::kPending);
  EXPECT_EQ(r.slow->questions(), 1u);  // block 0 came from the upper tier; block 1 asks the slow one
  r.slow->Answer(1);
  r.mgr->Poll();
  ASSERT_EQ(r.mgr->TakeLookup(id, &m), LookupState::kDone);
  EXPECT_EQ(m.lower_sources, (std::vector<int>{0, 1, 1, 1}));
  EXPECT_EQ(m.lower_tokens, 16);
}

TEST(KvLookup, PastItsDeadlineALookupIsAMissNotAHang) {
  Rig r(/*slow_lower=*/true);
  const auto prompt = Prompt(3, 2);
  const auto chain = HashPrefix(Ns(), prompt, kBs);
  for (const auto& h : chain) Put(&r.slow->inner(), h);
  const uint64_t id = r.mgr->SubmitLookup(prompt, {}, /*deadline_nanos=*/500);
  PrefixMatch m;
  EXPECT_EQ(r.mgr->TakeLookup(id, &m), LookupState::kPending);
  r.clock.Advance(499);
  EXPECT_EQ(r.mgr->TakeLookup(id, &m), LookupState::kPending);
  r.clock.Advance(1);
  ASSERT_EQ(r.mgr->TakeLookup(id, &m), LookupState::kExpired);
  EXPECT_EQ(m.lower_tokens, 0);
  EXPECT_TRUE(m.lower_sources.empty());
  // The answer arriving now is ignored; a new lookup still works.
  r.slow->Answer(1u << 30);
  r.mgr->Poll();
  const uint64_t again = r.mgr->SubmitLookup(prompt, {}, 0);
  ASSERT_EQ(r.mgr->TakeLookup(again, &m), LookupState::kDone);
  EXPECT_EQ(m.lower_tokens, 12);
}

TEST(KvLookup, ALookedUpMatchDrivesTheLoadsAndAGoneBlockIsRecomputed) {
  Rig r;
  const auto prompt = Prompt(3, 3);
  const auto chain = HashPrefix(Ns(), prompt, kBs);
  for (const auto& h : chain) Put(r.upper.get(), h);
  const uint64_t id = r.mgr->SubmitLookup(prompt, {}, 0);
  PrefixMatch m;
  ASSERT_EQ(r.mgr->TakeLookup(id, &m), LookupState::kDone);
  ASSERT_EQ(m.lower_sources, (std::vector<int>{0, 0, 0}));
  // Block 2 leaves the tier between the lookup and the allocation.
  ASSERT_TRUE(r.upper->Remove(chain[2]).ok());
  ASSERT_TRUE(r.mgr->AddRequest(RequestId(5), prompt, {}, &m).ok());
  ASSERT_EQ(*r.mgr->Allocate(RequestId(5), static_cast<int32_t>(prompt.size())), AllocOutcome::kAllocated);
  while (!r.mgr->IsReady(RequestId(5))) r.mgr->Poll();
  EXPECT_EQ(r.mgr->CachedTokens(RequestId(5)), 8);  // blocks 0 and 1 loaded; 2 failed, recomputed
  EXPECT_EQ(r.mgr->CachedBlockTiers(RequestId(5)), (std::vector<int>{1, 1}));
  EXPECT_EQ(r.mgr->stats().loads_failed, 1u);
  r.mgr->Free(RequestId(5));
  r.mgr->Poll();
  EXPECT_EQ(r.mgr->device_pool().stats().in_use, 0);
}

TEST(KvLookup, DeviceChangesBetweenSubmitAndTakeAreAccountedFor) {
  Rig r(/*slow_lower=*/true);
  const auto prompt = Prompt(4, 4);
  const auto chain = HashPrefix(Ns(), prompt, kBs);
  for (const auto& h : chain) Put(&r.slow->inner(), h);
  const uint64_t id = r.mgr->SubmitLookup(prompt, {}, 1'000'000);
  // Meanwhile the first two blocks land on the device.
  const auto head = std::vector<int32_t>(prompt.begin(), prompt.begin() + 2 * kBs + 1);
  ASSERT_TRUE(r.mgr->AddRequest(RequestId(1), head, {}, nullptr).ok());
  ASSERT_EQ(*r.mgr->Allocate(RequestId(1), static_cast<int32_t>(head.size())), AllocOutcome::kAllocated);
  r.slow->Answer(1u << 30);
  while (!r.mgr->IsReady(RequestId(1))) r.mgr->Poll();
  ASSERT_TRUE(r.mgr->Commit(RequestId(1), head).ok());
  r.mgr->Free(RequestId(1));
  r.mgr->Poll();
  PrefixMatch m;
  ASSERT_EQ(r.mgr->TakeLookup(id, &m), LookupState::kDone);
  const PrefixMatch want = r.mgr->Match(prompt, {});
  EXPECT_EQ(m.device_tokens, 8);
  EXPECT_EQ(m.device_tokens, want.device_tokens);
  EXPECT_EQ(m.lower_sources, want.lower_sources);  // shifted past the device's new blocks
  // The device loses them again: the lookup's lower walk started further
  // on, so it answers no lower hits rather than a prefix with a gap.
  const uint64_t id2 = r.mgr->SubmitLookup(prompt, {}, 1'000'000);
  ASSERT_TRUE(r.mgr->Flush(true, {}).ok());
  ASSERT_EQ(r.mgr->TakeLookup(id2, &m), LookupState::kDone);
  EXPECT_EQ(m.device_tokens, 0);
  EXPECT_TRUE(m.lower_sources.empty());
}

}  // namespace
}  // namespace strata::kvcache
