// AVX2 (+FMA, F16C) versions of the kernels in kernels.h. Every function
// carries its own target attribute (no file-wide -m flags or #pragma GCC
// target), so inline library functions emitted from this file stay baseline
// x86-64 and nothing here runs unless the dispatcher found AVX2. Float tails
// use vmaskmovps; 16-bit tails go through a small zero-padded buffer, so no
// access goes past the end of an array.

#include <immintrin.h>

#include <cstdint>

#include "model/backend/cpu/kernels_internal.h"

#define STRATA_AVX2 __attribute__((target("avx2,fma,f16c")))

namespace strata::cpu::internal {
namespace {

constexpr int kW = 8;

// Lanes [0, remaining) set.
STRATA_AVX2 inline __m256i TailMask(int remaining) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(remaining),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

STRATA_AVX2 inline float HSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

STRATA_AVX2 inline double HSumPd(__m256d v) {
  __m128d s = _mm_add_pd(_mm256_castpd256_pd128(v), _mm256_extractf128_pd(v, 1));
  s = _mm_add_sd(s, _mm_unpackhi_pd(s, s));
  return _mm_cvtsd_f64(s);
}

STRATA_AVX2 inline float HMax(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// See kernels_internal.h. 2^n is applied as 2^(n/2) * 2^(n - n/2) so that
// both factors are normal floats for every n in [-150, 128]; the result then
// overflows to inf and underflows to subnormals or zero as it should.
STRATA_AVX2 inline __m256 Exp(__m256 x) {
  // min/max return their second operand when one is NaN: x goes second.
  x = _mm256_min_ps(_mm256_set1_ps(kExpHi), x);
  x = _mm256_max_ps(_mm256_set1_ps(kExpLo), x);
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(kLog2e)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Hi), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(kLn2Lo), r);
  __m256 p = _mm256_set1_ps(kExpP0);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpP1));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpP2));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpP3));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpP4));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(kExpP5));
  p = _mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r);
  p = _mm256_add_ps(p, _mm256_set1_ps(1.0f));
  // n is NaN only when x is; p is then NaN too and the garbage exponent below
  // does not matter.
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i n1 = _mm256_srai_epi32(ni, 1);
  const __m256i n2 = _mm256_sub_epi32(ni, n1);
  const __m256i bias = _mm256_set1_epi32(127);
  const __m256 s1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n1, bias), 23));
  const __m256 s2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(n2, bias), 23));
  return _mm256_mul_ps(_mm256_mul_ps(p, s1), s2);
}

STRATA_AVX2 inline void AddSquaresPd(__m256 v, __m256d& acc0, __m256d& acc1) {
  const __m256d lo = _mm256_cvtps_pd(_mm256_castps256_ps128(v));
  const __m256d hi = _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1));
  acc0 = _mm256_fmadd_pd(lo, lo, acc0);
  acc1 = _mm256_fmadd_pd(hi, hi, acc1);
}

STRATA_AVX2 void RmsNormAvx2(const float* x, const float* weight, float* y, int n, float eps) {
  __m256d acc0 = _mm256_setzero_pd();
  __m256d acc1 = _mm256_setzero_pd();
  int i = 0;
  for (; i + kW <= n; i += kW) AddSquaresPd(_mm256_loadu_ps(x + i), acc0, acc1);
  if (i < n) AddSquaresPd(_mm256_maskload_ps(x + i, TailMask(n - i)), acc0, acc1);
  const double ss = HSumPd(_mm256_add_pd(acc0, acc1));
  const float scale = static_cast<float>(1.0 / __builtin_sqrt(ss / n + eps));
  const __m256 vs = _mm256_set1_ps(scale);
  for (i = 0; i + kW <= n; i += kW) {
    const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(x + i), vs);
    _mm256_storeu_ps(y + i, _mm256_mul_ps(v, _mm256_loadu_ps(weight + i)));
  }
  if (i < n) {
    const __m256i m = TailMask(n - i);
    const __m256 v = _mm256_mul_ps(_mm256_maskload_ps(x + i, m), vs);
    _mm256_maskstore_ps(y + i, m, _mm256_mul_ps(v, _mm256_maskload_ps(weight + i, m)));
  }
}

STRATA_AVX2 void RopeAvx2(float* x, int n_heads, int head_dim, const float* cos, const float* sin,
                          bool neox) {
  const int half = head_dim / 2;
  const __m256i dup = _mm256_setr_epi32(0, 0, 1, 1, 2, 2, 3, 3);
  for (int h = 0; h < n_heads; ++h) {
    float* v = x + static_cast<size_t>(h) * head_dim;
    int i = 0;
    if (!neox) {
      // 4 interleaved pairs per step.
      for (; i + 4 <= half; i += 4) {
        const __m256 c =
            _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(cos + i)), dup);
        const __m256 s =
            _mm256_permutevar8x32_ps(_mm256_castps128_ps256(_mm_loadu_ps(sin + i)), dup);
        const __m256 a = _mm256_loadu_ps(v + 2 * i);
        const __m256 swapped = _mm256_permute_ps(a, 0xB1);  // (x1, x0) in each pair
        // even lanes: x0*c - x1*s; odd lanes: x1*c + x0*s.
        _mm256_storeu_ps(v + 2 * i, _mm256_fmaddsub_ps(a, c, _mm256_mul_ps(swapped, s)));
      }
      for (; i < half; ++i) {
        const float a = v[2 * i];
        const float b = v[2 * i + 1];
        v[2 * i] = a * cos[i] - b * sin[i];
        v[2 * i + 1] = b * cos[i] + a * sin[i];
      }
      continue;
    }
    for (; i < half; i += kW) {
      const __m256i m = TailMask(half - i);
      const __m256 c = _mm256_maskload_ps(cos + i, m);
      const __m256 s = _mm256_maskload_ps(sin + i, m);
      const __m256 a = _mm256_maskload_ps(v + i, m);
      const __m256 b = _mm256_maskload_ps(v + half + i, m);
      _mm256_maskstore_ps(v + i, m, _mm256_fmsub_ps(a, c, _mm256_mul_ps(b, s)));
      _mm256_maskstore_ps(v + half + i, m, _mm256_fmadd_ps(b, c, _mm256_mul_ps(a, s)));
    }
  }
}

STRATA_AVX2 inline __m256 Silu(__m256 g) {
  const __m256 e = Exp(_mm256_sub_ps(_mm256_setzero_ps(), g));
  return _mm256_div_ps(g, _mm256_add_ps(_mm256_set1_ps(1.0f), e));
}

STRATA_AVX2 void SwiGluAvx2(const float* gate, const float* up, float* out, int n) {
  int i = 0;
  for (; i + kW <= n; i += kW) {
    _mm256_storeu_ps(out + i,
                     _mm256_mul_ps(Silu(_mm256_loadu_ps(gate + i)), _mm256_loadu_ps(up + i)));
  }
  if (i < n) {
    const __m256i m = TailMask(n - i);
    const __m256 s = Silu(_mm256_maskload_ps(gate + i, m));
    _mm256_maskstore_ps(out + i, m, _mm256_mul_ps(s, _mm256_maskload_ps(up + i, m)));
  }
}

STRATA_AVX2 inline void AddPd(__m256 v, __m256d& acc0, __m256d& acc1) {
  acc0 = _mm256_add_pd(acc0, _mm256_cvtps_pd(_mm256_castps256_ps128(v)));
  acc1 = _mm256_add_pd(acc1, _mm256_cvtps_pd(_mm256_extractf128_ps(v, 1)));
}

STRATA_AVX2 void SoftmaxAvx2(float* x, int n) {
  const __m256 neg_inf = _mm256_set1_ps(-__builtin_inff());
  __m256 vmax = neg_inf;
  int i = 0;
  for (; i + kW <= n; i += kW) vmax = _mm256_max_ps(vmax, _mm256_loadu_ps(x + i));
  if (i < n) {
    const __m256i m = TailMask(n - i);
    const __m256 v =
        _mm256_blendv_ps(neg_inf, _mm256_maskload_ps(x + i, m), _mm256_castsi256_ps(m));
    vmax = _mm256_max_ps(vmax, v);
  }
  const __m256 vm = _mm256_set1_ps(HMax(vmax));

  __m256d s0 = _mm256_setzero_pd();
  __m256d s1 = _mm256_setzero_pd();
  for (i = 0; i + kW <= n; i += kW) {
    const __m256 e = Exp(_mm256_sub_ps(_mm256_loadu_ps(x + i), vm));
    _mm256_storeu_ps(x + i, e);
    AddPd(e, s0, s1);
  }
  if (i < n) {
    const __m256i m = TailMask(n - i);
    const __m256 e =
        _mm256_and_ps(Exp(_mm256_sub_ps(_mm256_maskload_ps(x + i, m), vm)), _mm256_castsi256_ps(m));
    _mm256_maskstore_ps(x + i, m, e);
    AddPd(e, s0, s1);
  }
  const __m256 inv = _mm256_set1_ps(static_cast<float>(1.0 / HSumPd(_mm256_add_pd(s0, s1))));
  for (i = 0; i + kW <= n; i += kW)
    _mm256_storeu_ps(x + i, _mm256_mul_ps(_mm256_loadu_ps(x + i), inv));
  if (i < n) {
    const __m256i m = TailMask(n - i);
    _mm256_maskstore_ps(x + i, m, _mm256_mul_ps(_mm256_maskload_ps(x + i, m), inv));
  }
}

STRATA_AVX2 void AddAvx2(float* y, const float* x, int n) {
  int i = 0;
  for (; i + kW <= n; i += kW) {
    _mm256_storeu_ps(y + i, _mm256_add_ps(_mm256_loadu_ps(y + i), _mm256_loadu_ps(x + i)));
  }
  if (i < n) {
    const __m256i m = TailMask(n - i);
    _mm256_maskstore_ps(y + i, m,
                        _mm256_add_ps(_mm256_maskload_ps(y + i, m), _mm256_maskload_ps(x + i, m)));
  }
}

// Loads 8 KV elements starting at element i as floats.
template <DType T>
STRATA_AVX2 inline __m256 LoadKv(const void* p, int i) {
  if constexpr (T == DType::kF32) {
    return _mm256_loadu_ps(static_cast<const float*>(p) + i);
  } else {
    const __m128i h =
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(static_cast<const uint16_t*>(p) + i));
    if constexpr (T == DType::kF16) {
      return _mm256_cvtph_ps(h);
    } else {
      return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
  }
}

// Loads elements [i, n) (fewer than 8) as floats; the other lanes are 0.
template <DType T>
STRATA_AVX2 inline __m256 LoadKvTail(const void* p, int i, int n) {
  if constexpr (T == DType::kF32) {
    return _mm256_maskload_ps(static_cast<const float*>(p) + i, TailMask(n - i));
  } else {
    alignas(16) uint16_t buf[kW] = {};
    const uint16_t* src = static_cast<const uint16_t*>(p) + i;
    for (int j = 0; j < n - i; ++j) buf[j] = src[j];
    return LoadKv<T>(buf, 0);
  }
}

template <DType T>
STRATA_AVX2 float DotKvT(const float* q, const void* k, int n) {
  __m256 acc0 = _mm256_setzero_ps();
  __m256 acc1 = _mm256_setzero_ps();
  __m256 acc2 = _mm256_setzero_ps();
  __m256 acc3 = _mm256_setzero_ps();
  int i = 0;
  for (; i + 4 * kW <= n; i += 4 * kW) {
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), LoadKv<T>(k, i), acc0);
    acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + kW), LoadKv<T>(k, i + kW), acc1);
    acc2 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 2 * kW), LoadKv<T>(k, i + 2 * kW), acc2);
    acc3 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i + 3 * kW), LoadKv<T>(k, i + 3 * kW), acc3);
  }
  for (; i + kW <= n; i += kW)
    acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), LoadKv<T>(k, i), acc0);
  if (i < n) {
    const __m256 qv = _mm256_maskload_ps(q + i, TailMask(n - i));
    acc1 = _mm256_fmadd_ps(qv, LoadKvTail<T>(k, i, n), acc1);
  }
  return HSum(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
}

STRATA_AVX2 float DotKvAvx2(const float* q, const void* k, DType kv_type, int n) {
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
STRATA_AVX2 void AxpyKvT(float a, const void* v, float* out, int n) {
  const __m256 va = _mm256_set1_ps(a);
  int i = 0;
  for (; i + kW <= n; i += kW) {
    _mm256_storeu_ps(out + i, _mm256_fmadd_ps(va, LoadKv<T>(v, i), _mm256_loadu_ps(out + i)));
  }
  if (i < n) {
    const __m256i m = TailMask(n - i);
    _mm256_maskstore_ps(
        out + i, m, _mm256_fmadd_ps(va, LoadKvTail<T>(v, i, n), _mm256_maskload_ps(out + i, m)));
  }
}

STRATA_AVX2 void AxpyKvAvx2(float a, const void* v, DType kv_type, float* out, int n) {
  switch (kv_type) {
    case DType::kF16:
      return AxpyKvT<DType::kF16>(a, v, out, n);
    case DType::kBF16:
      return AxpyKvT<DType::kBF16>(a, v, out, n);
    default:
      return AxpyKvT<DType::kF32>(a, v, out, n);
  }
}

// 8 floats to bf16 with round-to-nearest-even; NaNs stay NaN (quiet).
STRATA_AVX2 inline __m128i ToBf16(__m256 v) {
  const __m256i x = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
  const __m256i rounded =
      _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(x, _mm256_set1_epi32(0x7fff)), lsb), 16);
  const __m256i quiet_nan = _mm256_or_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(0x40));
  const __m256 nan = _mm256_cmp_ps(v, v, _CMP_UNORD_Q);
  const __m256i r = _mm256_castps_si256(
      _mm256_blendv_ps(_mm256_castsi256_ps(rounded), _mm256_castsi256_ps(quiet_nan), nan));
  // Every lane is < 2^16, so the unsigned-saturating pack is exact.
  return _mm_packus_epi32(_mm256_castsi256_si128(r), _mm256_extracti128_si256(r, 1));
}

STRATA_AVX2 void StoreKvAvx2(const float* src, void* dst, DType kv_type, int n) {
  if (kv_type != DType::kF16 && kv_type != DType::kBF16) {
    auto* d = static_cast<float*>(dst);
    int i = 0;
    for (; i + kW <= n; i += kW) _mm256_storeu_ps(d + i, _mm256_loadu_ps(src + i));
    if (i < n) {
      const __m256i m = TailMask(n - i);
      _mm256_maskstore_ps(d + i, m, _mm256_maskload_ps(src + i, m));
    }
    return;
  }
  auto* d = static_cast<uint16_t*>(dst);
  const bool f16 = kv_type == DType::kF16;
  for (int i = 0; i < n; i += kW) {
    const int count = n - i < kW ? n - i : kW;
    const __m256 v = _mm256_maskload_ps(src + i, TailMask(count));
    const __m128i h = f16 ? _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT) : ToBf16(v);
    if (count == kW) {
      _mm_storeu_si128(reinterpret_cast<__m128i*>(d + i), h);
    } else {
      alignas(16) uint16_t buf[kW];
      _mm_store_si128(reinterpret_cast<__m128i*>(buf), h);
      for (int j = 0; j < count; ++j) d[i + j] = buf[j];
    }
  }
}

STRATA_AVX2 void ExpAvx2(const float* x, float* y, int n) {
  for (int i = 0; i < n; i += kW) {
    const __m256i m = TailMask(n - i);
    _mm256_maskstore_ps(y + i, m, Exp(_mm256_maskload_ps(x + i, m)));
  }
}

}  // namespace

const ElemKernels& Avx2ElemKernels() {
  static constexpr ElemKernels kTable = {
      SimdLevel::kAvx2, RmsNormAvx2, RopeAvx2,   SwiGluAvx2,  SoftmaxAvx2,
      AddAvx2,          DotKvAvx2,   AxpyKvAvx2, StoreKvAvx2, ExpAvx2,
  };
  return kTable;
}

}  // namespace strata::cpu::internal
