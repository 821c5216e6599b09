// cpu::Attend (every SIMD level's dispatch, and the AVX-512 kernel directly
// where the CPU has it) against a double-precision attention over the same
// stored K/V values, read through a shuffled block table.

#include "model/backend/cpu/attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <numeric>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "model/backend/cpu/cpu_features.h"
#include "model/backend/cpu/kernels.h"
#include "model/backend/cpu/kernels_internal.h"

namespace strata::cpu {
namespace {

struct Shape {
  int head_dim, group, n_kv_heads, n_ctx, block_size;
  DType kv;
};

std::string Name(const Shape& s) {
  return "hd" + std::to_string(s.head_dim) + "_g" + std::to_string(s.group) + "_kvh" + std::to_string(s.n_kv_heads) +
         "_n" + std::to_string(s.n_ctx) + "_bs" + std::to_string(s.block_size) + "_" + std::string(DTypeName(s.kv));
}

float Stored(float x, DType t) {
  if (t == DType::kF16) return internal::HalfBitsToFloat(internal::FloatToHalfBits(x));
  if (t == DType::kBF16) return internal::Bf16BitsToFloat(internal::FloatToBf16Bits(x));
  return x;
}

// A KV pool of `blocks` blocks holding one layer of n_kv_heads heads, the
// context's blocks at shuffled ids; attends for KV head `g`.
struct Fixture {
  Shape s;
  int g = 0;
  size_t elem = 0, row_bytes = 0, block_bytes = 0;
  std::vector<uint8_t> pool;
  std::vector<int32_t> table;
  std::vector<float> q;
  std::vector<std::vector<float>> k, v;  // stored values, [pos][head_dim] for head g

  explicit Fixture(const Shape& sh, uint32_t seed) : s(sh) {
    std::mt19937 gen(seed);
    std::uniform_real_distribution<float> u(-1.0f, 1.0f);
    elem = GetDTypeInfo(s.kv).block_bytes;
    const int kv_dim = s.n_kv_heads * s.head_dim;
    row_bytes = static_cast<size_t>(kv_dim) * elem;
    block_bytes = 2 * static_cast<size_t>(s.block_size) * row_bytes;
    const int need = (s.n_ctx + s.block_size - 1) / s.block_size;
    const int blocks = need + 3;
    pool.assign(block_bytes * static_cast<size_t>(blocks), 0xAB);  // garbage outside the context
    std::vector<int32_t> ids(static_cast<size_t>(blocks));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), gen);
    table.assign(ids.begin(), ids.begin() + need);
    g = s.n_kv_heads - 1;
    std::vector<float> row(static_cast<size_t>(kv_dim));
    for (int j = 0; j < s.n_ctx; ++j) {
      uint8_t* blk = pool.data() + static_cast<size_t>(table[j / s.block_size]) * block_bytes;
      for (int kvi = 0; kvi < 2; ++kvi) {
        for (float& x : row) x = u(gen) * 2.0f;
        StoreKv(row.data(), blk + (static_cast<size_t>(kvi) * s.block_size + j % s.block_size) * row_bytes, s.kv,
                kv_dim);
        std::vector<float> mine(static_cast<size_t>(s.head_dim));
        for (int d = 0; d < s.head_dim; ++d) mine[d] = Stored(row[static_cast<size_t>(g * s.head_dim + d)], s.kv);
        (kvi == 0 ? k : v).push_back(mine);
      }
    }
    q.resize(static_cast<size_t>(s.group * s.head_dim));
    for (float& x : q) x = u(gen) * 2.0f;
  }

  AttnArgs Args(float* out, float* scores) const {
    AttnArgs a;
    a.q = q.data();
    a.group = s.group;
    a.head_dim = s.head_dim;
    a.n_ctx = s.n_ctx;
    a.kv_base = pool.data();
    a.block_bytes = block_bytes;
    a.block_table = table.data();
    a.block_size = s.block_size;
    a.k_offset = static_cast<size_t>(g * s.head_dim) * elem;
    a.v_offset = static_cast<size_t>(s.block_size) * row_bytes + static_cast<size_t>(g * s.head_dim) * elem;
    a.row_bytes = row_bytes;
    a.kv_type = s.kv;
    a.scale = 1.0f / std::sqrt(static_cast<float>(s.head_dim));
    a.out = out;
    a.scores = scores;
    return a;
  }

  // Head h's scaled scores in double, and their maximum.
  std::vector<double> Scores(int h, double* mx) const {
    const double scale = 1.0 / std::sqrt(static_cast<double>(s.head_dim));
    std::vector<double> p(static_cast<size_t>(s.n_ctx));
    *mx = -1e300;
    for (int j = 0; j < s.n_ctx; ++j) {
      double d = 0;
      for (int i = 0; i < s.head_dim; ++i) d += static_cast<double>(q[static_cast<size_t>(h * s.head_dim + i)]) * k[j][i];
      p[j] = d * scale;
      *mx = std::max(*mx, p[j]);
    }
    return p;
  }

  // Each head's log Σ_j exp(score_j), in double.
  std::vector<double> LogSumExp() const {
    std::vector<double> out(static_cast<size_t>(s.group));
    for (int h = 0; h < s.group; ++h) {
      double mx = 0;
      double sum = 0;
      for (double x : Scores(h, &mx)) sum += std::exp(x - mx);
      out[static_cast<size_t>(h)] = mx + std::log(sum);
    }
    return out;
  }

  std::vector<double> Reference() const {
    std::vector<double> out(static_cast<size_t>(s.group * s.head_dim), 0.0);
    for (int h = 0; h < s.group; ++h) {
      double mx = 0;
      std::vector<double> p = Scores(h, &mx);
      double sum = 0;
      for (double& x : p) sum += (x = std::exp(x - mx));
      for (int j = 0; j < s.n_ctx; ++j)
        for (int i = 0; i < s.head_dim; ++i) out[static_cast<size_t>(h * s.head_dim + i)] += p[j] / sum * v[j][i];
    }
    return out;
  }
};

// Worst |got - want| over the output, relative to the largest |want| (outputs
// are convex combinations of V rows, so entries near 0 are not meaningful
// alone).
double Error(const std::vector<float>& got, const std::vector<double>& want) {
  double scale = 1e-30, worst = 0;
  for (double w : want) scale = std::max(scale, std::abs(w));
  for (size_t i = 0; i < want.size(); ++i) {
    if (!std::isfinite(got[i])) return INFINITY;
    worst = std::max(worst, std::abs(got[i] - want[i]));
  }
  return worst / scale;
}

std::vector<Shape> Shapes() {
  std::vector<Shape> v;
  for (DType kv : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (int hd : {12, 16, 64, 80, 128, 256}) {
      for (int group : {1, 3, 4, 8}) {
        v.push_back({hd, group, 2, 37, 16, kv});
      }
    }
    for (int n : {1, 15, 16, 17, 31, 33, 300}) v.push_back({64, 2, 3, n, 16, kv});
    v.push_back({64, 1, 12, 100, 32, kv});  // bench-110m's heads, blocks of 32 (two reduce chunks each)
    v.push_back({64, 4, 1, 50, 1, kv});
    v.push_back({64, 1, 1, 50, 7, kv});
  }
  return v;
}

class AttendTest : public ::testing::TestWithParam<Shape> {};

TEST_P(AttendTest, EveryPathMatchesDoublePrecision) {
  const Shape s = GetParam();
  Fixture f(s, 1234u + static_cast<uint32_t>(s.head_dim * 31 + s.group * 7 + s.n_ctx));
  const std::vector<double> want = f.Reference();
  const size_t n_out = static_cast<size_t>(s.group * s.head_dim);
  std::vector<float> scores(static_cast<size_t>(s.group * s.n_ctx));
  // Attend and the reference at every level this CPU runs.
  for (SimdLevel level : {SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvx512}) {
    if (level > DetectedSimdLevel()) continue;
    SetSimdLevelOverride(level);
    for (bool reference : {false, true}) {
      std::vector<float> out(n_out, NAN);
      AttnArgs a = f.Args(out.data(), scores.data());
      reference ? AttendReference(a) : Attend(a);
      EXPECT_LE(Error(out, want), 2e-5) << SimdLevelName(level) << (reference ? " reference" : " Attend");
    }
  }
  SetSimdLevelOverride(std::nullopt);
  if (DetectedSimdLevel() >= SimdLevel::kAvx512) {
    std::vector<float> out(n_out, NAN);
    AttnArgs a = f.Args(out.data(), scores.data());
    internal::AttendAvx512(a);
    EXPECT_LE(Error(out, want), 2e-5) << "AttendAvx512";
  } else {
    GTEST_SKIP() << "CPU lacks AVX-512: only the scalar/AVX2 paths were checked";
  }
}

// All KV heads in one call (AttnArgs::kv_heads, the position-major kernel)
// gives bitwise what one call per head gives, at every level; its scores
// reduce 16 positions at a time, so contexts around multiples of 16 and odd
// block sizes are the interesting shapes.
TEST_P(AttendTest, AllHeadsInOneCallEqualOneCallPerHead) {
  const Shape s = GetParam();
  Fixture f(s, 99u + static_cast<uint32_t>(s.head_dim + s.n_ctx));
  const int heads = s.n_kv_heads * s.group;
  const size_t hd = static_cast<size_t>(s.head_dim);
  std::vector<float> q(static_cast<size_t>(heads) * hd);
  std::mt19937 gen(7);
  std::uniform_real_distribution<float> u(-2.0f, 2.0f);
  for (float& x : q) x = u(gen);
  std::vector<float> scores(static_cast<size_t>(heads * s.n_ctx));
  for (SimdLevel level : {SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvx512}) {
    if (level > DetectedSimdLevel()) continue;
    SetSimdLevelOverride(level);
    std::vector<float> all(q.size(), NAN), each(q.size(), NAN);
    AttnArgs a = f.Args(all.data(), scores.data());
    a.q = q.data();
    a.k_offset -= static_cast<size_t>(f.g) * hd * f.elem;  // from head 0
    a.v_offset -= static_cast<size_t>(f.g) * hd * f.elem;
    a.kv_heads = s.n_kv_heads;
    a.kv_head_bytes = hd * f.elem;
    Attend(a);
    for (int i = 0; i < s.n_kv_heads; ++i) {
      AttnArgs one = a;
      one.kv_heads = 1;
      one.q = q.data() + static_cast<size_t>(i * s.group) * hd;
      one.out = each.data() + static_cast<size_t>(i * s.group) * hd;
      one.k_offset = a.k_offset + static_cast<size_t>(i) * a.kv_head_bytes;
      one.v_offset = a.v_offset + static_cast<size_t>(i) * a.kv_head_bytes;
      Attend(one);
    }
    EXPECT_EQ(std::memcmp(all.data(), each.data(), all.size() * sizeof(float)), 0) << SimdLevelName(level);
    for (float x : all) ASSERT_TRUE(std::isfinite(x)) << SimdLevelName(level);
  }
  SetSimdLevelOverride(std::nullopt);
}

// A context split at block boundaries into 1 to 3 ranges, each range's
// call (all KV heads at once, and one head group alone) with lse set, merged
// by MergeAttention: the same attention as the double reference over the
// whole context, and lse equal to the double log-sum-exp of the scores.
TEST_P(AttendTest, RangesMergeIntoTheWholeContext) {
  const Shape s = GetParam();
  const int blocks = (s.n_ctx + s.block_size - 1) / s.block_size;
  Fixture f(s, 5u + static_cast<uint32_t>(s.head_dim * 7 + s.n_ctx));
  const std::vector<double> want = f.Reference();
  const std::vector<double> want_lse = f.LogSumExp();  // head g's group
  const size_t hd = static_cast<size_t>(s.head_dim);
  for (int parts : {1, 2, 3}) {
    if (parts > blocks) continue;  // one range (the whole context) always runs
    for (SimdLevel level : {SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvx512}) {
      if (level > DetectedSimdLevel()) continue;
      SetSimdLevelOverride(level);
      for (bool wide : {false, true}) {
        // wide: all KV heads in one call (position-major kernel); the result
        // for head g's group is then taken from its slot.
        const int kvh = wide ? s.n_kv_heads : 1;
        const int heads = kvh * s.group;
        std::vector<float> q(static_cast<size_t>(heads) * hd);
        for (int i = 0; i < kvh; ++i) {
          const int src_group = wide ? (i == f.g ? 0 : -1) : 0;
          for (size_t e = 0; e < static_cast<size_t>(s.group) * hd; ++e)
            q[static_cast<size_t>(i * s.group) * hd + e] = src_group == 0 ? f.q[e] : 0.25f;
        }
        std::vector<float> out_p(static_cast<size_t>(parts * heads) * hd, NAN), lse_p(static_cast<size_t>(parts * heads), NAN);
        std::vector<float> scores(static_cast<size_t>(heads * s.n_ctx));
        for (int p = 0; p < parts; ++p) {
          const int b0 = blocks * p / parts, b1 = blocks * (p + 1) / parts;
          AttnArgs a = f.Args(out_p.data() + static_cast<size_t>(p * heads) * hd, scores.data());
          a.q = q.data();
          if (wide) {
            a.k_offset -= static_cast<size_t>(f.g) * hd * f.elem;
            a.v_offset -= static_cast<size_t>(f.g) * hd * f.elem;
            a.kv_heads = s.n_kv_heads;
            a.kv_head_bytes = hd * f.elem;
          }
          a.block_table = f.table.data() + b0;
          a.n_ctx = std::min(s.n_ctx, b1 * s.block_size) - b0 * s.block_size;
          a.lse = lse_p.data() + static_cast<size_t>(p * heads);
          Attend(a);
        }
        std::vector<float> merged(static_cast<size_t>(heads) * hd, NAN);
        MergeAttention(out_p.data(), lse_p.data(), parts, heads, s.head_dim, merged.data());
        const int slot = wide ? f.g : 0;
        std::vector<float> mine(merged.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>(slot * s.group) * hd),
                                merged.begin() + static_cast<std::ptrdiff_t>(static_cast<size_t>((slot + 1) * s.group) * hd));
        const std::string what = std::string(SimdLevelName(level)) + (wide ? " wide" : " one group") +
                                 " parts=" + std::to_string(parts);
        EXPECT_LE(Error(mine, want), 2e-5) << what;
        // Whole-context lse: log Σ_p exp(lse_p), against the double one.
        for (int h = 0; h < s.group; ++h) {
          double acc = 0;
          for (int p = 0; p < parts; ++p)
            acc += std::exp(static_cast<double>(lse_p[static_cast<size_t>(p * heads + slot * s.group + h)]) - want_lse[h]);
          EXPECT_NEAR(std::log(acc), 0.0, 1e-5) << what << " head " << h;
        }
      }
    }
  }
  SetSimdLevelOverride(std::nullopt);
}

// Two ranges with very different score scales (one range's scores far below
// the other's): the merge weights must come from the log-sum-exps, not from
// a plain average of the range outputs.
TEST(MergeAttention, WeightsRangesBySoftmaxMass) {
  const int hd = 2;
  // Range 0 holds essentially all the mass (lse 10), range 1 almost none.
  const std::vector<float> out_p = {1.0f, 2.0f, -5.0f, 7.0f};
  const std::vector<float> lse_p = {10.0f, -20.0f};
  std::vector<float> out(2);
  MergeAttention(out_p.data(), lse_p.data(), 2, 1, hd, out.data());
  const double w1 = std::exp(-30.0) / (1 + std::exp(-30.0));
  EXPECT_NEAR(out[0], 1.0 * (1 - w1) + -5.0 * w1, 1e-6);
  EXPECT_NEAR(out[1], 2.0 * (1 - w1) + 7.0 * w1, 1e-6);
  // Equal mass: the plain average.
  const std::vector<float> even = {3.0f, 3.0f};
  MergeAttention(out_p.data(), even.data(), 2, 1, hd, out.data());
  EXPECT_FLOAT_EQ(out[0], -2.0f);
  EXPECT_FLOAT_EQ(out[1], 4.5f);
}

INSTANTIATE_TEST_SUITE_P(Shapes, AttendTest, ::testing::ValuesIn(Shapes()),
                         [](const auto& info) { return Name(info.param); });

}  // namespace
}  // namespace strata::cpu
