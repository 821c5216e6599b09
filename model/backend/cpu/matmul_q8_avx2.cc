// AVX2 int8-activation kernels (matmul_q8.h), for CPUs without AVX-512 VNNI.
// Compiled for AVX2 + FMA + F16C; only reached through Avx2Q8Kernels(), which
// checks the CPU. Block sums by vpmaddubsw (pairs of u8 x s8, never
// saturating: bounds below) and vpmaddwd (exact). Q8_0 / Q4_0 by the lane
// kernel below (PackLanes's groups); the K-quants by matmul_q8_simd.h.

#include <immintrin.h>

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "model/backend/cpu/cpu_features.h"
#include "model/backend/cpu/matmul_q8.h"

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

namespace strata::cpu::internal {
namespace {
struct Q8Ops {
  // 16 ymm registers: 2 x 2 accumulators, 2 tokens' codes, temporaries.
  static constexpr int kMaxRows = 2;
  static constexpr int kMaxTokens = 2;
  // 4 accumulators, 2 x 2 codes, 2 scales, a mask: 15 registers.
  static constexpr int kMaxKTokens = 4;
  static __m256i Dot(__m256i aw, __m256i sx) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(aw, sx), _mm256_set1_epi16(1));
  }
  static __m256i DotW(__m256i acc, __m256i p, __m256i s) { return _mm256_add_epi32(acc, _mm256_madd_epi16(p, s)); }
};
}  // namespace
}  // namespace strata::cpu::internal

#include "model/backend/cpu/matmul_q8_simd.h"

namespace strata::cpu::internal {
namespace {

// ---- Q8_0 / Q4_0: 8 weight rows in the 8 dword lanes of a 256-bit vector ----
//
// PackLanes's 16-row groups (matmul_q8.h), read as two halves of 8 rows: the
// low 32 bytes of each 64-byte vector hold rows 0-7, the high ones rows
// 8-15. Per 32-element block and half, code vector k (k = 0..7) holds in
// dword lane i the 4 codes of row i that multiply the token's codes
// 4k..4k+3. Q4_0: the nibbles (code + 8, unsigned); vpmaddubsw with the
// token's code quads broadcast, the 8 products summed in int16 (at most
// 8 * 2 * 15 * 127 = 30480, never saturating), then vpmaddwd by ones, less
// 8 * (the token's code sum). Q8_0: the signed codes; the magnitudes times
// the token's codes carrying the weights' signs (at most 2 * 128 * 127 =
// 32512 per pair), vpmaddwd per vector. Each row's int32 sum is converted
// and multiplied by d_w * d_x into its f32 lane, block after block, so a
// (row, token) output is one sequence of operations in one lane whatever the
// tile, the rows around it, the tail or where its codes came from (the
// packed copy or the file, transposed on the fly: the same vectors).
constexpr int kLaneTokens2 = 4;  // one half x 4 tokens: 4 accumulators, 4 sums

template <int kIndex>
constexpr int64_t BlockBytes() {
  return kIndex == kIdxQ4_0 ? static_cast<int64_t>(sizeof(BlockQ4_0)) : static_cast<int64_t>(sizeof(BlockQ8_0));
}

// out[k] lane i = dword k of rows[i]'s 16 bytes at `at`, for k = 0..3.
inline void Transpose8x4(const uint8_t* const* rows, int64_t at, __m256i* out) {
  __m256i z[4];
  for (int j = 0; j < 4; ++j) {
    z[j] = _mm256_set_m128i(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[4 + j] + at)),
                            _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[j] + at)));
  }
  const __m256i a0 = _mm256_unpacklo_epi32(z[0], z[1]), a1 = _mm256_unpackhi_epi32(z[0], z[1]);
  const __m256i a2 = _mm256_unpacklo_epi32(z[2], z[3]), a3 = _mm256_unpackhi_epi32(z[2], z[3]);
  out[0] = _mm256_unpacklo_epi64(a0, a2);
  out[1] = _mm256_unpackhi_epi64(a0, a2);
  out[2] = _mm256_unpacklo_epi64(a1, a3);
  out[3] = _mm256_unpackhi_epi64(a1, a3);
}

// Half h of block b: Q4_0's 4 vectors of nibble pairs, or Q8_0's 8 vectors
// of signed codes, into v; returns the 8 rows' scales.
template <int kIndex>
struct FileRows8 {
  const uint8_t* rows[2][8];
  FileRows8(const Q8Args& a, int64_t r0, int nr) {
    for (int i = 0; i < 16; ++i) rows[i / 8][i % 8] = a.w + (r0 + (i < nr ? i : 0)) * a.row_bytes;
  }
  __m256 Block(int h, int64_t b, __m256i* v) const {
    const int64_t start = b * BlockBytes<kIndex>();
    Transpose8x4(rows[h], start + 2, v);
    if constexpr (kIndex == kIdxQ8_0) Transpose8x4(rows[h], start + 18, v + 4);
    uint16_t d[8];
    for (int i = 0; i < 8; ++i) std::memcpy(&d[i], rows[h][i] + start, 2);
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(d)));
  }
};

template <int kIndex>
struct PackedRows8 {
  const uint8_t* scales;
  const uint8_t* codes;
  PackedRows8(const Q8Args& a, int64_t r0) {
    scales = a.lanes + r0 * a.row_bytes;
    codes = scales + a.cols;  // nb * 32 bytes of scales
  }
  __m256 Block(int h, int64_t b, __m256i* v) const {
    if constexpr (kIndex == kIdxQ4_0) {
      const uint8_t* c = codes + b * 256 + 32 * h;
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) v[k] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + 64 * k));
    } else {
      const uint8_t* c = codes + b * 512 + 32 * h;
      const __m256i flip = _mm256_set1_epi8(static_cast<char>(0x80));  // stored as code + 128
#pragma GCC unroll 8
      for (int k = 0; k < 8; ++k) {
        v[k] = _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + 64 * k)), flip);
      }
    }
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(scales + 32 * b + 16 * h)));
  }
};

inline __m256i Quad(const int8_t* xq, int k) {
  int32_t quad;
  std::memcpy(&quad, xq + 4 * k, 4);
  return _mm256_set1_epi32(quad);
}

// Halves h0..h0+NH-1 of rows r0..r0+nr-1 (nr <= 16) x tokens t0..t0+NT-1.
template <int kIndex, int NH, int NT, class Rows>
void LaneTile8(const Q8Args& a, const Rows& src, int64_t r0, int nr, int h0, int64_t t0,
               const uint8_t* prefetch = nullptr) {
  const int64_t nb = a.cols / 32;
  constexpr int kPrefetchLines = static_cast<int>((kLaneRows * BlockBytes<kIndex>() + 63) / 64);
  const __m256i ones = _mm256_set1_epi16(1);
  __m256 acc[NH][NT];
#pragma GCC unroll 2
  for (int h = 0; h < NH; ++h) {
#pragma GCC unroll 4
    for (int t = 0; t < NT; ++t) acc[h][t] = _mm256_setzero_ps();
  }
  for (int64_t b = 0; b < nb; ++b) {
    if (prefetch != nullptr) {
      // The next 16 rows, spread over this group's blocks.
      for (int l = 0; l < kPrefetchLines; ++l) {
        _mm_prefetch(reinterpret_cast<const char*>(prefetch + (b * kPrefetchLines + l) * 64), _MM_HINT_T0);
      }
    }
#pragma GCC unroll 2
    for (int h = 0; h < NH; ++h) {
      __m256i v[8];
      const __m256 dw = src.Block(h0 + h, b, v);
      __m256i s[NT];
      if constexpr (kIndex == kIdxQ4_0) {
        const __m256i m = _mm256_set1_epi8(15);
        __m256i p[NT];
#pragma GCC unroll 4
        for (int t = 0; t < NT; ++t) p[t] = _mm256_setzero_si256();
#pragma GCC unroll 4
        for (int k = 0; k < 4; ++k) {
          const __m256i lo = _mm256_and_si256(v[k], m), hi = _mm256_and_si256(_mm256_srli_epi16(v[k], 4), m);
#pragma GCC unroll 4
          for (int t = 0; t < NT; ++t) {
            const int8_t* xq = a.xq + (t0 + t) * a.cols + 32 * b;
            p[t] = _mm256_add_epi16(p[t], _mm256_maddubs_epi16(lo, Quad(xq, k)));
            p[t] = _mm256_add_epi16(p[t], _mm256_maddubs_epi16(hi, Quad(xq, 4 + k)));
          }
        }
#pragma GCC unroll 4
        for (int t = 0; t < NT; ++t) {
          const int32_t bsum = a.xbsum[(t0 + t) * nb + b];
          s[t] = _mm256_sub_epi32(_mm256_madd_epi16(p[t], ones), _mm256_set1_epi32(8 * bsum));
        }
      } else {
#pragma GCC unroll 4
        for (int t = 0; t < NT; ++t) s[t] = _mm256_setzero_si256();
#pragma GCC unroll 8
        for (int k = 0; k < 8; ++k) {
          const __m256i mag = _mm256_sign_epi8(v[k], v[k]);
#pragma GCC unroll 4
          for (int t = 0; t < NT; ++t) {
            const int8_t* xq = a.xq + (t0 + t) * a.cols + 32 * b;
            const __m256i p = _mm256_maddubs_epi16(mag, _mm256_sign_epi8(Quad(xq, k), v[k]));
            s[t] = _mm256_add_epi32(s[t], _mm256_madd_epi16(p, ones));
          }
        }
      }
#pragma GCC unroll 4
      for (int t = 0; t < NT; ++t) {
        const __m256 scale = _mm256_mul_ps(dw, _mm256_set1_ps(a.xd[(t0 + t) * nb + b]));
        acc[h][t] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s[t]), scale, acc[h][t]);
      }
    }
  }
#pragma GCC unroll 2
  for (int h = 0; h < NH; ++h) {
    const int valid = std::min(8, nr - 8 * (h0 + h));
    const __m256i mask =
        _mm256_cmpgt_epi32(_mm256_set1_epi32(valid), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
#pragma GCC unroll 4
    for (int t = 0; t < NT; ++t) {
      _mm256_maskstore_ps(a.y + (t0 + t) * a.y_stride + r0 + 8 * (h0 + h), mask, acc[h][t]);
    }
  }
}

// One token: both halves in one pass over the group's blocks. More: each
// half on its own, kLaneTokens2 tokens at a time, so each block's codes are
// decoded once for them.
template <int kIndex, class Rows>
void LaneGroup8(const Q8Args& a, const Rows& src, int64_t r, int nr, const uint8_t* next) {
  const int halves = nr > 8 ? 2 : 1;
  if (a.n_tokens == 1) {
    if (halves == 2) {
      LaneTile8<kIndex, 2, 1>(a, src, r, nr, 0, 0, next);
    } else {
      LaneTile8<kIndex, 1, 1>(a, src, r, nr, 0, 0);
    }
    return;
  }
  for (int h = 0; h < halves; ++h) {
    int64_t t = 0;
    for (; t + kLaneTokens2 <= a.n_tokens; t += kLaneTokens2) LaneTile8<kIndex, 1, kLaneTokens2>(a, src, r, nr, h, t);
    switch (a.n_tokens - t) {
      case 3:
        LaneTile8<kIndex, 1, 3>(a, src, r, nr, h, t);
        break;
      case 2:
        LaneTile8<kIndex, 1, 2>(a, src, r, nr, h, t);
        break;
      case 1:
        LaneTile8<kIndex, 1, 1>(a, src, r, nr, h, t);
        break;
      default:
        break;
    }
  }
}
static_assert(kLaneTokens2 == 4, "LaneGroup8 finishes with 1-3 tokens");

inline bool Packed(const Q8Args& a, int64_t r, int nr) {
  return a.lanes != nullptr && nr == kLaneRows && r % kLaneRows == 0;
}

template <int kIndex>
void LaneRows8(const Q8Args& a) {
  for (int64_t r = a.row_begin; r < a.row_end; r += kLaneRows) {
    const int nr = static_cast<int>(std::min<int64_t>(kLaneRows, a.row_end - r));
    const int64_t rn = r + kLaneRows;  // the group prefetched
    const uint8_t* next = nullptr;
    if (rn + kLaneRows <= a.row_end) next = (Packed(a, rn, kLaneRows) ? a.lanes : a.w) + rn * a.row_bytes;
    if (Packed(a, r, nr)) {
      LaneGroup8<kIndex>(a, PackedRows8<kIndex>(a, r), r, nr, next);
    } else {
      LaneGroup8<kIndex>(a, FileRows8<kIndex>(a, r, nr), r, nr, next);
    }
  }
}

constexpr Q8KernelTable MakeAvx2Table() {
  Q8KernelTable t = MakeQ8Table("avx2");
  t.rows[kIdxQ4_0] = &LaneRows8<kIdxQ4_0>;
  t.rows[kIdxQ8_0] = &LaneRows8<kIdxQ8_0>;
  t.reads_lanes = true;
  // Q4_0 too: from packed weights this kernel beats f32 activations at every
  // batch size (bench-1b on an AVX2 EPYC: 1.9x at batch 1, 2.2-2.8x at 8;
  // docs/PERFORMANCE.md). Q8_0 not, for the reason the AVX-512 table gives;
  // nor wide activations (two int8 planes through vpmaddubsw measured
  // slower than f32 here), so Q8_0 keeps f32 at this level.
  t.auto_int8[kIdxQ4_0] = true;
  return t;
}
constexpr Q8KernelTable kTable = MakeAvx2Table();

}  // namespace
}  // namespace strata::cpu::internal

#pragma GCC pop_options

namespace strata::cpu::internal {
const Q8KernelTable* Avx2Q8Kernels() {
  const CpuFeatures& f = GetCpuFeatures();
  return f.avx2 && f.fma && f.f16c ? &kTable : nullptr;
}
}  // namespace strata::cpu::internal
