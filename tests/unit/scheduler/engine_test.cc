// The continuous-batching engine on the real model (stories260K, f32 KV):
// batched, chunked and preempted generation gives the same greedy tokens as
// strata::Generate for each request alone; prefix hits, cancellation,
// deadlines, priorities, queue limits, draining and the loop thread.

#include "scheduler/engine.h"

#include <gtest/gtest.h>

#include <map>
#include <mutex>
#include <thread>

#include "model/model_loader.h"
#include "tests/support/test_env.h"
#include "common/thread_pool.h"
#include "model/forward.h"
#include "model/generate.h"

namespace strata::scheduler {
namespace {

constexpr int kBlockSize = 4;

struct Collected {
  std::vector<int32_t> tokens;
  std::string text;
  std::vector<RequestOutput> events;
  bool finished = false;
  std::string reason;
  Status status;
};

class EngineTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto m = LoadModel(testing::Stories260KPath());
    ASSERT_TRUE(m.ok()) << m.error().ToString();
    model_ = std::move(m).value();
    threads_ = std::make_unique<ThreadPool>(1);
    prompts_ = {
        TokenizePrompt(*model_, "Once upon a time, there was a little girl named Lily. She loved to play"),
        TokenizePrompt(*model_, "The cat sat"),
        TokenizePrompt(*model_, "One day, a big dog went to the park with his friend, a small bird"),
        TokenizePrompt(*model_, "Tom had a red ball"),
    };
  }

  // Builds the engine stack with `blocks` device blocks.
  void Build(int blocks, EngineOptions eo = {}) {
    KvOptions kv;
    kv.block_size = kBlockSize;
    kv.dtype = DType::kF32;
    kv.num_blocks = blocks;
    fwd_ = std::move(ForwardEngine::Create(model_->weights, kv, threads_.get())).value();
    kvcache::KvManagerOptions o;
    o.block_size = kBlockSize;
    o.num_device_blocks = blocks;
    o.block_bytes = fwd_->kv_layout().block_bytes();
    o.ns = kvcache::NamespaceDigest(model_->weights.digest, model_->weights.config.arch, "f32", kBlockSize);
    auto mem = [e = fwd_.get()](BlockId id) { return e->block_data(static_cast<int32_t>(id.value())); };
    kv_ = std::move(kvcache::KvManager::Create(o, mem, std::vector<kvcache::LowerTier>{}, &clock_)).value();
    runner_ = std::make_unique<ForwardEngineRunner>(fwd_.get());
    engine_ = std::move(Engine::Create(eo, runner_.get(), kv_.get(), model_->tokenizer.get(), &clock_)).value();
  }

  // Greedy reference: Generate on its own engine.
  GenerateOutput Reference(const std::vector<int32_t>& prompt, int max_tokens) {
    KvOptions kv;
    kv.block_size = kBlockSize;
    kv.dtype = DType::kF32;
    kv.num_blocks = model_->weights.config.context_length / kBlockSize;
    auto eng = std::move(ForwardEngine::Create(model_->weights, kv, threads_.get())).value();
    GenerateOptions go;
    go.sampling.temperature = 0;
    go.max_tokens = max_tokens;
    go.ignore_eos = true;
    auto out = Generate(*eng, *model_->tokenizer, prompt, go);
    EXPECT_TRUE(out.ok()) << out.error().ToString();
    return *out;
  }

  EngineRequest Greedy(const std::vector<int32_t>& prompt, int max_tokens) {
    EngineRequest r;
    r.prompt = prompt;
    r.max_tokens = max_tokens;
    r.sampling.temperature = 0;
    r.ignore_eos = true;
    return r;
  }

  RequestId SubmitTo(EngineRequest r, Collected* c) {
    auto id = engine_->Submit(std::move(r), [c, this](RequestOutput&& ev) {
      std::lock_guard<std::mutex> lock(mu_);
      c->tokens.insert(c->tokens.end(), ev.token_ids.begin(), ev.token_ids.end());
      c->text += ev.text;
      if (ev.finished) {
        c->finished = true;
        c->reason = std::string(FinishReasonName(ev.finish_reason));
        c->status = ev.status;
      }
      c->events.push_back(std::move(ev));
    });
    EXPECT_TRUE(id.ok()) << id.error().ToString();
    return id.ok() ? *id : RequestId(0);
  }

  void RunUntilDone(int max_steps = 10000) {
    for (int i = 0; i < max_steps && engine_->num_unfinished() > 0; ++i) {
      auto r = engine_->Step();
      ASSERT_TRUE(r.ok()) << r.error().ToString();
    }
    ASSERT_EQ(engine_->num_unfinished(), 0);
  }

  std::mutex mu_;
  kvcache::ManualClock clock_;
  std::unique_ptr<LoadedModel> model_;
  std::unique_ptr<ThreadPool> threads_;
  std::unique_ptr<ForwardEngine> fwd_;
  std::unique_ptr<kvcache::KvManager> kv_;
  std::unique_ptr<ForwardEngineRunner> runner_;
  std::unique_ptr<Engine> engine_;
  std::vector<std::vector<int32_t>> prompts_;
};

TEST_F(EngineTest, SingleRequestMatchesGenerate) {
  Build(128);
  const auto ref = Reference(prompts_[0], 20);
  Collected c;
  SubmitTo(Greedy(prompts_[0], 20), &c);
  RunUntilDone();
  EXPECT_TRUE(c.finished);
  EXPECT_EQ(c.reason, "length");
  EXPECT_EQ(c.tokens, ref.tokens);
  EXPECT_EQ(c.text, ref.text);
  const RequestOutput& last = c.events.back();
  EXPECT_EQ(last.prompt_tokens, static_cast<int32_t>(prompts_[0].size()));
  EXPECT_EQ(last.completion_tokens, 20);
  EXPECT_EQ(last.cached_tokens, 0);
  EXPECT_EQ(engine_->Stats().device_blocks_in_use, 0);
}

TEST_F(EngineTest, BatchedChunkedRequestsMatchEachAlone) {
  // A budget of 6 tokens per step forces chunked prefill mixed with decode.
  EngineOptions eo;
  eo.max_batch_tokens = 6;
  Build(128, eo);
  std::vector<Collected> c(prompts_.size());
  std::vector<GenerateOutput> refs;
  for (const auto& p : prompts_) refs.push_back(Reference(p, 12));
  for (size_t i = 0; i < prompts_.size(); ++i) SubmitTo(Greedy(prompts_[i], 12), &c[i]);
  RunUntilDone();
  for (size_t i = 0; i < prompts_.size(); ++i) {
    EXPECT_EQ(c[i].tokens, refs[i].tokens) << "request " << i;
    EXPECT_EQ(c[i].text, refs[i].text) << "request " << i;
  }
  const EngineStats st = engine_->Stats();
  EXPECT_GT(st.steps, 12u);
  // Every prompt token and every generated token but the last of each
  // request went through a forward pass exactly once (nothing was cached:
  // prompts differ from the first block), split by the cost model's kinds.
  uint64_t expected = 0;
  for (const auto& p : prompts_) expected += p.size() + 12 - 1;
  EXPECT_EQ(st.step_prefill_tokens + st.step_decode_tokens, expected);
  EXPECT_GE(st.step_decode_tokens, prompts_.size() * 11);
  EXPECT_GT(st.forward_nanos, 0u);
  EXPECT_GE(st.step_nanos, st.forward_nanos);
}

TEST_F(EngineTest, RepeatedPromptHitsDevicePrefix) {
  Build(128);
  Collected a, b;
  SubmitTo(Greedy(prompts_[0], 4), &a);
  RunUntilDone();
  SubmitTo(Greedy(prompts_[0], 4), &b);
  RunUntilDone();
  const int32_t full_blocks = (static_cast<int32_t>(prompts_[0].size()) - 1) / kBlockSize * kBlockSize;
  EXPECT_EQ(b.events.back().cached_tokens, full_blocks);
  ASSERT_EQ(b.events.back().cached_tokens_by_tier.size(), 1u);
  EXPECT_EQ(b.events.back().cached_tokens_by_tier[0], full_blocks);
  EXPECT_EQ(a.tokens, b.tokens);
  const EngineStats st = engine_->Stats();
  EXPECT_EQ(st.kv.device.tokens, static_cast<uint64_t>(full_blocks));
}

TEST_F(EngineTest, PreemptionUnderBlockPressureKeepsOutputs) {
  // Room for about one and a half sequences: the engine must preempt and
  // recompute instead of failing.
  const int max_tokens = 24;
  int need = 0;
  for (const auto& p : prompts_)
    need = std::max(need, (static_cast<int>(p.size()) + max_tokens + kBlockSize - 1) / kBlockSize);
  Build(need + need / 2);
  std::vector<Collected> c(prompts_.size());
  std::vector<GenerateOutput> refs;
  for (const auto& p : prompts_) refs.push_back(Reference(p, max_tokens));
  for (size_t i = 0; i < prompts_.size(); ++i) SubmitTo(Greedy(prompts_[i], max_tokens), &c[i]);
  RunUntilDone();
  for (size_t i = 0; i < prompts_.size(); ++i) {
    EXPECT_EQ(c[i].reason, "length") << c[i].status.ToString();
    EXPECT_EQ(c[i].tokens, refs[i].tokens) << "request " << i;
    EXPECT_EQ(c[i].text, refs[i].text) << "request " << i;
  }
  EXPECT_GT(engine_->Stats().preemptions, 0u);
  EXPECT_EQ(engine_->Stats().device_blocks_in_use, 0);
}

TEST_F(EngineTest, CancelReleasesBlocksWithinOneStep) {
  Build(128);
  Collected c;
  RequestId id = SubmitTo(Greedy(prompts_[0], 50), &c);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(engine_->Step().ok());
  EXPECT_GT(engine_->Stats().device_blocks_in_use, 0);
  engine_->Cancel(id);
  ASSERT_TRUE(engine_->Step().ok());
  EXPECT_TRUE(c.finished);
  EXPECT_EQ(c.reason, "abort");
  EXPECT_EQ(c.status.code(), StatusCode::kCancelled);
  EXPECT_EQ(engine_->Stats().device_blocks_in_use, 0);
  EXPECT_EQ(engine_->Stats().num_running, 0);
  EXPECT_EQ(engine_->num_unfinished(), 0);
}

TEST_F(EngineTest, DeadlineCancelsOnInjectedClock) {
  Build(128);
  Collected c;
  EngineRequest r = Greedy(prompts_[0], 50);
  r.deadline_nanos = clock_.NowNanos() + 1'000'000;
  SubmitTo(std::move(r), &c);
  ASSERT_TRUE(engine_->Step().ok());
  EXPECT_FALSE(c.finished);
  clock_.Advance(2'000'000);
  ASSERT_TRUE(engine_->Step().ok());
  EXPECT_TRUE(c.finished);
  EXPECT_EQ(c.reason, "abort");
  EXPECT_EQ(c.status.code(), StatusCode::kDeadlineExceeded);
  EXPECT_EQ(engine_->Stats().device_blocks_in_use, 0);
}

TEST_F(EngineTest, PriorityThenArrivalOrder) {
  EngineOptions eo;
  eo.max_running = 1;
  Build(128, eo);
  Collected low, high, mid;
  EngineRequest a = Greedy(prompts_[1], 2);
  a.priority = 5;
  EngineRequest b = Greedy(prompts_[1], 2);
  b.priority = -1;
  EngineRequest d = Greedy(prompts_[1], 2);
  d.priority = 5;
  std::vector<std::string> order;
  auto sink = [&](const char* name) {
    return [&order, name](RequestOutput&& ev) {
      if (ev.finished) order.push_back(name);
    };
  };
  ASSERT_TRUE(engine_->Submit(a, sink("a")).ok());
  ASSERT_TRUE(engine_->Submit(b, sink("b")).ok());
  ASSERT_TRUE(engine_->Submit(d, sink("d")).ok());
  RunUntilDone();
  EXPECT_EQ(order, (std::vector<std::string>{"b", "a", "d"}));
}

TEST_F(EngineTest, QueueLimitAndDrainRejectWithoutQueueing) {
  EngineOptions eo;
  eo.max_waiting = 2;
  Build(128, eo);
  Collected c1, c2;
  SubmitTo(Greedy(prompts_[1], 2), &c1);
  SubmitTo(Greedy(prompts_[1], 2), &c2);
  auto third = engine_->Submit(Greedy(prompts_[1], 2), [](RequestOutput&&) { FAIL() << "rejected request ran"; });
  ASSERT_FALSE(third.ok());
  EXPECT_EQ(third.error().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(engine_->Stats().rejected_queue_full, 1u);
  RunUntilDone();
  engine_->BeginDrain();
  auto late = engine_->Submit(Greedy(prompts_[1], 2), [](RequestOutput&&) {});
  ASSERT_FALSE(late.ok());
  EXPECT_EQ(late.error().code(), StatusCode::kUnavailable);
}

TEST_F(EngineTest, RejectsBadRequestsAtSubmit) {
  Build(16);
  auto sink = [](RequestOutput&&) {};
  EXPECT_EQ(engine_->Submit(Greedy({}, 4), sink).error().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(engine_->Submit(Greedy({1, 1 << 30}, 4), sink).error().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(engine_->Submit(Greedy(prompts_[1], 0), sink).error().code(), StatusCode::kInvalidArgument);
  const int ctx = model_->weights.config.context_length;
  auto over = engine_->Submit(Greedy(prompts_[1], ctx), sink);
  ASSERT_FALSE(over.ok());
  EXPECT_NE(over.error().message().find(std::to_string(ctx)), std::string::npos);
  // Fits the context but not the 16-block pool.
  auto big = engine_->Submit(Greedy(prompts_[1], 100), sink);
  ASSERT_FALSE(big.ok());
  EXPECT_NE(big.error().message().find("device pool"), std::string::npos);
  EngineRequest bad = Greedy(prompts_[1], 4);
  bad.sampling.top_p = 0;
  EXPECT_EQ(engine_->Submit(bad, sink).error().code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(engine_->num_unfinished(), 0);
}

TEST_F(EngineTest, StopStringAndStopTokenEndTheRequest) {
  Build(128);
  const auto ref = Reference(prompts_[0], 20);
  ASSERT_GE(ref.text.size(), 8u);
  // A stop string taken from the reference text cuts the output before it.
  const std::string stop = ref.text.substr(ref.text.size() / 2, 3);
  Collected c;
  EngineRequest r = Greedy(prompts_[0], 20);
  r.stop = {stop};
  SubmitTo(std::move(r), &c);
  Collected t;
  EngineRequest r2 = Greedy(prompts_[0], 20);
  r2.stop_token_ids = {ref.tokens[3]};
  SubmitTo(std::move(r2), &t);
  RunUntilDone();
  EXPECT_EQ(c.reason, "stop");
  EXPECT_EQ(c.text, ref.text.substr(0, ref.text.find(stop)));
  EXPECT_EQ(t.reason, "stop");
  EXPECT_EQ(t.tokens, std::vector<int32_t>(ref.tokens.begin(), ref.tokens.begin() + 4));
}

TEST_F(EngineTest, LoopThreadServesConcurrentSubmitters) {
  Build(256);
  engine_->Start();
  std::vector<Collected> c(16);
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([&, t] {
      for (int i = 0; i < 4; ++i) SubmitTo(Greedy(prompts_[static_cast<size_t>(i)], 6), &c[static_cast<size_t>(t * 4 + i)]);
    });
  for (auto& th : threads) th.join();
  for (int i = 0; i < 2000 && engine_->num_unfinished() > 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  engine_->Stop(5);
  std::lock_guard<std::mutex> lock(mu_);
  for (size_t i = 0; i < c.size(); ++i) {
    EXPECT_TRUE(c[i].finished) << i;
    EXPECT_EQ(c[i].reason, "length") << i;
    EXPECT_EQ(c[i].tokens.size(), 6u) << i;
  }
  // Same prompt, same greedy tokens, whatever the batch it ran in.
  EXPECT_EQ(c[0].tokens, c[4].tokens);
  EXPECT_EQ(c[1].tokens, c[13].tokens);
}

TEST_F(EngineTest, StopAbortsWhatIsLeft) {
  Build(128);
  Collected a, b;
  SubmitTo(Greedy(prompts_[0], 50), &a);
  SubmitTo(Greedy(prompts_[2], 50), &b);
  ASSERT_TRUE(engine_->Step().ok());
  engine_->Stop(0);
  EXPECT_TRUE(a.finished);
  EXPECT_TRUE(b.finished);
  EXPECT_EQ(a.reason, "abort");
  EXPECT_EQ(engine_->Stats().device_blocks_in_use, 0);
  auto late = engine_->Submit(Greedy(prompts_[1], 2), [](RequestOutput&&) {});
  EXPECT_EQ(late.error().code(), StatusCode::kUnavailable);
}

}  // namespace
}  // namespace strata::scheduler
