// The decode side of a prefill/decode handoff, in process: engine A (the
// prefill instance) runs a prompt and pauses after its first token; engine
// B (the decode instance, its own pool) reserves device blocks for the
// prompt, receives A's KV for them (copied here as the transfer engine
// would write it), names them, and continues the request from A's
// continuation. The text equals an uninterrupted run, B computes only the
// prompt's tail, and a second turn of the conversation reserves (and is
// sent) only the blocks B does not hold yet. Every block returns to both
// pools. On the real stories260K model.

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>

#include "tests/support/test_env.h"
#include "tests/unit/scheduler/engine_stack.h"

namespace strata::scheduler {
namespace {

constexpr int kBlockSize = 4;

using testing::Collected;
using testing::EngineStack;

class EngineHandoffTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = testing::LoadStories260K();
    ASSERT_NE(model_, nullptr);
    threads_ = std::make_unique<ThreadPool>(1);
  }
  EngineStack Build() { return testing::BuildEngineStack(*model_, threads_.get(), &clock_, kBlockSize, 128, 64); }

  EngineRequest Request(const std::vector<int32_t>& prompt, bool seeded) const {
    EngineRequest r;
    r.prompt = prompt;
    r.max_tokens = 24;
    r.ignore_eos = true;
    r.sampling.temperature = seeded ? 0.9f : 0.0f;
    r.sampling.seed = 11;
    return r;
  }

  // Hands `request` from `a` to `b` after one token (the reservation `id`
  // on b); returns the continued stream and, in *sent, the blocks copied.
  Collected HandOff(EngineStack& a, EngineStack& b, const EngineRequest& request, uint64_t id, Collected* first,
                    int* sent) {
    EngineRequest p = request;
    p.pause_after = 1;
    *first = testing::RunToEnd(*a.engine, {p})[0];
    EXPECT_EQ(first->finish, FinishReason::kPaused);
    EXPECT_TRUE(first->continuation.has_value());

    // Decode side: reserve; prefill side: write each reserved block it
    // computed (named in A's pool by now: the request finished there).
    kvcache::KvManager::Reservation r;
    auto got = b.kv->Reserve(id, request.prompt, request.cache_salt, clock_.NowNanos() + 1'000'000'000, &r);
    EXPECT_TRUE(got.ok() && *got == kvcache::AllocOutcome::kAllocated);
    const size_t bytes = a.fwd->kv_layout().block_bytes();
    *sent = 0;
    for (size_t i = static_cast<size_t>(r.held_blocks); i < r.blocks.size(); ++i) {
      auto src = a.kv->device_pool().Lookup(r.chain[i]);
      EXPECT_TRUE(src.has_value()) << "block " << i << " was computed by the prefill side";
      if (!src) return {};
      std::memcpy(b.fwd->block_data(static_cast<int32_t>(r.blocks[i].value())),
                  a.fwd->block_data(static_cast<int32_t>(src->value())), bytes);
      ++*sent;
    }
    EXPECT_TRUE(b.kv->CompleteReservation(id, *sent).ok());

    EngineRequest rest = request;
    rest.continuation = *first->continuation;
    Collected c = testing::RunToEnd(*b.engine, {rest})[0];
    b.kv->ReleaseReservation(id);
    EXPECT_EQ(c.cached_tokens, static_cast<int32_t>(r.blocks.size()) * kBlockSize)
        << "decode computes only the prompt's tail";
    return c;
  }

  void ExpectHandOffExact(bool seeded) {
    const std::vector<int32_t> turn1 =
        TokenizePrompt(*model_, "Once upon a time, there was a little girl named Lily. She loved to play");
    EngineStack whole = Build();
    const Collected ref1 = testing::RunToEnd(*whole.engine, {Request(turn1, seeded)})[0];

    EngineStack a = Build(), b = Build();
    Collected first;
    int sent1 = 0;
    const Collected rest1 = HandOff(a, b, Request(turn1, seeded), 1, &first, &sent1);
    EXPECT_EQ(first.tokens.size() + rest1.tokens.size(), ref1.tokens.size());
    std::vector<int32_t> tokens = first.tokens;
    tokens.insert(tokens.end(), rest1.tokens.begin(), rest1.tokens.end());
    EXPECT_EQ(tokens, ref1.tokens);
    EXPECT_EQ(first.text + rest1.text, ref1.text);
    EXPECT_EQ(rest1.finish, ref1.finish);
    EXPECT_EQ(sent1, static_cast<int>((turn1.size() - 1) / kBlockSize));

    // The next turn: the conversation so far, then more. B holds turn 1's
    // prompt blocks (and its own generated ones): only the rest is sent.
    std::vector<int32_t> turn2 = turn1;
    turn2.insert(turn2.end(), ref1.tokens.begin(), ref1.tokens.end());
    const std::vector<int32_t> more = TokenizePrompt(*model_, " Then she went home.");
    turn2.insert(turn2.end(), more.begin() + 1, more.end());  // without the BOS
    const Collected ref2 = testing::RunToEnd(*whole.engine, {Request(turn2, seeded)})[0];
    int sent2 = 0;
    const Collected rest2 = HandOff(a, b, Request(turn2, seeded), 2, &first, &sent2);
    tokens = first.tokens;
    tokens.insert(tokens.end(), rest2.tokens.begin(), rest2.tokens.end());
    EXPECT_EQ(tokens, ref2.tokens);
    EXPECT_EQ(first.text + rest2.text, ref2.text);
    const int blocks2 = static_cast<int>((turn2.size() - 1) / kBlockSize);
    EXPECT_LE(sent2, blocks2 - sent1) << "turn 1's prompt blocks are held by the decode side";
    EXPECT_GT(sent2, 0);
    std::printf("turn 1: %d blocks sent; turn 2: %d of %d sent\n", sent1, sent2, blocks2);

    EXPECT_EQ(b.kv->num_reservations(), 0u);
    EXPECT_EQ(a.kv->stats().device_pool.in_use, 0);
    EXPECT_EQ(b.kv->stats().device_pool.in_use, 0);
  }

  kvcache::ManualClock clock_;
  std::unique_ptr<LoadedModel> model_;
  std::unique_ptr<ThreadPool> threads_;
};

TEST_F(EngineHandoffTest, GreedyTwoTurns) { ExpectHandOffExact(/*seeded=*/false); }
TEST_F(EngineHandoffTest, SeededTwoTurns) { ExpectHandOffExact(/*seeded=*/true); }

}  // namespace
}  // namespace strata::scheduler
