// Prefetch ahead of admission on the real model (stories260K, f32 KV) with a
// real host tier: a waiting request whose prompt prefix is on host starts
// loading it while another request runs, is admitted onto those blocks and
// generates exactly what the same prompt gives with no cache; cancelling it
// (or the engine's need for blocks) gives every prefetched block back.

#include <gtest/gtest.h>

#include <mutex>

#include "kvcache/host_store.h"
#include "model/model_loader.h"
#include "scheduler/engine.h"
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
  bool finished = false;
  std::string reason;
  int32_t cached_tokens = 0;
  std::vector<int32_t> cached_by_tier;
};

class EnginePrefetchTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto m = LoadModel(testing::Stories260KPath());
    ASSERT_TRUE(m.ok()) << m.error().ToString();
    model_ = std::move(m).value();
    threads_ = std::make_unique<ThreadPool>(1);
    cached_ = TokenizePrompt(*model_, "Once upon a time, there was a little girl named Lily. She loved to play");
    other_ = TokenizePrompt(*model_, "The cat sat");
  }

  void Build(int blocks, EngineOptions eo) {
    KvOptions kv;
    kv.block_size = kBlockSize;
    kv.dtype = DType::kF32;
    kv.num_blocks = blocks;
    fwd_ = std::move(ForwardEngine::Create(model_->weights, kv, threads_.get())).value();
    const uint64_t block_bytes = fwd_->kv_layout().block_bytes();
    host_ = std::move(kvcache::HostStore::Create({256 * block_bytes, block_bytes, false})).value();
    kvcache::KvManagerOptions o;
    o.block_size = kBlockSize;
    o.num_device_blocks = blocks;
    o.block_bytes = block_bytes;
    o.ns = kvcache::NamespaceDigest(model_->weights.digest, model_->weights.config.arch, "f32", kBlockSize);
    o.load_policy = kvcache::LoadPolicy::kAlways;
    auto mem = [e = fwd_.get()](BlockId id) { return e->block_data(static_cast<int32_t>(id.value())); };
    std::vector<kvcache::LowerTier> tiers = {{host_.get(), kvcache::WritePolicy::kWriteThrough, 0, 0}};
    kv_ = std::move(kvcache::KvManager::Create(o, mem, std::move(tiers), &clock_)).value();
    runner_ = std::make_unique<ForwardEngineRunner>(fwd_.get());
    engine_ = std::move(Engine::Create(eo, runner_.get(), kv_.get(), model_->tokenizer.get(), &clock_)).value();
  }

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

  RequestId Submit(const std::vector<int32_t>& prompt, int max_tokens, Collected* c) {
    EngineRequest r;
    r.prompt = prompt;
    r.max_tokens = max_tokens;
    r.sampling.temperature = 0;
    r.ignore_eos = true;
    auto id = engine_->Submit(std::move(r), [c, this](RequestOutput&& ev) {
      std::lock_guard<std::mutex> lock(mu_);
      c->tokens.insert(c->tokens.end(), ev.token_ids.begin(), ev.token_ids.end());
      c->text += ev.text;
      c->cached_tokens = ev.cached_tokens;
      c->cached_by_tier = ev.cached_tokens_by_tier;
      if (ev.finished) {
        c->finished = true;
        c->reason = std::string(FinishReasonName(ev.finish_reason));
      }
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

  // Runs `cached_` once (its blocks go through to host), then drops the
  // device copies: the prefix is now on host only.
  void WarmHostOnly() {
    Collected warm;
    Submit(cached_, 2, &warm);
    RunUntilDone();
    ASSERT_TRUE(engine_->Post([](kvcache::KvManager& kv) { ASSERT_TRUE(kv.Flush(true, {}).ok()); }));
    ASSERT_TRUE(engine_->Step().ok());
    const auto m = kv_->Match(cached_, {});
    ASSERT_EQ(m.device_tokens, 0);
    ASSERT_GT(m.lower_tokens, 0);
  }

  // Full blocks of `cached_` that can come from cache.
  int32_t CachedPrefixTokens() const {
    return (static_cast<int32_t>(cached_.size()) - 1) / kBlockSize * kBlockSize;
  }

  std::mutex mu_;
  kvcache::ManualClock clock_;
  std::unique_ptr<LoadedModel> model_;
  std::unique_ptr<ThreadPool> threads_;
  std::unique_ptr<ForwardEngine> fwd_;
  std::unique_ptr<kvcache::HostStore> host_;
  std::unique_ptr<kvcache::KvManager> kv_;
  std::unique_ptr<ForwardEngineRunner> runner_;
  std::unique_ptr<Engine> engine_;
  std::vector<int32_t> cached_, other_;
};

EngineOptions OneAtATime(int prefetch) {
  EngineOptions eo;
  eo.max_running = 1;  // the second request must wait
  eo.prefetch_max_requests = prefetch;
  return eo;
}

TEST_F(EnginePrefetchTest, WaitingRequestLoadsItsHostPrefixBeforeAdmissionAndMatchesNoCache) {
  Build(64, OneAtATime(4));
  WarmHostOnly();
  const auto ref = Reference(cached_, 12);
  const uint64_t host_hits_before = engine_->Stats().kv.tiers[0].hits.blocks;

  Collected runner, waiter;
  Submit(other_, 20, &runner);
  Submit(cached_, 12, &waiter);
  ASSERT_TRUE(engine_->Step().ok());
  EngineStats st = engine_->Stats();
  EXPECT_EQ(st.num_running, 1);
  EXPECT_EQ(st.num_waiting, 1);
  EXPECT_EQ(st.prefetches_started, 1u);
  EXPECT_EQ(st.num_prefetching, 1);
  EXPECT_EQ(st.prefetched_blocks, static_cast<uint64_t>(CachedPrefixTokens() / kBlockSize));
  // The loads finished (end-of-step poll) while the request is still waiting.
  EXPECT_EQ(st.kv.tiers[0].hits.blocks - host_hits_before, static_cast<uint64_t>(CachedPrefixTokens() / kBlockSize));
  EXPECT_TRUE(waiter.tokens.empty());

  RunUntilDone();
  st = engine_->Stats();
  EXPECT_EQ(st.prefetches_started, 1u);
  EXPECT_EQ(st.prefetches_used, 1u);
  EXPECT_EQ(st.prefetches_released, 0u);
  EXPECT_EQ(st.num_prefetching, 0);
  EXPECT_EQ(waiter.reason, "length");
  EXPECT_EQ(waiter.tokens, ref.tokens);
  EXPECT_EQ(waiter.text, ref.text);
  EXPECT_EQ(waiter.cached_tokens, CachedPrefixTokens());
  ASSERT_EQ(waiter.cached_by_tier.size(), 2u);
  EXPECT_EQ(waiter.cached_by_tier[1], CachedPrefixTokens());  // from host
  EXPECT_EQ(st.device_blocks_in_use, 0);
  EXPECT_TRUE(kv_->device_pool().CheckConsistency().ok());
}

TEST_F(EnginePrefetchTest, CancelWhilePrefetchingFreesEveryBlock) {
  Build(64, OneAtATime(4));
  WarmHostOnly();
  const int32_t start_allocatable = kv_->device_pool().num_allocatable();
  ASSERT_EQ(start_allocatable, 64);

  Collected runner, waiter;
  const RequestId r = Submit(other_, 20, &runner);
  const RequestId w = Submit(cached_, 12, &waiter);
  ASSERT_TRUE(engine_->Step().ok());
  ASSERT_EQ(engine_->Stats().num_prefetching, 1);
  const int32_t runner_blocks = static_cast<int32_t>(kv_->BlockTable(r).size());
  EXPECT_GT(static_cast<int32_t>(kv_->BlockTable(w).size()), 0);
  EXPECT_EQ(engine_->Stats().device_blocks_in_use, runner_blocks + CachedPrefixTokens() / kBlockSize);

  engine_->Cancel(w);
  ASSERT_TRUE(engine_->Step().ok());
  EXPECT_TRUE(waiter.finished);
  EXPECT_EQ(waiter.reason, "abort");
  EngineStats st = engine_->Stats();
  EXPECT_EQ(st.num_prefetching, 0);
  EXPECT_EQ(st.device_blocks_in_use, static_cast<int32_t>(kv_->BlockTable(r).size()));
  EXPECT_EQ(kv_->num_requests(), 1u);

  engine_->Cancel(r);
  ASSERT_TRUE(engine_->Step().ok());
  EXPECT_EQ(engine_->Stats().device_blocks_in_use, 0);
  EXPECT_EQ(kv_->device_pool().num_allocatable(), start_allocatable);
  EXPECT_EQ(kv_->num_requests(), 0u);
  EXPECT_TRUE(kv_->device_pool().CheckConsistency().ok());
}

TEST_F(EnginePrefetchTest, ZeroDisablesPrefetch) {
  Build(64, OneAtATime(0));
  WarmHostOnly();
  const auto ref = Reference(cached_, 6);
  Collected runner, waiter;
  Submit(other_, 10, &runner);
  Submit(cached_, 6, &waiter);
  ASSERT_TRUE(engine_->Step().ok());
  EXPECT_EQ(engine_->Stats().num_prefetching, 0);
  RunUntilDone();
  EXPECT_EQ(engine_->Stats().prefetches_started, 0u);
  EXPECT_EQ(waiter.tokens, ref.tokens);
  EXPECT_EQ(waiter.cached_tokens, CachedPrefixTokens());  // still a host hit, at admission
}

TEST_F(EnginePrefetchTest, PrefetchGivesWayWhenRunningRequestsNeedTheBlocks) {
  // Few blocks: the running request's growth must reclaim the prefetch
  // (released, not a preemption), and both outputs stay exact.
  const int32_t prefix_blocks = static_cast<int32_t>((cached_.size() - 1) / kBlockSize);
  const int max_tokens = 40;
  const int32_t runner_need = static_cast<int32_t>((other_.size() + max_tokens + kBlockSize - 1) / kBlockSize);
  const int32_t waiter_need = static_cast<int32_t>((cached_.size() + 4 + kBlockSize - 1) / kBlockSize);
  // Room for the runner's whole sequence, but not also the prefetch at its end.
  const int blocks = std::max(runner_need + prefix_blocks - 2, waiter_need);
  EngineOptions eo = OneAtATime(4);
  eo.prefetch_max_block_share = 1.0;  // let the prefetch take what is free
  Build(blocks, eo);
  WarmHostOnly();
  const auto ref_runner = Reference(other_, max_tokens);
  const auto ref_waiter = Reference(cached_, 4);
  Collected runner, waiter;
  Submit(other_, max_tokens, &runner);
  Submit(cached_, 4, &waiter);
  ASSERT_TRUE(engine_->Step().ok());
  ASSERT_EQ(engine_->Stats().prefetches_started, 1u);
  RunUntilDone();
  const EngineStats st = engine_->Stats();
  EXPECT_GE(st.prefetches_released, 1u);
  EXPECT_EQ(st.preemptions, 0u);
  EXPECT_EQ(runner.tokens, ref_runner.tokens);
  EXPECT_EQ(waiter.tokens, ref_waiter.tokens);
  EXPECT_EQ(st.device_blocks_in_use, 0);
  EXPECT_TRUE(kv_->device_pool().CheckConsistency().ok());
}

TEST_F(EnginePrefetchTest, RequestsBehindAHeadWaitingForBlocksDoNotPrefetch) {
  // The head of the queue needs more blocks than are free; the request
  // behind it has a host prefix that would fit. Those blocks are the head's.
  std::vector<int32_t> head = TokenizePrompt(*model_, "One day, a big dog went to the park with his friend, a small bird");
  const auto more = TokenizePrompt(*model_, "Tom had a red ball and a blue kite, and he ran up the hill");
  head.insert(head.end(), more.begin() + 1, more.end());
  const int32_t head_need = static_cast<int32_t>((head.size() + kBlockSize - 1) / kBlockSize);
  const int32_t cost = CachedPrefixTokens() / kBlockSize;
  ASSERT_GE(head_need, cost + 2) << "the test needs a head longer than the cached prompt";
  const int blocks = 24;
  const int runner_tokens = (blocks - 1) * kBlockSize - static_cast<int>(other_.size());
  EngineOptions eo;
  eo.max_running = 8;
  eo.prefetch_max_block_share = 1.0;
  Build(blocks, eo);
  WarmHostOnly();
  const auto ref_head = Reference(head, 4);
  const auto ref_cached = Reference(cached_, 4);
  Collected runner, first, second;
  Submit(other_, runner_tokens, &runner);
  for (int i = 0; i < 1000 && kv_->device_pool().num_allocatable() >= head_need; ++i)
    ASSERT_TRUE(engine_->Step().ok());
  ASSERT_LT(kv_->device_pool().num_allocatable(), head_need);
  ASSERT_GE(kv_->device_pool().num_allocatable(), cost + 1);  // room the prefetch would take
  Submit(head, 4, &first);
  Submit(cached_, 4, &second);
  ASSERT_TRUE(engine_->Step().ok());
  EngineStats st = engine_->Stats();
  EXPECT_EQ(st.num_waiting, 2);
  EXPECT_EQ(st.prefetches_started, 0u);
  RunUntilDone();
  EXPECT_EQ(first.tokens, ref_head.tokens);
  EXPECT_EQ(second.tokens, ref_cached.tokens);
  EXPECT_EQ(engine_->Stats().device_blocks_in_use, 0);
}

}  // namespace
}  // namespace strata::scheduler
