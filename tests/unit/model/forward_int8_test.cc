// With int8 activations (cpu::ActivationMode::kInt8), and with Q8_0's
// default wide (int16) ones, a token's logits do not depend on the batch it
// is in, on how its prompt was chunked, or on the thread count: bitwise.
// This is what lets a prefix loaded from the KV cache and the same prefix
// recomputed give identical logits on quantized weights.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <memory>
#include <numeric>
#include <span>
#include <string>
#include <vector>

#include "common/thread_pool.h"
#include "model/backend/cpu/matmul.h"
#include "model/backend/cpu/matmul_q8.h"
#include "model/forward.h"
#include "model/synth.h"
#include "model/weight_pack.h"

namespace strata {
namespace {

// A weight type and the activation mode its test runs in.
struct Case {
  DType type;
  cpu::ActivationMode mode;
};

constexpr int kVocab = 101;
constexpr int kBlock = 4;
constexpr int kBlocksPerSeq = 20;  // 80 positions

// Widths that fit the type's blocks: 32 for Q8_0/Q4_0, 256 for the K-quants.
ModelConfig Shape(DType t) {
  const bool k = t == DType::kQ4_K || t == DType::kQ5_K || t == DType::kQ6_K;
  ModelConfig c;
  c.arch = "llama";
  c.dim = k ? 256 : 64;
  c.n_layers = 3;
  c.n_heads = 8;
  c.n_kv_heads = 2;
  c.head_dim = c.dim / 8;
  c.ffn_dim = k ? 512 : 160;
  c.vocab_size = kVocab;
  c.context_length = 128;
  c.rms_eps = 1e-5f;
  c.rope_theta = 10000.0f;
  return c;
}

std::vector<int32_t> Tokens(int n, uint32_t seed) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  uint32_t s = seed * 2654435761u + 1;
  for (auto& v : t) {
    s = s * 1664525u + 1013904223u;
    v = static_cast<int32_t>((s >> 8) % kVocab);
  }
  return t;
}

std::vector<int32_t> Table(int seq) {
  std::vector<int32_t> b(kBlocksPerSeq);
  std::iota(b.begin(), b.end(), seq * kBlocksPerSeq);
  return b;
}

class Int8Forward : public ::testing::TestWithParam<Case> {
 protected:
  void SetUp() override {
    cpu::SetActivationMode(GetParam().mode);
    if (GetParam().mode == cpu::ActivationMode::kAuto &&
        cpu::ActivationsFor(GetParam().type, cpu::ActivationMode::kAuto) != cpu::ActivationKind::kWide) {
      GTEST_SKIP() << "no wide kernel at this SIMD level: the default is f32 activations for "
                   << DTypeName(GetParam().type);
    }
    SynthOptions opt;
    opt.dtype = GetParam().type;
    opt.seed = 5;
    w_ = std::move(MakeSyntheticWeights(Shape(opt.dtype), opt).value());
    ASSERT_EQ(w_.layers[0].wq.type, opt.dtype);
    // As loading does: Q4_0 / Q8_0 matrices get the lane kernel's packed copy
    // where it runs (model/weight_pack.h), so these tests cover that path.
    PackWeightsForInt8(&w_, {});
  }
  void TearDown() override { cpu::SetActivationMode(cpu::ActivationMode::kAuto); }
  std::unique_ptr<ForwardEngine> Engine(ThreadPool* pool) { return Engine(w_, pool); }
  static std::unique_ptr<ForwardEngine> Engine(const ModelWeights& w, ThreadPool* pool) {
    KvOptions kv;
    kv.block_size = kBlock;
    kv.dtype = DType::kF16;
    kv.num_blocks = 32 * kBlocksPerSeq;
    return std::move(ForwardEngine::Create(w, kv, pool).value());
  }
  // Logits of every position of `p` (sequence slot 0), fed `chunk` tokens
  // per Forward call.
  std::vector<float> Chunked(const std::vector<int32_t>& p, size_t chunk, ThreadPool* pool) {
    return Chunked(w_, p, chunk, pool);
  }
  static std::vector<float> Chunked(const ModelWeights& w, const std::vector<int32_t>& p, size_t chunk,
                                    ThreadPool* pool) {
    auto eng = Engine(w, pool);
    const std::vector<int32_t> table = Table(0);
    std::vector<float> all, lg;
    for (size_t start = 0; start < p.size(); start += chunk) {
      const size_t n = std::min(chunk, p.size() - start);
      ForwardSeq c{std::span<const int32_t>(p.data() + start, n), static_cast<int32_t>(start), table, true};
      EXPECT_TRUE(eng->Forward({&c, 1}, &lg).ok());
      all.insert(all.end(), lg.begin(), lg.end());
    }
    return all;
  }
  ModelWeights w_;
};

void ExpectBitwise(const std::vector<float>& got, const std::vector<float>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(std::memcmp(&got[i], &want[i], sizeof(float)), 0)
        << what << ": position " << i / kVocab << " logit " << i % kVocab << " " << got[i] << " vs " << want[i];
  }
}

TEST_P(Int8Forward, ChunkingAndThreadsDoNotChangeLogits) {
  ThreadPool one(1), two(2);
  const std::vector<int32_t> p = Tokens(70, 3);
  const std::vector<float> want = Chunked(p, 1, &one);
  for (size_t chunk : {size_t{7}, size_t{64}, p.size()}) {
    ExpectBitwise(Chunked(p, chunk, &two), want, "chunk " + std::to_string(chunk) + ", 2 threads");
  }
  ExpectBitwise(Chunked(p, 7, &one), want, "chunk 7, 1 thread");
  ExpectBitwise(Chunked(p, 1, &two), want, "chunk 1, 2 threads");
}

// Sequence 0's prompt prefilled alone, then in one batch with 2 and with 31
// other sequences (prompts of other lengths), then decoded 3 steps in each.
TEST_P(Int8Forward, BatchSizeDoesNotChangeLogits) {
  ThreadPool two(2);
  const std::vector<int32_t> p = Tokens(21, 7);
  std::vector<std::vector<float>> want;
  for (int batch : {1, 3, 32}) {
    auto eng = Engine(&two);
    std::vector<std::vector<int32_t>> prompts = {p};
    for (int s = 1; s < batch; ++s) prompts.push_back(Tokens(5 + s % 17, 100 + s));
    std::vector<std::vector<int32_t>> tables;
    for (int s = 0; s < batch; ++s) tables.push_back(Table(s));
    std::vector<ForwardSeq> fs;
    for (int s = 0; s < batch; ++s) fs.push_back({prompts[s], 0, tables[s], s == 0});
    std::vector<float> lg;
    ASSERT_TRUE(eng->Forward(fs, &lg).ok());
    std::vector<std::vector<float>> got = {std::vector<float>(lg.begin(), lg.begin() + p.size() * kVocab)};
    // Decode: every sequence adds token 1 + step.
    std::vector<std::vector<int32_t>> seqs = prompts;
    for (int step = 0; step < 3; ++step) {
      fs.clear();
      for (int s = 0; s < batch; ++s) {
        seqs[s].push_back(1 + step);
        fs.push_back({std::span<const int32_t>(&seqs[s].back(), 1), static_cast<int32_t>(seqs[s].size() - 1),
                      tables[s]});
      }
      ASSERT_TRUE(eng->Forward(fs, &lg).ok());
      got.emplace_back(lg.begin(), lg.begin() + kVocab);
    }
    if (want.empty()) {
      want = got;
      continue;
    }
    for (size_t i = 0; i < got.size(); ++i) {
      ExpectBitwise(got[i], want[i], "batch " + std::to_string(batch) + (i == 0 ? " prefill" : " decode"));
    }
  }
}

// The packed copy (Tensor::lanes) gives the bits the file's layout gives:
// weights packed and not, prompts fed whole, in chunks of 7 and token by
// token. Shape(): matrices of 16 to 160 rows and the 101-row output (6 whole
// groups and a tail of 5).
TEST_P(Int8Forward, PackedWeightsGiveTheSameLogits) {
  SynthOptions opt;
  opt.dtype = GetParam().type;
  opt.seed = 5;
  ModelWeights file = std::move(MakeSyntheticWeights(Shape(opt.dtype), opt).value());
  ModelWeights packed = std::move(MakeSyntheticWeights(Shape(opt.dtype), opt).value());
  const int n = PackWeightsForInt8(&packed, {});
  if (!cpu::internal::LanePackable(opt.dtype)) {
    EXPECT_EQ(n, 0) << "only Q4_0, Q8_0 and the K-quants have a packed layout";
    return;
  }
  if (!cpu::internal::ReadsLanes(cpu::internal::ActiveQ8Kernels(), opt.dtype)) {
    EXPECT_EQ(n, 0);
    GTEST_SKIP() << "no lane kernel at this SIMD level: nothing packed";
  }
  EXPECT_EQ(n, 3 * 7 + 1);  // 7 matrices per layer and the output
  EXPECT_NE(packed.output.lanes, nullptr);
  EXPECT_EQ(file.output.lanes, nullptr);
  ThreadPool two(2);
  const std::vector<int32_t> p = Tokens(70, 3);
  for (size_t chunk : {size_t{1}, size_t{7}, p.size()}) {
    ExpectBitwise(Chunked(packed, p, chunk, &two), Chunked(file, p, chunk, &two),
                  "packed vs file layout, chunk " + std::to_string(chunk));
  }
}

constexpr cpu::ActivationMode kInt8 = cpu::ActivationMode::kInt8;
INSTANTIATE_TEST_SUITE_P(Types, Int8Forward,
                         ::testing::Values(Case{DType::kQ8_0, kInt8}, Case{DType::kQ4_0, kInt8}, Case{DType::kQ4_K, kInt8},
                                           Case{DType::kQ5_K, kInt8}, Case{DType::kQ6_K, kInt8},
                                           Case{DType::kQ8_0, cpu::ActivationMode::kAuto}),
                         [](const auto& info) {
                           return std::string(DTypeName(info.param.type)) +
                                  (info.param.mode == cpu::ActivationMode::kAuto ? "_wide" : "");
                         });

}  // namespace
}  // namespace strata
