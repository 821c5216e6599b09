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
    for (int h = 0; h < hc; ++h) softmax(sc + static_cast<size_t>(h) * n, n);
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

using AttendFn = void (*)(const AttnArgs&);

template <DType T, int... NVs>
constexpr auto MakeTable(std::integer_sequence<int, NVs...>) {
  return std::array<AttendFn, sizeof...(NVs)>{&AttendT<T, NVs + 1>...};
}

}  // namespace

void AttendAvx512(const AttnArgs& a) {
  const int nv = a.head_dim / 16;
  if (a.head_dim % 16 != 0 || nv < 1 || nv > 16) {
    AttendReference(a);
    return;
  }
  static constexpr auto kF32 = MakeTable<DType::kF32>(std::make_integer_sequence<int, 16>{});
  static constexpr auto kF16 = MakeTable<DType::kF16>(std::make_integer_sequence<int, 16>{});
  static constexpr auto kBF16 = MakeTable<DType::kBF16>(std::make_integer_sequence<int, 16>{});
  switch (a.kv_type) {
    case DType::kF32:
      return kF32[static_cast<size_t>(nv - 1)](a);
    case DType::kF16:
      return kF16[static_cast<size_t>(nv - 1)](a);
    case DType::kBF16:
      return kBF16[static_cast<size_t>(nv - 1)](a);
    default:
      AttendReference(a);
  }
}

}  // namespace strata::cpu::internal
