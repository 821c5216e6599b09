// AVX-512 VNNI int8-activation kernels (matmul_q8.h). Q8_0/Q4_0: 16 weight
// rows in the lanes of a 512-bit vector (LaneRows below), block sums by
// vpdpbusd (u8 x s8, 4 products into each int32 lane, exact), from the
// weights packed at load (Q8Args::lanes) or, without them, transposed from
// the file's rows on each call. Q4_K/Q5_K:
// 512-bit tiles, one 64-element group (two sub-blocks) per vector. Q6_K: the
// 256-bit kernels of matmul_q8_simd.h.
// Only reached through Avx512VnniQ8Kernels(), which checks the CPU.

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstring>

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

constexpr Q8KernelTable kTable = {
    "avx512-vnni",
    {nullptr, nullptr, nullptr, &LaneRows<kIdxQ4_0>, &LaneRows<kIdxQ8_0>, &KRows512<kIdxQ4_K>,
     &KRows512<kIdxQ5_K>, &Q6Rows},
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
    /*auto_wide=*/true};

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
