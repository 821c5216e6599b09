// The int8-activation kernels (matmul_q8.h): activation quantization, each
// kernel against a double-precision reference of the same integer arithmetic
// at every SIMD level the machine has, and batch / path / thread invariance
// (bitwise).

#include "model/backend/cpu/matmul_q8.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <cstdint>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <type_traits>
#include <vector>

#include "model/backend/cpu/cpu_features.h"
#include "model/backend/cpu/matmul.h"
#include "model/backend/cpu/matmul_internal.h"
#include "model/backend/cpu/quant.h"
#include "tests/support/q8_args.h"
#include "tests/support/test_weights.h"

namespace strata::cpu::internal {
namespace {

constexpr DType kInt8Types[] = {DType::kQ8_0, DType::kQ4_0, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};

bool IsK(DType t) { return t == DType::kQ4_K || t == DType::kQ5_K || t == DType::kQ6_K; }

// MatMul takes the int8 path in this file.
class Int8Activations : public ::testing::Environment {
 public:
  void SetUp() override { SetActivationMode(ActivationMode::kInt8); }
  void TearDown() override { SetActivationMode(ActivationMode::kAuto); }
};
const auto* const kInt8Env = ::testing::AddGlobalTestEnvironment(new Int8Activations);

class LevelScope {
 public:
  explicit LevelScope(SimdLevel l) { SetSimdLevelOverride(l); }
  ~LevelScope() { SetSimdLevelOverride(std::nullopt); }
};

std::vector<SimdLevel> Levels() {
  std::vector<SimdLevel> v;
  for (int l = 0; l <= static_cast<int>(DetectedSimdLevel()); ++l) v.push_back(static_cast<SimdLevel>(l));
  return v;
}

using Weight = testing::TestWeight;

// testing::MakeTestWeight's weight (its `dense` is not kept up to date with
// the codes patched below: these tests decode `bytes` themselves).
Weight MakeWeight(DType type, int64_t rows, int64_t cols, uint32_t seed) {
  Weight w = testing::MakeTestWeight(type, rows, cols, seed);
  const size_t row_bytes = RowBytes(type, cols);
  // Extreme codes too: a Q8_0 weight of -128 (never written by the quantizer
  // but legal in a file) and a zero block.
  if (type == DType::kQ8_0 && rows > 1) {
    auto* blk = reinterpret_cast<BlockQ8_0*>(w.bytes.data() + row_bytes);
    for (int j = 0; j < 32; j += 3) blk->qs[j] = -128;
    auto* zero = reinterpret_cast<BlockQ8_0*>(w.bytes.data());
    for (int8_t& q : zero->qs) q = 0;
  }
  return w;
}

std::vector<float> RandomX(int64_t n, uint32_t seed) {
  std::vector<float> x = testing::GaussianVector(n, seed);
  // A block of outliers, as activations have.
  if (n >= 64) x[40] = 25.f;
  return x;
}

TEST(Q8ActivationTest, QuantizesAsGgmlQ8_0) {
  std::vector<float> x = RandomX(96, 1);
  x[64] = -3.f;  // the max of the third block, negative
  std::vector<int8_t> q(96);
  std::vector<float> d(3);
  std::vector<int16_t> bsum(3), bsum16(6);
  QuantizeActivationRow(x.data(), 96, 32, q.data(), d.data(), bsum.data(), bsum16.data());
  // The encoder of Q8_0 weights is ggml's reference; activations must match.
  std::vector<uint8_t> blocks(RowBytes(DType::kQ8_0, 96));
  QuantizeRow(DType::kQ8_0, x.data(), blocks.data(), 96);
  for (int b = 0; b < 3; ++b) {
    const auto* blk = reinterpret_cast<const BlockQ8_0*>(blocks.data()) + b;
    EXPECT_EQ(F32ToF16(d[b]), blk->d) << b;
    for (int j = 0; j < 32; ++j) EXPECT_EQ(q[b * 32 + j], blk->qs[j]) << b << " " << j;
    int sum = 0;
    for (int j = 0; j < 32; ++j) {
      EXPECT_LE(std::fabs(q[b * 32 + j] * d[b] - x[b * 32 + j]), d[b] * 0.5f * 1.0001f);
      sum += q[b * 32 + j];
    }
    EXPECT_EQ(bsum[b], sum);
  }
  EXPECT_EQ(q[64], -127);
}

// Every table's quantizer gives the scalar code's bytes, on ordinary rows,
// halves exactly at .5 after scaling, zero and non-finite blocks.
TEST(Q8ActivationTest, EveryLevelQuantizesTheSame) {
  for (int block : {32, 256}) {
    std::vector<float> x = RandomX(1024, 11);
    // A block (of either size) whose max is 127: d = 1, so x + 0.5 are exact halves.
    for (int j = 0; j < 256; ++j) x[256 + j] = static_cast<float>(j % 64 - 32) + 0.5f;
    x[256] = 127.f;
    for (int j = 0; j < 32; ++j) x[512 + j] = 0.f;
    x[800] = std::numeric_limits<float>::quiet_NaN();
    x[900] = -std::numeric_limits<float>::infinity();
    // A tiny block: d = max / 127 subnormal, 1 / d infinite (x / d then).
    for (int j = 0; j < 32; ++j) x[(block == 32 ? 576 : 0) + j] = static_cast<float>(j - 16) * 1e-39f;
    if (block == 256) {
      for (int j = 32; j < 256; ++j) x[j] = 0.f;
    }
    std::vector<int8_t> want_q(1024), q(1024);
    std::vector<float> want_d(1024 / block), d(1024 / block);
    std::vector<int16_t> want_b(32), b(32), want_b16(64), b16(64);
    QuantizeActivationRow(x.data(), 1024, block, want_q.data(), want_d.data(), want_b.data(), want_b16.data());
    EXPECT_EQ(want_q[257], -31);  // -30.5 rounds away from zero
    const int tiny = block == 32 ? 576 / 32 : 0;
    ASSERT_GT(want_d[tiny], 0.f);
    ASSERT_FALSE(std::isfinite(1.f / want_d[tiny]));
    for (int j = 0; j < 32; ++j) {
      const int i = tiny * block + j;
      EXPECT_LE(std::fabs(want_q[i] * want_d[tiny] - x[i]), want_d[tiny] * 0.5f * 1.0001f + 1e-45f) << i;
    }
    EXPECT_EQ(want_q[286], -2);   // -1.5
    for (const Q8KernelTable* t : {&ScalarQ8Kernels(), Avx2Q8Kernels(), Avx512VnniQ8Kernels()}) {
      if (t == nullptr) continue;
      t->quantize(x.data(), 1024, block, q.data(), d.data(), b.data(), b16.data());
      EXPECT_EQ(q, want_q) << t->name << " block " << block;
      for (size_t i = 0; i < d.size(); ++i) {
        EXPECT_EQ(std::memcmp(&d[i], &want_d[i], sizeof(float)), 0) << t->name << " " << i;
      }
      EXPECT_EQ(b, want_b) << t->name;
      EXPECT_EQ(b16, want_b16) << t->name;
    }
  }
}

// The K-quants' activations: one scale per 256, code sums per 32.
TEST(Q8ActivationTest, SuperBlocksOf256) {
  const std::vector<float> x = RandomX(512, 3);
  std::vector<int8_t> q(512);
  std::vector<float> d(2);
  std::vector<int16_t> bsum(16), bsum16(32);
  QuantizeActivationRow(x.data(), 512, 256, q.data(), d.data(), bsum.data(), bsum16.data());
  for (int b = 0; b < 2; ++b) {
    float amax = 0.f;
    for (int j = 0; j < 256; ++j) amax = std::max(amax, std::fabs(x[b * 256 + j]));
    EXPECT_EQ(d[b], amax / 127.f);
    for (int j = 0; j < 256; ++j) {
      EXPECT_LE(std::fabs(q[b * 256 + j] * d[b] - x[b * 256 + j]), d[b] * 0.5f * 1.0001f);
    }
  }
  for (int k = 0; k < 16; ++k) {
    int sum = 0;
    for (int j = 0; j < 32; ++j) sum += q[k * 32 + j];
    EXPECT_EQ(bsum[k], sum) << k;
  }
  for (int k = 0; k < 32; ++k) {
    int sum = 0;
    for (int j = 0; j < 16; ++j) sum += q[k * 16 + j];
    EXPECT_EQ(bsum16[k], sum) << k;
  }
  EXPECT_EQ(Q8ActBlockFor(DType::kQ4_K), 256);
  EXPECT_EQ(Q8ActBlockFor(DType::kQ5_K), 256);
  EXPECT_EQ(Q8ActBlockFor(DType::kQ8_0), 32);
}

TEST(Q8ActivationTest, ZeroAndNonFiniteBlocks) {
  std::vector<float> x(64, 0.f);
  x[40] = std::numeric_limits<float>::infinity();
  std::vector<int8_t> q(64, 5);
  std::vector<float> d(2);
  std::vector<int16_t> bsum(2), bsum16(4);
  QuantizeActivationRow(x.data(), 64, 32, q.data(), d.data(), bsum.data(), bsum16.data());
  EXPECT_EQ(d[0], 0.f);
  for (int j = 0; j < 32; ++j) EXPECT_EQ(q[j], 0);
  EXPECT_TRUE(std::isnan(d[1]));
}

// Every kernel on odd shapes (1 block, odd block counts for the AVX-512 pair
// tail, row and token counts that leave partial tiles) against the double
// reference of its own integer arithmetic: the integer sums are exact, so the
// only difference is f32 rounding of the per-block scaling and summation.
TEST(Q8KernelTest, MatchesDoubleReferenceAtEveryLevel) {
  for (DType type : kInt8Types) {
    const std::vector<int64_t> widths =
        IsK(type) ? std::vector<int64_t>{256, 768, 2048} : std::vector<int64_t>{32, 96, 160, 2048};
    const int block = Q8ActBlockFor(type);
    for (int64_t cols : widths) {
      // 16 and 35 rows: whole and partial groups of the 16-lane kernels.
      for (int64_t rows : {1, 3, 6, 13, 16, 35}) {
        const Weight w = MakeWeight(type, rows, cols, static_cast<uint32_t>(cols + rows));
        for (int64_t n_tokens : {1, 2, 3, 4, 5, 8, 9}) {
          const std::vector<float> x = RandomX(n_tokens * cols, static_cast<uint32_t>(n_tokens));
          Q8Activations act;
          QuantizeActivations(x.data(), n_tokens, cols, cols, block, &act, nullptr);
          const int64_t nb = cols / block;
          for (SimdLevel level : Levels()) {
            LevelScope scope(level);
            const Q8KernelTable& table = ActiveQ8Kernels();
            std::vector<float> y(static_cast<size_t>(n_tokens * rows), -1.f);
            Q8Args a = testing::Q8ArgsFor(w, act, 0, &y);
            table.rows[TypeIndex(type)](a);
            for (int64_t t = 0; t < n_tokens; ++t) {
              for (int64_t r = 0; r < rows; ++r) {
                const uint8_t* row = w.tensor.data + r * a.row_bytes;
                const double want = Q8ReferenceDot(type, row, cols, act.q.data() + t * cols,
                                                   act.d.data() + t * nb, act.bsum.data() + t * (cols / 32),
                                                   act.bsum16.data() + t * (cols / 16));
                // Bound: f32 rounding of the scaled sums, relative to the sum
                // of magnitudes (for the K-quants, of both terms: at most
                // d * 63 * 31 and dmin * 63 per element).
                double mag = 0.0;
                std::vector<float> dw(static_cast<size_t>(cols));
                DequantizeRow(type, row, dw.data(), cols);
                for (int64_t k = 0; k < cols; ++k) {
                  double wk = std::fabs(dw[k]);
                  if (type == DType::kQ6_K) {
                    // Both terms of sc_j (q - 32): at most 128 * 63 and 128 * 32.
                    const auto* sb = reinterpret_cast<const BlockQ6_K*>(row) + k / 256;
                    wk = std::fabs(F16ToF32(sb->d)) * 128 * 95;
                  } else if (IsK(type)) {
                    const uint8_t* sb = row + (k / 256) * RowBytes(type, 256);
                    uint16_t h[2];
                    std::memcpy(h, sb, sizeof(h));
                    wk = std::fabs(F16ToF32(h[0])) * 63 * 31 + std::fabs(F16ToF32(h[1])) * 63;
                  }
                  mag += wk * std::fabs(act.q[t * cols + k] * act.d[t * nb + k / block]);
                }
                EXPECT_LE(std::fabs(y[t * rows + r] - want), 1e-5 * mag + 1e-30)
                    << DTypeName(type) << " " << table.name << " cols=" << cols
                    << " rows=" << rows << " n=" << n_tokens << " r=" << r << " t=" << t;
              }
            }
          }
        }
      }
    }
  }
}

// PackLanes's copy (Tensor::lanes) gives the kernels' bits from the file's
// layout, for whole groups, tails, and row ranges that start inside a group
// (those groups are read from the file), at every level (the tables without
// reads_lanes ignore it); and MatMul passes it through over 1 and 2 threads.
TEST(Q8KernelTest, PackedLanesGiveTheSameBits) {
  ThreadPool one(1), two(2);
  for (DType type : {DType::kQ8_0, DType::kQ4_0, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}) {
    const std::vector<int64_t> widths = IsK(type) ? std::vector<int64_t>{256, 768, 2048} : std::vector<int64_t>{32, 96, 2048};
    for (int64_t cols : widths) {
      for (int64_t rows : {16, 35, 48}) {
        const Weight w = MakeWeight(type, rows, cols, static_cast<uint32_t>(7 * cols + rows));
        std::vector<uint8_t> packed(LanePackedBytes(w.tensor));
        // The file's bytes; Q4_K, Q5_K: 64 more per 16 rows and super-block.
        const bool unpacked_scales = type == DType::kQ4_K || type == DType::kQ5_K;
        const size_t want =
            static_cast<size_t>(rows / 16) * (16 * RowBytes(type, cols) + (unpacked_scales ? cols / 256 * 64 : 0));
        ASSERT_EQ(packed.size(), want);
        PackLanes(w.tensor, packed.data());
        Tensor with = w.tensor;
        with.lanes = packed.data();
        for (int64_t n_tokens : {1, 3, 9}) {
          const std::vector<float> x = RandomX(n_tokens * cols, static_cast<uint32_t>(n_tokens + cols));
          Q8Activations act;
          QuantizeActivations(x.data(), n_tokens, cols, cols, Q8ActBlockFor(type), &act, nullptr);
          for (SimdLevel level : Levels()) {
            LevelScope scope(level);
            const Q8KernelTable& table = ActiveQ8Kernels();
            for (int64_t begin : {int64_t{0}, int64_t{5}, int64_t{16}}) {
              if (begin >= rows) continue;
              std::vector<float> y[2];
              for (int k = 0; k < 2; ++k) {
                y[k].assign(static_cast<size_t>(n_tokens * rows), -1.f);
                Q8Args a = testing::Q8ArgsFor(w, act, begin, &y[k]);
                a.lanes = k == 0 ? nullptr : packed.data();
                table.rows[TypeIndex(type)](a);
              }
              for (size_t i = 0; i < y[0].size(); ++i) {
                ASSERT_EQ(std::memcmp(&y[0][i], &y[1][i], sizeof(float)), 0)
                    << DTypeName(type) << " " << table.name << " cols=" << cols << " rows=" << rows
                    << " begin=" << begin << " n=" << n_tokens << " i=" << i;
              }
            }
            for (ThreadPool* pool : {&one, &two}) {
              std::vector<float> want(static_cast<size_t>(n_tokens * rows)), got(want.size());
              MatMul(w.tensor, x.data(), n_tokens, want.data(), *pool);
              MatMul(with, x.data(), n_tokens, got.data(), *pool);
              ASSERT_EQ(std::memcmp(want.data(), got.data(), want.size() * sizeof(float)), 0)
                  << DTypeName(type) << " " << table.name << " MatMul cols=" << cols << " rows=" << rows;
            }
          }
        }
      }
    }
  }
}

// PackLanes's layout, byte by byte, for one Q4_0 and one Q8_0 group.
TEST(Q8KernelTest, PackLanesLayout) {
  for (DType type : {DType::kQ8_0, DType::kQ4_0}) {
    const int64_t cols = 64, nb = 2;
    const Weight w = MakeWeight(type, 17, cols, 3);
    std::vector<uint8_t> p(LanePackedBytes(w.tensor));
    PackLanes(w.tensor, p.data());
    const bool q4 = type == DType::kQ4_0;
    const size_t block_bytes = q4 ? sizeof(BlockQ4_0) : sizeof(BlockQ8_0);
    const int code_bytes = q4 ? 16 : 32;
    for (int64_t b = 0; b < nb; ++b) {
      for (int i = 0; i < 16; ++i) {
        const uint8_t* blk = w.tensor.row(i) + b * block_bytes;
        EXPECT_EQ(std::memcmp(p.data() + 32 * b + 2 * i, blk, 2), 0) << "scale " << b << " " << i;
        for (int j = 0; j < code_bytes; ++j) {
          const uint8_t want = q4 ? blk[2 + j] : static_cast<uint8_t>(blk[2 + j] + 128);
          const size_t at = static_cast<size_t>(nb * 32 + b * 16 * code_bytes + 64 * (j / 4) + 4 * i + j % 4);
          ASSERT_EQ(p[at], want) << DTypeName(type) << " block " << b << " row " << i << " code byte " << j;
        }
      }
    }
  }
}

// Packs a 512-column matrix of `type` (two whole groups of two super-blocks
// and a tail) and calls check(o, row, s, i) for super-block s of group row
// i: o, its packed bytes; row, the file's row. The copy is the file's bytes
// plus `extra` per 16 rows and super-block.
template <class Check>
void ForEachPackedSuperBlock(DType type, int64_t extra, Check&& check) {
  const int64_t cols = 512, nsb = 2;
  const Weight w = MakeWeight(type, 37, cols, static_cast<uint32_t>(type));
  std::vector<uint8_t> p(LanePackedBytes(w.tensor));
  const int64_t super = LaneSuperBytes(type);
  ASSERT_EQ(super, 16 * static_cast<int64_t>(RowBytes(type, 256)) + extra);
  ASSERT_EQ(p.size(), static_cast<size_t>(2 * nsb * super));
  PackLanes(w.tensor, p.data());
  for (int g = 0; g < 2; ++g) {
    for (int64_t s = 0; s < nsb; ++s) {
      for (int i = 0; i < 16; ++i) check(p.data() + (g * nsb + s) * super, w.tensor.row(16 * g + i), s, i);
    }
  }
}

// PackLanes's Q4_K and Q5_K layouts, byte by byte, against the file's
// fields and UnpackScaleMinK4.
template <class Block>
void ExpectQ45KLayout(DType type) {
  ForEachPackedSuperBlock(type, 64, [](const uint8_t* o, const uint8_t* row, int64_t s, int i) {
    const auto* blk = reinterpret_cast<const Block*>(row) + s;
    EXPECT_EQ(std::memcmp(o + 2 * i, &blk->d, 2), 0) << "d " << s << " " << i;
    EXPECT_EQ(std::memcmp(o + 32 + 2 * i, &blk->dmin, 2), 0) << "dmin " << s << " " << i;
    for (int j = 0; j < 8; ++j) {
      uint8_t sc = 0, m = 0;
      UnpackScaleMinK4(blk->scales, j, &sc, &m);
      EXPECT_EQ(o[64 + 16 * j + i], sc) << "scale " << j << " row " << i;
      EXPECT_EQ(o[192 + 32 * (j / 2) + 2 * i + j % 2], m) << "min " << j << " row " << i;
    }
    for (int b = 0; b < 128; ++b) {
      const int q = b / 32, k = b % 32 / 4;
      ASSERT_EQ(o[320 + 512 * q + 64 * k + 4 * i + b % 4], blk->qs[b]) << "code byte " << b << " row " << i;
    }
    if constexpr (std::is_same_v<Block, BlockQ5_K>) {
      for (int b = 0; b < 32; ++b) {
        ASSERT_EQ(o[2368 + 64 * (b / 4) + 4 * i + b % 4], blk->qh[b]) << "qh byte " << b << " row " << i;
      }
    }
  });
}

TEST(Q8KernelTest, PackLanesLayoutQ4KQ5K) {
  ExpectQ45KLayout<BlockQ4_K>(DType::kQ4_K);
  ExpectQ45KLayout<BlockQ5_K>(DType::kQ5_K);
}

// PackLanes's Q6_K layout, byte by byte (the file's size).
TEST(Q8KernelTest, PackLanesLayoutQ6K) {
  ForEachPackedSuperBlock(DType::kQ6_K, 0, [](const uint8_t* o, const uint8_t* row, int64_t s, int i) {
    const auto* blk = reinterpret_cast<const BlockQ6_K*>(row) + s;
    EXPECT_EQ(std::memcmp(o + 2 * i, &blk->d, 2), 0) << "d " << s << " " << i;
    for (int j = 0; j < 16; ++j) {
      EXPECT_EQ(static_cast<int8_t>(o[32 + 16 * j + i]), blk->scales[j]) << "scale " << j << " row " << i;
    }
    for (int h = 0; h < 2; ++h) {
      const uint8_t* half = o + 288 + 1536 * h;
      for (int b = 0; b < 32; ++b) {
        const size_t at = static_cast<size_t>(64 * (b / 4) + 4 * i + b % 4);
        ASSERT_EQ(half[at], blk->ql[64 * h + b]) << "ql " << h << " " << b << " row " << i;
        ASSERT_EQ(half[512 + at], blk->ql[64 * h + 32 + b]) << "ql " << h << " " << 32 + b << " row " << i;
        ASSERT_EQ(half[1024 + at], blk->qh[32 * h + b]) << "qh " << h << " " << b << " row " << i;
      }
    }
  });
}

// The tables this machine should have, named, so a lost dispatch shows.
TEST(Q8KernelTest, TablesPresentForTheCpu) {
  const CpuFeatures& f = GetCpuFeatures();
  EXPECT_EQ(Avx2Q8Kernels() != nullptr, f.avx2 && f.fma && f.f16c);
  EXPECT_EQ(Avx512VnniQ8Kernels() != nullptr,
            f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq && f.avx512_vnni && f.avx2);
  if (Avx512VnniQ8Kernels() != nullptr) {
    EXPECT_STREQ(ActiveQ8Kernels().name, "avx512-vnni");
  }
  for (DType t : kInt8Types) EXPECT_TRUE(Q8Supported(t));
  EXPECT_FALSE(Q8Supported(DType::kBF16));
  // The default uses int8 for the K-quants, and for Q4_0 where a lane
  // kernel runs (AVX2, AVX-512 VNNI; not the scalar table).
  for (DType t : {DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}) {
    EXPECT_TRUE(UsesIntegerActivations(t, ActivationMode::kAuto));
    EXPECT_FALSE(UsesIntegerActivations(t, ActivationMode::kExact));
  }
  for (SimdLevel level : Levels()) {
    LevelScope scope(level);
    const bool lanes = &ActiveQ8Kernels() != &ScalarQ8Kernels();
    EXPECT_EQ(ActiveQ8Kernels().reads_lanes, lanes) << static_cast<int>(level);
    // The K-quant lane kernels are AVX-512 VNNI's alone.
    for (DType t : {DType::kQ4_K, DType::kQ5_K, DType::kQ6_K}) {
      EXPECT_EQ(ReadsLanes(ActiveQ8Kernels(), t), &ActiveQ8Kernels() == Avx512VnniQ8Kernels())
          << static_cast<int>(level);
    }
    EXPECT_EQ(ReadsLanes(ActiveQ8Kernels(), DType::kQ8_0), lanes) << static_cast<int>(level);
    EXPECT_FALSE(ReadsLanes(ActiveQ8Kernels(), DType::kF16)) << static_cast<int>(level);
    EXPECT_EQ(UsesIntegerActivations(DType::kQ4_0, ActivationMode::kAuto), lanes) << static_cast<int>(level);
  }
  // Q8_0's default is wide activations (matmul_q8_wide_test.cc).
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
    EXPECT_FALSE(UsesIntegerActivations(t, ActivationMode::kAuto));
  }
  EXPECT_TRUE(UsesIntegerActivations(DType::kQ8_0, ActivationMode::kInt8));
  EXPECT_FALSE(UsesIntegerActivations(DType::kF16, ActivationMode::kInt8));
  EXPECT_FALSE(Q8Supported(DType::kF32));
}

// A token's output is bitwise the same alone, in any batch, at any thread
// count: what lets a cached prefix and a recomputed one agree.
TEST(Q8KernelTest, BatchAndThreadInvariantBitwise) {
  ThreadPool one(1), two(2);
  const int64_t rows = 37;
  for (DType type : kInt8Types) {
    const int64_t cols = IsK(type) ? 512 : 160;
    const Weight w = MakeWeight(type, rows, cols, 5);
    const int64_t n_max = 130;  // past the 64-token chunk and the old sgemm threshold
    const std::vector<float> x = RandomX(n_max * cols, 6);
    for (SimdLevel level : Levels()) {
      LevelScope scope(level);
      std::vector<float> alone(static_cast<size_t>(n_max * rows));
      for (int64_t t = 0; t < n_max; ++t) {
        MatMul(w.tensor, x.data() + t * cols, 1, alone.data() + t * rows, one);
      }
      for (int64_t n : {3, 7, 32, 64, 65, 130}) {
        for (ThreadPool* pool : {&one, &two}) {
          std::vector<float> y(static_cast<size_t>(n * rows));
          MatMul(w.tensor, x.data(), n, y.data(), *pool);
          for (int64_t i = 0; i < n * rows; ++i) {
            ASSERT_EQ(y[i], alone[i]) << DTypeName(type) << " " << SimdLevelName(level)
                                      << " n=" << n << " threads=" << pool->num_threads()
                                      << " i=" << i;
          }
        }
      }
    }
  }
}

// The int8 path is a bounded approximation of the exact product: within the
// activation quantization's error (half a step per element).
TEST(Q8KernelTest, CloseToTheExactProduct) {
  ThreadPool two(2);
  const int64_t cols = 2048, rows = 16, n = 5;
  for (DType type : kInt8Types) {
    const Weight w = MakeWeight(type, rows, cols, 8);
    const std::vector<float> x = RandomX(n * cols, 9);
    std::vector<float> exact(static_cast<size_t>(n * rows)), int8(exact.size());
    MatMulOptions exact_opt;
    exact_opt.force_activations = true;
    exact_opt.activations = ActivationMode::kExact;
    MatMulWithOptions(w.tensor, x.data(), n, exact.data(), two, exact_opt);
    MatMul(w.tensor, x.data(), n, int8.data(), two);
    std::vector<float> dw(cols);
    const int block = Q8ActBlockFor(type);
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t r = 0; r < rows; ++r) {
        DequantizeRow(type, w.tensor.data + r * RowBytes(type, cols), dw.data(), cols);
        double bound = 0.0;
        for (int64_t b = 0; b < cols / block; ++b) {
          float amax = 0.f;
          for (int j = 0; j < block; ++j) amax = std::max(amax, std::fabs(x[t * cols + b * block + j]));
          for (int j = 0; j < block; ++j) bound += std::fabs(dw[b * block + j]) * amax / 254.0;
        }
        const float e = exact[t * rows + r], q = int8[t * rows + r];
        EXPECT_LE(std::fabs(e - q), bound * 1.01 + 1e-3 * std::fabs(e)) << DTypeName(type);
        EXPECT_NE(e, q) << "the int8 path was not taken";
      }
    }
  }
}

TEST(Q8KernelTest, NonFiniteActivationsGiveNaN) {
  ThreadPool two(2);
  const Weight w = MakeWeight(DType::kQ8_0, 4, 64, 2);
  std::vector<float> x(64, 1.f);
  x[33] = std::numeric_limits<float>::quiet_NaN();
  std::vector<float> y(4);
  MatMul(w.tensor, x.data(), 1, y.data(), two);
  for (float v : y) EXPECT_TRUE(std::isnan(v));
}

}  // namespace
}  // namespace strata::cpu::internal
