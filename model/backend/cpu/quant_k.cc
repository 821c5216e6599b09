// The K-quants (Q4_K, Q5_K, Q6_K): scalar dequantization and ggml-compatible
// reference quantization (quantize_row_q{4,5,6}_K_ref without an importance
// matrix).

#include <algorithm>
#include <cmath>
#include <cstring>

#include "model/backend/cpu/quant.h"
#include "model/backend/cpu/quant_internal.h"

namespace strata::cpu::internal {

namespace {

// ggml's GROUP_MAX_EPS: groups whose largest magnitude is below it encode as zeros.
constexpr float kGroupMaxEps = 1e-15f;

// Fits x[i] ~= scale * L[i] - the_min with L in [0, nmax] (min <= 0), by
// trying nstep + 1 candidate inverse scales around nmax / (max - min) and
// solving weighted least squares for scale and min at each; keeps the best by
// weighted squared error. This is ggml's make_qkx2_quants (use_mad = false).
float FitScaleMin(int n, int nmax, const float* x, const float* w, uint8_t* L, float* the_min,
                  float rmin, float rdelta, int nstep) {
  float min = x[0];
  float max = x[0];
  float sum_w = 0.f;
  float sum_x = 0.f;
  for (int i = 0; i < n; ++i) {
    min = std::min(min, x[i]);
    max = std::max(max, x[i]);
    sum_w += w[i];
    sum_x += w[i] * x[i];
  }
  min = std::min(min, 0.f);
  if (!(max > min)) {  // also catches NaN
    std::memset(L, 0, static_cast<size_t>(n));
    *the_min = -min;
    return 0.f;
  }
  float iscale = static_cast<float>(nmax) / (max - min);
  float scale = 1.f / iscale;
  float best_err = 0.f;
  for (int i = 0; i < n; ++i) {
    L[i] = static_cast<uint8_t>(std::clamp(NearestInt(iscale * (x[i] - min)), 0, nmax));
    const float diff = scale * L[i] + min - x[i];
    best_err += w[i] * (diff * diff);  // ggml's order
  }
  uint8_t trial[32];
  for (int is = 0; is <= nstep; ++is) {
    iscale = (rmin + rdelta * static_cast<float>(is) + static_cast<float>(nmax)) / (max - min);
    float sum_l = 0.f, sum_l2 = 0.f, sum_xl = 0.f;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(NearestInt(iscale * (x[i] - min)), 0, nmax);
      trial[i] = static_cast<uint8_t>(l);
      sum_l += w[i] * static_cast<float>(l);
      sum_l2 += w[i] * static_cast<float>(l) * static_cast<float>(l);  // ggml's order: (w*l)*l
      sum_xl += w[i] * static_cast<float>(l) * x[i];
    }
    const float det = sum_w * sum_l2 - sum_l * sum_l;
    if (!(det > 0.f)) continue;
    float this_scale = (sum_w * sum_xl - sum_x * sum_l) / det;
    float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / det;
    if (this_min > 0.f) {
      this_min = 0.f;
      this_scale = sum_xl / sum_l2;
    }
    float err = 0.f;
    for (int i = 0; i < n; ++i) {
      const float diff = this_scale * trial[i] + this_min - x[i];
      err += w[i] * (diff * diff);
    }
    if (err < best_err) {
      std::memcpy(L, trial, static_cast<size_t>(n));
      best_err = err;
      scale = this_scale;
      min = this_min;
    }
  }
  *the_min = -min;
  return scale;
}

// Symmetric fit x[i] ~= scale * (L[i] - nmax), L - nmax in [-nmax, nmax - 1],
// weighted by x^2; the largest-magnitude element anchors the scale, and 18
// nearby scales are tried. This is ggml's make_qx_quants with rmse_type 1.
float FitScaleSymmetric(int n, int nmax, const float* x, int8_t* L) {
  float amax = 0.f;
  float max = 0.f;
  for (int i = 0; i < n; ++i) {
    if (std::fabs(x[i]) > amax) {
      amax = std::fabs(x[i]);
      max = x[i];
    }
  }
  if (!(amax >= kGroupMaxEps)) {  // all zero (ggml: amax < GROUP_MAX_EPS)
    std::memset(L, 0, static_cast<size_t>(n));
    return 0.f;
  }
  auto sums = [&](float iscale, float* sumlx, float* suml2) {
    *sumlx = 0.f;
    *suml2 = 0.f;
    for (int i = 0; i < n; ++i) {
      const int l = std::clamp(NearestInt(iscale * x[i]), -nmax, nmax - 1);
      const float w = x[i] * x[i];
      *sumlx += w * x[i] * static_cast<float>(l);
      *suml2 += w * static_cast<float>(l) * static_cast<float>(l);  // ggml's order: (w*l)*l
    }
  };
  auto assign = [&](float iscale) {
    for (int i = 0; i < n; ++i) {
      L[i] = static_cast<int8_t>(nmax + std::clamp(NearestInt(iscale * x[i]), -nmax, nmax - 1));
    }
  };
  float iscale = -static_cast<float>(nmax) / max;
  float sumlx, suml2;
  sums(iscale, &sumlx, &suml2);
  assign(iscale);
  float scale = suml2 != 0.f ? sumlx / suml2 : 0.f;
  float best = scale * sumlx;
  for (int is = -9; is <= 9; ++is) {
    if (is == 0) continue;
    iscale = -(static_cast<float>(nmax) + 0.1f * static_cast<float>(is)) / max;
    sums(iscale, &sumlx, &suml2);
    if (suml2 > 0.f && sumlx * sumlx > best * suml2) {
      assign(iscale);
      scale = sumlx / suml2;
      best = scale * sumlx;
    }
  }
  return scale;
}

// Q4_K and Q5_K share everything but the number of levels and the bit
// packing: fits 8 sub-blocks, quantizes their scales and mins to 6 bits
// against the block's largest, and requantizes with the stored values.
template <int kNmax>
void QuantizeSuperBlockScaleMin(const float* x, uint16_t* d_out, uint16_t* dmin_out,
                                uint8_t packed[12], uint8_t L[kQK_K]) {
  constexpr float kRmin = kNmax == 15 ? -1.f : -0.5f;
  constexpr int kSteps = kNmax == 15 ? 20 : 15;
  float scales[8];
  float mins[8];
  float w[32];
  float max_scale = 0.f;
  float max_min = 0.f;
  for (int j = 0; j < 8; ++j) {
    const float* xs = x + 32 * j;
    float sum_x2 = 0.f;
    for (int l = 0; l < 32; ++l) sum_x2 += xs[l] * xs[l];
    const float av_x = std::sqrt(sum_x2 / 32.f);
    for (int l = 0; l < 32; ++l) w[l] = av_x + std::fabs(xs[l]);
    scales[j] = FitScaleMin(32, kNmax, xs, w, L + 32 * j, &mins[j], kRmin, 0.1f, kSteps);
    max_scale = std::max(max_scale, scales[j]);
    max_min = std::max(max_min, mins[j]);
  }
  const float inv_scale = max_scale > 0.f ? 63.f / max_scale : 0.f;
  const float inv_min = max_min > 0.f ? 63.f / max_min : 0.f;
  uint8_t sc[8];
  uint8_t m[8];
  for (int j = 0; j < 8; ++j) {
    sc[j] = static_cast<uint8_t>(std::clamp(NearestInt(inv_scale * scales[j]), 0, 63));
    m[j] = static_cast<uint8_t>(std::clamp(NearestInt(inv_min * mins[j]), 0, 63));
  }
  PackScaleMinK4(sc, m, packed);
  *d_out = F32ToF16(max_scale / 63.f);
  *dmin_out = F32ToF16(max_min / 63.f);
  const float d = F16ToF32(*d_out);
  const float dmin = F16ToF32(*dmin_out);
  for (int j = 0; j < 8; ++j) {
    const float dj = d * sc[j];
    if (dj == 0.f) continue;  // every element decodes to -dmin * m[j]
    const float mj = dmin * m[j];
    for (int l = 0; l < 32; ++l) {
      L[32 * j + l] =
          static_cast<uint8_t>(std::clamp(NearestInt((x[32 * j + l] + mj) / dj), 0, kNmax));
    }
  }
}

}  // namespace

void DequantizeRowQ4_KScalar(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ4_K*>(src);
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float d = F16ToF32(b[i].d);
    const float dmin = F16ToF32(b[i].dmin);
    const uint8_t* q = b[i].qs;
    for (int g = 0; g < 4; ++g, q += 32) {
      uint8_t sc, m;
      UnpackScaleMinK4(b[i].scales, 2 * g, &sc, &m);
      const float d1 = d * sc, m1 = dmin * m;
      UnpackScaleMinK4(b[i].scales, 2 * g + 1, &sc, &m);
      const float d2 = d * sc, m2 = dmin * m;
      for (int l = 0; l < 32; ++l) *dst++ = d1 * static_cast<float>(q[l] & 0xf) - m1;
      for (int l = 0; l < 32; ++l) *dst++ = d2 * static_cast<float>(q[l] >> 4) - m2;
    }
  }
}

void DequantizeRowQ5_KScalar(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ5_K*>(src);
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float d = F16ToF32(b[i].d);
    const float dmin = F16ToF32(b[i].dmin);
    const uint8_t* q = b[i].qs;
    const uint8_t* qh = b[i].qh;
    for (int g = 0; g < 4; ++g, q += 32) {
      uint8_t sc, m;
      UnpackScaleMinK4(b[i].scales, 2 * g, &sc, &m);
      const float d1 = d * sc, m1 = dmin * m;
      UnpackScaleMinK4(b[i].scales, 2 * g + 1, &sc, &m);
      const float d2 = d * sc, m2 = dmin * m;
      for (int l = 0; l < 32; ++l) {
        const int v = (q[l] & 0xf) | (((qh[l] >> (2 * g)) & 1) << 4);
        *dst++ = d1 * static_cast<float>(v) - m1;
      }
      for (int l = 0; l < 32; ++l) {
        const int v = (q[l] >> 4) | (((qh[l] >> (2 * g + 1)) & 1) << 4);
        *dst++ = d2 * static_cast<float>(v) - m2;
      }
    }
  }
}

void DequantizeRowQ6_KScalar(const void* src, float* dst, int64_t n) {
  const auto* b = static_cast<const BlockQ6_K*>(src);
  for (int64_t i = 0; i < n / kQK_K; ++i) {
    const float d = F16ToF32(b[i].d);
    for (int h = 0; h < 2; ++h, dst += 128) {
      const uint8_t* ql = b[i].ql + 64 * h;
      const uint8_t* qh = b[i].qh + 32 * h;
      const int8_t* sc = b[i].scales + 8 * h;
      for (int l = 0; l < 32; ++l) {
        const int is = l / 16;
        const int q1 = ((ql[l] & 0xf) | (((qh[l] >> 0) & 3) << 4)) - 32;
        const int q2 = ((ql[l + 32] & 0xf) | (((qh[l] >> 2) & 3) << 4)) - 32;
        const int q3 = ((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4)) - 32;
        const int q4 = ((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4)) - 32;
        dst[l] = (d * sc[is + 0]) * static_cast<float>(q1);
        dst[l + 32] = (d * sc[is + 2]) * static_cast<float>(q2);
        dst[l + 64] = (d * sc[is + 4]) * static_cast<float>(q3);
        dst[l + 96] = (d * sc[is + 6]) * static_cast<float>(q4);
      }
    }
  }
}

void QuantizeRowQ4_K(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ4_K*>(dst);
  uint8_t L[kQK_K];
  for (int64_t i = 0; i < n / kQK_K; ++i, src += kQK_K) {
    QuantizeSuperBlockScaleMin<15>(src, &b[i].d, &b[i].dmin, b[i].scales, L);
    for (int g = 0; g < 4; ++g) {
      for (int l = 0; l < 32; ++l) {
        b[i].qs[32 * g + l] = static_cast<uint8_t>(L[64 * g + l] | (L[64 * g + 32 + l] << 4));
      }
    }
  }
}

void QuantizeRowQ5_K(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ5_K*>(dst);
  uint8_t L[kQK_K];
  for (int64_t i = 0; i < n / kQK_K; ++i, src += kQK_K) {
    QuantizeSuperBlockScaleMin<31>(src, &b[i].d, &b[i].dmin, b[i].scales, L);
    std::memset(b[i].qh, 0, sizeof b[i].qh);
    for (int g = 0; g < 4; ++g) {
      for (int l = 0; l < 32; ++l) {
        const int lo = L[64 * g + l];
        const int hi = L[64 * g + 32 + l];
        b[i].qs[32 * g + l] = static_cast<uint8_t>((lo & 0xf) | ((hi & 0xf) << 4));
        b[i].qh[l] |= static_cast<uint8_t>(((lo >> 4) << (2 * g)) | ((hi >> 4) << (2 * g + 1)));
      }
    }
  }
}

void QuantizeRowQ6_K(const float* src, void* dst, int64_t n) {
  auto* b = static_cast<BlockQ6_K*>(dst);
  int8_t L[kQK_K];
  float scales[16];
  for (int64_t i = 0; i < n / kQK_K; ++i, src += kQK_K) {
    float max_scale = 0.f;
    float max_abs_scale = 0.f;
    for (int j = 0; j < 16; ++j) {
      scales[j] = FitScaleSymmetric(16, 32, src + 16 * j, L + 16 * j);
      if (std::fabs(scales[j]) > max_abs_scale) {
        max_abs_scale = std::fabs(scales[j]);
        max_scale = scales[j];
      }
    }
    if (!(max_abs_scale >= kGroupMaxEps)) {
      std::memset(&b[i], 0, sizeof b[i]);
      continue;
    }
    // The sub-block scale of largest magnitude becomes -128, so d's sign
    // follows it and the int8 range is used in full.
    const float iscale = -128.f / max_scale;
    b[i].d = F32ToF16(1.f / iscale);
    for (int j = 0; j < 16; ++j) {
      b[i].scales[j] = static_cast<int8_t>(std::clamp(NearestInt(iscale * scales[j]), -128, 127));
    }
    const float d = F16ToF32(b[i].d);
    for (int j = 0; j < 16; ++j) {
      const float dj = d * b[i].scales[j];
      if (dj == 0.f) continue;
      for (int l = 0; l < 16; ++l) {
        L[16 * j + l] =
            static_cast<int8_t>(32 + std::clamp(NearestInt(src[16 * j + l] / dj), -32, 31));
      }
    }
    for (int h = 0; h < 2; ++h) {
      const int8_t* Lh = L + 128 * h;
      uint8_t* ql = b[i].ql + 64 * h;
      uint8_t* qh = b[i].qh + 32 * h;
      for (int l = 0; l < 32; ++l) {
        const int q1 = Lh[l], q2 = Lh[l + 32], q3 = Lh[l + 64], q4 = Lh[l + 96];
        ql[l] = static_cast<uint8_t>((q1 & 0xf) | ((q3 & 0xf) << 4));
        ql[l + 32] = static_cast<uint8_t>((q2 & 0xf) | ((q4 & 0xf) << 4));
        qh[l] = static_cast<uint8_t>((q1 >> 4) | ((q2 >> 4) << 2) | ((q3 >> 4) << 4) |
                                     ((q4 >> 4) << 6));
      }
    }
  }
}

}  // namespace strata::cpu::internal
