#pragma once
// Element formats of weights and KV caches, and conversions between them and
// f32. Block layouts are byte-for-byte ggml's (ggml-common.h), so tensors of a
// GGUF file are used in place.
//
// All functions are pure (no state), thread-safe, and never allocate. Rows are
// processed in whole blocks: REQUIRES n % GetDTypeInfo(t).block_elems == 0 and
// n >= 0; a trailing partial block is not read or written. `src` and `dst`
// must not overlap. Results do not depend on the SIMD level the CPU offers:
// DequantizeRow gives bit-identical floats on every x86-64 machine.

#include <bit>
#include <cstddef>
#include <cstdint>

#include "model/backend/dtype.h"

namespace strata::cpu {

// ---- Scalar half-precision conversions --------------------------------------

// IEEE binary16 -> f32; exact (subnormals, infinities and NaN payloads kept).
inline float F16ToF32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-24, exact in f32.
    const float v = static_cast<float>(mant) * 0x1p-24f;
    return std::bit_cast<float>(std::bit_cast<uint32_t>(v) | sign);
  }
  if (exp == 0x1f) return std::bit_cast<float>(sign | 0x7f800000u | (mant << 13));
  return std::bit_cast<float>(sign | ((exp + 112u) << 23) | (mant << 13));
}

// f32 -> IEEE binary16, round to nearest even. Overflow gives +-inf; NaN stays
// NaN (quiet, upper payload bits kept); results below the smallest subnormal
// round to signed zero.
inline uint16_t F32ToF16(float f) {
  uint32_t x = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((x >> 16) & 0x8000u);
  x &= 0x7fffffffu;
  if (x >= 0x7f800000u) {  // inf or NaN
    const uint16_t nan_bits =
        x > 0x7f800000u ? static_cast<uint16_t>(0x200u | ((x >> 13) & 0x3ffu)) : 0;
    return static_cast<uint16_t>(sign | 0x7c00u | nan_bits);
  }
  if (x >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);  // >= 65520 rounds to inf
  if (x < 0x38800000u) {
    // Below 2^-14: the result is subnormal (or zero / the smallest normal).
    // Adding 0.5 puts the f16 subnormal unit (2^-24) at the f32 ulp, so the
    // FPU's own round-to-nearest-even does the rounding.
    const float r = std::bit_cast<float>(x) + 0.5f;
    return static_cast<uint16_t>(sign | (std::bit_cast<uint32_t>(r) - 0x3f000000u));
  }
  const uint32_t odd = (x >> 13) & 1u;
  x += 0xc8000fffu + odd;  // rebias exponent (127 -> 15) and round to even
  return static_cast<uint16_t>(sign | (x >> 13));
}

// bfloat16 -> f32; exact.
inline float BF16ToF32(uint16_t h) { return std::bit_cast<float>(static_cast<uint32_t>(h) << 16); }

// f32 -> bfloat16, round to nearest even; NaN stays NaN (quietened).
inline uint16_t F32ToBF16(float f) {
  const uint32_t x = std::bit_cast<uint32_t>(f);
  if ((x & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((x >> 16) | 0x40u);
  return static_cast<uint16_t>((x + 0x7fffu + ((x >> 16) & 1u)) >> 16);
}

// ---- ggml block layouts -----------------------------------------------------

inline constexpr int kQK4_0 = 32;
inline constexpr int kQK8_0 = 32;
inline constexpr int kQK_K = 256;  // elements per K-quant super-block

// 32 elements: value = (q - 8) * d; qs[j] holds element j in its low nibble
// and element j + 16 in its high nibble.
struct BlockQ4_0 {
  uint16_t d;  // f16
  uint8_t qs[kQK4_0 / 2];
};

// 32 elements: value = qs[j] * d.
struct BlockQ8_0 {
  uint16_t d;  // f16
  int8_t qs[kQK8_0];
};

// 256 elements in 8 sub-blocks of 32: value = d * sc[j] * q - dmin * m[j],
// q in 0..15, with 6-bit sc/m packed into `scales` (see UnpackScaleMinK4).
// qs[32 * g + l] holds element 64 * g + l (low nibble) and 64 * g + 32 + l
// (high nibble).
struct BlockQ4_K {
  uint16_t d;     // f16, scale of the sub-block scales
  uint16_t dmin;  // f16, scale of the sub-block mins
  uint8_t scales[12];
  uint8_t qs[kQK_K / 2];
};

// As Q4_K with q in 0..31; bit 4 of element 64 * g + l is bit 2g of qh[l],
// of element 64 * g + 32 + l is bit 2g + 1 of qh[l].
struct BlockQ5_K {
  uint16_t d;
  uint16_t dmin;
  uint8_t scales[12];
  uint8_t qh[kQK_K / 8];
  uint8_t qs[kQK_K / 2];
};

// 256 elements in 16 sub-blocks of 16: value = d * scales[j] * (q - 32),
// q in 0..63. In each half h (128 elements) and l in 0..31, with
// ql = ql + 64h, qh = qh + 32h: element l = ql[l] low | qh[l] bits 0-1,
// l + 32 = ql[l + 32] low | bits 2-3, l + 64 = ql[l] high | bits 4-5,
// l + 96 = ql[l + 32] high | bits 6-7 (the qh bits are the top two).
struct BlockQ6_K {
  uint8_t ql[kQK_K / 2];
  uint8_t qh[kQK_K / 4];
  int8_t scales[kQK_K / 16];
  uint16_t d;  // f16
};

static_assert(sizeof(BlockQ4_0) == 18);
static_assert(sizeof(BlockQ8_0) == 34);
static_assert(sizeof(BlockQ4_K) == 144);
static_assert(sizeof(BlockQ5_K) == 176);
static_assert(sizeof(BlockQ6_K) == 210);

// The 6-bit scale and min of sub-block j (0..7) of a Q4_K/Q5_K block.
inline void UnpackScaleMinK4(const uint8_t* scales, int j, uint8_t* sc, uint8_t* m) {
  if (j < 4) {
    *sc = scales[j] & 63;
    *m = scales[j + 4] & 63;
  } else {
    *sc = static_cast<uint8_t>((scales[j + 4] & 0xf) | ((scales[j - 4] >> 6) << 4));
    *m = static_cast<uint8_t>((scales[j + 4] >> 4) | ((scales[j] >> 6) << 4));
  }
}

// All eight 6-bit scales and mins of a Q4_K/Q5_K block at once, as
// UnpackScaleMinK4 gives them one by one: scales 0..7 in the bytes of *sc,
// mins in *m. In 64-bit registers, not memory: the kernels move them into a
// vector with vmovq, where a 16-byte store read back as two 8-byte loads
// cannot be store-forwarded (each load spans two 4-byte stores) and stalled
// every block.
inline void UnpackAllScaleMinK4(const uint8_t packed[12], uint64_t* sc, uint64_t* m) {
  constexpr uint32_t kLow6 = 0x3f3f3f3f, kLow4 = 0x0f0f0f0f, kTop2 = 0x03030303;
  uint32_t w[3];
  __builtin_memcpy(w, packed, 12);
  const uint32_t sc_lo = w[0] & kLow6;                                          // sc 0..3
  const uint32_t sc_hi = (w[2] & kLow4) | (((w[0] >> 6) & kTop2) << 4);         // sc 4..7
  const uint32_t m_lo = w[1] & kLow6;                                           // m 0..3
  const uint32_t m_hi = ((w[2] >> 4) & kLow4) | (((w[1] >> 6) & kTop2) << 4);   // m 4..7
  *sc = static_cast<uint64_t>(sc_hi) << 32 | sc_lo;
  *m = static_cast<uint64_t>(m_hi) << 32 | m_lo;
}

// The inverse of UnpackScaleMinK4 for all 8 sub-blocks; sc[j], m[j] <= 63.
void PackScaleMinK4(const uint8_t sc[8], const uint8_t m[8], uint8_t scales[12]);

// ---- Row conversions ---------------------------------------------------------

// dst[0..n) = the values of the n elements of type `t` at `src`. Any DType.
void DequantizeRow(DType t, const void* src, float* dst, int64_t n);

// Encodes n floats as type `t` (any DType). Quantized types follow ggml's
// reference quantizers (quantize_row_*_ref, no importance matrix), float
// operations in ggml's order, so the bytes are llama-quantize's (pinned by
// QuantRoundTripTest.BytesEqualGgmlReferenceQuantizers). Inputs must be finite for the
// quantized types; non-finite values give unspecified (but in-bounds) codes.
void QuantizeRow(DType t, const float* src, void* dst, int64_t n);
// The same with the scale chosen by `fit`. kLeastSquares changes q8_0 and
// q4_0 (the K-quants' ggml quantizers already search their scales). Per
// block it decodes ggml's codes and those of a few other scales, and keeps
// the one with the least squared error (ggml's on a tie), so no block's
// error exceeds ggml's:
//   q8_0: amax / m, m = 127, 126.5, ..., 123, each rounded to f16 first and
//         the codes computed against the rounded scale (every element stays
//         within half a step of the stored scale);
//   q4_0: the element of largest magnitude at code -8, -7.5, -7, +7 or
//         +6.5, then the scale refitted to the codes (Σxl / Σl²) and the
//         codes recomputed.
// Offline use (model files): about 5x ggml's time for q8_0, 10x for q4_0.
void QuantizeRow(DType t, const float* src, void* dst, int64_t n, QuantFit fit);

// The same as QuantizeRow; named for its common use, storing activations
// (K/V rows) as f32, f16 or bf16, where it takes the SIMD path.
void ConvertRow(DType dst_type, const float* src, void* dst, int64_t n);

}  // namespace strata::cpu
