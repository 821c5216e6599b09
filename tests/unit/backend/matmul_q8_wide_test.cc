// Wide (int16) activations for Q8_0 weights (matmul_q8.h): the quantizer's
// codes and planes, each level's kernel against a double reference of the
// same integer arithmetic (file layout and packed lanes, odd shapes, tails,
// row ranges that start inside a group), batch / thread invariance through
// MatMul, the error bound against f32 activations, and which kind
// `engine.activations: auto` picks.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "model/backend/cpu/cpu_features.h"
#include "model/backend/cpu/matmul.h"
#include "model/backend/cpu/matmul_internal.h"
#include "model/backend/cpu/matmul_q8.h"
#include "model/backend/cpu/quant.h"
#include "tests/support/q8_args.h"
#include "tests/support/test_weights.h"

namespace strata::cpu::internal {
namespace {

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

// A Q8_0 weight with a zero block and codes of -128 (legal in a file).
testing::TestWeight MakeWeight(int64_t rows, int64_t cols, uint32_t seed) {
  testing::TestWeight w = testing::MakeTestWeight(DType::kQ8_0, rows, cols, seed);
  const size_t row_bytes = RowBytes(DType::kQ8_0, cols);
  if (rows > 1) {
    auto* blk = reinterpret_cast<BlockQ8_0*>(w.bytes.data() + row_bytes);
    for (int j = 0; j < 32; j += 3) blk->qs[j] = -128;
    for (int8_t& q : reinterpret_cast<BlockQ8_0*>(w.bytes.data())->qs) q = 0;
  }
  return w;
}

std::vector<float> RandomX(int64_t n, uint32_t seed) {
  std::vector<float> x = testing::GaussianVector(n, seed);
  if (n >= 64) x[40] = 25.f;  // an outlier block
  return x;
}

TEST(WideActivationTest, CodesPlanesAndSums) {
  std::vector<float> x = RandomX(128, 4);
  x[64] = -9.f;  // the third block's max, negative
  // The fourth block: max 32512 so d = 1, and exact halves.
  for (int j = 0; j < 32; ++j) x[96 + j] = static_cast<float>(j * 1000 - 16000) + 0.5f;
  x[96] = static_cast<float>(kWideMax);
  std::vector<int8_t> hi(128), lo(128);
  std::vector<float> d(4);
  std::vector<int16_t> hs(4), ls(4);
  QuantizeActivationRowWide(x.data(), 128, hi.data(), lo.data(), d.data(), hs.data(), ls.data());
  for (int b = 0; b < 4; ++b) {
    float amax = 0.f;
    for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[b * 32 + j]));
    EXPECT_EQ(d[b], amax / static_cast<float>(kWideMax)) << b;
    int hsum = 0, lsum = 0;
    for (int j = 0; j < 32; ++j) {
      const int i = b * 32 + j;
      ASSERT_LE(std::abs(int{hi[i]}), 127);
      ASSERT_LE(std::abs(int{lo[i]}), 127);
      const int q = 255 * hi[i] + lo[i];
      EXPECT_LE(std::fabs(static_cast<double>(q) * d[b] - x[i]), d[b] * 0.5 * 1.0001) << i;
      hsum += hi[i];
      lsum += lo[i];
    }
    EXPECT_EQ(hs[b], hsum);
    EXPECT_EQ(ls[b], lsum);
  }
  EXPECT_EQ(255 * hi[64] + lo[64], -kWideMax);
  EXPECT_EQ(255 * hi[96] + lo[96], kWideMax);
  EXPECT_EQ(255 * hi[97] + lo[97], -15000);  // -14999.5 rounds away from zero
  EXPECT_EQ(255 * hi[113] + lo[113], 1001);  // 1000.5
}

TEST(WideActivationTest, ZeroAndNonFiniteBlocks) {
  std::vector<float> x(64, 0.f);
  x[40] = std::numeric_limits<float>::quiet_NaN();
  x[41] = 7.f;
  std::vector<int8_t> hi(64, 5), lo(64, 5);
  std::vector<float> d(2);
  std::vector<int16_t> hs(2, 9), ls(2, 9);
  QuantizeActivationRowWide(x.data(), 64, hi.data(), lo.data(), d.data(), hs.data(), ls.data());
  EXPECT_EQ(d[0], 0.f);
  EXPECT_TRUE(std::isnan(d[1]));
  for (int j = 0; j < 64; ++j) EXPECT_EQ(hi[j] | lo[j], 0) << j;
  EXPECT_EQ(hs[0] | hs[1] | ls[0] | ls[1], 0);
}

// Every table's wide quantizer gives the scalar code's bytes: on ordinary
// rows, exact halves, zero and non-finite blocks, and every code from
// -kWideMax to kWideMax (blocks whose max is kWideMax, so d = 1).
TEST(WideActivationTest, EveryLevelQuantizesTheSame) {
  std::vector<float> x = RandomX(1024, 11);
  for (int j = 0; j < 32; ++j) x[256 + j] = static_cast<float>(j * 900 - 14000) + 0.5f;
  x[256] = static_cast<float>(kWideMax);
  for (int j = 0; j < 32; ++j) x[512 + j] = 0.f;
  x[800] = std::numeric_limits<float>::quiet_NaN();
  x[900] = -std::numeric_limits<float>::infinity();
  // Tiny blocks: d = max / 32512 subnormal, 1 / d infinite (x / d then).
  for (int j = 0; j < 32; ++j) x[640 + j] = static_cast<float>(j - 16) * 1e-36f;
  for (int j = 0; j < 32; ++j) x[672 + j] = static_cast<float>(j % 5) * 3e-41f;
  for (int q = -kWideMax; q <= kWideMax;) {
    x.push_back(static_cast<float>(kWideMax));
    for (int j = 1; j < 32; ++j) x.push_back(static_cast<float>(q <= kWideMax ? q++ : 0));
  }
  const int64_t cols = static_cast<int64_t>(x.size());
  const int64_t nb = cols / 32;
  std::vector<int8_t> want_h(x.size()), want_l(x.size()), h(x.size()), l(x.size());
  std::vector<float> want_d(nb), d(nb);
  std::vector<int16_t> want_hs(nb), want_ls(nb), hs(nb), ls(nb);
  QuantizeActivationRowWide(x.data(), cols, want_h.data(), want_l.data(), want_d.data(), want_hs.data(),
                            want_ls.data());
  int tables = 0;
  for (const Q8KernelTable* t : {&ScalarQ8Kernels(), Avx2Q8Kernels(), Avx512VnniQ8Kernels()}) {
    if (t == nullptr) continue;
    ASSERT_NE(t->quantize_wide, nullptr) << t->name;
    ++tables;
    t->quantize_wide(x.data(), cols, h.data(), l.data(), d.data(), hs.data(), ls.data());
    EXPECT_EQ(h, want_h) << t->name;
    EXPECT_EQ(l, want_l) << t->name;
    EXPECT_EQ(hs, want_hs) << t->name;
    EXPECT_EQ(ls, want_ls) << t->name;
    for (int64_t b = 0; b < nb; ++b) {
      ASSERT_EQ(std::memcmp(&d[b], &want_d[b], sizeof(float)), 0) << t->name << " " << b;
    }
  }
  EXPECT_GE(tables, 1);
  EXPECT_EQ(255 * want_h[257] + want_l[257], -13100);  // -13099.5 rounds away from zero
  for (int b : {640 / 32, 672 / 32}) {
    ASSERT_GT(want_d[b], 0.f);
    ASSERT_FALSE(std::isfinite(1.f / want_d[b]));
    for (int j = 0; j < 32; ++j) {
      const int64_t i = 32 * b + j;
      const double q = 255.0 * want_h[i] + want_l[i];
      EXPECT_LE(std::fabs(q * want_d[b] - x[i]), want_d[b] * 0.5 * 1.0001 + 1e-45) << i;
    }
  }
  EXPECT_TRUE(std::isnan(want_d[800 / 32]));
}

// Each level's wide kernel, from the file's rows and from PackLanes's copy,
// against the double reference; the two layouts give the same bits.
TEST(WideKernelTest, MatchesDoubleReferenceAtEveryLevel) {
  int tables = 0;
  for (int64_t cols : {32, 96, 160, 2048}) {
    for (int64_t rows : {1, 3, 13, 16, 35, 48}) {
      const testing::TestWeight w = MakeWeight(rows, cols, static_cast<uint32_t>(cols + 3 * rows));
      std::vector<uint8_t> packed(LanePackedBytes(w.tensor));
      PackLanes(w.tensor, packed.data());
      for (int64_t n_tokens : {1, 2, 3, 5, 8, 9}) {
        const std::vector<float> x = RandomX(n_tokens * cols, static_cast<uint32_t>(n_tokens + cols));
        Q8Activations act;
        QuantizeActivationsWide(x.data(), n_tokens, cols, cols, &act, nullptr);
        ASSERT_TRUE(act.wide);
        const int64_t nb = cols / 32;
        for (SimdLevel level : Levels()) {
          LevelScope scope(level);
          const Q8KernelTable& table = ActiveQ8Kernels();
          if (table.q8_0_wide == nullptr) continue;
          ++tables;
          for (int64_t begin : {int64_t{0}, int64_t{5}}) {
            if (begin >= rows) continue;
            std::vector<float> y[2];
            for (int k = 0; k < 2; ++k) {
              y[k].assign(static_cast<size_t>(n_tokens * rows), -1.f);
              Q8Args a = testing::Q8ArgsFor(w, act, begin, &y[k]);
              a.lanes = k == 0 || packed.empty() ? nullptr : packed.data();
              table.q8_0_wide(a);
            }
            for (int64_t t = 0; t < n_tokens; ++t) {
              for (int64_t r = 0; r < rows; ++r) {
                const size_t i = static_cast<size_t>(t * rows + r);
                if (r < begin) {
                  ASSERT_EQ(y[0][i], -1.f) << "wrote outside its rows";
                  continue;
                }
                const uint8_t* row = w.tensor.data + r * RowBytes(DType::kQ8_0, cols);
                const double want = Q8ReferenceDotWide(row, cols, act.q.data() + t * cols,
                                                       act.ql.data() + t * cols, act.d.data() + t * nb);
                // f32 rounding of each block's sum (up to 2^27: converted with
                // 24 bits) and of the scaled accumulation, relative to the sum
                // of magnitudes.
                std::vector<float> dw(static_cast<size_t>(cols));
                DequantizeRow(DType::kQ8_0, row, dw.data(), cols);
                double mag = 0.0;
                for (int64_t k = 0; k < cols; ++k) {
                  const int q = 255 * act.q[t * cols + k] + act.ql[t * cols + k];
                  mag += std::fabs(dw[k]) * std::abs(q) * act.d[t * nb + k / 32];
                }
                EXPECT_LE(std::fabs(y[0][i] - want), 1e-5 * mag + 1e-30)
                    << table.name << " cols=" << cols << " rows=" << rows << " n=" << n_tokens << " r=" << r
                    << " t=" << t;
                ASSERT_EQ(std::memcmp(&y[0][i], &y[1][i], sizeof(float)), 0)
                    << table.name << " packed vs file, cols=" << cols << " rows=" << rows << " begin=" << begin;
              }
            }
          }
        }
      }
    }
  }
  if (tables == 0) GTEST_SKIP() << "no wide kernel on this CPU (it needs AVX-512 VNNI)";
  EXPECT_EQ(Avx512VnniQ8Kernels() != nullptr, tables > 0);
}

class ModeScope {
 public:
  explicit ModeScope(ActivationMode m) { SetActivationMode(m); }
  ~ModeScope() { SetActivationMode(ActivationMode::kAuto); }
};

// Through MatMul in the default mode (wide where the level has it): a
// token's output is bitwise the same alone and in any batch, on 1 or 2
// threads, with and without the packed copy.
TEST(WideKernelTest, BatchThreadAndLayoutInvariantBitwise) {
  ModeScope mode(ActivationMode::kAuto);
  ThreadPool one(1), two(2);
  const int64_t rows = 37, cols = 160, n_max = 130;
  const testing::TestWeight w = MakeWeight(rows, cols, 5);
  std::vector<uint8_t> packed(LanePackedBytes(w.tensor));
  PackLanes(w.tensor, packed.data());
  Tensor with = w.tensor;
  with.lanes = packed.data();
  const std::vector<float> x = RandomX(n_max * cols, 6);
  int wide_levels = 0;
  for (SimdLevel level : Levels()) {
    LevelScope scope(level);
    if (ActivationsFor(DType::kQ8_0, ActivationMode::kAuto) != ActivationKind::kWide) continue;
    ++wide_levels;
    std::vector<float> alone(static_cast<size_t>(n_max * rows));
    for (int64_t t = 0; t < n_max; ++t) MatMul(w.tensor, x.data() + t * cols, 1, alone.data() + t * rows, one);
    for (int64_t n : {3, 7, 32, 65, 130}) {
      for (ThreadPool* pool : {&one, &two}) {
        for (const Tensor* t : {static_cast<const Tensor*>(&w.tensor), static_cast<const Tensor*>(&with)}) {
          std::vector<float> y(static_cast<size_t>(n * rows));
          MatMul(*t, x.data(), n, y.data(), *pool);
          ASSERT_EQ(std::memcmp(y.data(), alone.data(), y.size() * sizeof(float)), 0)
              << SimdLevelName(level) << " n=" << n << " threads=" << pool->num_threads()
              << (t == &with ? " packed" : " file");
        }
      }
    }
  }
  EXPECT_EQ(wide_levels, Avx512VnniQ8Kernels() != nullptr ? 1 : 0);
}

// Wide activations are within half a 16-bit step per element of the f32
// product (256 times tighter than int8's bound), and MatMul took that path:
// its result differs from both f32 and int8 activations.
TEST(WideKernelTest, CloseToTheExactProduct) {
  ThreadPool two(2);
  const int64_t cols = 2048, rows = 16, n = 5;
  const testing::TestWeight w = MakeWeight(rows, cols, 8);
  const std::vector<float> x = RandomX(n * cols, 9);
  std::vector<float> y[3];
  const ActivationMode modes[3] = {ActivationMode::kExact, ActivationMode::kInt8, ActivationMode::kAuto};
  for (int m = 0; m < 3; ++m) {
    y[m].resize(static_cast<size_t>(n * rows));
    MatMulOptions opt;
    opt.force_activations = true;
    opt.activations = modes[m];
    MatMulWithOptions(w.tensor, x.data(), n, y[m].data(), two, opt);
  }
  if (Avx512VnniQ8Kernels() == nullptr) GTEST_SKIP() << "no wide kernel on this CPU (it needs AVX-512 VNNI)";
  ASSERT_EQ(ActivationsFor(DType::kQ8_0, ActivationMode::kAuto), ActivationKind::kWide);
  std::vector<float> dw(cols);
  double worst_wide = 0.0, worst_int8 = 0.0;
  for (int64_t t = 0; t < n; ++t) {
    for (int64_t r = 0; r < rows; ++r) {
      DequantizeRow(DType::kQ8_0, w.tensor.data + r * RowBytes(DType::kQ8_0, cols), dw.data(), cols);
      double bound = 0.0, mag = 0.0;
      for (int64_t b = 0; b < cols / 32; ++b) {
        float amax = 0.f;
        for (int j = 0; j < 32; ++j) amax = std::max(amax, std::fabs(x[t * cols + b * 32 + j]));
        for (int j = 0; j < 32; ++j) {
          bound += std::fabs(dw[b * 32 + j]) * amax / (2.0 * kWideMax);
          mag += std::fabs(dw[b * 32 + j] * x[t * cols + b * 32 + j]);
        }
      }
      const size_t i = static_cast<size_t>(t * rows + r);
      const double e = y[0][i];
      // Plus f32 rounding in both products.
      EXPECT_LE(std::fabs(e - y[2][i]), bound + 1e-6 * mag);
      if (r == 0) continue;  // row 0 starts with a zero block; still a product
      EXPECT_NE(y[2][i], y[0][i]) << "the wide path was not taken";
      EXPECT_NE(y[2][i], y[1][i]) << "the int8 path was taken";
      worst_wide = std::max(worst_wide, std::fabs(e - y[2][i]));
      worst_int8 = std::max(worst_int8, std::fabs(e - y[1][i]));
    }
  }
  EXPECT_LT(worst_wide * 20, worst_int8) << "wide is not much closer than int8";
}

// Which kind each mode takes: Q8_0 wide by default where the AVX-512 VNNI
// table runs, f32 by default at other levels, int8 with --int8-activations,
// f32 with --exact-activations.
TEST(WideKernelTest, ModesPickTheKind) {
  for (SimdLevel level : Levels()) {
    LevelScope scope(level);
    const bool vnni = &ActiveQ8Kernels() == Avx512VnniQ8Kernels();
    EXPECT_EQ(ActiveQ8Kernels().q8_0_wide != nullptr, vnni) << SimdLevelName(level);
    EXPECT_EQ(ActivationsFor(DType::kQ8_0, ActivationMode::kAuto),
              vnni ? ActivationKind::kWide : ActivationKind::kF32)
        << SimdLevelName(level);
    EXPECT_EQ(UsesIntegerActivations(DType::kQ8_0, ActivationMode::kAuto), vnni);
    EXPECT_EQ(ActivationsFor(DType::kQ8_0, ActivationMode::kInt8), ActivationKind::kInt8);
    EXPECT_EQ(ActivationsFor(DType::kQ8_0, ActivationMode::kExact), ActivationKind::kF32);
    EXPECT_EQ(ActivationsFor(DType::kQ4_K, ActivationMode::kAuto), ActivationKind::kInt8);
    EXPECT_EQ(ActivationsFor(DType::kF16, ActivationMode::kInt8), ActivationKind::kF32);
  }
}

}  // namespace
}  // namespace strata::cpu::internal
