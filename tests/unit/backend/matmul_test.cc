#include "model/backend/cpu/matmul.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "model/backend/cpu/cpu_features.h"
#include "model/backend/cpu/matmul_internal.h"
#include "model/backend/cpu/quant.h"
#include "tests/support/test_weights.h"

namespace strata::cpu {
namespace {

using internal::BlasLibrary;
using internal::GemmThreading;
using internal::MatMulOptions;

constexpr DType kAllTypes[] = {DType::kF32,  DType::kF16,  DType::kBF16, DType::kQ4_0,
                               DType::kQ8_0, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};

std::vector<SimdLevel> Levels() {
  std::vector<SimdLevel> v;
  for (int l = 0; l <= static_cast<int>(DetectedSimdLevel()); ++l) {
    v.push_back(static_cast<SimdLevel>(l));
  }
  return v;
}

// These tests pin the f32-activation path (its 1e-4 contract) whatever the
// default; the int8 path has its own tests (matmul_q8_test.cc).
class ExactActivations : public ::testing::Environment {
 public:
  void SetUp() override { SetActivationMode(ActivationMode::kExact); }
};
const auto* const kExactEnv = ::testing::AddGlobalTestEnvironment(new ExactActivations);

class LevelScope {
 public:
  explicit LevelScope(SimdLevel l) { SetSimdLevelOverride(l); }
  ~LevelScope() { SetSimdLevelOverride(std::nullopt); }
};

using testing::TestWeight;
TestWeight MakeWeight(DType type, int64_t rows, int64_t cols, uint32_t seed) {
  return testing::MakeTestWeight(type, rows, cols, seed);
}
std::vector<float> RandomX(int64_t n, uint32_t seed) { return testing::GaussianVector(n, seed); }

// The double-precision product of the decoded weights, and for each output
// the scale of a float dot product's rounding error: sum |w_k x_k| (plain
// |ref| is not a scale: it can cancel to ~0).
struct Reference {
  std::vector<double> value;
  std::vector<double> magnitude;
};

Reference Compute(const TestWeight& w, const std::vector<float>& x, int64_t n_tokens) {
  const int64_t rows = w.tensor.rows(), cols = w.tensor.cols();
  Reference ref;
  ref.value.resize(n_tokens * rows);
  ref.magnitude.resize(n_tokens * rows);
  for (int64_t t = 0; t < n_tokens; ++t) {
    for (int64_t r = 0; r < rows; ++r) {
      double v = 0, mag = 0;
      for (int64_t k = 0; k < cols; ++k) {
        const double p = double{w.dense[r * cols + k]} * x[t * cols + k];
        v += p;
        mag += std::fabs(p);
      }
      ref.value[t * rows + r] = v;
      ref.magnitude[t * rows + r] = mag;
    }
  }
  return ref;
}

void ExpectMatches(const Reference& ref, const std::vector<float>& y, double tol,
                   const std::string& what) {
  ASSERT_EQ(y.size(), ref.value.size());
  for (size_t i = 0; i < y.size(); ++i) {
    const double err = std::fabs(y[i] - ref.value[i]);
    ASSERT_LE(err, tol * ref.magnitude[i] + 1e-30)
        << what << " output " << i << " y=" << y[i] << " ref=" << ref.value[i];
  }
}

void ExpectMatches(const TestWeight& w, const std::vector<float>& x, int64_t n_tokens,
                   const std::vector<float>& y, double tol, const std::string& what) {
  ExpectMatches(Compute(w, x, n_tokens), y, tol, what);
}

double Tolerance(DType t) { return t == DType::kF32 ? 1e-5 : 1e-4; }

int64_t ColsFor(DType t) {
  // Plain types get a column count that is not a multiple of any vector
  // width, to cover the kernels' tails; K-quants two super-blocks.
  switch (t) {
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
      return 333;
    case DType::kQ4_0:
    case DType::kQ8_0:
      return 96;
    default:
      return 512;
  }
}

// Every type, odd row counts, batch sizes on both sides of the sgemm
// threshold, 1 and 2 threads, every SIMD level.
TEST(MatMulTest, MatchesDoubleReference) {
  ThreadPool one(1), two(2);
  for (DType type : kAllTypes) {
    const int64_t cols = ColsFor(type);
    for (int64_t rows : {1, 7, 65, 300}) {
      const TestWeight w = MakeWeight(type, rows, cols, static_cast<uint32_t>(rows * 31 + cols));
      for (int64_t n_tokens : {1, 2, 5, 17, 64, 129}) {
        const std::vector<float> x = RandomX(n_tokens * cols, static_cast<uint32_t>(n_tokens));
        const Reference ref = Compute(w, x, n_tokens);
        for (SimdLevel level : Levels()) {
          LevelScope scope(level);
          for (ThreadPool* pool : {&one, &two}) {
            std::vector<float> y(n_tokens * rows, -1.f);
            MatMul(w.tensor, x.data(), n_tokens, y.data(), *pool);
            const std::string what =
                std::string(DTypeName(type)) + " rows=" + std::to_string(rows) +
                " n=" + std::to_string(n_tokens) + " " + std::string(SimdLevelName(level)) +
                " threads=" + std::to_string(pool->num_threads());
            ExpectMatches(ref, y, Tolerance(type), what);
          }
        }
      }
    }
  }
}

// Each strategy on its own, at batch sizes where it would not be the default.
TEST(MatMulTest, EveryStrategyMatches) {
  ThreadPool two(2);
  struct Strategy {
    const char* name;
    MatMulOptions options;
  };
  std::vector<Strategy> strategies;
  strategies.push_back({"dot",
                        {.gemm_min_tokens = std::numeric_limits<int64_t>::max(),
                         .tile_min_tokens = std::numeric_limits<int64_t>::max()}});
  strategies.push_back(
      {"tile", {.gemm_min_tokens = std::numeric_limits<int64_t>::max(), .tile_min_tokens = 1}});
  for (BlasLibrary lib : {BlasLibrary::kDnnl, BlasLibrary::kOpenBlas}) {
    if (!internal::BlasAvailable(lib)) continue;
    for (GemmThreading th : {GemmThreading::kPoolTiles, GemmThreading::kBlasThreads}) {
      strategies.push_back({internal::BlasName(lib),
                            {.gemm_min_tokens = 1, .tile_rows = 16, .threading = th, .blas = lib}});
    }
  }
  for (DType type : kAllTypes) {
    const int64_t cols = ColsFor(type);
    const TestWeight w = MakeWeight(type, 77, cols, 5);
    for (int64_t n_tokens : {1, 3, 9, 40}) {
      const std::vector<float> x = RandomX(n_tokens * cols, 9);
      const Reference ref = Compute(w, x, n_tokens);
      for (const Strategy& s : strategies) {
        std::vector<float> y(n_tokens * 77, -1.f);
        internal::MatMulWithOptions(w.tensor, x.data(), n_tokens, y.data(), two, s.options);
        ExpectMatches(
            ref, y, Tolerance(type),
            std::string(DTypeName(type)) + " " + s.name + " n=" + std::to_string(n_tokens));
      }
    }
  }
}

// Every batch size from 1 to 70 (across the dot / tile / sgemm thresholds of
// every type and the tile kernels' 4-row x 1..6-token tiles), with row counts
// that leave partial 4-row panels and uneven thread splits: the default
// choice and the tile kernels forced at every size, at every SIMD level.
TEST(MatMulTest, EveryTokenCountMatches) {
  ThreadPool two(2);
  const MatMulOptions tile_only{.gemm_min_tokens = std::numeric_limits<int64_t>::max(),
                                .tile_min_tokens = 1};
  for (DType type : kAllTypes) {
    const int64_t cols = ColsFor(type);
    for (int64_t rows : {6, 37}) {
      const TestWeight w = MakeWeight(type, rows, cols, static_cast<uint32_t>(rows + 3));
      for (int64_t n_tokens = 1; n_tokens <= 70; ++n_tokens) {
        const std::vector<float> x = RandomX(n_tokens * cols, static_cast<uint32_t>(n_tokens));
        const Reference ref = Compute(w, x, n_tokens);
        for (SimdLevel level : Levels()) {
          LevelScope scope(level);
          const std::string what = std::string(DTypeName(type)) + " rows=" + std::to_string(rows) +
                                   " n=" + std::to_string(n_tokens) + " " +
                                   std::string(SimdLevelName(level));
          std::vector<float> y(n_tokens * rows, -1.f);
          MatMul(w.tensor, x.data(), n_tokens, y.data(), two);
          ExpectMatches(ref, y, Tolerance(type), what + " default");
          std::fill(y.begin(), y.end(), -1.f);
          internal::MatMulWithOptions(w.tensor, x.data(), n_tokens, y.data(), two, tile_only);
          ExpectMatches(ref, y, Tolerance(type), what + " tile");
        }
      }
    }
  }
}

// Rows 4 KiB apart (1024 columns): the tile path copies x to a padded
// buffer and pads its decoded rows; results must not change.
TEST(MatMulTest, TilePathWithPowerOfTwoColumns) {
  ThreadPool two(2);
  const int64_t cols = 1024, rows = 23;
  for (DType type : kAllTypes) {
    const TestWeight w = MakeWeight(type, rows, cols, 21);
    for (int64_t n_tokens : {2, 4, 7, 8, 9, 33, 63}) {
      const std::vector<float> x = RandomX(n_tokens * cols, 22);
      std::vector<float> y(n_tokens * rows, -1.f);
      internal::MatMulWithOptions(
          w.tensor, x.data(), n_tokens, y.data(), two,
          {.gemm_min_tokens = std::numeric_limits<int64_t>::max(), .tile_min_tokens = 1});
      ExpectMatches(w, x, n_tokens, y, Tolerance(type),
                    std::string(DTypeName(type)) + " n=" + std::to_string(n_tokens));
    }
  }
}

// The defaults: the sgemm path from 64 tokens, the tile kernels from 2 to 5
// tokens (by type) below it.
TEST(MatMulTest, DefaultThresholds) {
  for (DType type : kAllTypes) {
    EXPECT_EQ(internal::DefaultGemmMinTokens(type), 64) << DTypeName(type);
    const int64_t tile = internal::DefaultTileMinTokens(type);
    EXPECT_GE(tile, 2) << DTypeName(type);
    EXPECT_LE(tile, 5) << DTypeName(type);
  }
}

// The SIMD dot kernels and the scalar reference kernels agree closely on
// realistic shapes (same decoded weights, different summation order).
TEST(MatMulTest, ScalarAndSimdAgree) {
  ThreadPool two(2);
  for (DType type : kAllTypes) {
    const TestWeight w = MakeWeight(type, 40, 2048, 11);
    const std::vector<float> x = RandomX(3 * 2048, 12);
    std::vector<float> want(3 * 40);
    {
      LevelScope scope(SimdLevel::kScalar);
      MatMul(w.tensor, x.data(), 3, want.data(), two);
    }
    for (SimdLevel level : Levels()) {
      LevelScope scope(level);
      std::vector<float> got(3 * 40);
      MatMul(w.tensor, x.data(), 3, got.data(), two);
      ExpectMatches(w, x, 3, got, Tolerance(type), std::string(SimdLevelName(level)));
      for (size_t i = 0; i < got.size(); ++i) {
        EXPECT_NEAR(got[i], want[i], 1e-4 * (1 + std::fabs(want[i])))
            << DTypeName(type) << " " << i;
      }
    }
  }
}

TEST(MatMulTest, ThreeDimensionalWeightUsesAllRows) {
  ThreadPool two(2);
  TestWeight w = MakeWeight(DType::kQ8_0, 6, 64, 3);
  w.tensor.ne = {64, 2, 3};
  ASSERT_EQ(w.tensor.rows(), 6);
  const std::vector<float> x = RandomX(64, 4);
  std::vector<float> y(6);
  MatMul(w.tensor, x.data(), 1, y.data(), two);
  ExpectMatches(w, x, 1, y, 1e-4, "3d");
}

TEST(MatMulTest, ValidateRejectsBadWeights) {
  TestWeight w = MakeWeight(DType::kQ4_K, 4, 256, 1);
  EXPECT_TRUE(ValidateMatMulWeight(w.tensor).ok());

  Tensor t = w.tensor;
  t.ne = {200, 4};  // not a multiple of 256
  EXPECT_EQ(ValidateMatMulWeight(t).code(), StatusCode::kInvalidArgument);
  t = w.tensor;
  t.nbytes -= 1;
  EXPECT_EQ(ValidateMatMulWeight(t).code(), StatusCode::kInvalidArgument);
  t = w.tensor;
  t.data = nullptr;
  EXPECT_EQ(ValidateMatMulWeight(t).code(), StatusCode::kInvalidArgument);
  t = w.tensor;
  t.ne = {};
  EXPECT_EQ(ValidateMatMulWeight(t).code(), StatusCode::kInvalidArgument);
  t = w.tensor;
  t.ne = {256, -4};
  EXPECT_EQ(ValidateMatMulWeight(t).code(), StatusCode::kInvalidArgument);
  t = w.tensor;
  t.type = static_cast<DType>(3);  // q4_1: not supported
  EXPECT_EQ(ValidateMatMulWeight(t).code(), StatusCode::kUnsupported);
}

TEST(MatMulTest, InvalidWeightGivesNaNNotACrash) {
  ThreadPool two(2);
  TestWeight w = MakeWeight(DType::kQ4_K, 4, 256, 1);
  Tensor t = w.tensor;
  t.ne = {200, 4};
  const std::vector<float> x = RandomX(2 * 200, 1);
  std::vector<float> y(8, 0.f);
  MatMul(t, x.data(), 2, y.data(), two);
  for (float v : y) EXPECT_TRUE(std::isnan(v));
  t = w.tensor;
  t.type = static_cast<DType>(3);
  MatMul(t, x.data(), 2, y.data(), two);
  for (float v : y) EXPECT_TRUE(std::isnan(v));
  // Nothing to do: no write at all.
  MatMul(w.tensor, x.data(), 0, nullptr, two);
}

// A weight with a column-panel copy (Tensor::panels) whose `data` holds
// different numbers, so a path that read `data` instead would not match.
struct PanelWeight {
  TestWeight w;
  std::vector<uint8_t> panels;
  std::vector<uint8_t> decoy;
  Tensor tensor;
};
PanelWeight MakePanelWeight(DType type, int64_t rows, int64_t cols, int64_t panel_cols, uint32_t seed) {
  PanelWeight p;
  p.w = MakeWeight(type, rows, cols, seed);
  p.panels.resize(PanelPackedBytes(p.w.tensor, panel_cols));
  PackPanels(p.w.tensor, panel_cols, p.panels.data());
  p.decoy = MakeWeight(type, rows, cols, seed + 1000).bytes;
  p.tensor = p.w.tensor;
  p.tensor.data = p.decoy.data();
  p.tensor.panels = p.panels.data();
  p.tensor.panel_cols = panel_cols;
  return p;
}

// Every path that multiplies with f32 activations (dot, tile, both sgemm
// threadings) reads the panels: it matches the double reference of the
// panels' weights although `data` holds others. Panel counts of 2 and 3
// with a narrower last panel, plain types with tails inside a panel, 1 and
// 2 threads, every SIMD level.
TEST(MatMulTest, ColumnPanelsAreWhatEveryPathReads) {
  ThreadPool one(1), two(2);
  std::vector<std::pair<std::string, MatMulOptions>> strategies = {
      {"default", {}},
      {"dot", {.gemm_min_tokens = std::numeric_limits<int64_t>::max(),
               .tile_min_tokens = std::numeric_limits<int64_t>::max()}},
      {"tile", {.gemm_min_tokens = std::numeric_limits<int64_t>::max(), .tile_min_tokens = 1}},
      {"sgemm", {.gemm_min_tokens = 1, .tile_rows = 16}},
      {"sgemm-blas-threads", {.gemm_min_tokens = 1, .tile_rows = 16, .threading = GemmThreading::kBlasThreads}},
  };
  struct Shape {
    DType type;
    int64_t cols, panel_cols;
  };
  const Shape shapes[] = {{DType::kF32, 333, 128},  {DType::kF16, 333, 128}, {DType::kBF16, 333, 192},
                          {DType::kF16, 1024, 512}, {DType::kQ8_0, 160, 64}, {DType::kQ4_0, 192, 128}};
  for (const Shape& sh : shapes) {
    const PanelWeight p = MakePanelWeight(sh.type, 37, sh.cols, sh.panel_cols, 17);
    ASSERT_GT(p.tensor.panel_count(), 1);
    for (int64_t n_tokens : {1, 2, 3, 5, 9, 64, 70}) {
      const std::vector<float> x = RandomX(n_tokens * sh.cols, static_cast<uint32_t>(n_tokens + 40));
      const Reference ref = Compute(p.w, x, n_tokens);
      for (SimdLevel level : Levels()) {
        LevelScope scope(level);
        for (ThreadPool* pool : {&one, &two}) {
          for (const auto& [name, options] : strategies) {
            std::vector<float> y(n_tokens * 37, -1.f);
            internal::MatMulWithOptions(p.tensor, x.data(), n_tokens, y.data(), *pool, options);
            ExpectMatches(ref, y, Tolerance(sh.type),
                          std::string(DTypeName(sh.type)) + " cols=" + std::to_string(sh.cols) + " " + name +
                              " n=" + std::to_string(n_tokens) + " " + std::string(SimdLevelName(level)) +
                              " threads=" + std::to_string(pool->num_threads()));
          }
        }
      }
    }
  }
}

// The panels hold the rows' bytes regrouped: panel p, row r is row r's
// bytes from column p * panel_cols on.
TEST(MatMulTest, PackPanelsRegroupsTheRowsBytes) {
  for (DType type : {DType::kF16, DType::kQ8_0}) {
    const int64_t cols = 320, pc = 128, rows = 5;
    const TestWeight w = MakeWeight(type, rows, cols, 3);
    std::vector<uint8_t> out(PanelPackedBytes(w.tensor, pc));
    ASSERT_EQ(out.size(), w.bytes.size());
    PackPanels(w.tensor, pc, out.data());
    Tensor t = w.tensor;
    t.panels = out.data();
    t.panel_cols = pc;
    ASSERT_EQ(t.panel_count(), 3);
    EXPECT_EQ(t.panel_width(2), 64);
    for (int64_t p = 0; p < 3; ++p) {
      for (int64_t r = 0; r < rows; ++r) {
        const uint8_t* want = w.tensor.row(r) + RowBytes(type, p * pc);
        EXPECT_EQ(0, std::memcmp(t.panel(p) + r * t.panel_row_bytes(p), want, t.panel_row_bytes(p)))
            << DTypeName(type) << " panel " << p << " row " << r;
      }
    }
  }
  EXPECT_EQ(PanelPackedBytes(MakeWeight(DType::kF16, 2, 128, 1).tensor, 128), 0u);
}

// Which matrices get panels: rows whose x (4 bytes a column) and weights
// pass 20 KiB, cut into panels of at most that much, 64-column multiples;
// never the K-quants (their kernels need whole rows).
TEST(MatMulTest, DecodePanelColsRule) {
  EXPECT_EQ(DecodePanelCols(DType::kF16, 2048), 0);
  EXPECT_EQ(DecodePanelCols(DType::kF16, 3072), 0);
  EXPECT_EQ(DecodePanelCols(DType::kF16, 4096), 2048);
  EXPECT_EQ(DecodePanelCols(DType::kF16, 5632), 2816);   // TinyLlama's w_down
  EXPECT_EQ(DecodePanelCols(DType::kF16, 11008), 2752);  // Llama-2 7B's w_down
  EXPECT_EQ(DecodePanelCols(DType::kF32, 2048), 0);
  EXPECT_EQ(DecodePanelCols(DType::kF32, 4096), 2048);
  EXPECT_EQ(DecodePanelCols(DType::kQ8_0, 5632), 2816);
  EXPECT_EQ(DecodePanelCols(DType::kQ4_K, 11008), 0);
  EXPECT_EQ(DecodePanelCols(DType::kQ6_K, 11008), 0);
  for (DType type : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0}) {
    for (int64_t cols = 64; cols <= 20000; cols += 64) {
      const int64_t pc = DecodePanelCols(type, cols);
      const int64_t whole = cols * 4 + static_cast<int64_t>(RowBytes(type, cols));
      if (whole <= (20 << 10)) {
        EXPECT_EQ(pc, 0) << DTypeName(type) << " " << cols;
        continue;
      }
      ASSERT_GT(pc, 0) << DTypeName(type) << " " << cols;
      EXPECT_LT(pc, cols);
      EXPECT_EQ(pc % 64, 0);
      EXPECT_LE(pc * 4 + static_cast<int64_t>(RowBytes(type, pc)), 20 << 10) << DTypeName(type) << " " << cols;
    }
  }
}

}  // namespace
}  // namespace strata::cpu
