// KvManager reservations (prefill/decode disaggregation): device blocks a
// peer fills, then named, so the continuation request that follows hits
// them; blocks this pool already names are held, not reserved; a short pool
// answers "not now" and changes nothing; a partial fill names only what
// landed; expiry and release return every block.

#include <gtest/gtest.h>

#include "kvcache/kv_manager.h"

namespace strata::kvcache {
namespace {

constexpr int kBs = 4;
constexpr uint64_t kBlockBytes = 64;

std::vector<int32_t> Seq(int n, int first) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[static_cast<size_t>(i)] = first + i;
  return t;
}

class KvReservationTest : public ::testing::Test {
 protected:
  void Make(int32_t device_blocks) {
    device_.assign(static_cast<size_t>(device_blocks) * kBlockBytes, 0);
    KvManagerOptions o;
    o.block_size = kBs;
    o.num_device_blocks = device_blocks;
    o.block_bytes = kBlockBytes;
    o.ns = NamespaceDigest("reservation-test", "llama", "f16", kBs);
    auto mem = [this](BlockId id) { return device_.data() + id.value() * kBlockBytes; };
    mgr_ = std::move(KvManager::Create(o, mem, std::vector<LowerTier>{}, &clock_)).value();
  }
  uint8_t* Block(BlockId b) { return device_.data() + b.value() * kBlockBytes; }
  void Fill(BlockId b, int seed) {
    for (uint64_t k = 0; k < kBlockBytes; ++k) Block(b)[k] = static_cast<uint8_t>(seed * 13 + k);
  }
  // A request over `prompt` after the handoff: what it takes from cache.
  int32_t Continue(uint64_t id, const std::vector<int32_t>& prompt, std::vector<int32_t>* table = nullptr) {
    EXPECT_TRUE(mgr_->AddRequest(RequestId(id), prompt, {}).ok());
    auto a = mgr_->Allocate(RequestId(id), static_cast<int32_t>(prompt.size()));
    EXPECT_TRUE(a.ok() && *a == AllocOutcome::kAllocated);
    EXPECT_TRUE(mgr_->IsReady(RequestId(id)));
    if (table != nullptr) {
      auto t = mgr_->BlockTable(RequestId(id));
      table->assign(t.begin(), t.end());
    }
    return mgr_->CachedTokens(RequestId(id));
  }
  int32_t InUse() const {
    const BlockPool& p = mgr_->device_pool();
    int32_t n = 0;
    for (int32_t b = 0; b < p.num_blocks(); ++b) n += p.ref(BlockId(static_cast<uint32_t>(b))) > 0;
    return n;
  }

  ManualClock clock_;
  std::vector<uint8_t> device_;
  std::unique_ptr<KvManager> mgr_;
};

TEST_F(KvReservationTest, FilledBlocksAreNamedAndTheContinuationHitsThem) {
  Make(16);
  const auto prompt = Seq(13, 1);  // 3 blocks can come from cache
  KvManager::Reservation r;
  auto got = mgr_->Reserve(7, prompt, {}, /*expires=*/1'000'000'000, &r);
  ASSERT_TRUE(got.ok() && *got == AllocOutcome::kAllocated);
  ASSERT_EQ(r.blocks.size(), 3u);
  EXPECT_EQ(r.held_blocks, 0);
  EXPECT_EQ(mgr_->Match(prompt, {}).device_tokens, 0) << "nothing is named before the writes landed";
  for (size_t i = 0; i < r.blocks.size(); ++i) Fill(r.blocks[i], static_cast<int>(i) + 1);
  ASSERT_TRUE(mgr_->CompleteReservation(7, 3).ok());
  EXPECT_EQ(mgr_->Match(prompt, {}).device_tokens, 12);

  std::vector<int32_t> table;
  EXPECT_EQ(Continue(1, prompt, &table), 12);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(table[i], static_cast<int32_t>(r.blocks[i].value())) << "shared, not copied";
    EXPECT_EQ(Block(r.blocks[i])[5], static_cast<uint8_t>((i + 1) * 13 + 5));
  }
  mgr_->ReleaseReservation(7);
  EXPECT_EQ(mgr_->num_reservations(), 0u);
  mgr_->Free(RequestId(1));
  EXPECT_EQ(InUse(), 0);
  EXPECT_TRUE(mgr_->device_pool().CheckConsistency().ok());
}

TEST_F(KvReservationTest, BlocksThePoolNamesAreHeldNotReserved) {
  Make(16);
  const auto first = Seq(13, 1);
  EXPECT_EQ(Continue(1, first), 0);
  ASSERT_TRUE(mgr_->Commit(RequestId(1), first).ok());
  mgr_->Free(RequestId(1));

  auto second = first;  // the next turn: the same 12 tokens, then more
  second.resize(12);
  for (int i = 0; i < 9; ++i) second.push_back(500 + i);  // 21 tokens: 5 blocks from cache
  KvManager::Reservation r;
  ASSERT_TRUE(mgr_->Reserve(8, second, {}, 1'000'000'000, &r).ok());
  ASSERT_EQ(r.blocks.size(), 5u);
  EXPECT_EQ(r.held_blocks, 3) << "the first turn's blocks are not sent again";
  ASSERT_TRUE(mgr_->CompleteReservation(8, 2).ok());
  EXPECT_EQ(Continue(2, second), 20);
  mgr_->ReleaseReservation(8);
  mgr_->Free(RequestId(2));
  EXPECT_EQ(InUse(), 0);
}

TEST_F(KvReservationTest, AShortPoolAnswersNotNowAndChangesNothing) {
  Make(4);
  EXPECT_EQ(Continue(1, Seq(9, 100)), 0);  // holds 3 of the 4 blocks
  const int32_t allocatable = mgr_->device_pool().num_allocatable();
  KvManager::Reservation r;
  auto got = mgr_->Reserve(9, Seq(13, 1), {}, 1'000'000'000, &r);
  ASSERT_TRUE(got.ok());
  EXPECT_EQ(*got, AllocOutcome::kNotNow);
  EXPECT_EQ(mgr_->num_reservations(), 0u);
  EXPECT_EQ(mgr_->device_pool().num_allocatable(), allocatable);
  mgr_->Free(RequestId(1));
  EXPECT_TRUE(mgr_->Reserve(9, Seq(13, 1), {}, 1'000'000'000, &r).ok());
  EXPECT_EQ(r.blocks.size(), 3u);
  mgr_->ReleaseReservation(9);
  EXPECT_EQ(InUse(), 0);
}

TEST_F(KvReservationTest, APartialFillNamesWhatLandedAndExpiryFreesTheRest) {
  Make(16);
  const auto prompt = Seq(13, 1);
  KvManager::Reservation r;
  ASSERT_TRUE(mgr_->Reserve(1, prompt, {}, /*expires=*/5'000, &r).ok());
  ASSERT_TRUE(mgr_->CompleteReservation(1, 1).ok());  // the peer died after one block
  EXPECT_EQ(mgr_->Match(prompt, {}).device_tokens, 4) << "the rest is recomputed";
  EXPECT_EQ(InUse(), 1) << "unfilled blocks are freed at once";

  ASSERT_TRUE(mgr_->Reserve(2, Seq(9, 300), {}, /*expires=*/5'000, &r).ok());  // never completed
  EXPECT_EQ(mgr_->ExpireReservations(), 0u);
  clock_.Advance(5'000);
  EXPECT_EQ(mgr_->ExpireReservations(), 2u);
  EXPECT_EQ(mgr_->num_reservations(), 0u);
  EXPECT_EQ(InUse(), 0);
  EXPECT_EQ(mgr_->Match(Seq(9, 300), {}).device_tokens, 0) << "an uncompleted reservation names nothing";
  EXPECT_EQ(mgr_->Match(prompt, {}).device_tokens, 4) << "a named block stays cached";
  EXPECT_TRUE(mgr_->device_pool().CheckConsistency().ok());
}

TEST_F(KvReservationTest, MisuseIsRefused) {
  Make(16);
  KvManager::Reservation r;
  ASSERT_TRUE(mgr_->Reserve(1, Seq(13, 1), {}, 1'000'000'000, &r).ok());
  EXPECT_EQ(mgr_->Reserve(1, Seq(13, 1), {}, 1'000'000'000, &r).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(mgr_->Reserve(2, {}, {}, 1'000'000'000, &r).status().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(mgr_->CompleteReservation(3, 0).code(), StatusCode::kNotFound);
  EXPECT_EQ(mgr_->CompleteReservation(1, 4).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(mgr_->CompleteReservation(1, -1).code(), StatusCode::kInvalidArgument);
  EXPECT_TRUE(mgr_->CompleteReservation(1, 3).ok());
  EXPECT_EQ(mgr_->CompleteReservation(1, 3).code(), StatusCode::kInvalidArgument);
  mgr_->ReleaseReservation(1);
  mgr_->ReleaseReservation(1);  // twice: ignored
  EXPECT_EQ(InUse(), 0);
}

}  // namespace
}  // namespace strata::kvcache
