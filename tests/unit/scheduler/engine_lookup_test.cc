// The engine asks the KV tiers for a waiting request's cached prefix
// asynchronously (real model, real host tier behind an index that answers
// only when told to, standing in for a remote one): while the answer is
// pending the request waits and running requests keep generating; an answer
// in time admits it onto the host's blocks, one past the deadline admits it
// as a miss; either way its output equals a run with no cache, and every
// block goes back to the pool.

#include <gtest/gtest.h>

#include <deque>
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

// A HostStore whose index (SubmitCountPrefix) answers at once until held,
// then only when released.
class HeldIndexStore final : public kvcache::BlockStore {
 public:
  explicit HeldIndexStore(std::unique_ptr<kvcache::HostStore> inner) : inner_(std::move(inner)) {}
  std::string_view name() const override { return "host"; }
  kvcache::TierKind kind() const override { return kvcache::TierKind::kHost; }
  kvcache::StoreStats stats() const override { return inner_->stats(); }
  bool Contains(const BlockHash& h) const override { return inner_->Contains(h); }
  size_t CountPrefix(std::span<const BlockHash> chain) const override { return inner_->CountPrefix(chain); }
  void SubmitCountPrefix(std::span<const BlockHash> chain, uint64_t tag) override {
    questions_.push_back({tag, std::vector<BlockHash>(chain.begin(), chain.end())});
  }
  size_t PollCountPrefix(std::vector<PrefixAnswer>* out) override {
    if (held_) return 0;
    const size_t n = questions_.size();
    for (const auto& [tag, chain] : questions_) out->push_back({tag, inner_->CountPrefix(chain)});
    questions_.clear();
    return n;
  }
  Status SubmitWrite(const BlockHash& h, const Sha256Digest& ns, const Region& data, uint64_t tag) override {
    return inner_->SubmitWrite(h, ns, data, tag);
  }
  Status SubmitRead(const BlockHash& h, const Region& dst, uint64_t tag) override {
    return inner_->SubmitRead(h, dst, tag);
  }
  size_t Poll(std::vector<kvcache::StoreCompletion>* out) override { return inner_->Poll(out); }
  void Drain(std::vector<kvcache::StoreCompletion>* out) override { inner_->Drain(out); }
  Status Remove(const BlockHash& h) override { return inner_->Remove(h); }
  Status Flush(const Sha256Digest* ns) override { return inner_->Flush(ns); }
  // The inner store's memory is in the table this one is attached to.
  Status RegisterMemory() override { return inner_->Attach(segments()); }
  void UnregisterMemory() override { inner_->Detach(); }
  void set_held(bool held) { held_ = held; }
  size_t questions() const { return questions_.size(); }

 private:
  std::unique_ptr<kvcache::HostStore> inner_;
  std::deque<std::pair<uint64_t, std::vector<BlockHash>>> questions_;
  bool held_ = false;
};

struct Collected {
  std::vector<int32_t> tokens;
  bool finished = false;
  int32_t cached_tokens = 0;
};

class EngineLookupTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto m = LoadModel(testing::Stories260KPath());
    ASSERT_TRUE(m.ok()) << m.error().ToString();
    model_ = std::move(m).value();
    threads_ = std::make_unique<ThreadPool>(1);
    cached_ = TokenizePrompt(*model_, "Once upon a time, there was a little girl named Lily. She loved to play");
    other_ = TokenizePrompt(*model_, "The cat sat");
    KvOptions kv;
    kv.block_size = kBlockSize;
    kv.dtype = DType::kF32;
    kv.num_blocks = 64;
    fwd_ = std::move(ForwardEngine::Create(model_->weights, kv, threads_.get())).value();
    const uint64_t block_bytes = fwd_->kv_layout().block_bytes();
    host_ = std::make_unique<HeldIndexStore>(
        std::move(kvcache::HostStore::Create({256 * block_bytes, block_bytes, false})).value());
    kvcache::KvManagerOptions o;
    o.block_size = kBlockSize;
    o.num_device_blocks = kv.num_blocks;
    o.block_bytes = block_bytes;
    o.ns = kvcache::NamespaceDigest(model_->weights.digest, model_->weights.config.arch, "f32", kBlockSize);
    o.load_policy = kvcache::LoadPolicy::kAlways;
    auto mem = [e = fwd_.get()](BlockId id) { return e->block_data(static_cast<int32_t>(id.value())); };
    std::vector<kvcache::LowerTier> tiers(1);
    tiers[0].store = host_.get();
    kv_ = std::move(kvcache::KvManager::Create(o, mem, std::move(tiers), &clock_)).value();
    runner_ = std::make_unique<ForwardEngineRunner>(fwd_.get());
    EngineOptions eo;
    eo.lookup_timeout_seconds = 1.0;  // in the test's ManualClock time
    engine_ = std::move(Engine::Create(eo, runner_.get(), kv_.get(), model_->tokenizer.get(), &clock_)).value();
  }

  void Submit(const std::vector<int32_t>& prompt, int max_tokens, Collected* c) {
    EngineRequest r;
    r.prompt = prompt;
    r.max_tokens = max_tokens;
    r.sampling.temperature = 0;
    r.ignore_eos = true;
    auto id = engine_->Submit(std::move(r), [c, this](RequestOutput&& ev) {
      std::lock_guard<std::mutex> lock(mu_);
      c->tokens.insert(c->tokens.end(), ev.token_ids.begin(), ev.token_ids.end());
      c->cached_tokens = ev.cached_tokens;
      c->finished = c->finished || ev.finished;
    });
    ASSERT_TRUE(id.ok()) << id.error().ToString();
  }

  void Step() {
    auto r = engine_->Step();
    ASSERT_TRUE(r.ok()) << r.error().ToString();
  }

  void RunUntilDone() {
    for (int i = 0; i < 10000 && engine_->num_unfinished() > 0; ++i) Step();
    ASSERT_EQ(engine_->num_unfinished(), 0);
  }

  // `cached_` run once, its blocks written through to host; device flushed.
  void WarmHostOnly(std::vector<int32_t>* reference) {
    Collected warm;
    Submit(cached_, 8, &warm);
    RunUntilDone();
    *reference = warm.tokens;
    ASSERT_TRUE(kv_->Flush(true, {}).ok());
    ASSERT_EQ(kv_->Match(cached_, {}).device_tokens, 0);
    ASSERT_GT(kv_->Match(cached_, {}).lower_tokens, 0);
  }

  kvcache::ManualClock clock_;
  std::unique_ptr<LoadedModel> model_;
  std::unique_ptr<ThreadPool> threads_;
  std::unique_ptr<ForwardEngine> fwd_;
  std::unique_ptr<HeldIndexStore> host_;
  std::unique_ptr<kvcache::KvManager> kv_;
  std::unique_ptr<ForwardEngineRunner> runner_;
  std::unique_ptr<Engine> engine_;
  std::vector<int32_t> cached_, other_;
  std::mutex mu_;
};

TEST_F(EngineLookupTest, AnAnswerInTimeAdmitsOntoTheHostsBlocks) {
  std::vector<int32_t> reference;
  WarmHostOnly(&reference);
  host_->set_held(true);
  Collected a;
  Submit(cached_, 8, &a);
  for (int i = 0; i < 5; ++i) Step();
  EXPECT_TRUE(a.tokens.empty());  // pending: not admitted
  EXPECT_EQ(kv_->num_requests(), 0u);
  host_->set_held(false);  // the answer arrives before the deadline
  RunUntilDone();
  EXPECT_EQ(a.tokens, reference);
  EXPECT_EQ(a.cached_tokens, static_cast<int32_t>((cached_.size() - 1) / kBlockSize * kBlockSize));
  EXPECT_EQ(kv_->device_pool().stats().in_use, 0);
}

TEST_F(EngineLookupTest, PastTheDeadlineTheRequestRunsAsAMissWhileOthersKeepGoing) {
  std::vector<int32_t> reference;
  WarmHostOnly(&reference);
  Collected running, waiting;
  // `other_` is admitted first (the index answers it at once).
  Submit(other_, 40, &running);
  Step();
  host_->set_held(true);
  Submit(cached_, 8, &waiting);
  const size_t before = running.tokens.size();
  for (int i = 0; i < 5; ++i) Step();
  EXPECT_GT(running.tokens.size(), before);  // a pending lookup stalls no step
  EXPECT_TRUE(waiting.tokens.empty());
  clock_.Advance(2'000'000'000);  // past lookup_timeout_seconds
  RunUntilDone();
  EXPECT_EQ(waiting.tokens, reference);  // recomputed: the same tokens
  EXPECT_EQ(waiting.cached_tokens, 0);   // the late answer counted as a miss
  EXPECT_EQ(kv_->device_pool().stats().in_use, 0);
  EXPECT_EQ(kv_->num_requests(), 0u);
}

}  // namespace
}  // namespace strata::scheduler
