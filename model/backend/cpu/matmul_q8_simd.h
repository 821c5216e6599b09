// Internal to the CPU backend: the int8-activation tile kernels, written once
// for 256-bit vectors and instantiated per ISA (matmul_q8_avx2.cc,
// matmul_q8_avx512.cc). Include only from a translation unit whose target
// pragma enables AVX2 + FMA + F16C, after defining struct Q8Ops with
//   static constexpr int kMaxRows, kMaxTokens;  // tile shape
//   static __m256i Dot(__m256i aw, __m256i sx);  // 8 int32 sums of 4 products
// (aw unsigned, sx signed bytes; exact), inside strata::cpu::internal's
// anonymous namespace.
//
// Per (weight row, token) and 32-element block: the weight codes' magnitudes
// (u8) times the token's codes carrying the weights' signs (s8), summed by
// Dot into 8 int32 lanes, converted and multiplied by d_w * d_x into an f32
// accumulator of 8 lanes, reduced at the end. The tiles run that sequence for
// up to kMaxRows x kMaxTokens outputs at once, each with its own accumulator,
// so a token's result does not depend on the tile it was in.

#include <immintrin.h>

#include <algorithm>
#include <cstdint>

#include "model/backend/cpu/matmul_q8.h"
#include "model/backend/cpu/quant.h"

namespace strata::cpu::internal {
namespace {

constexpr int kIdxQ4_0 = 3;
constexpr int kIdxQ8_0 = 4;

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

constexpr Q8KernelTable MakeQ8Table(const char* name) {
  return {name, {nullptr, nullptr, nullptr, &Q8Rows<kIdxQ4_0>, &Q8Rows<kIdxQ8_0>, nullptr, nullptr, nullptr}};
}

}  // namespace
}  // namespace strata::cpu::internal
