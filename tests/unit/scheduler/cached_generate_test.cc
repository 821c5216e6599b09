// CachedGenerate on the real model (stories260K, f32 KV, block size 4):
// greedy tokens with the prefix from device, host and disk (after a
// "restart": new manager, reopened store, device memory scribbled) equal
// those of plain Generate(); each case asserts where its blocks came from.

#include "scheduler/cached_generate.h"

#include <gtest/gtest.h>

#include <cstring>

#include "kvcache/disk_store.h"
#include "kvcache/host_store.h"
#include "model/model_loader.h"
#include "tests/support/test_env.h"

namespace strata::scheduler {
namespace {

using kvcache::KvManager;
using kvcache::LowerTier;

constexpr int kBlockSize = 4;

class CachedGenerateTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto m = LoadModel(testing::Stories260KPath());
    ASSERT_TRUE(m.ok()) << m.error().ToString();
    model_ = std::move(m).value();
    threads_ = std::make_unique<ThreadPool>(1);
    KvOptions kv;
    kv.block_size = kBlockSize;
    kv.dtype = DType::kF32;
    kv.num_blocks = model_->weights.config.context_length / kBlockSize;
    engine_ = std::move(ForwardEngine::Create(model_->weights, kv, threads_.get())).value();
    opts_.sampling.temperature = 0;
    opts_.max_tokens = 12;
    a_ = TokenizePrompt(*model_,
                        "Once upon a time, there was a little girl named Lily. She loved to play");
    b_ = TokenizePrompt(
        *model_, "Once upon a time, there was a little girl named Lily. She had a big red ball");
    // The reference uses the engine's blocks 0..n: run it before any manager.
    auto ref = Generate(*engine_, *model_->tokenizer, b_, opts_);
    ASSERT_TRUE(ref.ok()) << ref.error().ToString();
    ref_b_ = ref->tokens;
  }

  std::unique_ptr<KvManager> Manager(std::vector<LowerTier> tiers) {
    kvcache::KvManagerOptions o;
    o.block_size = kBlockSize;
    o.num_device_blocks = engine_->num_blocks();
    o.block_bytes = engine_->kv_layout().block_bytes();
    o.ns = kvcache::NamespaceDigest(model_->weights.digest, model_->weights.config.arch, "f32",
                                    kBlockSize);
    o.load_policy = kvcache::LoadPolicy::kAlways;
    auto mem = [e = engine_.get()](BlockId id) {
      return e->block_data(static_cast<int32_t>(id.value()));
    };
    return std::move(KvManager::Create(o, mem, std::move(tiers), &clock_)).value();
  }

  Result<CachedGenerateOutput> Run(KvManager& mgr, const std::vector<int32_t>& prompt,
                                   uint64_t id) {
    CachedGenerateOptions c;
    c.request_id = RequestId(id);
    return CachedGenerate(*engine_, mgr, *model_->tokenizer, prompt, opts_, c);
  }

  void Scribble() {
    const size_t bytes = engine_->kv_layout().block_bytes();
    for (int b = 0; b < engine_->num_blocks(); ++b)
      std::memset(engine_->block_data(b), 0x7f, bytes);
  }

  kvcache::ManualClock clock_;
  std::unique_ptr<LoadedModel> model_;
  std::unique_ptr<ThreadPool> threads_;
  std::unique_ptr<ForwardEngine> engine_;
  GenerateOptions opts_;
  std::vector<int32_t> a_, b_, ref_b_;
};

TEST_F(CachedGenerateTest, ColdRunEqualsGenerate) {
  auto mgr = Manager({});
  auto out = Run(*mgr, b_, 1);
  ASSERT_TRUE(out.ok()) << out.error().ToString();
  EXPECT_EQ(out->cached_tokens, 0);
  EXPECT_EQ(out->gen.tokens, ref_b_);
  EXPECT_EQ(mgr->num_requests(), 0u);
  EXPECT_EQ(mgr->device_pool().stats().in_use, 0);
}

TEST_F(CachedGenerateTest, PrefixFromDevice) {
  auto mgr = Manager({});
  ASSERT_TRUE(Run(*mgr, a_, 1).ok());
  auto out = Run(*mgr, b_, 2);
  ASSERT_TRUE(out.ok()) << out.error().ToString();
  EXPECT_GT(out->cached_tokens, kBlockSize);
  EXPECT_EQ(out->tier_hit_tokens.at(0), out->cached_tokens);
  EXPECT_EQ(out->gen.tokens, ref_b_);
}

TEST_F(CachedGenerateTest, PrefixFromHostWithAFreshDevicePool) {
  auto host =
      std::move(kvcache::HostStore::Create({1 << 20, engine_->kv_layout().block_bytes(), false}))
          .value();
  {
    auto mgr = Manager({{host.get()}});
    ASSERT_TRUE(Run(*mgr, a_, 1).ok());
  }
  Scribble();
  auto mgr = Manager({{host.get()}});
  auto out = Run(*mgr, b_, 2);
  ASSERT_TRUE(out.ok()) << out.error().ToString();
  EXPECT_GT(out->cached_tokens, kBlockSize);
  EXPECT_EQ(out->tier_names.at(1), "host");
  EXPECT_EQ(out->tier_hit_tokens.at(1), out->cached_tokens);
  EXPECT_GT(mgr->stats().tiers.at(0).hits.blocks, 0u);
  EXPECT_EQ(out->gen.tokens, ref_b_);
}

TEST_F(CachedGenerateTest, PrefixFromDiskAfterRestart) {
  const uint64_t block_bytes = engine_->kv_layout().block_bytes();
  ASSERT_GE(block_bytes, 4096u);  // DiskStore's minimum: 5 layers x 2 x 4 x 32 x 4 B = 5120
  kvcache::DiskStoreOptions d;
  d.directory = testing::MakeTempDir("strata-cached-gen-") + "/kv";
  d.capacity_bytes = 8ull << 20;
  d.block_bytes = block_bytes;
  d.grow_bytes = 1ull << 20;
  d.reserve_bytes = 0;
  {
    auto disk = std::move(kvcache::DiskStore::Open(d)).value();
    auto mgr = Manager({{disk.get()}});
    ASSERT_TRUE(Run(*mgr, a_, 1).ok());
  }  // manager drains, store closes: a restart
  Scribble();
  auto disk = kvcache::DiskStore::Open(d);
  ASSERT_TRUE(disk.ok()) << disk.error().ToString();
  auto mgr = Manager({{disk->get()}});
  auto out = Run(*mgr, b_, 2);
  ASSERT_TRUE(out.ok()) << out.error().ToString();
  EXPECT_GT(out->cached_tokens, kBlockSize);
  EXPECT_EQ(out->tier_names.at(1), "disk");
  EXPECT_EQ(out->tier_hit_tokens.at(1), out->cached_tokens);
  EXPECT_GT(mgr->stats().tiers.at(0).bytes_up, 0u);
  EXPECT_EQ(out->gen.tokens, ref_b_);
}

TEST_F(CachedGenerateTest, TooSmallPoolIsResourceExhausted) {
  kvcache::KvManagerOptions o;
  o.block_size = kBlockSize;
  o.num_device_blocks = 2;
  o.block_bytes = engine_->kv_layout().block_bytes();
  auto mem = [e = engine_.get()](BlockId id) {
    return e->block_data(static_cast<int32_t>(id.value()));
  };
  auto mgr = std::move(KvManager::Create(o, mem, std::vector<LowerTier>{}, &clock_)).value();
  auto out = Run(*mgr, b_, 1);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.error().code(), StatusCode::kResourceExhausted);
  EXPECT_EQ(mgr->num_requests(), 0u);
}

}  // namespace
}  // namespace strata::scheduler
