// The CPU backend (model/backend/cpu/cpu_backend.h): the KV pool is a
// registered segment of host memory; the forward pass over it computes what
// a ForwardEngine with a pool of its own computes; a block copied with the
// backend's copy engine is read by the next forward as if computed there;
// pools of another backend and empty pools are refused.

#include "model/backend/cpu/cpu_backend.h"

#include <gtest/gtest.h>

#include "model/forward.h"
#include "model/synth.h"

namespace strata {
namespace {

constexpr int kBs = 4;

ModelWeights Weights() {
  ModelConfig c;
  c.arch = "llama";
  c.dim = 64;
  c.n_layers = 2;
  c.n_heads = 8;
  c.n_kv_heads = 2;
  c.head_dim = 8;
  c.ffn_dim = 128;
  c.vocab_size = 97;
  c.context_length = 64;
  c.rms_eps = 1e-5f;
  SynthOptions o;
  o.seed = 5;
  return std::move(MakeSyntheticWeights(c, o)).value();
}

KvLayout LayoutOf(const ModelConfig& c) { return {c.n_layers, c.n_kv_heads, c.head_dim, kBs, DType::kF32}; }

std::vector<int32_t> Prompt(int n) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) t[static_cast<size_t>(i)] = (i * 13 + 5) % 97;
  return t;
}

TEST(CpuBackend, ThePoolIsARegisteredHostSegment) {
  const ModelWeights w = Weights();
  ThreadPool threads(2);
  CpuBackend b(&threads);
  EXPECT_EQ(b.name(), "cpu");
  auto pool = b.AllocateKvPool(LayoutOf(w.config), 8);
  ASSERT_TRUE(pool.ok()) << pool.error().ToString();
  const auto seg = b.segments().Get(pool->segment);
  ASSERT_TRUE(seg.has_value());
  EXPECT_EQ(seg->kind, SegmentKind::kHost);
  EXPECT_EQ(seg->base, pool->base);
  EXPECT_EQ(seg->size, 8 * LayoutOf(w.config).block_bytes());
  EXPECT_EQ(reinterpret_cast<uintptr_t>(pool->base) % 4096, 0u);
  EXPECT_EQ(b.AllocateKvPool(LayoutOf(w.config), 0).error().code(), StatusCode::kInvalidArgument);
}

TEST(CpuBackend, ForwardOverTheBackendPoolEqualsAnEngineWithItsOwnPool) {
  const ModelWeights w = Weights();
  ThreadPool threads(2);
  CpuBackend b(&threads);
  auto pool = b.AllocateKvPool(LayoutOf(w.config), 8);
  ASSERT_TRUE(pool.ok());
  auto fwd = b.CreateForward(w, *pool);
  ASSERT_TRUE(fwd.ok()) << fwd.error().ToString();
  EXPECT_EQ((*fwd)->num_blocks(), 8);
  EXPECT_EQ((*fwd)->vocab_size(), 97);
  EXPECT_EQ((*fwd)->context_length(), 64);
  KvOptions own{kBs, DType::kF32, 8};
  auto ref = ForwardEngine::Create(w, own, &threads);
  ASSERT_TRUE(ref.ok());
  const auto toks = Prompt(10);
  const std::vector<int32_t> table = {0, 1, 2};
  ForwardSeq seq{toks, 0, table, true};
  std::vector<float> a, r;
  ASSERT_TRUE((*fwd)->Forward({&seq, 1}, &a).ok());
  ASSERT_TRUE((*ref)->Forward({&seq, 1}, &r).ok());
  EXPECT_EQ(a, r);  // same kernels, same order: bit for bit
}

TEST(CpuBackend, ABlockCopiedWithTheCopyEngineIsReadByTheNextForward) {
  const ModelWeights w = Weights();
  ThreadPool threads(2);
  CpuBackend b(&threads);
  auto pool = b.AllocateKvPool(LayoutOf(w.config), 8);
  ASSERT_TRUE(pool.ok());
  auto fwd = std::move(b.CreateForward(w, *pool)).value();
  // Prefill 8 tokens into blocks 0 and 1, then compute the ninth over them.
  const auto toks = Prompt(9);
  const std::vector<int32_t> table = {0, 1, 2};
  ForwardSeq first{std::span<const int32_t>(toks).first(8), 0, table};
  std::vector<float> scratch, want, cold;
  ASSERT_TRUE(fwd->Forward({&first, 1}, &scratch).ok());
  ForwardSeq ninth{std::span<const int32_t>(toks).subspan(8), 8, table};
  ASSERT_TRUE(fwd->Forward({&ninth, 1}, &want).ok());
  // Over blocks nobody filled (5, 6: zeros) the ninth token comes out
  // otherwise: the comparison below can fail.
  const std::vector<int32_t> copied = {5, 6, 7};
  ForwardSeq last{std::span<const int32_t>(toks).subspan(8), 8, copied};
  ASSERT_TRUE(fwd->Forward({&last, 1}, &cold).ok());
  EXPECT_NE(cold, want);
  // Copy blocks 0 and 1 to blocks 5 and 6 through the copy engine, then
  // compute the ninth token over the copies.
  const uint64_t bb = pool->layout.block_bytes();
  for (int i = 0; i < 2; ++i)
    ASSERT_TRUE(
        b.copy_engine().Submit(Region{pool->segment, (5u + i) * bb, bb}, Region{pool->segment, i * bb, bb}, 0).ok());
  std::vector<float> got;
  ASSERT_TRUE(fwd->Forward({&last, 1}, &got).ok());
  EXPECT_TRUE(b.copy_engine().Reached(b.copy_engine().Fence()));
  ASSERT_EQ(got.size(), want.size());
  EXPECT_EQ(got, want);
}

TEST(CpuBackend, RefusesAPoolItDidNotAllocate) {
  const ModelWeights w = Weights();
  ThreadPool threads(2);
  CpuBackend a(&threads), b(&threads);
  auto pool = a.AllocateKvPool(LayoutOf(w.config), 4);
  ASSERT_TRUE(pool.ok());
  EXPECT_EQ(b.CreateForward(w, *pool).error().code(), StatusCode::kInvalidArgument);
  KvLayout wrong = LayoutOf(w.config);
  wrong.n_layers += 1;
  auto other = a.AllocateKvPool(wrong, 4);
  ASSERT_TRUE(other.ok());
  EXPECT_EQ(a.CreateForward(w, *other).error().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace strata
