// Exactness with the real model (stories260K): greedy generation whose prompt
// prefix comes from device blocks, or from the host tier after the device copy
// was evicted and the pool scribbled over, produces exactly the tokens of a
// cold run; each case asserts its tier's hit counter rose.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>

#include "kvcache/eviction_policy.h"
#include "kvcache/host_store.h"
#include "kvcache/kv_manager.h"
#include "model/forward.h"
#include "model/model_loader.h"
#include "tests/support/test_env.h"

namespace strata::kvcache {
namespace {

constexpr int kBlockSize = 4;
constexpr int kNumBlocks = 64;
constexpr int kNewTokens = 12;

// Parameter: the eviction policy of the device pool and the host tier.
class KvExactnessTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    auto m = LoadModel(testing::Stories260KPath());
    ASSERT_TRUE(m.ok()) << m.error().ToString();
    model_ = std::move(m).value();
    threads_ = std::make_unique<ThreadPool>(1);
    KvOptions kv;
    kv.block_size = kBlockSize;
    kv.dtype = DType::kF32;
    kv.num_blocks = kNumBlocks;
    auto e = ForwardEngine::Create(model_->weights, kv, threads_.get());
    ASSERT_TRUE(e.ok()) << e.error().ToString();
    engine_ = std::move(e).value();
  }

  std::unique_ptr<KvManager> MakeManager(BlockStore* host) {
    KvManagerOptions o;
    o.block_size = kBlockSize;
    o.num_device_blocks = engine_->num_blocks();
    o.block_bytes = engine_->kv_layout().block_bytes();
    o.ns = NamespaceDigest(model_->weights.digest, model_->weights.config.arch, "f32", kBlockSize);
    o.load_policy = LoadPolicy::kAlways;
    o.eviction_policy = GetParam();
    auto mem = [e = engine_.get()](BlockId id) { return e->block_data(static_cast<int32_t>(id.value())); };
    auto m = KvManager::Create(o, mem, host, &clock_);
    EXPECT_TRUE(m.ok());
    return std::move(m).value();
  }

  // Greedy generation through the manager; returns the new tokens.
  std::vector<int32_t> Generate(KvManager& mgr, uint64_t id, const std::vector<int32_t>& prompt) {
    const RequestId rid(id);
    EXPECT_TRUE(mgr.AddRequest(rid, prompt, {}).ok());
    auto a = mgr.Allocate(rid, static_cast<int32_t>(prompt.size()) + kNewTokens);
    EXPECT_TRUE(a.ok() && *a == AllocOutcome::kAllocated);
    mgr.Poll();
    EXPECT_TRUE(mgr.IsReady(rid));
    std::vector<int32_t> tokens = prompt;
    int32_t pos = mgr.CachedTokens(rid);
    std::vector<int32_t> out;
    std::vector<float> logits;
    const int vocab = engine_->config().vocab_size;
    while (static_cast<int>(out.size()) < kNewTokens) {
      ForwardSeq seq{std::span<const int32_t>(tokens).subspan(static_cast<size_t>(pos)), pos, mgr.BlockTable(rid)};
      Status s = engine_->Forward({&seq, 1}, &logits);
      EXPECT_TRUE(s.ok()) << s.ToString();
      if (!s.ok()) break;
      pos = static_cast<int32_t>(tokens.size());
      EXPECT_TRUE(mgr.Commit(rid, tokens).ok());
      const int32_t next = static_cast<int32_t>(std::max_element(logits.begin(), logits.begin() + vocab) - logits.begin());
      out.push_back(next);
      tokens.push_back(next);
    }
    mgr.Poll();
    mgr.Free(rid);
    return out;
  }

  void EvictDeviceAndScribble(KvManager& mgr) {
    // A request that takes every block evicts all cached ones.
    std::vector<int32_t> filler(static_cast<size_t>(kNumBlocks * kBlockSize), 3);
    ASSERT_TRUE(mgr.AddRequest(RequestId(999), filler, {}).ok());
    ASSERT_EQ(*mgr.Allocate(RequestId(999), kNumBlocks * kBlockSize), AllocOutcome::kAllocated);
    mgr.Free(RequestId(999));
    mgr.Poll();
    const size_t bytes = engine_->kv_layout().block_bytes();
    for (int b = 0; b < kNumBlocks; ++b) std::memset(engine_->block_data(b), 0x7f, bytes);  // NaN-ish garbage
  }

  std::vector<int32_t> PromptA() { return TokenizePrompt(*model_, "Once upon a time, there was a little girl named Lily. She loved to play"); }
  std::vector<int32_t> PromptB() { return TokenizePrompt(*model_, "Once upon a time, there was a little girl named Lily. She had a big red ball"); }

  ManualClock clock_;
  std::unique_ptr<LoadedModel> model_;
  std::unique_ptr<ThreadPool> threads_;
  std::unique_ptr<ForwardEngine> engine_;
};

TEST_P(KvExactnessTest, PrefixFromDeviceMatchesColdRun) {
  auto a = PromptA(), b = PromptB();
  ASSERT_GT(b.size(), 3u * kBlockSize);
  auto cold_mgr = MakeManager(nullptr);
  const auto cold_b = Generate(*cold_mgr, 1, b);
  ASSERT_EQ(cold_mgr->stats().device.blocks, 0u);

  auto mgr = MakeManager(nullptr);
  Generate(*mgr, 1, a);
  const auto warm_b = Generate(*mgr, 2, b);
  EXPECT_GT(mgr->stats().device.blocks, 1u);
  EXPECT_EQ(warm_b, cold_b);
}

TEST_P(KvExactnessTest, PrefixFromHostMatchesColdRun) {
  auto a = PromptA(), b = PromptB();
  auto cold_mgr = MakeManager(nullptr);
  const auto cold_b = Generate(*cold_mgr, 1, b);

  auto host = std::move(HostStore::Create({256ull * engine_->kv_layout().block_bytes(),
                                           engine_->kv_layout().block_bytes(), false, true, {}, GetParam()}))
                  .value();
  auto mgr = MakeManager(host.get());
  Generate(*mgr, 1, a);
  EvictDeviceAndScribble(*mgr);
  ASSERT_EQ(mgr->Match(b, {}).device_tokens, 0);
  ASSERT_GT(mgr->Match(b, {}).lower_tokens, kBlockSize);
  const auto warm_b = Generate(*mgr, 2, b);
  EXPECT_EQ(mgr->stats().device.blocks, 0u);
  EXPECT_GT(mgr->stats().lower.blocks, 1u);
  EXPECT_GT(mgr->stats().bytes_up, 0u);
  EXPECT_EQ(warm_b, cold_b);
}

INSTANTIATE_TEST_SUITE_P(Policies, KvExactnessTest, ::testing::ValuesIn(EvictionPolicyNames()),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace strata::kvcache
