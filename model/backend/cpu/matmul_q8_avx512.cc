// AVX-512 VNNI int8-activation kernels (matmul_q8.h). Q8_0/Q4_0: the 256-bit
// kernels of matmul_q8_simd.h with block sums by vpdpbusd (u8 x s8, 4
// products into each int32 lane, exact) and the 32 vector registers
// AVX-512VL gives for bigger tiles; 256-bit because pairing 32-element blocks
// into 512-bit vectors (with their scales) measured 3x slower. Q4_K/Q5_K:
// 512-bit tiles below, one 64-element group (two sub-blocks) per vector.
// Only reached through Avx512VnniQ8Kernels(), which checks the CPU.

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include "model/backend/cpu/cpu_features.h"
#include "model/backend/cpu/matmul_q8.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")

namespace strata::cpu::internal {
namespace {
struct Q8Ops {
  static constexpr int kMaxRows = 4;
  static constexpr int kMaxTokens = 4;
  static constexpr int kMaxKTokens = 4;
  static __m256i Dot(__m256i aw, __m256i sx) {
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), aw, sx);
  }
  static __m256i DotW(__m256i acc, __m256i p, __m256i s) { return _mm256_dpwssd_epi32(acc, p, s); }
};
}  // namespace
}  // namespace strata::cpu::internal

#include "model/backend/cpu/matmul_q8_simd.h"

namespace strata::cpu::internal {
namespace {

// Q4_K / Q5_K, 1 row x NT tokens, the sequence of matmul_q8_simd.h's
// Q8KTile on 512-bit vectors: per group g of 64 elements, the codes of
// sub-blocks 2g (low half) and 2g + 1 (high half) times the token's 64 codes
// by vpmaddubsw, times [sc_2g x 16 | sc_2g+1 x 16] into 16 int32 lanes by
// vpdpwssd (exact); per super-block converted and scaled by d_x * d; the
// minimums' integer sum by a 128-bit vpdpwssd, scaled by d_x * dmin into 4
// f32 lanes.
template <int kIndex, int NT>
void KTile512(const Q8Args& a, int64_t r, int64_t t0) {
  const int64_t nsb = a.cols / 256;
  const int64_t nb32 = a.cols / 32;
  const uint8_t* row = a.w + r * a.row_bytes;
  __m512 acc[NT];
  __m128 mins[NT];  // 4 lanes of the minimums' term
#pragma GCC unroll 8
  for (int t = 0; t < NT; ++t) {
    acc[t] = _mm512_setzero_ps();
    mins[t] = _mm_setzero_ps();
  }
  for (int64_t s = 0; s < nsb; ++s) {
    const KSuperBlock sb = LoadKSuperBlock<kIndex>(row, s);
    const float d = sb.d, dmin = sb.dmin;
    const __m512i sc16 =
        _mm512_broadcast_i32x4(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(static_cast<int64_t>(sb.sc8))));
    const __m128i m16 = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(static_cast<int64_t>(sb.m8)));
    __m512i iacc[NT];
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) iacc[t] = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int g = 0; g < 4; ++g) {
      __m256i lo, hi;
      KGroupCodes<kIndex>(sb, g, &lo, &hi);
      const __m512i w = _mm512_inserti64x4(_mm512_castsi256_si512(lo), hi, 1);
      const __m512i pick = _mm512_inserti64x4(
          _mm512_castsi256_si512(_mm256_set1_epi16(static_cast<int16_t>(0x0100 + 0x0202 * 2 * g))),
          _mm256_set1_epi16(static_cast<int16_t>(0x0100 + 0x0202 * (2 * g + 1))), 1);
      const __m512i sv = _mm512_shuffle_epi8(sc16, pick);
#pragma GCC unroll 8
      for (int t = 0; t < NT; ++t) {
        const __m512i x = _mm512_loadu_si512(a.xq + (t0 + t) * a.cols + 256 * s + 64 * g);
        iacc[t] = _mm512_dpwssd_epi32(iacc[t], _mm512_maddubs_epi16(w, x), sv);
      }
    }
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) {
      const float dx = a.xd[(t0 + t) * nsb + s];
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(iacc[t]), _mm512_set1_ps(dx * d), acc[t]);
      const __m128i bs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a.xbsum + (t0 + t) * nb32 + 8 * s));
      const __m128i p = _mm_dpwssd_epi32(_mm_setzero_si128(), m16, bs);
      mins[t] = _mm_fmadd_ps(_mm_cvtepi32_ps(p), _mm_set1_ps(dx * dmin), mins[t]);
    }
  }
#pragma GCC unroll 8
  for (int t = 0; t < NT; ++t) {
    __m128 m = _mm_add_ps(mins[t], _mm_movehl_ps(mins[t], mins[t]));
    m = _mm_add_ss(m, _mm_movehdup_ps(m));
    a.y[(t0 + t) * a.y_stride + r] = _mm512_reduce_add_ps(acc[t]) - _mm_cvtss_f32(m);
  }
}

constexpr int kKTokens512 = 8;

template <int kIndex, int NT>
void KTile512Upto(const Q8Args& a, int64_t r, int64_t t0, int nt) {
  if constexpr (NT > 1) {
    if (nt < NT) return KTile512Upto<kIndex, NT - 1>(a, r, t0, nt);
  }
  KTile512<kIndex, NT>(a, r, t0);
}

template <int kIndex>
void KRows512(const Q8Args& a) {
  for (int64_t r = a.row_begin; r < a.row_end; ++r) {
    for (int64_t t = 0; t < a.n_tokens; t += kKTokens512) {
      const int nt = static_cast<int>(std::min<int64_t>(kKTokens512, a.n_tokens - t));
      KTile512Upto<kIndex, kKTokens512>(a, r, t, nt);
    }
  }
}

constexpr Q8KernelTable kTable = {
    "avx512-vnni",
    {nullptr, nullptr, nullptr, &Q8Rows<kIdxQ4_0>, &Q8Rows<kIdxQ8_0>, &KRows512<kIdxQ4_K>, &KRows512<kIdxQ5_K>,
     &Q6Rows},
    &QuantizeRowSimd};

}  // namespace
}  // namespace strata::cpu::internal

#pragma GCC pop_options

namespace strata::cpu::internal {
const Q8KernelTable* Avx512VnniQ8Kernels() {
  const CpuFeatures& f = GetCpuFeatures();
  const bool ok = f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq && f.avx512_vnni && f.avx2 &&
                  f.fma && f.f16c;
  return ok ? &kTable : nullptr;
}
}  // namespace strata::cpu::internal
