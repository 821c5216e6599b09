#include "model/backend/cpu/quant.h"

#include <gtest/gtest.h>

#include <bit>
#include <cmath>
#include <cstddef>
#include <cstring>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "model/backend/cpu/cpu_features.h"

namespace strata::cpu {
namespace {

constexpr DType kQuantTypes[] = {DType::kQ4_0, DType::kQ8_0, DType::kQ4_K, DType::kQ5_K,
                                 DType::kQ6_K};
constexpr DType kAllTypes[] = {DType::kF32,  DType::kF16,  DType::kBF16, DType::kQ4_0,
                               DType::kQ8_0, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};

// Every SIMD level this CPU can run, narrowest first.
std::vector<SimdLevel> Levels() {
  std::vector<SimdLevel> v;
  for (int l = 0; l <= static_cast<int>(DetectedSimdLevel()); ++l)
    v.push_back(static_cast<SimdLevel>(l));
  return v;
}

class LevelScope {
 public:
  explicit LevelScope(SimdLevel l) { SetSimdLevelOverride(l); }
  ~LevelScope() { SetSimdLevelOverride(std::nullopt); }
};

uint32_t Bits(float f) { return std::bit_cast<uint32_t>(f); }
float FromBits(uint32_t b) { return std::bit_cast<float>(b); }

// ---- f16 -------------------------------------------------------------------

TEST(F16Test, DecodesSpecialValues) {
  EXPECT_EQ(Bits(F16ToF32(0x0000)), 0u);
  EXPECT_EQ(Bits(F16ToF32(0x8000)), 0x80000000u);
  EXPECT_EQ(F16ToF32(0x3c00), 1.f);
  EXPECT_EQ(F16ToF32(0xc000), -2.f);
  EXPECT_EQ(F16ToF32(0x0001), std::ldexp(1.f, -24));           // smallest subnormal
  EXPECT_EQ(F16ToF32(0x03ff), 1023.f * std::ldexp(1.f, -24));  // largest subnormal
  EXPECT_EQ(F16ToF32(0x0400), std::ldexp(1.f, -14));           // smallest normal
  EXPECT_EQ(F16ToF32(0x7bff), 65504.f);
  EXPECT_EQ(F16ToF32(0x7c00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(F16ToF32(0xfc00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(F16ToF32(0x7e00)));
  EXPECT_TRUE(std::isnan(F16ToF32(0x7c01)));
}

TEST(F16Test, EveryHalfRoundTrips) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const float f = F16ToF32(static_cast<uint16_t>(h));
    const uint16_t back = F32ToF16(f);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(F16ToF32(back))) << std::hex << h;
      EXPECT_EQ(back & 0x8000, h & 0x8000) << std::hex << h;
    } else {
      EXPECT_EQ(back, h) << std::hex << h;
    }
  }
}

TEST(F16Test, RoundsToNearestEven) {
  const float ulp1 = std::ldexp(1.f, -10);          // f16 spacing at 1.0
  EXPECT_EQ(F32ToF16(1.f + ulp1 / 2), 0x3c00);      // tie -> even (1.0)
  EXPECT_EQ(F32ToF16(1.f + 3 * ulp1 / 2), 0x3c02);  // tie -> even (1 + 2 ulp)
  EXPECT_EQ(F32ToF16(std::nextafter(1.f + ulp1 / 2, 2.f)), 0x3c01);
  EXPECT_EQ(F32ToF16(-(1.f + ulp1 / 2)), 0xbc00);
  // Overflow: 65520 is the tie between 65504 and 2^16 (which is inf).
  EXPECT_EQ(F32ToF16(65519.996f), 0x7bff);
  EXPECT_EQ(F32ToF16(65520.f), 0x7c00);
  EXPECT_EQ(F32ToF16(-1e10f), 0xfc00);
  EXPECT_EQ(F32ToF16(std::numeric_limits<float>::infinity()), 0x7c00);
  // Subnormal results and their ties.
  const float sub = std::ldexp(1.f, -24);
  EXPECT_EQ(F32ToF16(sub / 2), 0x0000);  // tie -> 0
  EXPECT_EQ(F32ToF16(std::nextafter(sub / 2, 1.f)), 0x0001);
  EXPECT_EQ(F32ToF16(3 * sub / 2), 0x0002);  // tie -> even
  EXPECT_EQ(F32ToF16(5 * sub / 2), 0x0002);
  EXPECT_EQ(F32ToF16(1023.5f * sub), 0x0400);  // tie -> smallest normal
  EXPECT_EQ(F32ToF16(-sub), 0x8001);
  EXPECT_EQ(F32ToF16(1e-30f), 0x0000);
  EXPECT_EQ(F32ToF16(-0.f), 0x8000);
  EXPECT_EQ(F32ToF16(std::ldexp(1.f, -149)), 0x0000);  // f32 subnormal input
  // NaN stays NaN, also when the payload sits only in the low bits.
  for (uint32_t nan : {0x7fc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu}) {
    const uint16_t h = F32ToF16(FromBits(nan));
    EXPECT_EQ(h & 0x7c00, 0x7c00) << std::hex << nan;
    EXPECT_NE(h & 0x03ff, 0) << std::hex << nan;
    EXPECT_EQ(h >> 15, nan >> 31);
  }
}

// Brute-force nearest-even f16 by searching the (monotonic) finite codes.
uint16_t ReferenceF16(float f) {
  const uint16_t sign = std::signbit(f) ? 0x8000 : 0;
  const double a = std::fabs(static_cast<double>(f));
  if (a >= 65520.0) return sign | 0x7c00;
  uint32_t lo = 0, hi = 0x7bff;
  while (lo < hi) {  // largest code with value <= a
    const uint32_t mid = (lo + hi + 1) / 2;
    if (F16ToF32(static_cast<uint16_t>(mid)) <= a)
      lo = mid;
    else
      hi = mid - 1;
  }
  if (lo == 0x7bff) return sign | 0x7bff;
  const double below = F16ToF32(static_cast<uint16_t>(lo));
  const double above = F16ToF32(static_cast<uint16_t>(lo + 1));
  uint32_t pick = lo;
  if (a - below > above - a || (a - below == above - a && (lo & 1))) pick = lo + 1;
  return static_cast<uint16_t>(sign | pick);
}

TEST(F16Test, MatchesBruteForceRounding) {
  std::mt19937 rng(1);
  std::uniform_int_distribution<uint32_t> exp(90, 145);  // subnormal-to-overflow range
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 20000; ++i) {
    const uint32_t b = (bits(rng) & 0x807fffffu) | (exp(rng) << 23);
    const float f = FromBits(b);
    ASSERT_EQ(F32ToF16(f), ReferenceF16(f)) << std::hex << b;
  }
}

// ---- bf16 ------------------------------------------------------------------

TEST(BF16Test, ConvertsAndRoundsToNearestEven) {
  EXPECT_EQ(BF16ToF32(0x3f80), 1.f);
  EXPECT_EQ(Bits(BF16ToF32(0x8000)), 0x80000000u);
  EXPECT_EQ(F32ToBF16(1.f), 0x3f80);
  EXPECT_EQ(F32ToBF16(FromBits(0x3f808000u)), 0x3f80);  // tie -> even
  EXPECT_EQ(F32ToBF16(FromBits(0x3f818000u)), 0x3f82);  // tie -> even
  EXPECT_EQ(F32ToBF16(FromBits(0x3f808001u)), 0x3f81);
  EXPECT_EQ(F32ToBF16(FromBits(0x3f807fffu)), 0x3f80);
  EXPECT_EQ(F32ToBF16(FromBits(0xbf808001u)), 0xbf81);
  EXPECT_EQ(F32ToBF16(std::numeric_limits<float>::max()), 0x7f80);  // rounds up to inf
  EXPECT_EQ(F32ToBF16(std::numeric_limits<float>::infinity()), 0x7f80);
  EXPECT_EQ(F32ToBF16(-std::numeric_limits<float>::infinity()), 0xff80);
  EXPECT_EQ(F32ToBF16(FromBits(0x00008000u)), 0x0000);  // subnormal tie -> even
  EXPECT_EQ(F32ToBF16(FromBits(0x00018000u)), 0x0002);
  EXPECT_EQ(F32ToBF16(FromBits(0x00010000u)), 0x0001);  // subnormals kept
  for (uint32_t nan : {0x7fc00000u, 0x7f800001u, 0xff800001u, 0x7fffffffu, 0x7f80ffffu}) {
    EXPECT_TRUE(std::isnan(BF16ToF32(F32ToBF16(FromBits(nan))))) << std::hex << nan;
  }
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const float f = BF16ToF32(static_cast<uint16_t>(h));
    if (!std::isnan(f)) {
      ASSERT_EQ(F32ToBF16(f), h);
    }
  }
}

// The SIMD encoders must give exactly the scalar bits, tails included.
TEST(ConvertRowTest, SimdMatchesScalarBitForBit) {
  std::mt19937 rng(2);
  std::uniform_int_distribution<uint32_t> bits;
  std::vector<float> src(1000 + 13);
  for (auto& f : src) f = FromBits(bits(rng));
  // Make sure the interesting classes are present.
  const uint32_t specials[] = {0x7f800001u, 0xffc00000u, 0x7f800000u, 0x00000001u, 0x33000000u,
                               0x477ff000u, 0x477fefffu, 0x3f808000u, 0x80000000u, 0x387fc000u};
  for (size_t i = 0; i < std::size(specials); ++i) src[i * 7] = FromBits(specials[i]);
  for (DType t : {DType::kF16, DType::kBF16}) {
    std::vector<uint16_t> want(src.size());
    for (size_t i = 0; i < src.size(); ++i)
      want[i] = t == DType::kF16 ? F32ToF16(src[i]) : F32ToBF16(src[i]);
    for (SimdLevel level : Levels()) {
      LevelScope scope(level);
      std::vector<uint16_t> got(src.size());
      ConvertRow(t, src.data(), got.data(), static_cast<int64_t>(src.size()));
      for (size_t i = 0; i < src.size(); ++i) {
        ASSERT_EQ(got[i], want[i]) << DTypeName(t) << " " << SimdLevelName(level) << " i=" << i
                                   << " bits=" << std::hex << Bits(src[i]);
      }
      std::vector<float> back(src.size());
      DequantizeRow(t, got.data(), back.data(), static_cast<int64_t>(src.size()));
      for (size_t i = 0; i < src.size(); ++i) {
        const float expect = t == DType::kF16 ? F16ToF32(want[i]) : BF16ToF32(want[i]);
        ASSERT_EQ(Bits(back[i]), Bits(expect)) << i;
      }
    }
  }
}

// ---- Hand-built blocks decode per the format definition ----------------------

uint16_t H(float f) { return F32ToF16(f); }

TEST(QuantLayoutTest, BlockLayoutsAreGgml) {
  EXPECT_EQ(offsetof(BlockQ4_0, qs), 2u);
  EXPECT_EQ(offsetof(BlockQ8_0, qs), 2u);
  EXPECT_EQ(offsetof(BlockQ4_K, dmin), 2u);
  EXPECT_EQ(offsetof(BlockQ4_K, scales), 4u);
  EXPECT_EQ(offsetof(BlockQ4_K, qs), 16u);
  EXPECT_EQ(offsetof(BlockQ5_K, qh), 16u);
  EXPECT_EQ(offsetof(BlockQ5_K, qs), 48u);
  EXPECT_EQ(offsetof(BlockQ6_K, qh), 128u);
  EXPECT_EQ(offsetof(BlockQ6_K, scales), 192u);
  EXPECT_EQ(offsetof(BlockQ6_K, d), 208u);
  for (DType t : kAllTypes) {
    const auto& info = GetDTypeInfo(t);
    EXPECT_EQ(RowBytes(t, info.block_elems), static_cast<size_t>(info.block_bytes));
  }
  EXPECT_EQ(sizeof(BlockQ4_K), static_cast<size_t>(GetDTypeInfo(DType::kQ4_K).block_bytes));
  EXPECT_EQ(sizeof(BlockQ5_K), static_cast<size_t>(GetDTypeInfo(DType::kQ5_K).block_bytes));
  EXPECT_EQ(sizeof(BlockQ6_K), static_cast<size_t>(GetDTypeInfo(DType::kQ6_K).block_bytes));
}

// The 6-bit (scale, min) of sub-block j, read straight from the packing rule:
// j < 4: low 6 bits of bytes j and j + 4; j >= 4: low/high nibble of byte
// j + 4 plus the top two bits of bytes j - 4 / j as bits 4-5.
void RefScaleMin(const uint8_t* s, int j, int* sc, int* m) {
  if (j < 4) {
    *sc = s[j] & 0x3f;
    *m = s[j + 4] & 0x3f;
  } else {
    *sc = (s[j + 4] & 0x0f) | ((s[j - 4] >> 6) << 4);
    *m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

template <class Block>
Block RandomBlock(std::mt19937& rng) {
  Block b;
  auto* p = reinterpret_cast<uint8_t*>(&b);
  for (size_t i = 0; i < sizeof b; ++i) p[i] = static_cast<uint8_t>(rng());
  return b;
}

// Expected decodes are computed with the same float operations the format
// prescribes ((d * scale) * q - dmin * min), so they must match exactly.
TEST(QuantDecodeTest, Q4_0) {
  std::mt19937 rng(3);
  for (SimdLevel level : Levels()) {
    LevelScope scope(level);
    auto b = RandomBlock<BlockQ4_0>(rng);
    b.d = H(-0.375f);
    float out[32];
    DequantizeRow(DType::kQ4_0, &b, out, 32);
    for (int e = 0; e < 32; ++e) {
      const int q = e < 16 ? (b.qs[e] & 0xf) : (b.qs[e - 16] >> 4);
      EXPECT_EQ(out[e], static_cast<float>(q - 8) * -0.375f) << e;
    }
  }
}

TEST(QuantDecodeTest, Q8_0) {
  std::mt19937 rng(4);
  for (SimdLevel level : Levels()) {
    LevelScope scope(level);
    auto b = RandomBlock<BlockQ8_0>(rng);
    b.d = H(0.0625f);
    b.qs[0] = -128;
    b.qs[1] = 127;
    float out[32];
    DequantizeRow(DType::kQ8_0, &b, out, 32);
    for (int e = 0; e < 32; ++e) EXPECT_EQ(out[e], b.qs[e] * 0.0625f) << e;
  }
}

TEST(QuantDecodeTest, Q4_K) {
  std::mt19937 rng(5);
  for (SimdLevel level : Levels()) {
    LevelScope scope(level);
    auto b = RandomBlock<BlockQ4_K>(rng);
    b.d = H(0.01f);
    b.dmin = H(0.003f);
    const float d = F16ToF32(b.d), dmin = F16ToF32(b.dmin);
    float out[256];
    DequantizeRow(DType::kQ4_K, &b, out, 256);
    for (int e = 0; e < 256; ++e) {
      const int g = e / 64, hi = (e % 64) / 32, l = e % 32;
      const int q = hi ? (b.qs[32 * g + l] >> 4) : (b.qs[32 * g + l] & 0xf);
      int sc, m;
      RefScaleMin(b.scales, 2 * g + hi, &sc, &m);
      EXPECT_EQ(out[e], (d * sc) * q - dmin * m) << e;
    }
  }
}

TEST(QuantDecodeTest, Q5_K) {
  std::mt19937 rng(6);
  for (SimdLevel level : Levels()) {
    LevelScope scope(level);
    auto b = RandomBlock<BlockQ5_K>(rng);
    b.d = H(0.02f);
    b.dmin = H(0.25f);
    const float d = F16ToF32(b.d), dmin = F16ToF32(b.dmin);
    float out[256];
    DequantizeRow(DType::kQ5_K, &b, out, 256);
    for (int e = 0; e < 256; ++e) {
      const int g = e / 64, hi = (e % 64) / 32, l = e % 32;
      const int lo4 = hi ? (b.qs[32 * g + l] >> 4) : (b.qs[32 * g + l] & 0xf);
      const int q = lo4 + (((b.qh[l] >> (2 * g + hi)) & 1) ? 16 : 0);
      int sc, m;
      RefScaleMin(b.scales, 2 * g + hi, &sc, &m);
      EXPECT_EQ(out[e], (d * sc) * q - dmin * m) << e;
    }
  }
}

TEST(QuantDecodeTest, Q6_K) {
  std::mt19937 rng(7);
  for (SimdLevel level : Levels()) {
    LevelScope scope(level);
    auto b = RandomBlock<BlockQ6_K>(rng);
    b.d = H(-0.004f);
    const float d = F16ToF32(b.d);
    float out[256];
    DequantizeRow(DType::kQ6_K, &b, out, 256);
    for (int e = 0; e < 256; ++e) {
      const int h = e / 128, quarter = (e % 128) / 32, l = e % 32;
      const uint8_t qlb = b.ql[64 * h + l + (quarter & 1) * 32];
      const int low = quarter < 2 ? (qlb & 0xf) : (qlb >> 4);
      const int high = (b.qh[32 * h + l] >> (2 * quarter)) & 3;
      const int q = (low | (high << 4)) - 32;
      const int sc = b.scales[8 * h + 2 * quarter + l / 16];
      EXPECT_EQ(out[e], (d * sc) * q) << e;
    }
  }
}

TEST(QuantDecodeTest, ScaleMinPackingRoundTrips) {
  std::mt19937 rng(8);
  for (int it = 0; it < 100; ++it) {
    uint8_t sc[8], m[8], packed[12];
    for (int j = 0; j < 8; ++j) {
      sc[j] = rng() & 63;
      m[j] = rng() & 63;
    }
    PackScaleMinK4(sc, m, packed);
    for (int j = 0; j < 8; ++j) {
      uint8_t s2, m2;
      UnpackScaleMinK4(packed, j, &s2, &m2);
      int s3, m3;
      RefScaleMin(packed, j, &s3, &m3);
      EXPECT_EQ(s2, sc[j]);
      EXPECT_EQ(m2, m[j]);
      EXPECT_EQ(s3, sc[j]);
      EXPECT_EQ(m3, m[j]);
    }
  }
}

// Every SIMD level decodes random (finite-scaled) blocks to the same bits.
TEST(QuantDecodeTest, SimdMatchesScalarBitForBit) {
  std::mt19937 rng(9);
  std::normal_distribution<float> scale(0.f, 0.05f);
  for (DType t : kAllTypes) {
    const auto& info = GetDTypeInfo(t);
    const int64_t n = info.block_elems == 1 ? 1000 + 7 : info.block_elems * 5;
    std::vector<uint8_t> raw(RowBytes(t, n));
    for (auto& byte : raw) byte = static_cast<uint8_t>(rng());
    // Keep the f16 block scales finite; random mantissas and signs.
    const size_t bb = static_cast<size_t>(info.block_bytes);
    for (size_t off = 0; IsQuantized(t) && off < raw.size(); off += bb) {
      auto put = [&](size_t at) {
        const uint16_t h = H(scale(rng));
        std::memcpy(&raw[off + at], &h, 2);
      };
      if (t == DType::kQ4_0 || t == DType::kQ8_0 || t == DType::kQ4_K || t == DType::kQ5_K) put(0);
      if (t == DType::kQ4_K || t == DType::kQ5_K) put(2);
      if (t == DType::kQ6_K) put(208);
    }
    std::vector<float> want(n), got(n);
    {
      LevelScope scope(SimdLevel::kScalar);
      DequantizeRow(t, raw.data(), want.data(), n);
    }
    for (SimdLevel level : Levels()) {
      LevelScope scope(level);
      DequantizeRow(t, raw.data(), got.data(), n);
      for (int64_t i = 0; i < n; ++i) {
        if (std::isnan(want[i])) {
          ASSERT_TRUE(std::isnan(got[i]));
          continue;
        }
        ASSERT_EQ(Bits(got[i]), Bits(want[i]))
            << DTypeName(t) << " " << SimdLevelName(level) << " i=" << i;
      }
    }
  }
}

// ---- Quantize -> dequantize ---------------------------------------------------

double RelativeRmsError(DType t, const std::vector<float>& x) {
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<uint8_t> q(RowBytes(t, n));
  QuantizeRow(t, x.data(), q.data(), n);
  std::vector<float> y(n);
  DequantizeRow(t, q.data(), y.data(), n);
  double err = 0, ref = 0;
  for (int64_t i = 0; i < n; ++i) {
    err += (double{y[i]} - x[i]) * (double{y[i]} - x[i]);
    ref += double{x[i]} * x[i];
  }
  return std::sqrt(err / ref);
}

struct Bound {
  DType type;
  double max_rel_rms;
};

// Relative RMS error on N(0, 0.02) data, 256 rows x 4096. Measured: f16
// 2.1e-4, bf16 1.7e-3, q8_0 5.3e-3, q6_k 1.78e-2, q5_k 3.61e-2, q4_k 7.13e-2,
// q4_0 8.59e-2, in line with the step size of each format (e.g. q8_0: step
// ~amax/127 ~ 2.1 sigma / 127, error step / sqrt(12) ~ 0.005). The bounds
// leave ~10% headroom, so a regression in the scale search shows up.
constexpr Bound kBounds[] = {
    {DType::kF32, 0.0},   {DType::kF16, 2.5e-4}, {DType::kBF16, 2e-3},  {DType::kQ8_0, 0.006},
    {DType::kQ6_K, 0.02}, {DType::kQ5_K, 0.04},  {DType::kQ4_K, 0.078}, {DType::kQ4_0, 0.095},
};

TEST(QuantRoundTripTest, GaussianErrorWithinBounds) {
  std::mt19937 rng(10);
  std::normal_distribution<float> g(0.f, 0.02f);
  std::vector<float> x(256 * 4096);
  for (auto& v : x) v = g(rng);
  for (const Bound& b : kBounds) {
    const double e = RelativeRmsError(b.type, x);
    EXPECT_LE(e, b.max_rel_rms) << DTypeName(b.type);
    RecordProperty(std::string("rel_rms_") + std::string(DTypeName(b.type)), std::to_string(e));
  }
}

// Data with a non-zero mean per block exercises the K-quants' min.
TEST(QuantRoundTripTest, ShiftedDataUsesTheMin) {
  std::mt19937 rng(11);
  std::normal_distribution<float> g(0.f, 1.f);
  std::vector<float> x(64 * 256);
  for (size_t i = 0; i < x.size(); ++i) x[i] = 3.f + g(rng);
  EXPECT_LE(RelativeRmsError(DType::kQ4_K, x), 0.03);
  EXPECT_LE(RelativeRmsError(DType::kQ5_K, x), 0.015);
}

TEST(QuantRoundTripTest, ZerosStayZero) {
  for (DType t : kAllTypes) {
    std::vector<float> x(512, 0.f);
    std::vector<uint8_t> q(RowBytes(t, 512), 0xcd);
    QuantizeRow(t, x.data(), q.data(), 512);
    std::vector<float> y(512, 1.f);
    DequantizeRow(t, q.data(), y.data(), 512);
    for (float v : y) ASSERT_EQ(v, 0.f) << DTypeName(t);
  }
}

void ExpectExact(DType t, const std::vector<float>& x) {
  const int64_t n = static_cast<int64_t>(x.size());
  std::vector<uint8_t> q(RowBytes(t, n));
  QuantizeRow(t, x.data(), q.data(), n);
  std::vector<float> y(n);
  DequantizeRow(t, q.data(), y.data(), n);
  for (int64_t i = 0; i < n; ++i) ASSERT_EQ(y[i], x[i]) << DTypeName(t) << " i=" << i;
}

TEST(QuantRoundTripTest, RepresentableValuesAreExact) {
  std::mt19937 rng(12);
  const float d = 1.f / 64;  // exact in f16
  // Q8_0: q * d with 127 present so that amax / 127 == d.
  {
    std::vector<float> x(64);
    for (int i = 0; i < 64; ++i) x[i] = static_cast<float>(static_cast<int>(rng() % 255) - 127) * d;
    x[5] = 127 * d;
    x[40] = -127 * d;
    ExpectExact(DType::kQ8_0, x);
  }
  // Q4_0: (q - 8) * d with -8 * d the largest magnitude.
  {
    std::vector<float> x(64);
    for (int i = 0; i < 64; ++i) x[i] = static_cast<float>(static_cast<int>(rng() % 16) - 8) * d;
    x[3] = -8 * d;
    x[33] = -8 * d;
    ExpectExact(DType::kQ4_0, x);
    for (float& v : x) v = -v;  // then +8 * d is the anchor and d < 0
    ExpectExact(DType::kQ4_0, x);
  }
  // Q4_K / Q5_K: sub-block j holds (d * sc_j) * q - dmin * m_j with q using
  // both 0 and nmax; the largest sc and m are 63 so the 6-bit scales are exact.
  for (DType t : {DType::kQ4_K, DType::kQ5_K}) {
    const int nmax = t == DType::kQ4_K ? 15 : 31;
    const float dd = 1.f / 1024, dm = 1.f / 256;
    std::vector<float> x(512);
    for (int blk = 0; blk < 2; ++blk) {
      for (int j = 0; j < 8; ++j) {
        const int sc = j == 3 ? 63 : 20 + static_cast<int>(rng() % 44);
        const int m = j == 6 ? 63 : static_cast<int>(rng() % 64);
        for (int l = 0; l < 32; ++l) {
          const int q = l == 0 ? 0 : l == 1 ? nmax : static_cast<int>(rng() % (nmax + 1));
          x[256 * blk + 32 * j + l] = (dd * sc) * q - dm * m;
        }
      }
    }
    ExpectExact(t, x);
  }
  // Q6_K: sub-block j holds (d * sc_j) * q, q in [-32, 31] with -32 present,
  // and the sub-block scale of largest magnitude is -128.
  {
    const float d6 = 1.f / 4096;
    std::vector<float> x(256);
    for (int j = 0; j < 16; ++j) {
      const int sc = j == 9 ? -128 : -1 - static_cast<int>(rng() % 120);
      for (int l = 0; l < 16; ++l) {
        const int q = l == 5 ? -32 : static_cast<int>(rng() % 64) - 32;
        x[16 * j + l] = (d6 * sc) * q;
      }
    }
    ExpectExact(DType::kQ6_K, x);
  }
  // f16 / bf16: values already on their grids.
  {
    std::vector<float> x(100);
    for (auto& v : x) v = F16ToF32(static_cast<uint16_t>(rng() & 0x7bff));
    ExpectExact(DType::kF16, x);
    for (auto& v : x) v = BF16ToF32(static_cast<uint16_t>(rng() & 0x7f7f));
    ExpectExact(DType::kBF16, x);
  }
}

// Inputs that are not finite must not crash or write out of bounds.
TEST(QuantRoundTripTest, NonFiniteInputsAreContained) {
  std::vector<float> x(256, 1.f);
  x[3] = std::numeric_limits<float>::quiet_NaN();
  x[100] = std::numeric_limits<float>::infinity();
  x[200] = -std::numeric_limits<float>::infinity();
  for (DType t : kQuantTypes) {
    std::vector<uint8_t> q(RowBytes(t, 256) + 16, 0xab);
    QuantizeRow(t, x.data(), q.data(), 256);
    for (size_t i = RowBytes(t, 256); i < q.size(); ++i) ASSERT_EQ(q[i], 0xab) << DTypeName(t);
    std::vector<float> y(256);
    DequantizeRow(t, q.data(), y.data(), 256);
  }
}

TEST(QuantRoundTripTest, PartialBlocksAreNotTouched) {
  std::vector<float> x(300, 0.5f);
  for (DType t : kQuantTypes) {
    const int be = GetDTypeInfo(t).block_elems;
    std::vector<uint8_t> q(RowBytes(t, 512), 0xab);
    QuantizeRow(t, x.data(), q.data(), be + 5);
    for (size_t i = RowBytes(t, be); i < q.size(); ++i) ASSERT_EQ(q[i], 0xab) << DTypeName(t);
    std::vector<float> y(be + 5, -7.f);
    DequantizeRow(t, q.data(), y.data(), be + 5);
    for (int i = be; i < be + 5; ++i) ASSERT_EQ(y[i], -7.f);
    DequantizeRow(t, q.data(), y.data(), 0);
    QuantizeRow(t, x.data(), q.data(), -3);
  }
}

// Gaussian values with outliers encoded as `t` by ggml's fit and by least
// squares, decoded, and each 32-element block's squared error under both.
struct FitComparison {
  std::vector<float> x, y_ls;
  std::vector<uint8_t> ggml, ls;
  std::vector<double> err_ggml, err_ls;
  double total_ggml = 0, total_ls = 0;
};

FitComparison CompareFits(DType t, uint32_t seed) {
  constexpr int64_t kN = 256 * 1024;
  constexpr int kBlock = 32;
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.f, 0.02f);
  FitComparison c;
  c.x.resize(kN);
  for (int64_t i = 0; i < kN; ++i) c.x[static_cast<size_t>(i)] = g(rng) * (i % 613 == 0 ? 6.f : 1.f);
  c.ggml.resize(RowBytes(t, kN));
  c.ls.resize(RowBytes(t, kN));
  QuantizeRow(t, c.x.data(), c.ggml.data(), kN);
  QuantizeRow(t, c.x.data(), c.ls.data(), kN, QuantFit::kLeastSquares);
  std::vector<float> y_ggml(kN);
  c.y_ls.resize(kN);
  DequantizeRow(t, c.ggml.data(), y_ggml.data(), kN);
  DequantizeRow(t, c.ls.data(), c.y_ls.data(), kN);
  c.err_ggml.assign(kN / kBlock, 0.0);
  c.err_ls.assign(kN / kBlock, 0.0);
  for (int64_t i = 0; i < kN; ++i) {
    const double x = c.x[static_cast<size_t>(i)];
    const double eg = (y_ggml[static_cast<size_t>(i)] - x), el = (c.y_ls[static_cast<size_t>(i)] - x);
    c.err_ggml[static_cast<size_t>(i / kBlock)] += eg * eg;
    c.err_ls[static_cast<size_t>(i / kBlock)] += el * el;
  }
  for (size_t b = 0; b < c.err_ggml.size(); ++b) {
    c.total_ggml += c.err_ggml[b];
    c.total_ls += c.err_ls[b];
  }
  return c;
}

// QuantFit::kLeastSquares: no q8_0 block decodes worse than ggml's, a row of
// them decodes better as a whole, a changed block is within half a step of
// its stored scale, representable values stay exact, and every other type's
// bytes are ggml's.
TEST(QuantFitTest, LeastSquaresQ8_0IsNeverWorseThanGgmlAndLeavesOtherTypesAlone) {
  const FitComparison c = CompareFits(DType::kQ8_0, 21);
  const auto* ggml = reinterpret_cast<const BlockQ8_0*>(c.ggml.data());
  const auto* ls = reinterpret_cast<const BlockQ8_0*>(c.ls.data());
  size_t changed = 0;
  for (size_t b = 0; b < c.err_ggml.size(); ++b) {
    ASSERT_LE(c.err_ls[b], c.err_ggml[b]) << "block " << b;
    if (std::memcmp(&ggml[b], &ls[b], sizeof(BlockQ8_0)) == 0) continue;
    ++changed;
    const double d = F16ToF32(ls[b].d);
    for (size_t j = b * kQK8_0; j < (b + 1) * kQK8_0; ++j)
      ASSERT_LE(std::fabs(double{c.y_ls[j]} - c.x[j]), 0.5 * d * (1 + 1e-5)) << b;
  }
  RecordProperty("squared_error_ls_over_ggml", std::to_string(c.total_ls / c.total_ggml));
  RecordProperty("blocks_changed", std::to_string(changed));
  EXPECT_LT(c.total_ls, 0.9 * c.total_ggml);  // measured 0.85 on this input
  EXPECT_GT(changed, c.err_ggml.size() / 2);
  // Representable values: q * d with 127 present.
  std::mt19937 rng(23);
  std::vector<float> r(64);
  for (int i = 0; i < 64; ++i) r[static_cast<size_t>(i)] = static_cast<float>(static_cast<int>(rng() % 255) - 127) / 64;
  r[5] = 127.f / 64;
  std::vector<BlockQ8_0> rq(2);
  QuantizeRow(DType::kQ8_0, r.data(), rq.data(), 64, QuantFit::kLeastSquares);
  std::vector<float> ry(64);
  DequantizeRow(DType::kQ8_0, rq.data(), ry.data(), 64);
  EXPECT_EQ(ry, r);
  // Other types but q4_0 (below): ggml's bytes.
  for (DType t : kAllTypes) {
    if (t == DType::kQ8_0 || t == DType::kQ4_0) continue;
    std::vector<uint8_t> a(RowBytes(t, 4096)), b(RowBytes(t, 4096));
    QuantizeRow(t, c.x.data(), a.data(), 4096);
    QuantizeRow(t, c.x.data(), b.data(), 4096, QuantFit::kLeastSquares);
    EXPECT_EQ(a, b) << DTypeName(t);
  }
}

// The same for q4_0, whose least-squares blocks may move an element more
// than half a step (the scale is refitted to the codes).
TEST(QuantFitTest, LeastSquaresQ4_0IsNeverWorseThanGgml) {
  const FitComparison c = CompareFits(DType::kQ4_0, 22);
  for (size_t b = 0; b < c.err_ggml.size(); ++b) ASSERT_LE(c.err_ls[b], c.err_ggml[b]) << "block " << b;
  RecordProperty("squared_error_ls_over_ggml", std::to_string(c.total_ls / c.total_ggml));
  EXPECT_LT(c.total_ls, 0.95 * c.total_ggml);  // measured 0.926 on this input
  std::vector<float> z(64, 0.f), zy(64, 1.f);
  std::vector<BlockQ4_0> zq(2);
  QuantizeRow(DType::kQ4_0, z.data(), zq.data(), 64, QuantFit::kLeastSquares);
  DequantizeRow(DType::kQ4_0, zq.data(), zy.data(), 64);
  EXPECT_EQ(zy, z);
}

// QuantizeRow's bytes are ggml's: the FNV-1a hashes below are of the output
// of ggml's quantize_row_*_ref (llama.cpp c392e509, libggml-base built by its
// CMake Release defaults, after ggml_init) on this input. Float operations must keep ggml's
// order (e.g. (w * l) * l, w * (d * d)) for the K-quants' fits to choose the
// same levels; `strata model quantize` files then equal llama-quantize's byte
// for byte (docs/PERFORMANCE.md).
TEST(QuantRoundTripTest, BytesEqualGgmlReferenceQuantizers) {
  // Continuous values (sums of three uniforms) over 2,048 super-blocks: the
  // K-quants' fits compare float sums, and an operation order other than
  // ggml's changed ~0.3% of blocks of such input.
  constexpr int kN = 1 << 19;
  std::vector<float> x(kN);
  uint32_t s = 12345;
  for (int i = 0; i < kN; ++i) {
    float v = 0.0f;
    for (int k = 0; k < 3; ++k) {
      s = s * 1664525u + 1013904223u;
      v += static_cast<float>(static_cast<int32_t>(s >> 8) - 8388608) / 8388608.0f;
    }
    v *= 0.0173f * static_cast<float>(1 + (i / 256) % 3);
    if (i % 997 == 0) v *= 5.0f;  // outliers
    x[static_cast<size_t>(i)] = v;
  }
  auto fnv = [](const std::vector<uint8_t>& b) {
    uint64_t h = 1469598103934665603ull;
    for (uint8_t c : b) {
      h ^= c;
      h *= 1099511628211ull;
    }
    return h;
  };
  const std::pair<DType, uint64_t> want[] = {{DType::kQ8_0, 0xa4089494486ca053ull},
                                             {DType::kQ4_0, 0x01260b7a3f5c048dull},
                                             {DType::kQ4_K, 0x7631ccafffc56f91ull},
                                             {DType::kQ5_K, 0x579ec92e1834c79aull},
                                             {DType::kQ6_K, 0xfce8fae01ef07acbull}};
  for (const auto& [t, hash] : want) {
    std::vector<uint8_t> out(RowBytes(t, kN));
    QuantizeRow(t, x.data(), out.data(), kN);
    EXPECT_EQ(fnv(out), hash) << DTypeName(t);
  }
}

}  // namespace
}  // namespace strata::cpu
