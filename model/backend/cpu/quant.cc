// Row codecs: dispatch, plain float types and the 32-element block types.
// The K-quants are in quant_k.cc.

#include "model/backend/cpu/quant.h"

#include <cmath>
#include <cstring>
#include <optional>

#include "model/backend/cpu/matmul_kernels.h"
#include "model/backend/cpu/quant_internal.h"

namespace strata::cpu {

namespace internal {

void DequantizeRowF16Scalar(const void* src, float* dst, int64_t n) {
  const auto* h = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = F16ToF32(h[i]);
}

void DequantizeRowBF16Scalar(const void* src, float* dst, int64_t n) {
  const auto* h = static_cast<const uint16_t*>(src);
  for (int64_t i = 0; i < n; ++i) dst[i] = BF16ToF32(h[i]);
}

void QuantizeRowF16Scalar(const float* src, void* dst, int64_t n) {
  auto* h = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; ++i) h[i] = F32ToF16(src[i]);
}

void QuantizeRowBF16Scalar(const float* src, void* dst, int64_t n) {
  auto* h = static_cast<uint16_t*>(dst);
  for (int64_t i = 0; i < n; ++i) h[i] = F32ToBF16(src[i]);
}

void DequantizeRowQ4_0Scalar(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ4_0*>(src);
  for (int64_t i = 0; i < n / kQK4_0; ++i, dst += kQK4_0) {
    const float d = F16ToF32(b[i].d);
    for (int j = 0; j < kQK4_0 / 2; ++j) {
      dst[j] = static_cast<float>((b[i].qs[j] & 0xf) - 8) * d;
      dst[j + kQK4_0 / 2] = static_cast<float>((b[i].qs[j] >> 4) - 8) * d;
    }
  }
}

void DequantizeRowQ8_0Scalar(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ8_0*>(src);
  for (int64_t i = 0; i < n / kQK8_0; ++i, dst += kQK8_0) {
    const float d = F16ToF32(b[i].d);
    for (int j = 0; j < kQK8_0; ++j) dst[j] = static_cast<float>(b[i].qs[j]) * d;
  }
}

// ggml's quantize_row_q4_0_ref: the element of largest magnitude maps to -8,
// so its sign picks the sign of d and the full range [-8, 7] is used.
void QuantizeRowQ4_0(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ4_0*>(dst);
  for (int64_t i = 0; i < n / kQK4_0; ++i, src += kQK4_0) {
    float amax = 0.f;
    float max = 0.f;
    for (int j = 0; j < kQK4_0; ++j) {
      if (std::fabs(src[j]) > amax) {
        amax = std::fabs(src[j]);
        max = src[j];
      }
    }
    const float d = max / -8.f;
    const float id = d != 0.f ? 1.f / d : 0.f;
    b[i].d = F32ToF16(d);
    for (int j = 0; j < kQK4_0 / 2; ++j) {
      // Truncation of v + 8.5 rounds half up; v >= -8 keeps it non-negative.
      // fmin/fmax also turn NaN into an in-range code.
      const float v0 = std::fmax(0.f, std::fmin(15.f, src[j] * id + 8.5f));
      const float v1 = std::fmax(0.f, std::fmin(15.f, src[j + kQK4_0 / 2] * id + 8.5f));
      b[i].qs[j] = static_cast<uint8_t>(static_cast<int>(v0) | (static_cast<int>(v1) << 4));
    }
  }
}

// ggml's quantize_row_q8_0_ref: d = amax / 127, q = round(x / d).
void QuantizeRowQ8_0(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ8_0*>(dst);
  for (int64_t i = 0; i < n / kQK8_0; ++i, src += kQK8_0) {
    float amax = 0.f;
    for (int j = 0; j < kQK8_0; ++j) amax = std::fmax(amax, std::fabs(src[j]));
    const float d = amax / 127.f;
    const float id = d != 0.f ? 1.f / d : 0.f;
    b[i].d = F32ToF16(d);
    for (int j = 0; j < kQK8_0; ++j) {
      const float v = std::fmax(-127.f, std::fmin(127.f, std::round(src[j] * id)));
      b[i].qs[j] = static_cast<int8_t>(v);
    }
  }
}

namespace {

// Squared error of one 32-element block against x, decoded by `dequant`.
static_assert(kQK4_0 == 32 && kQK8_0 == 32);
template <typename Block>
double BlockSquaredError(const float* x, const Block& b, void (*dequant)(const void*, float*, int64_t)) {
  float y[32];
  dequant(&b, y, 32);
  double e = 0;
  for (int j = 0; j < 32; ++j) e += (static_cast<double>(x[j]) - y[j]) * (static_cast<double>(x[j]) - y[j]);
  return e;
}

// Codes of x (l - 8, l in [0, 15]) against the scale stored in b.d.
void EncodeQ4_0(const float* x, BlockQ4_0* b) {
  const float d = F16ToF32(b->d);
  const float id = d != 0.f ? 1.f / d : 0.f;
  for (int j = 0; j < kQK4_0 / 2; ++j) {
    const float v0 = std::fmax(0.f, std::fmin(15.f, std::round(x[j] * id) + 8.f));
    const float v1 = std::fmax(0.f, std::fmin(15.f, std::round(x[j + kQK4_0 / 2] * id) + 8.f));
    b->qs[j] = static_cast<uint8_t>(static_cast<int>(v0) | (static_cast<int>(v1) << 4));
  }
}

// The least-squares scale for b's codes, Σxl / Σl², as f16; nullopt when
// every code is 0.
std::optional<uint16_t> RefitQ4_0(const float* x, const BlockQ4_0& b) {
  double sxl = 0, sll = 0;
  for (int j = 0; j < kQK4_0 / 2; ++j) {
    const int l0 = (b.qs[j] & 0xf) - 8, l1 = (b.qs[j] >> 4) - 8;
    sxl += static_cast<double>(x[j]) * l0 + static_cast<double>(x[j + kQK4_0 / 2]) * l1;
    sll += l0 * l0 + l1 * l1;
  }
  if (sll == 0) return std::nullopt;
  return F32ToF16(static_cast<float>(sxl / sll));
}

}  // namespace

void QuantizeRowQ4_0LeastSquares(const float* src, void* dst, int64_t n) {
  // The largest element's code: -8 (ggml's), -7.5, -7, or +7, +6.5. Up to
  // 36 finer candidates lowered the error on Gaussian blocks by a further
  // 0.15% only, at 4x the time.
  constexpr float kCodes[] = {8.f, 7.5f, 7.f, -7.f, -6.5f};
  auto* b = static_cast<BlockQ4_0*>(dst);
  for (int64_t i = 0; i < n / kQK4_0; ++i, src += kQK4_0) {
    QuantizeRowQ4_0(src, &b[i], kQK4_0);  // ggml's: the first candidate
    double best = BlockSquaredError(src, b[i], DequantizeRowQ4_0Scalar);
    auto keep_if_better = [&](const BlockQ4_0& c) {
      const double e = BlockSquaredError(src, c, DequantizeRowQ4_0Scalar);
      if (e < best) {
        best = e;
        b[i] = c;
      }
    };
    float max = 0.f;
    for (int j = 0; j < kQK4_0; ++j)
      if (std::fabs(src[j]) > std::fabs(max)) max = src[j];
    // Per candidate: the largest element at code -m; the scale refitted to
    // those codes and the codes recomputed for it; the scale refitted again.
    for (const float m : kCodes) {
      if (best == 0) break;
      BlockQ4_0 c;
      c.d = F32ToF16(max / -m);
      EncodeQ4_0(src, &c);
      keep_if_better(c);
      std::optional<uint16_t> d = RefitQ4_0(src, c);
      if (!d) continue;
      c.d = *d;
      EncodeQ4_0(src, &c);
      keep_if_better(c);
      if (!(d = RefitQ4_0(src, c))) continue;
      c.d = *d;
      keep_if_better(c);
    }
  }
}

void QuantizeRowQ8_0LeastSquares(const float* src, void* dst, int64_t n) {
  constexpr int kCandidates = 8;  // m = 127 - k / 2, k = 0..8: steps up to ~3% coarser
  auto* b = static_cast<BlockQ8_0*>(dst);
  for (int64_t i = 0; i < n / kQK8_0; ++i, src += kQK8_0) {
    QuantizeRowQ8_0(src, &b[i], kQK8_0);  // ggml's codes: the first candidate
    double best = BlockSquaredError(src, b[i], DequantizeRowQ8_0Scalar);
    float amax = 0.f;
    for (int j = 0; j < kQK8_0; ++j) amax = std::fmax(amax, std::fabs(src[j]));
    BlockQ8_0 c;
    for (int k = 0; k <= kCandidates && best > 0; ++k) {
      c.d = F32ToF16(amax / (127.f - 0.5f * static_cast<float>(k)));
      const float d = F16ToF32(c.d);
      const float id = d != 0.f ? 1.f / d : 0.f;
      for (int j = 0; j < kQK8_0; ++j)
        c.qs[j] = static_cast<int8_t>(std::fmax(-127.f, std::fmin(127.f, std::round(src[j] * id))));
      const double e = BlockSquaredError(src, c, DequantizeRowQ8_0Scalar);
      if (e < best) {
        best = e;
        b[i] = c;
      }
    }
  }
}

}  // namespace internal

void PackScaleMinK4(const uint8_t sc[8], const uint8_t m[8], uint8_t scales[12]) {
  for (int j = 0; j < 4; ++j) {
    scales[j] = static_cast<uint8_t>(sc[j] & 63);
    scales[j + 4] = static_cast<uint8_t>(m[j] & 63);
  }
  for (int j = 4; j < 8; ++j) {
    scales[j + 4] = static_cast<uint8_t>((sc[j] & 0xf) | ((m[j] & 0xf) << 4));
    scales[j - 4] |= static_cast<uint8_t>(((sc[j] >> 4) & 3) << 6);
    scales[j] |= static_cast<uint8_t>(((m[j] >> 4) & 3) << 6);
  }
}

void DequantizeRow(DType t, const void* src, float* dst, int64_t n) {
  if (n <= 0) return;
  const int idx = internal::TypeIndex(t);
  if (idx < 0) return;
  const int64_t whole = n - n % GetDTypeInfo(t).block_elems;
  internal::ActiveKernels().dequant[idx](src, dst, whole);
}

void QuantizeRow(DType t, const float* src, void* dst, int64_t n) {
  if (n <= 0) return;
  const int64_t whole = n - n % GetDTypeInfo(t).block_elems;
  using namespace internal;
  switch (t) {
    case DType::kF32:
      std::memcpy(dst, src, static_cast<size_t>(whole) * sizeof(float));
      return;
    case DType::kF16:
      ActiveKernels().f32_to_f16(src, dst, whole);
      return;
    case DType::kBF16:
      ActiveKernels().f32_to_bf16(src, dst, whole);
      return;
    case DType::kQ4_0:
      QuantizeRowQ4_0(src, dst, whole);
      return;
    case DType::kQ8_0:
      QuantizeRowQ8_0(src, dst, whole);
      return;
    case DType::kQ4_K:
      QuantizeRowQ4_K(src, dst, whole);
      return;
    case DType::kQ5_K:
      QuantizeRowQ5_K(src, dst, whole);
      return;
    case DType::kQ6_K:
      QuantizeRowQ6_K(src, dst, whole);
      return;
  }
}

void QuantizeRow(DType t, const float* src, void* dst, int64_t n, QuantFit fit) {
  if (fit == QuantFit::kLeastSquares && t == DType::kQ8_0 && n > 0) {
    internal::QuantizeRowQ8_0LeastSquares(src, dst, n - n % GetDTypeInfo(t).block_elems);
    return;
  }
  if (fit == QuantFit::kLeastSquares && t == DType::kQ4_0 && n > 0) {
    internal::QuantizeRowQ4_0LeastSquares(src, dst, n - n % GetDTypeInfo(t).block_elems);
    return;
  }
  QuantizeRow(t, src, dst, n);
}

void ConvertRow(DType dst_type, const float* src, void* dst, int64_t n) {
  QuantizeRow(dst_type, src, dst, n);
}

}  // namespace strata::cpu
