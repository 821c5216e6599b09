#pragma once
// Internals of kernels.h shared by kernels.cc (dispatch + scalar versions),
// kernels_avx2.cc and kernels_avx512.cc, and used by tests to run each SIMD
// level against the scalar one. Not for other callers.

#include <bit>
#include <cstdint>

#include "model/backend/cpu/cpu_features.h"
#include "model/backend/dtype.h"

namespace strata::cpu {

// One level's kernels. Sizes are > 0 here; the public wrappers filter the
// rest. rope takes cos/sin per pair (head_dim/2 each), computed by the
// wrapper. exp is the vector exp the other kernels use (y may equal x).
struct ElemKernels {
  SimdLevel level;
  void (*rms_norm)(const float* x, const float* weight, float* y, int n, float eps);
  void (*rope)(float* x, int n_heads, int head_dim, const float* cos, const float* sin, bool neox);
  void (*swiglu)(const float* gate, const float* up, float* out, int n);
  void (*softmax)(float* x, int n);
  void (*add)(float* y, const float* x, int n);
  float (*dot_kv)(const float* q, const void* k, DType kv_type, int n);
  void (*axpy_kv)(float a, const void* v, DType kv_type, float* out, int n);
  void (*store_kv)(const float* src, void* dst, DType kv_type, int n);
  void (*exp)(const float* x, float* y, int n);
};

// The kernels of `level`, or nullptr when this CPU cannot run them
// (level > DetectedSimdLevel()).
const ElemKernels* ElemKernelsFor(SimdLevel level);

namespace internal {

const ElemKernels& ScalarElemKernels();
// Defined in kernels_avx2.cc / kernels_avx512.cc. Only call a function from
// these tables when DetectedSimdLevel() reaches their level.
const ElemKernels& Avx2ElemKernels();
const ElemKernels& Avx512ElemKernels();

// Vector exp: Cephes expf's range reduction and polynomial, ~1-2 ulp on
// [-87.3, 88.7]. Inputs are clamped to [kExpLo, kExpHi] first, so -inf gives
// exactly 0, anything above ln(FLT_MAX) gives inf, and NaN stays NaN.
inline constexpr float kExpHi = 88.8f;
inline constexpr float kExpLo = -104.0f;  // exp(-104) rounds to 0
inline constexpr float kLog2e = 1.44269504088896341f;
inline constexpr float kLn2Hi = 0.693359375f;  // few bits: n * kLn2Hi is exact
inline constexpr float kLn2Lo = -2.12194440e-4f;
inline constexpr float kExpP0 = 1.9875691500e-4f;
inline constexpr float kExpP1 = 1.3981999507e-3f;
inline constexpr float kExpP2 = 8.3334519073e-3f;
inline constexpr float kExpP3 = 4.1665795894e-2f;
inline constexpr float kExpP4 = 1.6666665459e-1f;
inline constexpr float kExpP5 = 5.0000001201e-1f;

// Scalar f16/bf16 conversions that match the hardware ones bit for bit
// (F16C vcvtph2ps / vcvtps2ph with round-to-nearest-even; NaNs come out
// quiet). Named apart from quant.h's so both headers can be included.
inline float HalfBitsToFloat(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0x1f) {
    return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13) | (mant != 0 ? 0x400000u : 0u));
  }
  if (exp != 0) return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (mant << 13));
  // Zero or subnormal: mant * 2^-24, exact in float.
  const float f = static_cast<float>(mant) * 0x1p-24f;
  return sign != 0 ? -f : f;
}

inline uint16_t FloatToHalfBits(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  const uint32_t sign = (x >> 16) & 0x8000u;
  const uint32_t abs = x & 0x7fffffffu;
  if (abs > 0x7f800000u) return static_cast<uint16_t>(sign | 0x7e00u | ((abs >> 13) & 0x3ffu));
  if (abs >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 and inf
  if (abs >= 0x38800000u) {                                              // normal half
    uint32_t r = abs - 0x38000000u;                                      // rebias 127 -> 15
    r += 0xfffu + ((r >> 13) & 1u);
    return static_cast<uint16_t>(sign | (r >> 13));
  }
  // Subnormal half (or zero): adding 0.5f lines the half's 2^-24 unit up
  // with the float's last mantissa bit, so the FPU does the RNE rounding.
  const float sum = std::bit_cast<float>(abs) + 0.5f;
  return static_cast<uint16_t>(sign | (std::bit_cast<uint32_t>(sum) - 0x3f000000u));
}

inline float Bf16BitsToFloat(uint16_t b) {
  return std::bit_cast<float>(static_cast<uint32_t>(b) << 16);
}

inline uint16_t FloatToBf16Bits(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u)
    return static_cast<uint16_t>((x >> 16) | 0x40u);  // quiet NaN
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

}  // namespace internal
}  // namespace strata::cpu
