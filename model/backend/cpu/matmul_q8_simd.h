// Internal to the CPU backend: the int8-activation tile kernels, written once
// for 256-bit vectors and instantiated per ISA (matmul_q8_avx2.cc,
// matmul_q8_avx512.cc). Include only from a translation unit whose target
// pragma enables AVX2 + FMA + F16C, after defining struct Q8Ops with
//   static constexpr int kMaxRows, kMaxTokens;  // Q8_0/Q4_0 tile shape
//   static constexpr int kMaxKTokens;           // K-quant tile: 1 row x this
//   static __m256i Dot(__m256i aw, __m256i sx);  // 8 int32 sums of 4 products
//   static __m256i DotW(__m256i acc, __m256i p, __m256i s);  // acc + pairs of p*s
// (aw unsigned, sx signed bytes; p, s int16; exact), inside
// strata::cpu::internal's anonymous namespace.
//
// Per (weight row, token) and 32-element block: the weight codes' magnitudes
// (u8) times the token's codes carrying the weights' signs (s8), summed by
// Dot into 8 int32 lanes, converted and multiplied by d_w * d_x into an f32
// accumulator of 8 lanes, reduced at the end. The tiles run that sequence for
// up to kMaxRows x kMaxTokens outputs at once, each with its own accumulator,
// so a token's result does not depend on the tile it was in.

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

#include "model/backend/cpu/matmul_q8.h"
#include "model/backend/cpu/quant.h"

namespace strata::cpu::internal {
namespace {


// The 32 signed codes of block b of a Q8_0 / Q4_0 row, and its scale.
template <int kIndex>
inline __m256i BlockCodes(const uint8_t* row, int64_t b, float* d) {
  if constexpr (kIndex == kIdxQ8_0) {
    const auto* blk = reinterpret_cast<const BlockQ8_0*>(row) + b;
    *d = _cvtsh_ss(blk->d);
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk->qs));
  } else {
    const auto* blk = reinterpret_cast<const BlockQ4_0*>(row) + b;
    *d = _cvtsh_ss(blk->d);
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk->qs));
    const __m128i m = _mm_set1_epi8(15);
    const __m256i q = _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(v, 4), m), _mm_and_si128(v, m));
    return _mm256_sub_epi8(q, _mm256_set1_epi8(8));
  }
}

// QuantizeActivationRow, 8 floats at a time, with the same operations (the
// max is exact in any order; x * (1 / d) and the rounding by truncation and
// remainder are the scalar code's), so the same bytes.
inline void QuantizeRowSimd(const float* x, int64_t cols, int block, int8_t* q, float* d, int16_t* bsum,
                            int16_t* bsum16) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 inf = _mm256_set1_ps(__builtin_inff());
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t b = 0; b < cols / block; ++b) {
    const float* xb = x + b * block;
    int8_t* qb = q + b * block;
    __m256 vmax = _mm256_setzero_ps(), bad = _mm256_setzero_ps();
    for (int j = 0; j < block; j += 8) {
      const __m256 a = _mm256_and_ps(_mm256_loadu_ps(xb + j), abs_mask);
      bad = _mm256_or_ps(bad, _mm256_cmp_ps(a, inf, _CMP_NLT_UQ));  // inf or NaN
      vmax = _mm256_max_ps(vmax, a);
    }
    if (_mm256_movemask_ps(bad) != 0) {
      d[b] = __builtin_nanf("");
      for (int j = 0; j < block; ++j) qb[j] = 0;
      continue;
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    const float amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
    const float db = amax / 127.f;
    const float id = db != 0.f ? 1.f / db : 0.f;
    if (!std::isfinite(id)) {  // d subnormal: the scalar code's x / d
      int16_t sums32[8], sums16[16];  // the row's sums are taken below
      QuantizeActivationRow(xb, block, block, qb, d + b, sums32, sums16);
      continue;
    }
    d[b] = db;
    const __m256 vid = _mm256_set1_ps(id);
    for (int j = 0; j < block; j += 32) {
      __m256i i32[4];
      for (int k = 0; k < 4; ++k) {
        const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(xb + j + 8 * k), vid);
        __m256i i = _mm256_cvttps_epi32(v);
        const __m256 frac = _mm256_sub_ps(v, _mm256_cvtepi32_ps(i));
        // +1 where frac >= 0.5, -1 where frac <= -0.5 (masks are all ones = -1).
        i = _mm256_sub_epi32(i, _mm256_castps_si256(_mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ)));
        i = _mm256_add_epi32(i, _mm256_castps_si256(_mm256_cmp_ps(frac, _mm256_set1_ps(-0.5f), _CMP_LE_OQ)));
        i32[k] = _mm256_max_epi32(_mm256_min_epi32(i, _mm256_set1_epi32(127)), _mm256_set1_epi32(-127));
      }
      const __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(i32[0], i32[1]), _mm256_packs_epi32(i32[2], i32[3]));
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(qb + j), _mm256_permutevar8x32_epi32(p, order));
    }
  }
  // Sums of 16 codes: |sum of 8 codes + 128 each| by vpsadbw, less 16 * 128.
  for (int64_t k = 0; k < cols / 32; ++k) {
    const __m256i v = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 32 * k)),
                                       _mm256_set1_epi8(static_cast<char>(0x80)));
    const __m256i s = _mm256_sad_epu8(v, _mm256_setzero_si256());
    const int s0 = _mm256_extract_epi32(s, 0) + _mm256_extract_epi32(s, 2) - 2048;
    const int s1 = _mm256_extract_epi32(s, 4) + _mm256_extract_epi32(s, 6) - 2048;
    bsum16[2 * k] = static_cast<int16_t>(s0);
    bsum16[2 * k + 1] = static_cast<int16_t>(s1);
    bsum[k] = static_cast<int16_t>(s0 + s1);
  }
}

// QuantizeActivationRowWide, 8 floats at a time: the codes by the scalar
// code's operations; hi = q / 255 rounded to nearest as q * (1 / 255) in f32
// rounded to nearest (for |q| <= kWideMax the quotient is at least 1/510
// from a half, the f32 error under 2e-5), so the same bytes.
inline void QuantizeRowWideSimd(const float* x, int64_t cols, int8_t* hi, int8_t* lo, float* d, int16_t* hbsum,
                                int16_t* lbsum) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  const __m256 inf = _mm256_set1_ps(__builtin_inff());
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  const __m256 inv255 = _mm256_set1_ps(1.f / 255.f);
  for (int64_t b = 0; b < cols / 32; ++b) {
    const float* xb = x + b * 32;
    __m256 vmax = _mm256_setzero_ps(), bad = _mm256_setzero_ps();
    for (int j = 0; j < 32; j += 8) {
      const __m256 a = _mm256_and_ps(_mm256_loadu_ps(xb + j), abs_mask);
      bad = _mm256_or_ps(bad, _mm256_cmp_ps(a, inf, _CMP_NLT_UQ));  // inf or NaN
      vmax = _mm256_max_ps(vmax, a);
    }
    if (_mm256_movemask_ps(bad) != 0) {
      d[b] = __builtin_nanf("");
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(hi + 32 * b), _mm256_setzero_si256());
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(lo + 32 * b), _mm256_setzero_si256());
      hbsum[b] = lbsum[b] = 0;
      continue;
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(vmax), _mm256_extractf128_ps(vmax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    const float amax = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4)));
    const float db = amax / static_cast<float>(kWideMax);
    const float id = db != 0.f ? 1.f / db : 0.f;
    if (!std::isfinite(id)) {  // d subnormal: the scalar code's x / d
      QuantizeActivationRowWide(xb, 32, hi + 32 * b, lo + 32 * b, d + b, hbsum + b, lbsum + b);
      continue;
    }
    d[b] = db;
    const __m256 vid = _mm256_set1_ps(id);
    __m256i h32[4], l32[4];
    __m256i hs = _mm256_setzero_si256(), ls = _mm256_setzero_si256();
    for (int k = 0; k < 4; ++k) {
      const __m256 v = _mm256_mul_ps(_mm256_loadu_ps(xb + 8 * k), vid);
      __m256i i = _mm256_cvttps_epi32(v);
      const __m256 frac = _mm256_sub_ps(v, _mm256_cvtepi32_ps(i));
      i = _mm256_sub_epi32(i, _mm256_castps_si256(_mm256_cmp_ps(frac, _mm256_set1_ps(0.5f), _CMP_GE_OQ)));
      i = _mm256_add_epi32(i, _mm256_castps_si256(_mm256_cmp_ps(frac, _mm256_set1_ps(-0.5f), _CMP_LE_OQ)));
      i = _mm256_max_epi32(_mm256_min_epi32(i, _mm256_set1_epi32(kWideMax)), _mm256_set1_epi32(-kWideMax));
      const __m256i h = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_cvtepi32_ps(i), inv255));
      h32[k] = h;
      l32[k] = _mm256_sub_epi32(i, _mm256_sub_epi32(_mm256_slli_epi32(h, 8), h));
      hs = _mm256_add_epi32(hs, h32[k]);
      ls = _mm256_add_epi32(ls, l32[k]);
    }
    const __m256i ph = _mm256_packs_epi16(_mm256_packs_epi32(h32[0], h32[1]), _mm256_packs_epi32(h32[2], h32[3]));
    const __m256i pl = _mm256_packs_epi16(_mm256_packs_epi32(l32[0], l32[1]), _mm256_packs_epi32(l32[2], l32[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(hi + 32 * b), _mm256_permutevar8x32_epi32(ph, order));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(lo + 32 * b), _mm256_permutevar8x32_epi32(pl, order));
    // Both sums at once: hs's lanes in the low half, ls's in the high.
    const __m256i hl = _mm256_hadd_epi32(hs, ls);  // h01 h23 l01 l23 | h45 h67 l45 l67
    const __m128i q = _mm_add_epi32(_mm256_castsi256_si128(hl), _mm256_extracti128_si256(hl, 1));
    const __m128i r = _mm_hadd_epi32(q, q);  // h, l, h, l
    hbsum[b] = static_cast<int16_t>(_mm_cvtsi128_si32(r));
    lbsum[b] = static_cast<int16_t>(_mm_extract_epi32(r, 1));
  }
}

inline float Reduce8(__m256 v) {
  const __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  const __m128 h = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(h, _mm_movehdup_ps(h)));
}

// Block b's products for NR rows x NT tokens into acc.
template <int kIndex, int NR, int NT>
inline void Q8Block(const Q8Args& a, int64_t r0, int64_t t0, int64_t nb, int64_t b,
                    __m256 (&acc)[NR][NT]) {
  __m256i xv[NT];
  float xs[NT];
#pragma GCC unroll 4
  for (int t = 0; t < NT; ++t) {
    xv[t] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.xq + (t0 + t) * a.cols + b * 32));
    xs[t] = a.xd[(t0 + t) * nb + b];
  }
#pragma GCC unroll 4
  for (int r = 0; r < NR; ++r) {
    float ws = 0.f;
    const __m256i wv = BlockCodes<kIndex>(a.w + (r0 + r) * a.row_bytes, b, &ws);
    const __m256i aw = _mm256_sign_epi8(wv, wv);
#pragma GCC unroll 4
    for (int t = 0; t < NT; ++t) {
      const __m256i is = Q8Ops::Dot(aw, _mm256_sign_epi8(xv[t], wv));
      acc[r][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is), _mm256_set1_ps(ws * xs[t]), acc[r][t]);
    }
  }
}

// Even blocks into one accumulator, odd ones into another (two FMA chains),
// added at the end: the same order in every tile shape.
template <int kIndex, int NR, int NT>
void Q8Tile(const Q8Args& a, int64_t r0, int64_t t0) {
  const int64_t nb = a.cols / 32;
  __m256 even[NR][NT], odd[NR][NT];
#pragma GCC unroll 4
  for (int r = 0; r < NR; ++r) {
#pragma GCC unroll 4
    for (int t = 0; t < NT; ++t) even[r][t] = odd[r][t] = _mm256_setzero_ps();
  }
  int64_t b = 0;
  for (; b + 2 <= nb; b += 2) {
    Q8Block<kIndex, NR, NT>(a, r0, t0, nb, b, even);
    Q8Block<kIndex, NR, NT>(a, r0, t0, nb, b + 1, odd);
  }
  if (b < nb) Q8Block<kIndex, NR, NT>(a, r0, t0, nb, b, even);
#pragma GCC unroll 4
  for (int r = 0; r < NR; ++r) {
#pragma GCC unroll 4
    for (int t = 0; t < NT; ++t) {
      a.y[(t0 + t) * a.y_stride + r0 + r] = Reduce8(_mm256_add_ps(even[r][t], odd[r][t]));
    }
  }
}

using Q8TileFn = void (*)(const Q8Args&, int64_t, int64_t);

// Tiles of nr x nt for nr, nt in 1..4 (limited to the Ops' maxima).
template <int kIndex, int NR>
Q8TileFn Q8TileForTokens(int nt) {
  if constexpr (Q8Ops::kMaxTokens >= 4) {
    if (nt >= 4) return &Q8Tile<kIndex, NR, 4>;
  }
  if constexpr (Q8Ops::kMaxTokens >= 3) {
    if (nt == 3) return &Q8Tile<kIndex, NR, 3>;
  }
  return nt == 2 ? &Q8Tile<kIndex, NR, 2> : &Q8Tile<kIndex, NR, 1>;
}

template <int kIndex>
Q8TileFn Q8TileFor(int nr, int nt) {
  if constexpr (Q8Ops::kMaxRows >= 4) {
    if (nr >= 4) return Q8TileForTokens<kIndex, 4>(nt);
    if (nr == 3) return Q8TileForTokens<kIndex, 3>(nt);
  }
  return nr == 2 ? Q8TileForTokens<kIndex, 2>(nt) : Q8TileForTokens<kIndex, 1>(nt);
}

template <int kIndex>
void Q8Rows(const Q8Args& a) {
  // One row at a time for a single token: several interleaved weight
  // streams ran 2.5x slower from DRAM (measured, Zen 4 VM); from two tokens
  // on, each weight block loaded serves a whole tile.
  const int64_t max_rows = a.n_tokens >= 2 ? Q8Ops::kMaxRows : 1;
  for (int64_t r = a.row_begin; r < a.row_end; r += max_rows) {
    const int nr = static_cast<int>(std::min<int64_t>(max_rows, a.row_end - r));
    for (int64_t t = 0; t < a.n_tokens; t += Q8Ops::kMaxTokens) {
      const int nt = static_cast<int>(std::min<int64_t>(Q8Ops::kMaxTokens, a.n_tokens - t));
      Q8TileFor<kIndex>(nr, nt)(a, r, t);
    }
  }
}

// ---- Q4_K / Q5_K with Q8_K-style activations (one scale per 256) --------
//
// Per (row, token) and super-block: the codes (u8, 0..15 or 0..31) times the
// token's codes by vpmaddubsw (pairs: at most 2 * 31 * 127, no saturation),
// times the sub-block's 6-bit scale and summed into 8 int32 lanes by DotW
// (exact: at most 256 * 31 * 127 * 63 < 2^31); converted and scaled by
// d_x * d into an f32 accumulator. The minimums: sum_j m_j * bsum_j in
// integers, scaled by d_x * dmin into a scalar subtracted at the end.

// The parts of super-block s of a Q4_K/Q5_K row the int8 kernels read.
struct KSuperBlock {
  const uint8_t* qs;
  uint64_t sc8, m8;  // UnpackAllScaleMinK4's
  float d, dmin;
  __m256i hbits;  // Q5_K's qh; zero for Q4_K
};

template <int kIndex>
inline KSuperBlock LoadKSuperBlock(const uint8_t* row, int64_t s) {
  using Block = std::conditional_t<kIndex == kIdxQ4_K, BlockQ4_K, BlockQ5_K>;
  const auto* blk = reinterpret_cast<const Block*>(row) + s;
  KSuperBlock b;
  b.qs = blk->qs;
  UnpackAllScaleMinK4(blk->scales, &b.sc8, &b.m8);
  b.d = _cvtsh_ss(blk->d);
  b.dmin = _cvtsh_ss(blk->dmin);
  if constexpr (kIndex == kIdxQ5_K) {
    b.hbits = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk->qh));
  } else {
    b.hbits = _mm256_setzero_si256();
  }
  return b;
}

// The codes of group g (elements 64g .. 64g + 63): sub-block 2g in *lo,
// 2g + 1 in *hi, one per byte.
template <int kIndex>
inline void KGroupCodes(const KSuperBlock& b, int g, __m256i* lo, __m256i* hi) {
  const __m256i low4 = _mm256_set1_epi8(15);
  const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs + 32 * g));
  *lo = _mm256_and_si256(raw, low4);
  *hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
  if constexpr (kIndex == kIdxQ5_K) {
    // Bit 2g of qh[l] is bit 4 of element 64g + l, bit 2g + 1 of 64g + 32 + l.
    const __m256i one = _mm256_set1_epi8(1);
    const __m256i b0 = _mm256_and_si256(_mm256_srl_epi16(b.hbits, _mm_cvtsi32_si128(2 * g)), one);
    const __m256i b1 = _mm256_and_si256(_mm256_srl_epi16(b.hbits, _mm_cvtsi32_si128(2 * g + 1)), one);
    *lo = _mm256_or_si256(*lo, _mm256_slli_epi16(b0, 4));
    *hi = _mm256_or_si256(*hi, _mm256_slli_epi16(b1, 4));
  }
}

template <int kIndex, int NT>
void Q8KTile(const Q8Args& a, int64_t r, int64_t t0) {
  const int64_t nsb = a.cols / 256;
  const int64_t nb32 = a.cols / 32;
  const uint8_t* row = a.w + r * a.row_bytes;
  __m256 acc[NT];
  float mins[NT];
#pragma GCC unroll 6
  for (int t = 0; t < NT; ++t) {
    acc[t] = _mm256_setzero_ps();
    mins[t] = 0.f;
  }
  for (int64_t s = 0; s < nsb; ++s) {
    const KSuperBlock sb = LoadKSuperBlock<kIndex>(row, s);
    const float d = sb.d, dmin = sb.dmin;
    // The 6-bit scales and mins as 8 int16 each; the scales in both 128-bit
    // halves, so one byte shuffle broadcasts sub-block j's.
    const __m256i sc16 =
        _mm256_broadcastsi128_si256(_mm_cvtepu8_epi16(_mm_cvtsi64_si128(static_cast<int64_t>(sb.sc8))));
    const __m128i m16 = _mm_cvtepu8_epi16(_mm_cvtsi64_si128(static_cast<int64_t>(sb.m8)));
    __m256i iacc[NT];
#pragma GCC unroll 6
    for (int t = 0; t < NT; ++t) iacc[t] = _mm256_setzero_si256();
#pragma GCC unroll 4
    for (int g = 0; g < 4; ++g) {
      __m256i lo, hi;
      KGroupCodes<kIndex>(sb, g, &lo, &hi);
      const __m256i s0 = _mm256_shuffle_epi8(sc16, _mm256_set1_epi16(static_cast<int16_t>(0x0100 + 0x0202 * 2 * g)));
      const __m256i s1 =
          _mm256_shuffle_epi8(sc16, _mm256_set1_epi16(static_cast<int16_t>(0x0100 + 0x0202 * (2 * g + 1))));
#pragma GCC unroll 6
      for (int t = 0; t < NT; ++t) {
        const int8_t* xq = a.xq + (t0 + t) * a.cols + 256 * s + 64 * g;
        const __m256i x0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq));
        const __m256i x1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq + 32));
        iacc[t] = Q8Ops::DotW(iacc[t], _mm256_maddubs_epi16(lo, x0), s0);
        iacc[t] = Q8Ops::DotW(iacc[t], _mm256_maddubs_epi16(hi, x1), s1);
      }
    }
#pragma GCC unroll 6
    for (int t = 0; t < NT; ++t) {
      const float dx = a.xd[(t0 + t) * nsb + s];
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc[t]), _mm256_set1_ps(dx * d), acc[t]);
      const __m128i bs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(a.xbsum + (t0 + t) * nb32 + 8 * s));
      __m128i p = _mm_madd_epi16(m16, bs);
      p = _mm_add_epi32(p, _mm_shuffle_epi32(p, 0x4e));
      p = _mm_add_epi32(p, _mm_shuffle_epi32(p, 0xb1));
      const float i2 = static_cast<float>(_mm_cvtsi128_si32(p));
      mins[t] = _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(dx * dmin), _mm_set_ss(i2), _mm_set_ss(mins[t])));
    }
  }
#pragma GCC unroll 6
  for (int t = 0; t < NT; ++t) a.y[(t0 + t) * a.y_stride + r] = Reduce8(acc[t]) - mins[t];
}

template <int kIndex>
Q8TileFn Q8KTileFor(int nt) {
  static_assert(Q8Ops::kMaxKTokens == 4);
  switch (nt) {
    case 1:
      return &Q8KTile<kIndex, 1>;
    case 2:
      return &Q8KTile<kIndex, 2>;
    case 3:
      return &Q8KTile<kIndex, 3>;
    default:
      return &Q8KTile<kIndex, 4>;
  }
}

template <int kIndex>
void Q8KRows(const Q8Args& a) {
  for (int64_t r = a.row_begin; r < a.row_end; ++r) {
    for (int64_t t = 0; t < a.n_tokens; t += Q8Ops::kMaxKTokens) {
      const int nt = static_cast<int>(std::min<int64_t>(Q8Ops::kMaxKTokens, a.n_tokens - t));
      Q8KTileFor<kIndex>(nt)(a, r, t);
    }
  }
}

// ---- Q6_K -------------------------------------------------------------------
//
// Per (row, token) and super-block: the codes (u8, 0..63) times the token's
// codes by vpmaddubsw (pairs: at most 2 * 63 * 127, no saturation), times the
// 16-element sub-blocks' int8 scales into 8 int32 lanes by DotW, less
// 32 * sum_j sc_j * bsum16_j (vpmaddwd; the offset of the codes), all exact
// (at most 2^26 in magnitude); converted and scaled by d_x * d.

template <int NT>
void Q6Tile(const Q8Args& a, int64_t r, int64_t t0) {
  const int64_t nsb = a.cols / 256;
  const int64_t nb16 = a.cols / 16;
  const uint8_t* row = a.w + r * a.row_bytes;
  __m256 acc[NT];
#pragma GCC unroll 4
  for (int t = 0; t < NT; ++t) acc[t] = _mm256_setzero_ps();
  const __m256i low4 = _mm256_set1_epi8(15), two = _mm256_set1_epi8(3);
  for (int64_t s = 0; s < nsb; ++s) {
    const auto* blk = reinterpret_cast<const BlockQ6_K*>(row) + s;
    const float d = _cvtsh_ss(blk->d);
    const __m128i sc8 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(blk->scales));
    const __m256i sc16 = _mm256_cvtepi8_epi16(sc8);  // scale j in int16 lane j
    // Each half's 8 scales in both 128-bit lanes, for the per-group shuffles.
    const __m256i half_sc[2] = {_mm256_broadcastsi128_si256(_mm256_castsi256_si128(sc16)),
                                _mm256_broadcastsi128_si256(_mm256_extracti128_si256(sc16, 1))};
    __m256i iacc[NT];
#pragma GCC unroll 4
    for (int t = 0; t < NT; ++t) {
      // -32 * sum_j sc_j * bsum16_j, as 8 int32 lanes.
      const __m256i bs = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a.xbsum16 + (t0 + t) * nb16 + 16 * s));
      iacc[t] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(_mm256_madd_epi16(sc16, bs), 5));
    }
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      const __m256i ql0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk->ql + 64 * h));
      const __m256i ql1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk->ql + 64 * h + 32));
      const __m256i qh = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(blk->qh + 32 * h));
      const __m256i q[4] = {
          _mm256_or_si256(_mm256_and_si256(ql0, low4), _mm256_slli_epi16(_mm256_and_si256(qh, two), 4)),
          _mm256_or_si256(_mm256_and_si256(ql1, low4),
                          _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2), two), 4)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql0, 4), low4),
                          _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 4), two), 4)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(ql1, 4), low4),
                          _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 6), two), 4))};
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) {
        // Group k of this half: elements 128h + 32k + [0, 32), scales
        // 8h + 2k (first 16, low lane) and 8h + 2k + 1 (high lane).
        const __m256i pick = _mm256_set_m128i(_mm_set1_epi16(static_cast<int16_t>(0x0100 + 0x0202 * (2 * k + 1))),
                                              _mm_set1_epi16(static_cast<int16_t>(0x0100 + 0x0202 * (2 * k))));
        const __m256i sv = _mm256_shuffle_epi8(half_sc[h], pick);
#pragma GCC unroll 4
        for (int t = 0; t < NT; ++t) {
          const __m256i x = _mm256_loadu_si256(
              reinterpret_cast<const __m256i*>(a.xq + (t0 + t) * a.cols + 256 * s + 128 * h + 32 * k));
          iacc[t] = Q8Ops::DotW(iacc[t], _mm256_maddubs_epi16(q[k], x), sv);
        }
      }
    }
#pragma GCC unroll 4
    for (int t = 0; t < NT; ++t) {
      acc[t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(iacc[t]), _mm256_set1_ps(a.xd[(t0 + t) * nsb + s] * d), acc[t]);
    }
  }
#pragma GCC unroll 4
  for (int t = 0; t < NT; ++t) a.y[(t0 + t) * a.y_stride + r] = Reduce8(acc[t]);
}

inline void Q6Rows(const Q8Args& a) {
  for (int64_t r = a.row_begin; r < a.row_end; ++r) {
    for (int64_t t = 0; t < a.n_tokens; t += 4) {
      switch (std::min<int64_t>(4, a.n_tokens - t)) {
        case 1:
          Q6Tile<1>(a, r, t);
          break;
        case 2:
          Q6Tile<2>(a, r, t);
          break;
        case 3:
          Q6Tile<3>(a, r, t);
          break;
        default:
          Q6Tile<4>(a, r, t);
      }
    }
  }
}

constexpr Q8KernelTable MakeQ8Table(const char* name) {
  return {name,
          {nullptr, nullptr, nullptr, &Q8Rows<kIdxQ4_0>, &Q8Rows<kIdxQ8_0>, &Q8KRows<kIdxQ4_K>, &Q8KRows<kIdxQ5_K>,
           &Q6Rows},
          &QuantizeRowSimd,
          kAutoInt8KQuants,
          /*reads_lanes=*/false,
          /*q8_0_wide=*/nullptr,
          &QuantizeRowWideSimd,
          /*auto_wide=*/false};
}

}  // namespace
}  // namespace strata::cpu::internal
