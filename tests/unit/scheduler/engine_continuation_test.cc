// A request paused after k generated tokens in one engine and continued in
// another (its own forward pass, pool and KV manager, as another process
// would have) produces exactly the output of an uninterrupted run: tokens,
// text, logprobs and finish reason, for k = 1, 7 and 31; greedy, seeded,
// n = 2 (two choices with seeds s and s + 1, batched together), logprobs
// with top alternatives, presence/frequency/repetition penalties, and a
// stop string that spans the pause. On the real stories260K model.

#include <gtest/gtest.h>

#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "tests/support/test_env.h"
#include "tests/unit/scheduler/engine_stack.h"

namespace strata::scheduler {
namespace {

constexpr int kBlockSize = 4;
constexpr int kMaxTokens = 40;

using testing::Collected;
using Stack = testing::EngineStack;

class EngineContinuationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    model_ = testing::LoadStories260K();
    ASSERT_NE(model_, nullptr);
    threads_ = std::make_unique<ThreadPool>(1);
    prompt_ = TokenizePrompt(*model_, "Once upon a time, there was a little girl named Lily. She loved to play");
    a_ = Build();
    b_ = Build();
  }

  // 128 blocks; a continuation of 31 tokens + the prompt takes two chunks of 64.
  Stack Build() { return testing::BuildEngineStack(*model_, threads_.get(), &clock_, kBlockSize, 128, 64); }

  std::vector<Collected> Run(Engine& engine, std::vector<EngineRequest> requests) {
    return testing::RunToEnd(engine, std::move(requests));
  }

  // Runs `requests` whole in a fresh engine, then paused after k tokens in
  // fresh engine A and continued in fresh engine B, and checks the two agree
  // choice by choice. Fresh engines: a prefix cache hit changes how many
  // tokens a step computes, and the CPU kernels pick their path (and so the
  // last bits of the logits) by that number; the continuation reproduces
  // the uninterrupted run's steps, not a cache-warm one's.
  void ExpectSameAsUninterrupted(const std::vector<EngineRequest>& requests, int k) {
    SCOPED_TRACE("k = " + std::to_string(k));
    Stack fresh = Build();
    const std::vector<Collected> whole = Run(*fresh.engine, requests);
    a_.Reset();
    b_.Reset();
    a_ = Build();
    b_ = Build();
    std::vector<EngineRequest> first = requests;
    for (auto& r : first) r.pause_after = k;
    const std::vector<Collected> paused = Run(*a_.engine, first);
    std::vector<EngineRequest> rest = requests;
    for (size_t i = 0; i < rest.size(); ++i) {
      ASSERT_EQ(paused[i].finish, FinishReason::kPaused) << "choice " << i;
      ASSERT_EQ(paused[i].finals, 1);
      ASSERT_TRUE(paused[i].continuation.has_value());
      EXPECT_EQ(paused[i].continuation->generated, paused[i].tokens);
      EXPECT_EQ(static_cast<int>(paused[i].tokens.size()), k);
      rest[i].continuation = *paused[i].continuation;
    }
    const std::vector<Collected> continued = Run(*b_.engine, rest);
    for (size_t i = 0; i < requests.size(); ++i) {
      SCOPED_TRACE("choice " + std::to_string(i));
      std::vector<int32_t> tokens = paused[i].tokens;
      tokens.insert(tokens.end(), continued[i].tokens.begin(), continued[i].tokens.end());
      EXPECT_EQ(tokens, whole[i].tokens);
      EXPECT_EQ(paused[i].text + continued[i].text, whole[i].text);
      EXPECT_EQ(continued[i].finish, whole[i].finish);
      EXPECT_EQ(continued[i].finals, 1);
      EXPECT_EQ(continued[i].completion_tokens, whole[i].completion_tokens);
      std::vector<SampleResult> lp = paused[i].logprobs;
      lp.insert(lp.end(), continued[i].logprobs.begin(), continued[i].logprobs.end());
      ASSERT_EQ(lp.size(), whole[i].logprobs.size());
      for (size_t t = 0; t < lp.size(); ++t) {
        EXPECT_EQ(lp[t].token, whole[i].logprobs[t].token);
        EXPECT_EQ(lp[t].logprob, whole[i].logprobs[t].logprob) << "token " << t;
        ASSERT_EQ(lp[t].top.size(), whole[i].logprobs[t].top.size());
        for (size_t j = 0; j < lp[t].top.size(); ++j) {
          EXPECT_EQ(lp[t].top[j].id, whole[i].logprobs[t].top[j].id);
          EXPECT_EQ(lp[t].top[j].logprob, whole[i].logprobs[t].top[j].logprob);
        }
      }
    }
    // Every block went back to both pools.
    EXPECT_EQ(a_.kv->stats().device_pool.in_use, 0);
    EXPECT_EQ(b_.kv->stats().device_pool.in_use, 0);
  }

  EngineRequest Request(SamplingParams p) const {
    EngineRequest r;
    r.prompt = prompt_;
    r.max_tokens = kMaxTokens;
    r.sampling = std::move(p);
    r.ignore_eos = true;
    return r;
  }

  kvcache::ManualClock clock_;
  std::unique_ptr<LoadedModel> model_;
  std::unique_ptr<ThreadPool> threads_;
  std::vector<int32_t> prompt_;
  Stack a_, b_;
};

TEST_F(EngineContinuationTest, Greedy) {
  SamplingParams p;
  p.temperature = 0;
  for (int k : {1, 7, 31}) ExpectSameAsUninterrupted({Request(p)}, k);
}

TEST_F(EngineContinuationTest, SeededWithLogprobs) {
  SamplingParams p;
  p.temperature = 1.0f;
  p.top_p = 0.9f;
  p.seed = 42;
  p.logprobs = true;
  p.top_logprobs = 3;
  for (int k : {1, 7, 31}) ExpectSameAsUninterrupted({Request(p)}, k);
}

TEST_F(EngineContinuationTest, TwoChoicesSeededBatchedTogether) {
  SamplingParams p;
  p.temperature = 0.8f;
  p.top_k = 20;
  p.seed = 7;
  EngineRequest c0 = Request(p);
  p.seed = 8;  // choice i runs with seed + i, as the front end submits n > 1
  EngineRequest c1 = Request(p);
  for (int k : {1, 7, 31}) ExpectSameAsUninterrupted({c0, c1}, k);
}

TEST_F(EngineContinuationTest, PresenceFrequencyAndRepetitionPenalties) {
  SamplingParams p;
  p.temperature = 0.9f;
  p.seed = 3;
  p.presence_penalty = 0.8f;
  p.frequency_penalty = 0.5f;
  p.repetition_penalty = 1.3f;
  p.logprobs = true;
  for (int k : {1, 7, 31}) ExpectSameAsUninterrupted({Request(p)}, k);
  p.temperature = 0;  // greedy: the penalties alone steer the choice
  for (int k : {1, 7, 31}) ExpectSameAsUninterrupted({Request(p)}, k);
}

TEST_F(EngineContinuationTest, StopStringAcrossThePause) {
  SamplingParams p;
  p.temperature = 0;
  Stack fresh = Build();
  const std::vector<Collected> ref = Run(*fresh.engine, {Request(p)});
  const std::string& full = ref[0].text;
  // The text shown by the first 7 tokens; a stop string that begins before
  // that point and ends after it, first seen there.
  std::vector<EngineRequest> first = {Request(p)};
  first[0].pause_after = 7;
  const size_t boundary = Run(*b_.engine, first)[0].text.size();
  ASSERT_GT(boundary, 3u);
  std::string stop;
  for (size_t before = 2; before <= 6 && stop.empty(); ++before)
    for (size_t after = 2; after <= 6 && stop.empty(); ++after) {
      if (boundary < before || boundary + after > full.size()) continue;
      const std::string s = full.substr(boundary - before, before + after);
      if (full.find(s) == boundary - before) stop = s;
    }
  ASSERT_FALSE(stop.empty()) << full;
  EngineRequest r = Request(p);
  r.stop = {stop};
  const std::vector<Collected> whole = Run(*a_.engine, {r});
  ASSERT_EQ(whole[0].finish, FinishReason::kStop);
  ASSERT_EQ(whole[0].text, full.substr(0, full.find(stop)));
  ExpectSameAsUninterrupted({r}, 7);
}

TEST_F(EngineContinuationTest, BadContinuationsAreRefused) {
  SamplingParams p;
  p.temperature = 0;
  EngineRequest r = Request(p);
  r.continuation.generated = {1, 2, -5};
  auto sink = [](RequestOutput&&) {};
  EXPECT_EQ(a_.engine->Submit(r, sink).error().code(), StatusCode::kInvalidArgument);
  r.continuation.generated.assign(kMaxTokens, 1);  // nothing left to generate
  EXPECT_EQ(a_.engine->Submit(r, sink).error().code(), StatusCode::kInvalidArgument);
  r.continuation.generated = {1, 2};
  r.pause_after = 2;  // would pause before generating anything
  EXPECT_EQ(a_.engine->Submit(r, sink).error().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(a_.engine->num_unfinished(), 0);
}

}  // namespace
}  // namespace strata::scheduler
