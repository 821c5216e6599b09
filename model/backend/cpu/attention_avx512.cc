// AVX-512 Attend (attention.h). Like kernels_avx512.cc, every function
// carries its own target attribute and runs only when the dispatcher found
// AVX-512.
//
// Specialised on the KV element type and on NV = head_dim / 16 (1..16): a
// chunk of HC = 16 / NV query heads (at least 1) lives in HC × NV registers,
// each K or V row is loaded and converted once per chunk, and the scores of a
// head are reduced with one horizontal add per position.

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <algorithm>
#include <array>
#include <cstdint>
#include <utility>
#include <vector>

#include "model/backend/cpu/attention.h"
#include "model/backend/cpu/kernels_internal.h"

#define STRATA_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")))

namespace strata::cpu::internal {
namespace {

template <DType T>
STRATA_AVX512 inline __m512 LoadRow(const uint8_t* p, int v) {
  if constexpr (T == DType::kF32) {
    return _mm512_loadu_ps(reinterpret_cast<const float*>(p) + 16 * v);
  } else if constexpr (T == DType::kF16) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 * v)));
  } else {
    const __m512i w = _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + 32 * v)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(w, 16));
  }
}

template <DType T, int NV>
STRATA_AVX512 void AttendT(const AttnArgs& a) {
  constexpr int HC = NV >= 16 ? 1 : 16 / NV;
  const int n = a.n_ctx;
  const int bs = a.block_size;
  const int hd = a.head_dim;
  const __m512 scale = _mm512_set1_ps(a.scale);
  const auto softmax = Avx512ElemKernels().softmax;
  for (int h0 = 0; h0 < a.group; h0 += HC) {
    const int hc = std::min(HC, a.group - h0);
    float* sc = a.scores + static_cast<size_t>(h0) * n;
    // Pass 1: scores.
    __m512 q[HC][NV];
#pragma GCC unroll 16
    for (int h = 0; h < HC; ++h) {
#pragma GCC unroll 16
      for (int v = 0; v < NV; ++v) {
        q[h][v] = h < hc ? _mm512_mul_ps(_mm512_loadu_ps(a.q + static_cast<size_t>(h0 + h) * hd + 16 * v), scale)
                         : _mm512_setzero_ps();
      }
    }
    for (int j0 = 0, blk = 0; j0 < n; j0 += bs, ++blk) {
      const uint8_t* kb = a.kv_base + static_cast<size_t>(a.block_table[blk]) * a.block_bytes + a.k_offset;
      const int m = std::min(bs, n - j0);
      for (int s = 0; s < m; ++s) {
        const uint8_t* row = kb + static_cast<size_t>(s) * a.row_bytes;
        __m512 k[NV];
#pragma GCC unroll 16
        for (int v = 0; v < NV; ++v) k[v] = LoadRow<T>(row, v);
#pragma GCC unroll 16
        for (int h = 0; h < HC; ++h) {
          if (h >= hc) break;
          __m512 acc = _mm512_mul_ps(q[h][0], k[0]);
#pragma GCC unroll 16
          for (int v = 1; v < NV; ++v) acc = _mm512_fmadd_ps(q[h][v], k[v], acc);
          sc[static_cast<size_t>(h) * n + j0 + s] = _mm512_reduce_add_ps(acc);
        }
      }
    }
    SoftmaxRows(softmax, sc, hc, n, a.lse == nullptr ? nullptr : a.lse + h0);
    // Pass 2: out = sum_j p_j v_j.
    __m512 o[HC][NV];
#pragma GCC unroll 16
    for (int h = 0; h < HC; ++h) {
#pragma GCC unroll 16
      for (int v = 0; v < NV; ++v) o[h][v] = _mm512_setzero_ps();
    }
    for (int j0 = 0, blk = 0; j0 < n; j0 += bs, ++blk) {
      const uint8_t* vb = a.kv_base + static_cast<size_t>(a.block_table[blk]) * a.block_bytes + a.v_offset;
      const int m = std::min(bs, n - j0);
      for (int s = 0; s < m; ++s) {
        const uint8_t* row = vb + static_cast<size_t>(s) * a.row_bytes;
        __m512 vv[NV];
#pragma GCC unroll 16
        for (int v = 0; v < NV; ++v) vv[v] = LoadRow<T>(row, v);
#pragma GCC unroll 16
        for (int h = 0; h < HC; ++h) {
          if (h >= hc) break;
          const __m512 p = _mm512_set1_ps(sc[static_cast<size_t>(h) * n + j0 + s]);
#pragma GCC unroll 16
          for (int v = 0; v < NV; ++v) o[h][v] = _mm512_fmadd_ps(p, vv[v], o[h][v]);
        }
      }
    }
#pragma GCC unroll 16
    for (int h = 0; h < HC; ++h) {
      if (h >= hc) break;
#pragma GCC unroll 16
      for (int v = 0; v < NV; ++v) _mm512_storeu_ps(a.out + static_cast<size_t>(h0 + h) * hd + 16 * v, o[h][v]);
    }
  }
}

// The horizontal sums of 16 vectors x[p] (16 floats apart), as one vector:
// out[p] = _mm512_reduce_add_ps(x[p]) bit for bit. GCC's reduce adds
// element i to i + 8, then i to i + 4 (i < 4), then i to i + 2, then 0 to 1;
// each step below makes the same pairs for several positions at once.
STRATA_AVX512 inline __m512 Reduce16(const float* x) {
  __m512 r[8];
#pragma GCC unroll 8
  for (int k = 0; k < 8; ++k) {  // lanes (128-bit): p0 i|i+8 for i<4, i<8; p1 the same
    const __m512 a = _mm512_loadu_ps(x + 32 * k), b = _mm512_loadu_ps(x + 32 * k + 16);
    r[k] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(1, 0, 1, 0)),
                         _mm512_shuffle_f32x4(a, b, _MM_SHUFFLE(3, 2, 3, 2)));
  }
  __m512 s[4];
#pragma GCC unroll 4
  for (int m = 0; m < 4; ++m)  // lane L: position 4m + L, its 4 sums of i and i + 4
    s[m] = _mm512_add_ps(_mm512_shuffle_f32x4(r[2 * m], r[2 * m + 1], _MM_SHUFFLE(2, 0, 2, 0)),
                         _mm512_shuffle_f32x4(r[2 * m], r[2 * m + 1], _MM_SHUFFLE(3, 1, 3, 1)));
  // Lane L: [pos L: 0+2, pos 4+L: 0+2, pos L: 1+3, pos 4+L: 1+3] (u0), 8+L and 12+L (u1).
  const __m512 u0 = _mm512_add_ps(_mm512_unpacklo_ps(s[0], s[1]), _mm512_unpackhi_ps(s[0], s[1]));
  const __m512 u1 = _mm512_add_ps(_mm512_unpacklo_ps(s[2], s[3]), _mm512_unpackhi_ps(s[2], s[3]));
  // Lane L: positions L, 4 + L, 8 + L, 12 + L: element 4L + e is position L + 4e.
  const __m512d lo = _mm512_unpacklo_pd(_mm512_castps_pd(u0), _mm512_castps_pd(u1));
  const __m512d hi = _mm512_unpackhi_pd(_mm512_castps_pd(u0), _mm512_castps_pd(u1));
  const __m512 w = _mm512_add_ps(_mm512_castpd_ps(lo), _mm512_castpd_ps(hi));
  const __m512i order = _mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15);
  return _mm512_permutexvar_ps(order, w);
}

// Prefetches [p, p + bytes) into L2. The position-major walk prefetches the
// same row of the next block (one block ahead: blocks are scattered, so the
// hardware cannot run ahead across them).
STRATA_AVX512 inline void PrefetchSpan(const uint8_t* p, size_t bytes) {
  const char* c = reinterpret_cast<const char*>(p);
  for (size_t b = 0; b < bytes; b += 64) _mm_prefetch(c + b, _MM_HINT_T1);
}

// Several KV heads (a.kv_heads > 1), walked position-major: for each
// position every head's K (then V) row, so the blocks are read front to back
// (attention.h). The queries (scaled) and the outputs live in L1, not
// registers: per position the kernel waits on 2 × kv_heads × head_bytes of
// KV from memory, next to which the extra loads and stores are free. Per
// head the operations and their order are AttendT's, so the results are
// bitwise equal.
template <DType T, int NV>
STRATA_AVX512 void AttendWideT(const AttnArgs& a) {
  const int n = a.n_ctx;
  const int bs = a.block_size;
  const int hd = a.head_dim;
  const int heads = a.kv_heads * a.group;
  // Bytes of a position's rows this call reads (its heads side by side).
  const size_t span = static_cast<size_t>(a.kv_heads - 1) * a.kv_head_bytes + static_cast<size_t>(NV) * 16 *
                      (T == DType::kF32 ? 4 : 2);
  const __m512 scale = _mm512_set1_ps(a.scale);
  thread_local std::vector<float> qs;
  if (qs.size() < static_cast<size_t>(heads) * hd) qs.resize(static_cast<size_t>(heads) * hd);
  for (int h = 0; h < heads; ++h) {
#pragma GCC unroll 16
    for (int v = 0; v < NV; ++v) {
      const size_t at = static_cast<size_t>(h) * hd + 16 * v;
      _mm512_storeu_ps(qs.data() + at, _mm512_mul_ps(_mm512_loadu_ps(a.q + at), scale));
    }
  }
  // Pass 1: scores. A position's products per head are summed to one vector
  // and parked in L1 (acc, 16 positions x heads); every 16 positions each
  // head's 16 vectors are reduced together (Reduce16), which costs a quarter
  // of 16 separate horizontal adds and sums in the same pairs.
  thread_local std::vector<float> acc;
  if (acc.size() < static_cast<size_t>(heads) * 256) acc.resize(static_cast<size_t>(heads) * 256);
  for (int j0 = 0, blk = 0; j0 < n; j0 += bs, ++blk) {
    const uint8_t* kb = a.kv_base + static_cast<size_t>(a.block_table[blk]) * a.block_bytes + a.k_offset;
    const int m = std::min(bs, n - j0);
    const uint8_t* kn = j0 + bs < n ? a.kv_base + static_cast<size_t>(a.block_table[blk + 1]) * a.block_bytes + a.k_offset
                                    : nullptr;
    for (int s0 = 0; s0 < m; s0 += 16) {
      const int c = std::min(16, m - s0);
      for (int s = s0; s < s0 + c; ++s) {
        const uint8_t* row = kb + static_cast<size_t>(s) * a.row_bytes;
        if (kn != nullptr) PrefetchSpan(kn + static_cast<size_t>(s) * a.row_bytes, span);
        for (int i = 0; i < a.kv_heads; ++i) {
          __m512 k[NV];
#pragma GCC unroll 16
          for (int v = 0; v < NV; ++v) k[v] = LoadRow<T>(row + static_cast<size_t>(i) * a.kv_head_bytes, v);
          for (int g = 0; g < a.group; ++g) {
            const int h = i * a.group + g;
            const float* q = qs.data() + static_cast<size_t>(h) * hd;
            __m512 d = _mm512_mul_ps(_mm512_loadu_ps(q), k[0]);
#pragma GCC unroll 16
            for (int v = 1; v < NV; ++v) d = _mm512_fmadd_ps(_mm512_loadu_ps(q + 16 * v), k[v], d);
            _mm512_storeu_ps(acc.data() + (static_cast<size_t>(h) * 16 + (s - s0)) * 16, d);
          }
        }
      }
      for (int h = 0; h < heads; ++h) {
        float* out = a.scores + static_cast<size_t>(h) * n + j0 + s0;
        const float* in = acc.data() + static_cast<size_t>(h) * 256;
        if (c == 16) {
          _mm512_storeu_ps(out, Reduce16(in));
        } else {
          for (int p = 0; p < c; ++p) out[p] = _mm512_reduce_add_ps(_mm512_loadu_ps(in + 16 * p));
        }
      }
    }
  }
  const auto softmax = Avx512ElemKernels().softmax;
  SoftmaxRows(softmax, a.scores, heads, n, a.lse);
  // Pass 2: out = sum_j p_j v_j, accumulated in place.
  std::fill(a.out, a.out + static_cast<size_t>(heads) * hd, 0.0f);
  for (int j0 = 0, blk = 0; j0 < n; j0 += bs, ++blk) {
    const uint8_t* vb = a.kv_base + static_cast<size_t>(a.block_table[blk]) * a.block_bytes + a.v_offset;
    const uint8_t* vn = j0 + bs < n ? a.kv_base + static_cast<size_t>(a.block_table[blk + 1]) * a.block_bytes + a.v_offset
                                    : nullptr;
    const int m = std::min(bs, n - j0);
    for (int s = 0; s < m; ++s) {
      const uint8_t* row = vb + static_cast<size_t>(s) * a.row_bytes;
      if (vn != nullptr) PrefetchSpan(vn + static_cast<size_t>(s) * a.row_bytes, span);
      for (int i = 0; i < a.kv_heads; ++i) {
        __m512 vv[NV];
#pragma GCC unroll 16
        for (int v = 0; v < NV; ++v) vv[v] = LoadRow<T>(row + static_cast<size_t>(i) * a.kv_head_bytes, v);
        for (int g = 0; g < a.group; ++g) {
          const int h = i * a.group + g;
          const __m512 p = _mm512_set1_ps(a.scores[static_cast<size_t>(h) * n + j0 + s]);
          float* o = a.out + static_cast<size_t>(h) * hd;
#pragma GCC unroll 16
          for (int v = 0; v < NV; ++v)
            _mm512_storeu_ps(o + 16 * v, _mm512_fmadd_ps(p, vv[v], _mm512_loadu_ps(o + 16 * v)));
        }
      }
    }
  }
}

using AttendFn = void (*)(const AttnArgs&);
using Table = std::array<AttendFn, 16>;  // by NV - 1

template <DType T, bool kWide, int... NVs>
constexpr Table MakeTable(std::integer_sequence<int, NVs...>) {
  if constexpr (kWide) {
    return Table{&AttendWideT<T, NVs + 1>...};
  } else {
    return Table{&AttendT<T, NVs + 1>...};
  }
}

// The kernels of one walk (per head group, or all heads position-major), per KV type.
template <bool kWide>
struct Tables {
  static constexpr Table kF32 = MakeTable<DType::kF32, kWide>(std::make_integer_sequence<int, 16>{});
  static constexpr Table kF16 = MakeTable<DType::kF16, kWide>(std::make_integer_sequence<int, 16>{});
  static constexpr Table kBF16 = MakeTable<DType::kBF16, kWide>(std::make_integer_sequence<int, 16>{});
  static AttendFn Pick(DType t, int nv) {
    const size_t i = static_cast<size_t>(nv - 1);
    switch (t) {
      case DType::kF32:
        return kF32[i];
      case DType::kF16:
        return kF16[i];
      case DType::kBF16:
        return kBF16[i];
      default:
        return nullptr;
    }
  }
};

}  // namespace

void AttendAvx512(const AttnArgs& a) {
  const int nv = a.head_dim / 16;
  if (a.head_dim % 16 != 0 || nv < 1 || nv > 16) {
    AttendReference(a);
    return;
  }
  const AttendFn fn = a.kv_heads > 1 ? Tables<true>::Pick(a.kv_type, nv) : Tables<false>::Pick(a.kv_type, nv);
  if (fn == nullptr) {
    AttendReference(a);
    return;
  }
  fn(a);
}

}  // namespace strata::cpu::internal
