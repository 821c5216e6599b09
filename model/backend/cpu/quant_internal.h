#pragma once
// Internal to the CPU backend: the portable (scalar) per-type row codecs that
// quant.cc dispatches to and the scalar kernel table reuses. Same contracts as
// DequantizeRow / QuantizeRow in quant.h, with n a multiple of the block size.

#include <cstdint>

namespace strata::cpu::internal {

void DequantizeRowF16Scalar(const void* src, float* dst, int64_t n);
void DequantizeRowBF16Scalar(const void* src, float* dst, int64_t n);
void DequantizeRowQ4_0Scalar(const void* src, float* dst, int64_t n);
void DequantizeRowQ8_0Scalar(const void* src, float* dst, int64_t n);
void DequantizeRowQ4_KScalar(const void* src, float* dst, int64_t n);
void DequantizeRowQ5_KScalar(const void* src, float* dst, int64_t n);
void DequantizeRowQ6_KScalar(const void* src, float* dst, int64_t n);

void QuantizeRowF16Scalar(const float* src, void* dst, int64_t n);
void QuantizeRowBF16Scalar(const float* src, void* dst, int64_t n);
void QuantizeRowQ4_0(const float* src, void* dst, int64_t n);
void QuantizeRowQ8_0(const float* src, void* dst, int64_t n);
void QuantizeRowQ8_0LeastSquares(const float* src, void* dst, int64_t n);
void QuantizeRowQ4_0LeastSquares(const float* src, void* dst, int64_t n);
void QuantizeRowQ4_K(const float* src, void* dst, int64_t n);
void QuantizeRowQ5_K(const float* src, void* dst, int64_t n);
void QuantizeRowQ6_K(const float* src, void* dst, int64_t n);

// ggml's nearest_int: round to nearest, ties to even, for |v| < 2^22.
inline int NearestInt(float v) {
  float r = v + 12582912.f;  // 1.5 * 2^23 puts the integer in the low mantissa bits
  uint32_t bits;
  __builtin_memcpy(&bits, &r, sizeof bits);
  return static_cast<int>(bits & 0x007fffffu) - 0x00400000;
}

}  // namespace strata::cpu::internal
