// AVX-512 VNNI int8-activation kernels (matmul_q8.h). Q8_0/Q4_0: 16 weight
// rows in the lanes of a 512-bit vector (LaneRows below), block sums by
// vpdpbusd (u8 x s8, 4 products into each int32 lane, exact), from the
// weights packed at load (Q8Args::lanes) or, without them, transposed from
// the file's rows on each call. Q4_K/Q5_K/Q6_K: 16 rows in the lanes too
// (KLaneRows below), from their own packed layouts.
// Only reached through Avx512VnniQ8Kernels(), which checks the CPU.

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstring>
#include <vector>

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

// Q8_0 / Q4_0, 16 weight rows in the 16 lanes of a 512-bit vector. Per
// 32-element block, vector k (k = 0..7) holds in lane i the 4 codes of row i
// that multiply the token's codes 4k..4k+3, as unsigned bytes (Q4_0: the
// nibble, its code + 8; Q8_0: the code + 128), so 8 vpdpbusd with the
// token's code quads broadcast give the 16 rows' block sums, started from
// -offset * (the token's code sum) so the sums are the exact signed ones.
// Each is converted and multiplied by d_w * d_x into that row's f32 lane,
// block after block: a (row, token) output is one sequence of operations
// in one lane whatever the tile, the rows around it or the tail.
constexpr int kLaneTokens = 8;
constexpr int kPrefetchGroups = 1;  // how many 16-row groups ahead the weights are prefetched

// Four rows' 16 bytes at byte offset `at` into the 128-bit lanes of one vector.
inline __m512i Load4x16(const uint8_t* const* rows, int j, int64_t at) {
  __m512i z = _mm512_castsi128_si512(_mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[j] + at)));
  z = _mm512_inserti32x4(z, _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[4 + j] + at)), 1);
  z = _mm512_inserti32x4(z, _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[8 + j] + at)), 2);
  return _mm512_inserti32x4(z, _mm_loadu_si128(reinterpret_cast<const __m128i*>(rows[12 + j] + at)), 3);
}

// out[k] lane i = dword k of rows[i]'s 16 bytes at `at`, for k = 0..3.
inline void Transpose16x4(const uint8_t* const* rows, int64_t at, __m512i* out) {
  // z_j's 128-bit lane q holds row 4q + j, so the 4 x 4 transposes within
  // the 128-bit lanes leave row i in lane i.
  const __m512i z0 = Load4x16(rows, 0, at), z1 = Load4x16(rows, 1, at);
  const __m512i z2 = Load4x16(rows, 2, at), z3 = Load4x16(rows, 3, at);
  const __m512i a0 = _mm512_unpacklo_epi32(z0, z1), a1 = _mm512_unpackhi_epi32(z0, z1);
  const __m512i a2 = _mm512_unpacklo_epi32(z2, z3), a3 = _mm512_unpackhi_epi32(z2, z3);
  out[0] = _mm512_unpacklo_epi64(a0, a2);
  out[1] = _mm512_unpackhi_epi64(a0, a2);
  out[2] = _mm512_unpacklo_epi64(a1, a3);
  out[3] = _mm512_unpackhi_epi64(a1, a3);
}

template <int kIndex>
constexpr int64_t LaneBlockBytes() {
  return kIndex == kIdxQ4_0 ? static_cast<int64_t>(sizeof(BlockQ4_0)) : static_cast<int64_t>(sizeof(BlockQ8_0));
}

// Block b of the 16 rows: the 8 code vectors and the 16 scales.
template <int kIndex>
inline __m512 LaneBlock(const uint8_t* const* rows, int64_t b, __m512i* v) {
  const int64_t at = b * LaneBlockBytes<kIndex>() + 2;  // the codes follow the f16 scale
  if constexpr (kIndex == kIdxQ4_0) {
    // Byte j holds element j (low nibble) and element j + 16 (high nibble).
    __m512i q[4];
    Transpose16x4(rows, at, q);
    const __m512i m = _mm512_set1_epi8(15);
    for (int k = 0; k < 4; ++k) {
      v[k] = _mm512_and_si512(q[k], m);
      v[4 + k] = _mm512_and_si512(_mm512_srli_epi16(q[k], 4), m);
    }
  } else {
    const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
    Transpose16x4(rows, at, v);
    Transpose16x4(rows, at + 16, v + 4);
    for (int k = 0; k < 8; ++k) v[k] = _mm512_xor_si512(v[k], flip);
  }
  // The f16 scales: dword 0 of each row's block (the scale, then two codes),
  // transposed as the codes are (cheaper than a gather on Zen 4, measured).
  const int64_t start = at - 2;
  const __m512i z0 = Load4x16(rows, 0, start), z1 = Load4x16(rows, 1, start);
  const __m512i z2 = Load4x16(rows, 2, start), z3 = Load4x16(rows, 3, start);
  const __m512i d32 = _mm512_unpacklo_epi64(_mm512_unpacklo_epi32(z0, z1), _mm512_unpacklo_epi32(z2, z3));
  return _mm512_cvtph_ps(_mm512_cvtepi32_epi16(d32));
}

// Where a 16-row group's blocks come from: the file's rows, transposed on
// each call (a tail group repeats its first row in the unused lanes), or
// PackLanes's copy, which already has them in the lanes. Both give the same
// vectors, so the same bits.
template <int kIndex>
struct FileRows {
  const uint8_t* rows[kLaneRows];
  FileRows(const Q8Args& a, int64_t r0, int nr) {
    for (int i = 0; i < kLaneRows; ++i) rows[i] = a.w + (r0 + (i < nr ? i : 0)) * a.row_bytes;
  }
  __m512 Block(int64_t b, __m512i* v) const { return LaneBlock<kIndex>(rows, b, v); }
};

template <int kIndex>
struct PackedRows {
  const uint8_t* scales;
  const uint8_t* codes;
  PackedRows(const Q8Args& a, int64_t r0) {
    scales = a.lanes + r0 * a.row_bytes;
    codes = scales + a.cols;  // nb * 32 bytes of scales
  }
  __m512 Block(int64_t b, __m512i* v) const {
    if constexpr (kIndex == kIdxQ4_0) {
      const uint8_t* c = codes + b * 256;
      const __m512i m = _mm512_set1_epi8(15);
      // Unrolled, so that v stays in registers (rolled, GCC stored the 8
      // vectors to the stack and read them back for every block: Q4_0 read
      // 24 GB/s from L2 on one thread).
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) {
        const __m512i q = _mm512_loadu_si512(c + 64 * k);
        v[k] = _mm512_and_si512(q, m);
        v[4 + k] = _mm512_and_si512(_mm512_srli_epi16(q, 4), m);
      }
    } else {
      const uint8_t* c = codes + b * 512;
      for (int k = 0; k < 8; ++k) v[k] = _mm512_loadu_si512(c + 64 * k);
    }
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(scales + 32 * b)));
  }
};

// kWide (Q8_0 only): the token's two planes' sums side by side, each
// started from -128 * its code sum, then 255 * (the high one) + the low one:
// the exact signed block sum.
template <int kIndex, int NT, bool kWide, class Rows>
void LaneTile(const Q8Args& a, const Rows& src, int64_t r0, int nr, int64_t t0, const uint8_t* prefetch) {
  static_assert(!kWide || kIndex == kIdxQ8_0, "wide activations are for Q8_0");
  const int64_t nb = a.cols / 32;
  constexpr int32_t kOffset = kIndex == kIdxQ4_0 ? 8 : 128;
  constexpr int kPrefetchLines = static_cast<int>((kLaneRows * LaneBlockBytes<kIndex>() + 63) / 64);
  __m512 acc[NT];
#pragma GCC unroll 8
  for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    if (prefetch != nullptr) {
      // The next 16 rows, spread over this group's blocks, into L2: a group
      // (34 KiB of Q8_0 at 2,048 columns) outgrows L1, so into L1 they evicted
      // each other before use (T1 measured 1.1-1.2x faster at batch 1 from
      // DRAM, 5,632 x 2,048 Q8_0, 4 alternating pairs).
      for (int l = 0; l < kPrefetchLines; ++l) {
        _mm_prefetch(reinterpret_cast<const char*>(prefetch + (b * kPrefetchLines + l) * 64), _MM_HINT_T1);
      }
    }
    __m512i v[8];
    const __m512 dw = src.Block(b, v);
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) {
      const int64_t tb = (t0 + t) * nb + b;
      const int8_t* xq = a.xq + (t0 + t) * a.cols + 32 * b;
      __m512i s = _mm512_set1_epi32(-kOffset * int32_t{a.xbsum[tb]});
      if constexpr (kWide) {
        // Two independent chains (one token alone has no other to overlap).
        const int8_t* xl = a.xql + (t0 + t) * a.cols + 32 * b;
        __m512i sl = _mm512_set1_epi32(-kOffset * int32_t{a.xlbsum[tb]});
#pragma GCC unroll 8
        for (int k = 0; k < 8; ++k) {
          int32_t qh, ql;
          std::memcpy(&qh, xq + 4 * k, 4);
          std::memcpy(&ql, xl + 4 * k, 4);
          s = _mm512_dpbusd_epi32(s, v[k], _mm512_set1_epi32(qh));
          sl = _mm512_dpbusd_epi32(sl, v[k], _mm512_set1_epi32(ql));
        }
        s = _mm512_add_epi32(_mm512_sub_epi32(_mm512_slli_epi32(s, 8), s), sl);
      } else {
#pragma GCC unroll 8
        for (int k = 0; k < 8; ++k) {
          int32_t quad;
          std::memcpy(&quad, xq + 4 * k, 4);
          s = _mm512_dpbusd_epi32(s, v[k], _mm512_set1_epi32(quad));
        }
      }
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(dw, _mm512_set1_ps(a.xd[tb])), acc[t]);
    }
  }
  const __mmask16 store = static_cast<__mmask16>((1u << nr) - 1);
#pragma GCC unroll 8
  for (int t = 0; t < NT; ++t) _mm512_mask_storeu_ps(a.y + (t0 + t) * a.y_stride + r0, store, acc[t]);
}

template <int kIndex, int NT, bool kWide, class Rows>
void LaneTileUpto(const Q8Args& a, const Rows& src, int64_t r0, int nr, int64_t t0, int nt,
                  const uint8_t* prefetch) {
  if constexpr (NT > 1) {
    if (nt < NT) return LaneTileUpto<kIndex, NT - 1, kWide>(a, src, r0, nr, t0, nt, prefetch);
  }
  LaneTile<kIndex, NT, kWide>(a, src, r0, nr, t0, prefetch);
}

// A group of 16 rows starting at a multiple of 16 has a packed copy when
// the tensor has one.
inline bool GroupPacked(const Q8Args& a, int64_t r, int nr) {
  return a.lanes != nullptr && nr == kLaneRows && r % kLaneRows == 0;
}

template <int kIndex, bool kWide, class Rows>
void LaneGroup(const Q8Args& a, const Rows& src, int64_t r, int nr, const uint8_t* next) {
  for (int64_t t = 0; t < a.n_tokens; t += kLaneTokens) {
    const int nt = static_cast<int>(std::min<int64_t>(kLaneTokens, a.n_tokens - t));
    LaneTileUpto<kIndex, kLaneTokens, kWide>(a, src, r, nr, t, nt, t == 0 ? next : nullptr);
  }
}

template <int kIndex, bool kWide = false>
void LaneRows(const Q8Args& a) {
  for (int64_t r = a.row_begin; r < a.row_end; r += kLaneRows) {
    const int nr = static_cast<int>(std::min<int64_t>(kLaneRows, a.row_end - r));
    const int64_t rn = r + kPrefetchGroups * kLaneRows;  // the group prefetched
    const uint8_t* next = nullptr;
    if (rn + kLaneRows <= a.row_end) next = (GroupPacked(a, rn, kLaneRows) ? a.lanes : a.w) + rn * a.row_bytes;
    if (GroupPacked(a, r, nr)) {
      LaneGroup<kIndex, kWide>(a, PackedRows<kIndex>(a, r), r, nr, next);
    } else {
      LaneGroup<kIndex, kWide>(a, FileRows<kIndex>(a, r, nr), r, nr, next);
    }
  }
}

// Q4_K, Q5_K and Q6_K, 16 rows in the lanes of a 512-bit vector, from
// PackLanes's layouts (matmul_q8.h). Per super-block and token, one exact
// int32 sum per lane (row), then in f32 acc += sum * (d * d_x) (Q4_K/Q5_K:
// acc -= mins * (dmin * d_x) too). A (row, token) output is one sequence of operations in
// one lane whatever the tile, the rows around it or the tail, packed or not.
constexpr int kKLaneTokens = 8;

// The 8 sub-blocks' sums of code x token code by 8 vpdpbusd each (codes
// 0..15, Q5_K 0..31, as unsigned bytes: exact), times each row's 6-bit scale
// (vpmulld): at most 256 * 31 * 127 * 63 < 2^31. Q5_K's bit 4 of sub-block
// j's codes is bit j of the qh bytes, moved to bit 4 by a 16-bit shift
// (left by 4 - j, or right by j - 4: within each byte either way).
//
// Q5_K, one token: each 64-byte vector of codes and of qh is loaded once
// for all the sub-blocks it holds (the loop below loads each code vector
// twice and the qh eight times); from L2 1.3 x the loop's speed, from DRAM
// level with it. The int32 sums are exact: the same bits. Q4_K keeps the
// loop at batch 1 too (it reads strictly forward; this order, with four
// streams 512 bytes apart, read DRAM 5-10% slower in a microbenchmark).
inline void Q5KSuperSumsOne(const Q8Args& a, const uint8_t* p, int64_t s, int64_t t, __m512i* isum) {
  const __m512i m15 = _mm512_set1_epi8(15), m16 = _mm512_set1_epi8(16);
  const int8_t* x = a.xq + t * a.cols + 256 * s;
  __m512i sums[8];  // sub-block j
#pragma GCC unroll 8
  for (int j = 0; j < 8; ++j) sums[j] = _mm512_setzero_si512();
#pragma GCC unroll 8
  for (int k = 0; k < 8; ++k) {
    const __m512i qh = _mm512_loadu_si512(p + 320 + 4 * 512 + 64 * k);
#pragma GCC unroll 4
    for (int g = 0; g < 4; ++g) {
      const __m512i raw = _mm512_loadu_si512(p + 320 + 512 * g + 64 * k);
#pragma GCC unroll 2
      for (int n = 0; n < 2; ++n) {
        const int j = 2 * g + n;
        const __m512i lo = _mm512_and_si512(n == 0 ? raw : _mm512_srli_epi16(raw, 4), m15);
        const __m512i bit = j <= 4 ? _mm512_sll_epi16(qh, _mm_cvtsi32_si128(4 - j))
                                   : _mm512_srl_epi16(qh, _mm_cvtsi32_si128(j - 4));
        const __m512i v = _mm512_ternarylogic_epi32(lo, bit, m16, 0xF8);  // lo | (bit & 16)
        int32_t quad;
        std::memcpy(&quad, x + 32 * j + 4 * k, 4);
        sums[j] = _mm512_dpbusd_epi32(sums[j], v, _mm512_set1_epi32(quad));
      }
    }
  }
#pragma GCC unroll 8
  for (int j = 0; j < 8; ++j) {
    const __m512i sc = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 64 + 16 * j)));
    isum[0] = _mm512_add_epi32(isum[0], _mm512_mullo_epi32(sums[j], sc));
  }
}

template <int kIndex, int NT>
inline void Q45KSuperSums(const Q8Args& a, const uint8_t* p, int64_t s, int64_t t0, __m512i* isum) {
  const __m512i m15 = _mm512_set1_epi8(15);
#pragma GCC unroll 1
  for (int j = 0; j < 8; ++j) {
    // Sub-block j: group j / 2's low (j even) or high nibbles.
    const uint8_t* c = p + 320 + 512 * (j / 2);
    __m512i v[8];
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k) {
      const __m512i raw = _mm512_loadu_si512(c + 64 * k);
      v[k] = _mm512_and_si512(j % 2 == 0 ? raw : _mm512_srli_epi16(raw, 4), m15);
      if constexpr (kIndex == kIdxQ5_K) {
        const __m512i qh = _mm512_loadu_si512(p + 320 + 4 * 512 + 64 * k);
        const __m512i bit = j <= 4 ? _mm512_sll_epi16(qh, _mm_cvtsi32_si128(4 - j))
                                   : _mm512_srl_epi16(qh, _mm_cvtsi32_si128(j - 4));
        v[k] = _mm512_ternarylogic_epi32(v[k], bit, _mm512_set1_epi8(16), 0xF8);  // v | (bit & 16)
      }
    }
    const __m512i sc = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 64 + 16 * j)));
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) {
      const int8_t* x = a.xq + (t0 + t) * a.cols + 256 * s + 32 * j;
      __m512i sum = _mm512_setzero_si512();
#pragma GCC unroll 8
      for (int k = 0; k < 8; ++k) {
        int32_t quad;
        std::memcpy(&quad, x + 4 * k, 4);
        sum = _mm512_dpbusd_epi32(sum, v[k], _mm512_set1_epi32(quad));
      }
      isum[t] = _mm512_add_epi32(isum[t], _mm512_mullo_epi32(sum, sc));
    }
  }
}

// The minimums' term of token t, sum_j m_j * bsum_j, by 4 vpdpwssd on
// (m_2p, m_2p+1) int16 pairs.
inline __m512i Q45KMins(const Q8Args& a, const uint8_t* p, int64_t s, int64_t t) {
  const int16_t* bs = a.xbsum + t * (a.cols / 32) + 8 * s;
  __m512i mins = _mm512_setzero_si512();
#pragma GCC unroll 4
  for (int q = 0; q < 4; ++q) {
    const __m512i m = _mm512_cvtepu8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 192 + 32 * q)));
    int32_t pair;
    std::memcpy(&pair, bs + 2 * q, 4);
    mins = _mm512_dpwssd_epi32(mins, m, _mm512_set1_epi32(pair));
  }
  return mins;
}

// Q6_K: per sub-block j of 16, sc_j * (dot_j - 32 bsum16_j), the sum started
// from -32 bsum16_j and run by 4 vpdpbusd (codes 0..63 unsigned), times the
// row's int8 scale: at most 16 * (16 * 63 * 127 + 32 * 16 * 127) * 128 < 2^31.
// Quarter u of half h (elements 128h + 32u..): vector k holds elements
// 4k..4k+3 of it, low 4 bits from ql (A: u = 0, 2; B: u = 1, 3; the high
// nibble for u >= 2), bits 4-5 from qh bits 2u, 2u + 1.
//
// Q6_K, one token: each 64-byte vector of a half (ql A, ql B, qh) is loaded
// once and gives element quad k of all four quarters (the loop below loads
// qh four times and each ql twice, jumping back within the half); it reads
// DRAM at 0.8-0.9 of two threads' plain sum where the loop read 0.65-0.75.
// The int32 sums are exact: the order differs from the loop's, the bits
// do not.
inline void Q6KSuperSumsOne(const Q8Args& a, const uint8_t* p, int64_t s, int64_t t, __m512i* isum) {
  const __m512i m15 = _mm512_set1_epi8(15), m48 = _mm512_set1_epi8(48);
  const int16_t* bs = a.xbsum16 + t * (a.cols / 16) + 16 * s;
#pragma GCC unroll 2
  for (int h = 0; h < 2; ++h) {
    const uint8_t* half = p + 288 + 1536 * h;
    const int8_t* x = a.xq + t * a.cols + 256 * s + 128 * h;
    __m512i sums[8];  // sub-block 8h + i
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) sums[i] = _mm512_set1_epi32(-32 * int32_t{bs[8 * h + i]});
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k) {
      const __m512i la = _mm512_loadu_si512(half + 64 * k);
      const __m512i lb = _mm512_loadu_si512(half + 512 + 64 * k);
      const __m512i hb = _mm512_loadu_si512(half + 1024 + 64 * k);
      const __m512i v[4] = {
          _mm512_ternarylogic_epi32(_mm512_and_si512(la, m15), _mm512_slli_epi16(hb, 4), m48, 0xF8),
          _mm512_ternarylogic_epi32(_mm512_and_si512(lb, m15), _mm512_slli_epi16(hb, 2), m48, 0xF8),
          _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(la, 4), m15), hb, m48, 0xF8),
          _mm512_ternarylogic_epi32(_mm512_and_si512(_mm512_srli_epi16(lb, 4), m15), _mm512_srli_epi16(hb, 2),
                                    m48, 0xF8)};
      // Quarter u's quad k: elements 32u + 4k.., of sub-block 2u + k / 4.
#pragma GCC unroll 4
      for (int u = 0; u < 4; ++u) {
        int32_t q;
        std::memcpy(&q, x + 32 * u + 4 * k, 4);
        sums[2 * u + k / 4] = _mm512_dpbusd_epi32(sums[2 * u + k / 4], v[u], _mm512_set1_epi32(q));
      }
    }
#pragma GCC unroll 8
    for (int i = 0; i < 8; ++i) {
      const __m512i sc =
          _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 32 + 16 * (8 * h + i))));
      isum[0] = _mm512_add_epi32(isum[0], _mm512_mullo_epi32(sums[i], sc));
    }
  }
}

template <int NT>
inline void Q6KSuperSums(const Q8Args& a, const uint8_t* p, int64_t s, int64_t t0, __m512i* isum) {
  const __m512i m15 = _mm512_set1_epi8(15), m48 = _mm512_set1_epi8(48);
  const int16_t* bsum16 = a.xbsum16 + 16 * s;
#pragma GCC unroll 8
  for (int hu = 0; hu < 8; ++hu) {
    const int h = hu / 4, u = hu % 4;
    const uint8_t* half = p + 288 + 1536 * h;
    const uint8_t* ql = half + (u % 2 == 0 ? 0 : 512);
    __m512i v[8];
#pragma GCC unroll 8
    for (int k = 0; k < 8; ++k) {
      const __m512i l = _mm512_loadu_si512(ql + 64 * k);
      const __m512i hb = _mm512_loadu_si512(half + 1024 + 64 * k);
      const __m512i lo = _mm512_and_si512(u < 2 ? l : _mm512_srli_epi16(l, 4), m15);
      __m512i hi;
      if (u == 0) {
        hi = _mm512_slli_epi16(hb, 4);
      } else if (u == 1) {
        hi = _mm512_slli_epi16(hb, 2);
      } else if (u == 2) {
        hi = hb;
      } else {
        hi = _mm512_srli_epi16(hb, 2);
      }
      v[k] = _mm512_ternarylogic_epi32(lo, hi, m48, 0xF8);  // lo | (hi & 48)
    }
    const int j0 = 8 * h + 2 * u;  // sub-blocks j0 (k = 0..3) and j0 + 1 (k = 4..7)
    const __m512i sc0 = _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 32 + 16 * j0)));
    const __m512i sc1 =
        _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 32 + 16 * (j0 + 1))));
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) {
      const int8_t* x = a.xq + (t0 + t) * a.cols + 256 * s + 128 * h + 32 * u;
      const int16_t* bs = bsum16 + (t0 + t) * (a.cols / 16);
      __m512i s0 = _mm512_set1_epi32(-32 * int32_t{bs[j0]});
      __m512i s1 = _mm512_set1_epi32(-32 * int32_t{bs[j0 + 1]});
#pragma GCC unroll 4
      for (int k = 0; k < 4; ++k) {
        int32_t q0, q1;
        std::memcpy(&q0, x + 4 * k, 4);
        std::memcpy(&q1, x + 16 + 4 * k, 4);
        s0 = _mm512_dpbusd_epi32(s0, v[k], _mm512_set1_epi32(q0));
        s1 = _mm512_dpbusd_epi32(s1, v[4 + k], _mm512_set1_epi32(q1));
      }
      isum[t] = _mm512_add_epi32(isum[t], _mm512_add_epi32(_mm512_mullo_epi32(s0, sc0), _mm512_mullo_epi32(s1, sc1)));
    }
  }
}

template <int kIndex>
constexpr DType KLaneType() {
  return kIndex == kIdxQ4_K ? DType::kQ4_K : kIndex == kIdxQ5_K ? DType::kQ5_K : DType::kQ6_K;
}

template <int kIndex, int NT>
void KLaneTile(const Q8Args& a, const uint8_t* group, int nr, int64_t t0, const uint8_t* prefetch) {
  constexpr int64_t kSuper = LaneSuperBytes(KLaneType<kIndex>());
  constexpr int kPrefetchLines = static_cast<int>(kSuper / 64);
  const int64_t nsb = a.cols / 256;
  __m512 acc[NT];
#pragma GCC unroll 8
  for (int t = 0; t < NT; ++t) acc[t] = _mm512_setzero_ps();
  for (int64_t s = 0; s < nsb; ++s) {
    const uint8_t* p = group + s * kSuper;
    if (prefetch != nullptr) {
      // The next group's super-block s, into L2 (as LaneTile's).
      const uint8_t* np = prefetch + s * kSuper;
      for (int l = 0; l < kPrefetchLines; ++l) _mm_prefetch(reinterpret_cast<const char*>(np + 64 * l), _MM_HINT_T1);
    }
    __m512i isum[NT];
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) isum[t] = _mm512_setzero_si512();
    if constexpr (kIndex == kIdxQ6_K && NT == 1) {
      Q6KSuperSumsOne(a, p, s, t0, isum);
    } else if constexpr (kIndex == kIdxQ6_K) {
      Q6KSuperSums<NT>(a, p, s, t0, isum);
    } else if constexpr (kIndex == kIdxQ5_K && NT == 1) {
      Q5KSuperSumsOne(a, p, s, t0, isum);
    } else {
      Q45KSuperSums<kIndex, NT>(a, p, s, t0, isum);
    }
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) {
      const __m512 dx = _mm512_set1_ps(a.xd[(t0 + t) * nsb + s]);
      acc[t] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[t]), _mm512_mul_ps(dw, dx), acc[t]);
      if constexpr (kIndex != kIdxQ6_K) {
        const __m512 dm = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32)));
        acc[t] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(Q45KMins(a, p, s, t0 + t)), _mm512_mul_ps(dm, dx), acc[t]);
      }
    }
  }
  const __mmask16 store = static_cast<__mmask16>((1u << nr) - 1);
#pragma GCC unroll 8
  for (int t = 0; t < NT; ++t) _mm512_mask_storeu_ps(a.y + (t0 + t) * a.y_stride, store, acc[t]);
}

template <int kIndex, int NT>
void KLaneTileUpto(const Q8Args& a, const uint8_t* group, int nr, int64_t t0, int nt, const uint8_t* prefetch) {
  if constexpr (NT > 1) {
    if (nt < NT) return KLaneTileUpto<kIndex, NT - 1>(a, group, nr, t0, nt, prefetch);
  }
  KLaneTile<kIndex, NT>(a, group, nr, t0, prefetch);
}

// Rows [row_begin, row_end): whole groups at multiples of 16 from the packed
// copy, every other group packed here from the file's rows first (a tail
// group's unused lanes repeat its first row).
template <int kIndex>
void KLaneRows(const Q8Args& a) {
  constexpr DType kType = KLaneType<kIndex>();
  const int64_t group_bytes = LaneGroupBytes(kType, a.cols);
  thread_local std::vector<uint8_t> scratch;
  for (int64_t r = a.row_begin; r < a.row_end; r += kLaneRows) {
    const int nr = static_cast<int>(std::min<int64_t>(kLaneRows, a.row_end - r));
    const int64_t rn = r + kLaneRows;  // the group prefetched
    const uint8_t* next = nullptr;
    if (rn + kLaneRows <= a.row_end && GroupPacked(a, rn, kLaneRows)) next = a.lanes + rn / kLaneRows * group_bytes;
    const uint8_t* group;
    if (GroupPacked(a, r, nr)) {
      group = a.lanes + r / kLaneRows * group_bytes;
    } else {
      const uint8_t* rows[kLaneRows];
      for (int i = 0; i < kLaneRows; ++i) rows[i] = a.w + (r + (i < nr ? i : 0)) * a.row_bytes;
      scratch.resize(static_cast<size_t>(group_bytes));
      PackKLaneGroup(kType, rows, a.cols, scratch.data());
      group = scratch.data();
    }
    Q8Args at = a;
    at.y = a.y + r;
    for (int64_t t = 0; t < a.n_tokens; t += kKLaneTokens) {
      const int nt = static_cast<int>(std::min<int64_t>(kKLaneTokens, a.n_tokens - t));
      KLaneTileUpto<kIndex, kKLaneTokens>(at, group, nr, t, nt, t == 0 ? next : nullptr);
    }
  }
}

constexpr Q8KernelTable kTable = {
    "avx512-vnni",
    {nullptr, nullptr, nullptr, &LaneRows<kIdxQ4_0>, &LaneRows<kIdxQ8_0>, &KLaneRows<kIdxQ4_K>,
     &KLaneRows<kIdxQ5_K>, &KLaneRows<kIdxQ6_K>},
    &QuantizeRowSimd,
    // Q4_0 too: with packed weights the lane kernel beats f32 at every batch
    // size (1.4-1.6 x the unpacked kernel at batch 1). Q8_0 not: faster too,
    // but on stories260K int8 misses the 0.99 top-1 goal (0.987;
    // docs/PERFORMANCE.md).
    {{false, false, false, true, false, true, true, true}},
    /*reads_lanes=*/true,
    &LaneRows<kIdxQ8_0, true>,
    &QuantizeRowWideSimd,
    // Q8_0 takes wide activations by default: docs/PERFORMANCE.md.
    /*auto_wide=*/true,
    /*reads_k_lanes=*/true};

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
