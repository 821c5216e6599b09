// AVX-512 versions of the kernels in kernels.h. Every function carries its own
// target attribute (no file-wide -m flags or #pragma GCC target), so inline
// library functions emitted from this file stay baseline x86-64 and nothing
// here runs unless the dispatcher found AVX-512. Tails use masked loads and
// stores, so no access goes past the end of an array.

// GCC 12's AVX-512 intrinsics seed unmasked builtins with a self-initialized
// "undefined" vector, which -W(maybe-)uninitialized flags once inlined here
// (GCC bug 105593, fixed in 12.3/13). The values are never read. The pragmas
// cover only the header's own lines, so this file's code stays checked.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstdint>

#include "model/backend/cpu/kernels_internal.h"

#define STRATA_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))

namespace strata::cpu::internal {
namespace {

constexpr int kW = 16;

STRATA_AVX512 inline __mmask16 TailMask(int remaining) {
  return static_cast<__mmask16>((1u << remaining) - 1u);
}

// See kernels_internal.h. The final scaling by 2^n uses vscalefps, which
// handles overflow to inf and underflow to subnormals and zero exactly.
STRATA_AVX512 inline __m512 Exp(__m512 x) {
  // min/max return their second operand when one is NaN: x goes second.
  x = _mm512_min_ps(_mm512_set1_ps(kExpHi), x);
  x = _mm512_max_ps(_mm512_set1_ps(kExpLo), x);
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Hi), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kLn2Lo), r);
  __m512 p = _mm512_set1_ps(kExpP0);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpP1));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpP2));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpP3));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpP4));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpP5));
  p = _mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r);
  p = _mm512_add_ps(p, _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(p, n);
}

// Adds the squares of v's 16 floats, widened to double, into two accumulators.
STRATA_AVX512 inline void AddSquaresPd(__m512 v, __m512d& acc0, __m512d& acc1) {
  const __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
  const __m512d hi = _mm512_cvtps_pd(_mm512_extractf32x8_ps(v, 1));
  acc0 = _mm512_fmadd_pd(lo, lo, acc0);
  acc1 = _mm512_fmadd_pd(hi, hi, acc1);
}

STRATA_AVX512 inline void AddPd(__m512 v, __m512d& acc0, __m512d& acc1) {
  acc0 = _mm512_add_pd(acc0, _mm512_cvtps_pd(_mm512_castps512_ps256(v)));
  acc1 = _mm512_add_pd(acc1, _mm512_cvtps_pd(_mm512_extractf32x8_ps(v, 1)));
}

STRATA_AVX512 void RmsNormAvx512(const float* x, const float* weight, float* y, int n, float eps) {
  __m512d acc0 = _mm512_setzero_pd();
  __m512d acc1 = _mm512_setzero_pd();
  int i = 0;
  for (; i + kW <= n; i += kW) AddSquaresPd(_mm512_loadu_ps(x + i), acc0, acc1);
  if (i < n) AddSquaresPd(_mm512_maskz_loadu_ps(TailMask(n - i), x + i), acc0, acc1);
  const double ss = _mm512_reduce_add_pd(_mm512_add_pd(acc0, acc1));
  const float scale = static_cast<float>(1.0 / __builtin_sqrt(ss / n + eps));
  const __m512 vs = _mm512_set1_ps(scale);
  for (i = 0; i + kW <= n; i += kW) {
    const __m512 v = _mm512_mul_ps(_mm512_loadu_ps(x + i), vs);
    _mm512_storeu_ps(y + i, _mm512_mul_ps(v, _mm512_loadu_ps(weight + i)));
  }
  if (i < n) {
    const __mmask16 m = TailMask(n - i);
    const __m512 v = _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), vs);
    _mm512_mask_storeu_ps(y + i, m, _mm512_mul_ps(v, _mm512_maskz_loadu_ps(m, weight + i)));
  }
}

// One group of up to 8 interleaved pairs (2*pairs floats at v).
STRATA_AVX512 inline void RopePairs(float* v, const float* cos, const float* sin, int pairs) {
  const __m512i dup = _mm512_set_epi32(7, 7, 6, 6, 5, 5, 4, 4, 3, 3, 2, 2, 1, 1, 0, 0);
  const __mmask8 mp = static_cast<__mmask8>((1u << pairs) - 1u);
  const __mmask16 mf = TailMask(2 * pairs);
  const __m512 c =
      _mm512_permutexvar_ps(dup, _mm512_castps256_ps512(_mm256_maskz_loadu_ps(mp, cos)));
  const __m512 s =
      _mm512_permutexvar_ps(dup, _mm512_castps256_ps512(_mm256_maskz_loadu_ps(mp, sin)));
  const __m512 x = _mm512_maskz_loadu_ps(mf, v);
  const __m512 swapped = _mm512_permute_ps(x, 0xB1);  // (x1, x0) in each pair
  // even lanes: x0*c - x1*s; odd lanes: x1*c + x0*s.
  _mm512_mask_storeu_ps(v, mf, _mm512_fmaddsub_ps(x, c, _mm512_mul_ps(swapped, s)));
}

STRATA_AVX512 void RopeAvx512(float* x, int n_heads, int head_dim, const float* cos,
                              const float* sin, bool neox) {
  const int half = head_dim / 2;
  for (int h = 0; h < n_heads; ++h) {
    float* v = x + static_cast<size_t>(h) * head_dim;
    if (!neox) {
      for (int i = 0; i < half; i += 8)
        RopePairs(v + 2 * i, cos + i, sin + i, half - i < 8 ? half - i : 8);
      continue;
    }
    for (int i = 0; i < half; i += kW) {
      const __mmask16 m = half - i < kW ? TailMask(half - i) : static_cast<__mmask16>(0xffff);
      const __m512 c = _mm512_maskz_loadu_ps(m, cos + i);
      const __m512 s = _mm512_maskz_loadu_ps(m, sin + i);
      const __m512 a = _mm512_maskz_loadu_ps(m, v + i);
      const __m512 b = _mm512_maskz_loadu_ps(m, v + half + i);
      _mm512_mask_storeu_ps(v + i, m, _mm512_fmsub_ps(a, c, _mm512_mul_ps(b, s)));
      _mm512_mask_storeu_ps(v + half + i, m, _mm512_fmadd_ps(b, c, _mm512_mul_ps(a, s)));
    }
  }
}

STRATA_AVX512 inline __m512 Silu(__m512 g) {
  const __m512 e = Exp(_mm512_sub_ps(_mm512_setzero_ps(), g));
  return _mm512_div_ps(g, _mm512_add_ps(_mm512_set1_ps(1.0f), e));
}

STRATA_AVX512 void SwiGluAvx512(const float* gate, const float* up, float* out, int n) {
  int i = 0;
  for (; i + kW <= n; i += kW) {
    const __m512 s = Silu(_mm512_loadu_ps(gate + i));
    _mm512_storeu_ps(out + i, _mm512_mul_ps(s, _mm512_loadu_ps(up + i)));
  }
  if (i < n) {
    const __mmask16 m = TailMask(n - i);
    const __m512 s = Silu(_mm512_maskz_loadu_ps(m, gate + i));
    _mm512_mask_storeu_ps(out + i, m, _mm512_mul_ps(s, _mm512_maskz_loadu_ps(m, up + i)));
  }
}

STRATA_AVX512 void SoftmaxAvx512(float* x, int n) {
  const __m512 neg_inf = _mm512_set1_ps(-__builtin_inff());
  __m512 vmax = neg_inf;
  int i = 0;
  for (; i + kW <= n; i += kW) vmax = _mm512_max_ps(vmax, _mm512_loadu_ps(x + i));
  if (i < n) vmax = _mm512_max_ps(vmax, _mm512_mask_loadu_ps(neg_inf, TailMask(n - i), x + i));
  const __m512 vm = _mm512_set1_ps(_mm512_reduce_max_ps(vmax));

  __m512d s0 = _mm512_setzero_pd();
  __m512d s1 = _mm512_setzero_pd();
  for (i = 0; i + kW <= n; i += kW) {
    const __m512 e = Exp(_mm512_sub_ps(_mm512_loadu_ps(x + i), vm));
    _mm512_storeu_ps(x + i, e);
    AddPd(e, s0, s1);
  }
  if (i < n) {
    const __mmask16 m = TailMask(n - i);
    const __m512 e =
        _mm512_maskz_mov_ps(m, Exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + i), vm)));
    _mm512_mask_storeu_ps(x + i, m, e);
    AddPd(e, s0, s1);
  }
  const __m512 inv =
      _mm512_set1_ps(static_cast<float>(1.0 / _mm512_reduce_add_pd(_mm512_add_pd(s0, s1))));
  for (i = 0; i + kW <= n; i += kW)
    _mm512_storeu_ps(x + i, _mm512_mul_ps(_mm512_loadu_ps(x + i), inv));
  if (i < n) {
    const __mmask16 m = TailMask(n - i);
    _mm512_mask_storeu_ps(x + i, m, _mm512_mul_ps(_mm512_maskz_loadu_ps(m, x + i), inv));
  }
}

STRATA_AVX512 void AddAvx512(float* y, const float* x, int n) {
  int i = 0;
  for (; i + kW <= n; i += kW) {
    _mm512_storeu_ps(y + i, _mm512_add_ps(_mm512_loadu_ps(y + i), _mm512_loadu_ps(x + i)));
  }
  if (i < n) {
    const __mmask16 m = TailMask(n - i);
    _mm512_mask_storeu_ps(
        y + i, m, _mm512_add_ps(_mm512_maskz_loadu_ps(m, y + i), _mm512_maskz_loadu_ps(m, x + i)));
  }
}

// Loads 16 (or, masked, fewer) KV elements as floats; masked-off lanes are 0.
template <DType T>
STRATA_AVX512 inline __m512 LoadKv(const void* p, int i, __mmask16 m) {
  if constexpr (T == DType::kF32) {
    return _mm512_maskz_loadu_ps(m, static_cast<const float*>(p) + i);
  } else {
    const __m256i h = _mm256_maskz_loadu_epi16(m, static_cast<const uint16_t*>(p) + i);
    if constexpr (T == DType::kF16) {
      return _mm512_cvtph_ps(h);
    } else {
      return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
    }
  }
}

template <DType T>
STRATA_AVX512 float DotKvT(const float* q, const void* k, int n) {
  constexpr __mmask16 kAll = 0xffff;
  __m512 acc0 = _mm512_setzero_ps();
  __m512 acc1 = _mm512_setzero_ps();
  __m512 acc2 = _mm512_setzero_ps();
  __m512 acc3 = _mm512_setzero_ps();
  int i = 0;
  for (; i + 4 * kW <= n; i += 4 * kW) {
    acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(q + i), LoadKv<T>(k, i, kAll), acc0);
    acc1 = _mm512_fmadd_ps(_mm512_loadu_ps(q + i + kW), LoadKv<T>(k, i + kW, kAll), acc1);
    acc2 = _mm512_fmadd_ps(_mm512_loadu_ps(q + i + 2 * kW), LoadKv<T>(k, i + 2 * kW, kAll), acc2);
    acc3 = _mm512_fmadd_ps(_mm512_loadu_ps(q + i + 3 * kW), LoadKv<T>(k, i + 3 * kW, kAll), acc3);
  }
  for (; i + kW <= n; i += kW) {
    acc0 = _mm512_fmadd_ps(_mm512_loadu_ps(q + i), LoadKv<T>(k, i, kAll), acc0);
  }
  if (i < n) {
    const __mmask16 m = TailMask(n - i);
    acc1 = _mm512_fmadd_ps(_mm512_maskz_loadu_ps(m, q + i), LoadKv<T>(k, i, m), acc1);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc0, acc1), _mm512_add_ps(acc2, acc3)));
}

STRATA_AVX512 float DotKvAvx512(const float* q, const void* k, DType kv_type, int n) {
  switch (kv_type) {
    case DType::kF16:
      return DotKvT<DType::kF16>(q, k, n);
    case DType::kBF16:
      return DotKvT<DType::kBF16>(q, k, n);
    default:
      return DotKvT<DType::kF32>(q, k, n);
  }
}

template <DType T>
STRATA_AVX512 void AxpyKvT(float a, const void* v, float* out, int n) {
  const __m512 va = _mm512_set1_ps(a);
  int i = 0;
  for (; i + kW <= n; i += kW) {
    _mm512_storeu_ps(out + i,
                     _mm512_fmadd_ps(va, LoadKv<T>(v, i, 0xffff), _mm512_loadu_ps(out + i)));
  }
  if (i < n) {
    const __mmask16 m = TailMask(n - i);
    _mm512_mask_storeu_ps(
        out + i, m, _mm512_fmadd_ps(va, LoadKv<T>(v, i, m), _mm512_maskz_loadu_ps(m, out + i)));
  }
}

STRATA_AVX512 void AxpyKvAvx512(float a, const void* v, DType kv_type, float* out, int n) {
  switch (kv_type) {
    case DType::kF16:
      return AxpyKvT<DType::kF16>(a, v, out, n);
    case DType::kBF16:
      return AxpyKvT<DType::kBF16>(a, v, out, n);
    default:
      return AxpyKvT<DType::kF32>(a, v, out, n);
  }
}

// 16 floats to bf16 with round-to-nearest-even; NaNs stay NaN (quiet).
STRATA_AVX512 inline __m256i ToBf16(__m512 v) {
  const __m512i x = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(1));
  const __m512i rounded =
      _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(x, _mm512_set1_epi32(0x7fff)), lsb), 16);
  const __m512i quiet_nan = _mm512_or_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(0x40));
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rounded, quiet_nan));
}

STRATA_AVX512 void StoreKvAvx512(const float* src, void* dst, DType kv_type, int n) {
  if (kv_type != DType::kF16 && kv_type != DType::kBF16) {
    auto* d = static_cast<float*>(dst);
    int i = 0;
    for (; i + kW <= n; i += kW) _mm512_storeu_ps(d + i, _mm512_loadu_ps(src + i));
    if (i < n) {
      const __mmask16 m = TailMask(n - i);
      _mm512_mask_storeu_ps(d + i, m, _mm512_maskz_loadu_ps(m, src + i));
    }
    return;
  }
  auto* d = static_cast<uint16_t*>(dst);
  const bool f16 = kv_type == DType::kF16;
  for (int i = 0; i < n; i += kW) {
    const __mmask16 m = n - i < kW ? TailMask(n - i) : static_cast<__mmask16>(0xffff);
    const __m512 v = _mm512_maskz_loadu_ps(m, src + i);
    const __m256i h = f16 ? _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT) : ToBf16(v);
    _mm256_mask_storeu_epi16(d + i, m, h);
  }
}

STRATA_AVX512 void ExpAvx512(const float* x, float* y, int n) {
  for (int i = 0; i < n; i += kW) {
    const __mmask16 m = n - i < kW ? TailMask(n - i) : static_cast<__mmask16>(0xffff);
    _mm512_mask_storeu_ps(y + i, m, Exp(_mm512_maskz_loadu_ps(m, x + i)));
  }
}

}  // namespace

const ElemKernels& Avx512ElemKernels() {
  static constexpr ElemKernels kTable = {
      SimdLevel::kAvx512, RmsNormAvx512, RopeAvx512,   SwiGluAvx512,  SoftmaxAvx512,
      AddAvx512,          DotKvAvx512,   AxpyKvAvx512, StoreKvAvx512, ExpAvx512,
  };
  return kTable;
}

}  // namespace strata::cpu::internal
