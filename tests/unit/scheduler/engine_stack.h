#pragma once
// Test helpers: one in-process engine stack on a real model (forward pass,
// KV manager over its pool, engine), and running requests to their end on
// it, collecting what each stream delivered. Used by the continuation and
// handoff tests, where two stacks stand for two instances.

#include <gtest/gtest.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/thread_pool.h"
#include "kvcache/kv_manager.h"
#include "model/forward.h"
#include "model/model_loader.h"
#include "scheduler/engine.h"
#include "tests/support/test_env.h"

namespace strata::scheduler::testing {

// Destroyed in reverse (engine first).
struct EngineStack {
  std::unique_ptr<ForwardEngine> fwd;
  std::unique_ptr<kvcache::KvManager> kv;
  std::unique_ptr<ForwardEngineRunner> runner;
  std::unique_ptr<Engine> engine;
  void Reset() {
    engine.reset();
    runner.reset();
    kv.reset();
    fwd.reset();
  }
  ~EngineStack() { Reset(); }
  EngineStack() = default;
  EngineStack(EngineStack&&) = default;
  EngineStack& operator=(EngineStack&& o) noexcept {
    Reset();
    fwd = std::move(o.fwd);
    kv = std::move(o.kv);
    runner = std::move(o.runner);
    engine = std::move(o.engine);
    return *this;
  }
};

// The real stories260K model (../shared/models), or null after a test failure.
inline std::unique_ptr<LoadedModel> LoadStories260K() {
  auto m = LoadModel(::strata::testing::Stories260KPath());
  EXPECT_TRUE(m.ok()) << m.error().ToString();
  return m.ok() ? std::move(m).value() : nullptr;
}

// f32 KV, no lower tiers; `m`, `threads` and `clock` outlive the stack.
inline EngineStack BuildEngineStack(const LoadedModel& m, ThreadPool* threads, kvcache::Clock* clock,
                                    int block_size, int num_blocks, int max_batch_tokens) {
  EngineStack s;
  KvOptions kv;
  kv.block_size = block_size;
  kv.dtype = DType::kF32;
  kv.num_blocks = num_blocks;
  s.fwd = std::move(ForwardEngine::Create(m.weights, kv, threads)).value();
  kvcache::KvManagerOptions o;
  o.block_size = block_size;
  o.num_device_blocks = kv.num_blocks;
  o.block_bytes = s.fwd->kv_layout().block_bytes();
  o.ns = kvcache::NamespaceDigest(m.weights.digest, m.weights.config.arch, "f32", block_size);
  auto mem = [e = s.fwd.get()](BlockId id) { return e->block_data(static_cast<int32_t>(id.value())); };
  s.kv = std::move(kvcache::KvManager::Create(o, mem, std::vector<kvcache::LowerTier>{}, clock)).value();
  s.runner = std::make_unique<ForwardEngineRunner>(s.fwd.get());
  EngineOptions eo;
  eo.max_batch_tokens = max_batch_tokens;
  s.engine = std::move(Engine::Create(eo, s.runner.get(), s.kv.get(), m.tokenizer.get(), clock)).value();
  return s;
}

struct Collected {
  std::vector<int32_t> tokens;
  std::string text;
  std::vector<SampleResult> logprobs;
  FinishReason finish = FinishReason::kNone;
  int finals = 0;
  int32_t completion_tokens = 0;
  int32_t cached_tokens = 0;
  std::optional<Continuation> continuation;
};

// Submits each request to `engine`, steps it (on this thread) until all
// finish, and returns what each stream delivered.
inline std::vector<Collected> RunToEnd(Engine& engine, std::vector<EngineRequest> requests) {
  std::vector<Collected> got(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    auto id = engine.Submit(std::move(requests[i]), [c = &got[i]](RequestOutput&& ev) {
      c->tokens.insert(c->tokens.end(), ev.token_ids.begin(), ev.token_ids.end());
      c->text += ev.text;
      c->logprobs.insert(c->logprobs.end(), ev.logprobs.begin(), ev.logprobs.end());
      c->completion_tokens = ev.completion_tokens;
      c->cached_tokens = ev.cached_tokens;
      if (ev.finished) {
        ++c->finals;
        c->finish = ev.finish_reason;
        c->continuation = std::move(ev.continuation);
      }
    });
    EXPECT_TRUE(id.ok()) << id.error().ToString();
  }
  for (int i = 0; i < 10000 && engine.num_unfinished() > 0; ++i) EXPECT_TRUE(engine.Step().ok());
  EXPECT_EQ(engine.num_unfinished(), 0);
  return got;
}

}  // namespace strata::scheduler::testing
