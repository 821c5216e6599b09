// AVX-512 instantiation of the SIMD kernels (matmul_simd.h). Everything below
// the target pragma is compiled for AVX-512 F/BW/VL/DQ and is only reached
// through Avx512Kernels(), which callers use after checking the CPU.

// GCC 12's AVX-512 headers trip -Wuninitialized on their own
// _mm512_undefined_*() (GCC PR 105593) once inlined into target-pragma code.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include <cstddef>
#include <cstdint>
#include <type_traits>

#include "model/backend/cpu/matmul_kernels.h"
#include "model/backend/cpu/quant.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx2,fma,f16c")
// Weight decoding must round exactly like the scalar codecs: no a*b-c -> FMA.
#pragma GCC optimize("fp-contract=off")

namespace strata::cpu::internal {
namespace {

struct Avx512Ops {
  static constexpr int kLanes = 16;
  using F = __m512;
  using I = __m512i;
  // Exact, as F16ToF32 (F16C).
  static float HalfToFloat(uint16_t h) { return _cvtsh_ss(h); }
  static F Zero() { return _mm512_setzero_ps(); }
  static F Set1(float v) { return _mm512_set1_ps(v); }
  static F LoadF(const float* p) { return _mm512_loadu_ps(p); }
  static void StoreF(float* p, F v) { _mm512_storeu_ps(p, v); }
  static F Fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F Mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F Sub(F a, F b) { return _mm512_sub_ps(a, b); }
  static F Add(F a, F b) { return _mm512_add_ps(a, b); }
  static float ReduceAdd(F v) { return _mm512_reduce_add_ps(v); }
  static I LoadU8(const uint8_t* p) {
    return _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static I LoadI8(const int8_t* p) {
    return _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static F LoadF16(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static F LoadBF16(const uint16_t* p) {
    const __m512i v =
        _mm512_cvtepu16_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
    return _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
  }
  static void StoreF16(uint16_t* p, F v) {
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p),
                        _mm512_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  // Integer round-to-nearest-even, as F32ToBF16 (no DAZ, unlike vcvtneps2bf16).
  static void StoreBF16(uint16_t* p, F v) {
    const __m512i x = _mm512_castps_si512(v);
    const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(1));
    const __m512i rounded = _mm512_srli_epi32(
        _mm512_add_epi32(x, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7fff))), 16);
    const __m512i quiet = _mm512_or_si512(_mm512_srli_epi32(x, 16), _mm512_set1_epi32(0x40));
    const __mmask16 nan = _mm512_cmpgt_epu32_mask(
        _mm512_and_si512(x, _mm512_set1_epi32(0x7fffffff)), _mm512_set1_epi32(0x7f800000));
    const __m512i r = _mm512_mask_blend_epi32(nan, rounded, quiet);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm512_cvtepi32_epi16(r));
  }
  static I And(I v, int m) { return _mm512_and_si512(v, _mm512_set1_epi32(m)); }
  static I Or(I a, I b) { return _mm512_or_si512(a, b); }
  static I Srl(I v, int n) { return _mm512_srl_epi32(v, _mm_cvtsi32_si128(n)); }
  static I Sll(I v, int n) { return _mm512_sll_epi32(v, _mm_cvtsi32_si128(n)); }
  static I SubI(I v, int k) { return _mm512_sub_epi32(v, _mm512_set1_epi32(k)); }
  static F Cvt(I v) { return _mm512_cvtepi32_ps(v); }
  // float(v & 15) and float((v & 15) - 8): a table lookup (vpermps reads only
  // the low 4 bits of each index), cheaper than mask + convert.
  static F Nibble(I v) {
    return _mm512_permutexvar_ps(
        v, _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
  }
  // 1 + ((v >> shift) & 15) / 16, built as float bits (shift 0 or 4): the
  // nibble becomes the top mantissa bits of a number in [1, 2).
  static F UnitNibble(I v, int shift) {
    return _mm512_castsi512_ps(_mm512_ternarylogic_epi32(
        _mm512_sll_epi32(v, _mm_cvtsi32_si128(19 - shift)), _mm512_set1_epi32(0x00780000),
        _mm512_set1_epi32(0x3f800000), 0xea));  // (a & b) | c
  }
  static F NibbleMinus8(I v) {
    return _mm512_permutexvar_ps(
        v, _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7));
  }
};
using V = Avx512Ops;

}  // namespace
}  // namespace strata::cpu::internal

#include "model/backend/cpu/matmul_simd.h"

namespace strata::cpu::internal {
namespace {
constexpr KernelTable kAvx512Table = MakeTable("avx512");
}  // namespace
}  // namespace strata::cpu::internal

#pragma GCC pop_options

namespace strata::cpu::internal {
const KernelTable* Avx512Kernels() { return &kAvx512Table; }
}  // namespace strata::cpu::internal
