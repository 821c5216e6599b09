// Each instruction-set level of the CPU kernels against a double-precision
// reference, on odd lengths and unaligned pointers.

#include "model/backend/cpu/kernels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "model/backend/cpu/kernels_internal.h"

namespace strata::cpu {
namespace {

using internal::Bf16BitsToFloat;
using internal::FloatToBf16Bits;
using internal::FloatToHalfBits;
using internal::HalfBitsToFloat;

constexpr int kLengths[] = {1, 7, 17, 64, 65, 257, 4099};
constexpr float kInf = std::numeric_limits<float>::infinity();

// Deterministic uniform floats in [lo, hi) (no std::*_distribution, whose
// output differs between standard libraries).
class Rng {
 public:
  explicit Rng(uint64_t seed) : gen_(seed) {}
  double Uniform() { return static_cast<double>(gen_() >> 11) * 0x1p-53; }
  float Uniform(float lo, float hi) { return static_cast<float>(lo + (hi - lo) * Uniform()); }
  uint32_t Bits() { return static_cast<uint32_t>(gen_()); }

 private:
  std::mt19937_64 gen_;
};

// A buffer whose data() is deliberately not 16/32/64-byte aligned.
template <typename T>
class Unaligned {
 public:
  explicit Unaligned(int n) : storage_(static_cast<size_t>(n) + 1) {}
  T* data() { return storage_.data() + 1; }
  T& operator[](int i) { return data()[i]; }

 private:
  std::vector<T> storage_;
};

Unaligned<float> RandomFloats(int n, Rng& rng, float lo, float hi) {
  Unaligned<float> v(n);
  for (int i = 0; i < n; ++i) v[i] = rng.Uniform(lo, hi);
  return v;
}

// Runs the public kernels at the level under test (via the process-wide
// override) and reads that level's table directly where a test needs it.
class KernelsTest : public ::testing::TestWithParam<SimdLevel> {
 protected:
  void SetUp() override {
    if (ElemKernelsFor(GetParam()) == nullptr) {
      GTEST_SKIP() << "CPU lacks " << SimdLevelName(GetParam());
    }
    SetSimdLevelOverride(GetParam());
    ASSERT_EQ(ActiveSimdLevel(), GetParam());
  }
  void TearDown() override { SetSimdLevelOverride(std::nullopt); }
  const ElemKernels& table() { return *ElemKernelsFor(GetParam()); }
};

TEST_P(KernelsTest, ExpIsAccurateOverTheFloatRange) {
  std::vector<float> x;
  for (double v = -87.3; v <= 88.7; v += 0.00137) x.push_back(static_cast<float>(v));
  for (float v : {0.0f, -0.0f, 1.0f, -1.0f, 0.34657359f, -0.34657359f, 88.72f, -87.33f}) {
    x.push_back(v);
  }
  std::vector<float> y(x.size());
  table().exp(x.data(), y.data(), static_cast<int>(x.size()));
  double worst = 0.0;
  for (size_t i = 0; i < x.size(); ++i) {
    const double ref = std::exp(static_cast<double>(x[i]));
    worst = std::max(worst, std::abs(y[i] - ref) / ref);
  }
  EXPECT_LE(worst, 3e-7);            // measured: 1.4 ulp (8.2e-8)
  EXPECT_EQ(y[x.size() - 8], 1.0f);  // exp(0)

  const float special[] = {-kInf, kInf, std::nanf(""), 100.0f, -200.0f, -100.0f, 1e30f, -1e30f};
  float out[8];
  table().exp(special, out, 8);
  EXPECT_EQ(out[0], 0.0f);
  EXPECT_EQ(out[1], kInf);
  EXPECT_TRUE(std::isnan(out[2]));
  EXPECT_EQ(out[3], kInf);
  EXPECT_EQ(out[4], 0.0f);
  EXPECT_LE(out[5], 1e-43f);
  EXPECT_GE(out[5], 0.0f);
  EXPECT_EQ(out[6], kInf);
  EXPECT_EQ(out[7], 0.0f);
}

TEST_P(KernelsTest, RmsNormMatchesReference) {
  Rng rng(1);
  for (int n : kLengths) {
    SCOPED_TRACE(n);
    auto x = RandomFloats(n, rng, -4.0f, 4.0f);
    auto w = RandomFloats(n, rng, 0.5f, 1.5f);
    Unaligned<float> y(n);
    RmsNorm(x.data(), w.data(), y.data(), n, 1e-5f);
    double ss = 0.0;
    for (int i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
    const double scale = 1.0 / std::sqrt(ss / n + 1e-5);
    for (int i = 0; i < n; ++i) {
      const double ref = x[i] * scale * w[i];
      ASSERT_NEAR(y[i], ref, 1e-5 * std::abs(ref) + 1e-30) << i;
    }
    // In place gives the same values.
    RmsNorm(x.data(), w.data(), x.data(), n, 1e-5f);
    for (int i = 0; i < n; ++i) ASSERT_EQ(x[i], y[i]) << i;
  }
}

TEST_P(KernelsTest, RmsNormSurvivesValuesWhoseSquaresOverflowFloat) {
  const int n = 257;
  Unaligned<float> x(n);
  Unaligned<float> w(n);
  Unaligned<float> y(n);
  for (int i = 0; i < n; ++i) {
    x[i] = (i % 2 == 0 ? 3e20f : -3e20f);
    w[i] = 2.0f;
  }
  RmsNorm(x.data(), w.data(), y.data(), n, 1e-6f);
  for (int i = 0; i < n; ++i) ASSERT_NEAR(y[i], i % 2 == 0 ? 2.0 : -2.0, 1e-5) << i;
}

std::vector<float> InvFreq(int head_dim) {
  std::vector<float> f(head_dim / 2);
  for (int i = 0; i < head_dim / 2; ++i) {
    f[i] = static_cast<float>(std::pow(500000.0, -2.0 * i / head_dim));
  }
  return f;
}

TEST_P(KernelsTest, RopeMatchesReference) {
  Rng rng(2);
  for (bool neox : {false, true}) {
    for (int head_dim : {2, 6, 14, 34, 64, 128, 130}) {
      for (int pos : {0, 1, 17, 4095, 131071}) {
        SCOPED_TRACE(std::to_string(neox) + " " + std::to_string(head_dim) + " " +
                     std::to_string(pos));
        const int n_heads = 3;
        const int n = n_heads * head_dim;
        auto x = RandomFloats(n, rng, -2.0f, 2.0f);
        const std::vector<float> before(x.data(), x.data() + n);
        const std::vector<float> inv_freq = InvFreq(head_dim);
        ApplyRope(x.data(), n_heads, head_dim, pos, inv_freq.data(), neox);
        const int half = head_dim / 2;
        for (int h = 0; h < n_heads; ++h) {
          for (int i = 0; i < half; ++i) {
            const int i0 = h * head_dim + (neox ? i : 2 * i);
            const int i1 = h * head_dim + (neox ? i + half : 2 * i + 1);
            const double angle = static_cast<double>(pos) * inv_freq[i];
            const double c = std::cos(angle);
            const double s = std::sin(angle);
            const double a = before[i0];
            const double b = before[i1];
            const double tol = 1e-5 * (std::abs(a) + std::abs(b));
            ASSERT_NEAR(x[i0], a * c - b * s, tol) << h << " " << i;
            ASSERT_NEAR(x[i1], b * c + a * s, tol) << h << " " << i;
            if (pos == 0) {
              ASSERT_EQ(x[i0], before[i0]);
              ASSERT_EQ(x[i1], before[i1]);
            }
          }
        }
      }
    }
  }
}

TEST_P(KernelsTest, RopeLayoutsAgreeUpToPermutation) {
  // Interleaved on (x0, x_h, x1, x_h+1, ...) equals neox on (x0, x1, ..., x_h, ...).
  Rng rng(3);
  const int head_dim = 38;
  const int half = head_dim / 2;
  auto neox = RandomFloats(head_dim, rng, -1.0f, 1.0f);
  Unaligned<float> inter(head_dim);
  for (int i = 0; i < half; ++i) {
    inter[2 * i] = neox[i];
    inter[2 * i + 1] = neox[i + half];
  }
  const std::vector<float> inv_freq = InvFreq(head_dim);
  ApplyRope(neox.data(), 1, head_dim, 321, inv_freq.data(), true);
  ApplyRope(inter.data(), 1, head_dim, 321, inv_freq.data(), false);
  for (int i = 0; i < half; ++i) {
    EXPECT_NEAR(inter[2 * i], neox[i], 1e-6);
    EXPECT_NEAR(inter[2 * i + 1], neox[i + half], 1e-6);
  }
}

TEST_P(KernelsTest, SwiGluMatchesReference) {
  Rng rng(4);
  for (int n : kLengths) {
    SCOPED_TRACE(n);
    auto g = RandomFloats(n, rng, -20.0f, 20.0f);
    auto u = RandomFloats(n, rng, -3.0f, 3.0f);
    Unaligned<float> out(n);
    SwiGlu(g.data(), u.data(), out.data(), n);
    for (int i = 0; i < n; ++i) {
      const double gd = g[i];
      const double ref = gd / (1.0 + std::exp(-gd)) * u[i];
      ASSERT_NEAR(out[i], ref, 1e-5 * std::abs(ref) + 1e-30) << i;
    }
    SwiGlu(g.data(), u.data(), g.data(), n);  // out aliases gate
    for (int i = 0; i < n; ++i) ASSERT_EQ(g[i], out[i]) << i;
  }
  const float big[] = {-100.0f, 100.0f, 0.0f};
  const float ones[] = {1.0f, 1.0f, 1.0f};
  float r[3];
  SwiGlu(big, ones, r, 3);
  EXPECT_NEAR(r[0], 0.0f, 1e-30f);
  EXPECT_EQ(r[1], 100.0f);
  EXPECT_EQ(r[2], 0.0f);
}

TEST_P(KernelsTest, SoftmaxMatchesReference) {
  Rng rng(5);
  for (int n : kLengths) {
    SCOPED_TRACE(n);
    for (float offset : {0.0f, 1000.0f, -1000.0f}) {
      auto x = RandomFloats(n, rng, -30.0f + offset, 30.0f + offset);
      std::vector<double> ref(x.data(), x.data() + n);
      const double m = *std::max_element(ref.begin(), ref.end());
      double sum = 0.0;
      for (double& v : ref) sum += (v = std::exp(v - m));
      Softmax(x.data(), n);
      double total = 0.0;
      for (int i = 0; i < n; ++i) {
        ASSERT_NEAR(x[i], ref[i] / sum, 1e-5 * ref[i] / sum + 1e-38) << i;
        total += x[i];
      }
      EXPECT_NEAR(total, 1.0, 1e-5);
    }
  }
}

TEST_P(KernelsTest, SoftmaxGivesMaskedEntriesExactlyZero) {
  for (int n : kLengths) {
    Unaligned<float> x(n);
    for (int i = 0; i < n; ++i) x[i] = (i % 3 == 1) ? -kInf : 0.5f;
    Softmax(x.data(), n);
    int live = 0;
    for (int i = 0; i < n; ++i) live += (i % 3 != 1);
    for (int i = 0; i < n; ++i) {
      if (i % 3 == 1) {
        ASSERT_EQ(x[i], 0.0f) << n << " " << i;
      } else {
        ASSERT_NEAR(x[i], 1.0 / live, 1e-6 / live) << n << " " << i;
      }
    }
  }
}

TEST_P(KernelsTest, AddIsExact) {
  Rng rng(6);
  for (int n : kLengths) {
    auto y = RandomFloats(n, rng, -10.0f, 10.0f);
    auto x = RandomFloats(n, rng, -10.0f, 10.0f);
    const std::vector<float> y0(y.data(), y.data() + n);
    Add(y.data(), x.data(), n);
    for (int i = 0; i < n; ++i) ASSERT_EQ(y[i], y0[i] + x[i]) << n << " " << i;
  }
}

// Random floats stored as `t`, and the float values they hold. data() is one
// element past a vector's start: aligned to the element, not to SIMD width.
struct KvData {
  std::vector<uint32_t> storage;
  size_t elem_bytes = 4;
  std::vector<float> values;
  const void* data() const { return reinterpret_cast<const uint8_t*>(storage.data()) + elem_bytes; }
};

KvData MakeKv(DType t, int n, Rng& rng) {
  KvData kv;
  kv.elem_bytes = RowBytes(t, 1);
  kv.storage.resize(RowBytes(t, n + 1) / 4 + 1);
  kv.values.resize(n);
  uint8_t* base = reinterpret_cast<uint8_t*>(kv.storage.data()) + kv.elem_bytes;
  for (int i = 0; i < n; ++i) {
    const float f = rng.Uniform(-3.0f, 3.0f);
    uint8_t* p = base + RowBytes(t, i);
    if (t == DType::kF32) {
      std::memcpy(p, &f, 4);
      kv.values[i] = f;
    } else {
      const uint16_t h = t == DType::kF16 ? FloatToHalfBits(f) : FloatToBf16Bits(f);
      std::memcpy(p, &h, 2);
      kv.values[i] = t == DType::kF16 ? HalfBitsToFloat(h) : Bf16BitsToFloat(h);
    }
  }
  return kv;
}

constexpr DType kKvTypes[] = {DType::kF32, DType::kF16, DType::kBF16};

TEST_P(KernelsTest, DotKvMatchesReference) {
  Rng rng(7);
  for (DType t : kKvTypes) {
    for (int n : kLengths) {
      SCOPED_TRACE(std::string(DTypeName(t)) + " " + std::to_string(n));
      auto q = RandomFloats(n, rng, -2.0f, 2.0f);
      const KvData k = MakeKv(t, n, rng);
      double ref = 0.0;
      double mag = 0.0;
      for (int i = 0; i < n; ++i) {
        ref += static_cast<double>(q[i]) * k.values[i];
        mag += std::abs(static_cast<double>(q[i]) * k.values[i]);
      }
      EXPECT_NEAR(DotKv(q.data(), k.data(), t, n), ref, 1e-5 * mag);
    }
  }
  const float q = 1.0f;
  EXPECT_TRUE(std::isnan(DotKv(&q, &q, DType::kQ8_0, 1)));
  EXPECT_EQ(DotKv(&q, &q, DType::kF32, 0), 0.0f);
}

TEST_P(KernelsTest, AxpyKvMatchesReference) {
  Rng rng(8);
  for (DType t : kKvTypes) {
    for (int n : kLengths) {
      SCOPED_TRACE(std::string(DTypeName(t)) + " " + std::to_string(n));
      auto out = RandomFloats(n, rng, -1.0f, 1.0f);
      const std::vector<float> out0(out.data(), out.data() + n);
      const KvData v = MakeKv(t, n, rng);
      const float a = 0.37f;
      AxpyKv(a, v.data(), t, out.data(), n);
      for (int i = 0; i < n; ++i) {
        const double ref = out0[i] + static_cast<double>(a) * v.values[i];
        ASSERT_NEAR(out[i], ref, 1e-6 * (std::abs(out0[i]) + std::abs(a * v.values[i]))) << i;
      }
    }
  }
}

TEST_P(KernelsTest, KvLoadsConvertEveryHalfAndBf16Exactly) {
  // out = 0 + 1 * v reproduces v exactly (but for the sign of zero).
  std::vector<uint16_t> all(65536);
  for (int i = 0; i < 65536; ++i) all[i] = static_cast<uint16_t>(i);
  for (DType t : {DType::kF16, DType::kBF16}) {
    std::vector<float> out(65536, 0.0f);
    AxpyKv(1.0f, all.data(), t, out.data(), 65536);
    for (int i = 0; i < 65536; ++i) {
      const float ref = t == DType::kF16 ? HalfBitsToFloat(all[i]) : Bf16BitsToFloat(all[i]);
      if (std::isnan(ref)) {
        ASSERT_TRUE(std::isnan(out[i])) << i;
      } else {
        ASSERT_EQ(out[i], ref) << DTypeName(t) << " " << i;
      }
    }
  }
}

TEST_P(KernelsTest, StoreKvRoundsLikeTheScalarConversions) {
  Rng rng(9);
  std::vector<float> src;
  for (int i = 0; i < 4099; ++i) {
    // Random bit patterns cover every exponent, NaNs and infinities included;
    // the second half is scaled into the f16 range and its subnormals.
    const float r = std::bit_cast<float>(rng.Bits());
    src.push_back(i % 2 == 0 ? r : rng.Uniform(-1.0f, 1.0f) * std::ldexp(1.0f, i % 44 - 28));
  }
  for (float f : {65504.0f, 65519.99f, 65520.0f, 0x1p-24f, 0x1p-25f, 0x3p-25f, 1.0f + 0x1p-11f,
                  1.0f + 0x3p-11f, -0.0f, kInf, -kInf, 3.4e38f}) {
    src.push_back(f);
  }
  const int n = static_cast<int>(src.size());
  for (DType t : kKvTypes) {
    SCOPED_TRACE(DTypeName(t));
    for (int len : {1, 7, 17, 65, n}) {
      // One element of guard on each side; data aligned to the element only.
      const size_t eb = RowBytes(t, 1);
      std::vector<uint32_t> storage(RowBytes(t, len + 2) / 4 + 1);
      std::memset(storage.data(), 0xAB, storage.size() * 4);
      uint8_t* dst = reinterpret_cast<uint8_t*>(storage.data()) + eb;
      StoreKv(src.data(), dst, t, len);
      for (size_t b = 0; b < eb; ++b) {
        EXPECT_EQ(dst[-1 - static_cast<ptrdiff_t>(b)], 0xAB);
        EXPECT_EQ(dst[RowBytes(t, len) + b], 0xAB);  // nothing written past the end
      }
      for (int i = 0; i < len; ++i) {
        if (t == DType::kF32) {
          float f;
          std::memcpy(&f, dst + 4 * i, 4);
          ASSERT_EQ(std::bit_cast<uint32_t>(f), std::bit_cast<uint32_t>(src[i])) << i;
          continue;
        }
        uint16_t h;
        std::memcpy(&h, dst + 2 * i, 2);
        const uint16_t ref = t == DType::kF16 ? FloatToHalfBits(src[i]) : FloatToBf16Bits(src[i]);
        ASSERT_EQ(h, ref) << i << " " << src[i];
      }
    }
  }
}

TEST_P(KernelsTest, SizesAtOrBelowZeroAreNoOps) {
  float x[2] = {1.0f, 2.0f};
  const float w[2] = {1.0f, 1.0f};
  RmsNorm(x, w, x, 0, 1e-5f);
  Softmax(x, -1);
  SwiGlu(x, x, x, 0);
  Add(x, x, 0);
  AxpyKv(1.0f, x, DType::kF32, x, 0);
  StoreKv(x, x, DType::kF16, 0);
  ApplyRope(x, 0, 2, 1, w, false);
  ApplyRope(x, 1, 0, 1, w, false);
  EXPECT_EQ(x[0], 1.0f);
  EXPECT_EQ(x[1], 2.0f);
}

INSTANTIATE_TEST_SUITE_P(AllLevels, KernelsTest,
                         ::testing::Values(SimdLevel::kScalar, SimdLevel::kAvx2,
                                           SimdLevel::kAvx512),
                         [](const ::testing::TestParamInfo<SimdLevel>& info) {
                           return std::string(SimdLevelName(info.param));
                         });

TEST(ScalarConversionsTest, HalfRoundTripsEveryValue) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = HalfBitsToFloat(static_cast<uint16_t>(h));
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(HalfBitsToFloat(FloatToHalfBits(f))));
      continue;
    }
    ASSERT_EQ(FloatToHalfBits(f), h) << h;
  }
}

TEST(ScalarConversionsTest, KnownValuesRoundToNearestEven) {
  EXPECT_EQ(FloatToHalfBits(1.0f), 0x3c00);
  EXPECT_EQ(FloatToHalfBits(-2.0f), 0xc000);
  EXPECT_EQ(FloatToHalfBits(65504.0f), 0x7bff);
  EXPECT_EQ(FloatToHalfBits(65519.99f), 0x7bff);
  EXPECT_EQ(FloatToHalfBits(65520.0f), 0x7c00);  // tie rounds to even: inf
  EXPECT_EQ(FloatToHalfBits(1e10f), 0x7c00);
  EXPECT_EQ(FloatToHalfBits(0x1p-24f), 0x0001);
  EXPECT_EQ(FloatToHalfBits(0x1p-25f), 0x0000);  // tie to even
  EXPECT_EQ(FloatToHalfBits(0x3p-25f), 0x0002);  // 1.5 units: tie to even
  EXPECT_EQ(FloatToHalfBits(1.0f + 0x1p-11f), 0x3c00);
  EXPECT_EQ(FloatToHalfBits(1.0f + 0x3p-11f), 0x3c02);
  EXPECT_EQ(FloatToHalfBits(0x1p-14f - 0x1p-26f), 0x0400);  // rounds up to the smallest normal
  EXPECT_EQ(HalfBitsToFloat(0x0001), 0x1p-24f);
  EXPECT_EQ(HalfBitsToFloat(0x7c00), kInf);
  EXPECT_TRUE(std::isnan(HalfBitsToFloat(0x7c01)));

  EXPECT_EQ(FloatToBf16Bits(1.0f), 0x3f80);
  EXPECT_EQ(FloatToBf16Bits(1.0f + 0x1p-8f), 0x3f80);  // tie to even
  EXPECT_EQ(FloatToBf16Bits(1.0f + 0x3p-8f), 0x3f82);
  EXPECT_EQ(FloatToBf16Bits(3.4028235e38f), 0x7f80);  // rounds up to inf
  EXPECT_EQ(FloatToBf16Bits(-kInf), 0xff80);
  EXPECT_TRUE(std::isnan(Bf16BitsToFloat(FloatToBf16Bits(std::nanf("")))));
  // A NaN whose payload is only in the low 16 bits must not become inf.
  EXPECT_TRUE(std::isnan(Bf16BitsToFloat(FloatToBf16Bits(std::bit_cast<float>(0x7f800001u)))));
  EXPECT_EQ(Bf16BitsToFloat(0x3f80), 1.0f);
}

TEST(DispatchTest, EveryLevelUpToTheDetectedOneHasItsTable) {
  for (SimdLevel level : {SimdLevel::kScalar, SimdLevel::kAvx2, SimdLevel::kAvx512}) {
    const ElemKernels* t = ElemKernelsFor(level);
    if (static_cast<int>(level) <= static_cast<int>(DetectedSimdLevel())) {
      ASSERT_NE(t, nullptr) << SimdLevelName(level);
      EXPECT_EQ(t->level, level);
    } else {
      EXPECT_EQ(t, nullptr) << SimdLevelName(level);
    }
  }
}

}  // namespace
}  // namespace strata::cpu
