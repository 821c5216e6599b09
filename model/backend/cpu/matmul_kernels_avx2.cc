// AVX2 instantiation of the SIMD kernels (matmul_simd.h). Everything below the
// target pragma is compiled for AVX2 + FMA + F16C and is only reached through
// Avx2Kernels(), which callers use after checking the CPU.

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
#pragma GCC target("avx2,fma,f16c")
// Weight decoding must round exactly like the scalar codecs: no a*b-c -> FMA.
#pragma GCC optimize("fp-contract=off")

namespace strata::cpu::internal {
namespace {

struct Avx2Ops {
  static constexpr int kLanes = 8;
  using F = __m256;
  using I = __m256i;
  // Exact, as F16ToF32 (F16C).
  static float HalfToFloat(uint16_t h) { return _cvtsh_ss(h); }
  static F Zero() { return _mm256_setzero_ps(); }
  static F Set1(float v) { return _mm256_set1_ps(v); }
  static F LoadF(const float* p) { return _mm256_loadu_ps(p); }
  static void StoreF(float* p, F v) { _mm256_storeu_ps(p, v); }
  static F Fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F Mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F Sub(F a, F b) { return _mm256_sub_ps(a, b); }
  static F Add(F a, F b) { return _mm256_add_ps(a, b); }
  static float ReduceAdd(F v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
  static I LoadU8(const uint8_t* p) {
    return _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  }
  static I LoadI8(const int8_t* p) {
    return _mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)));
  }
  static F LoadF16(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static F LoadBF16(const uint16_t* p) {
    const __m256i v = _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(v, 16));
  }
  static void StoreF16(uint16_t* p, F v) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p),
                     _mm256_cvtps_ph(v, _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  }
  // Integer round-to-nearest-even, as F32ToBF16.
  static void StoreBF16(uint16_t* p, F v) {
    const __m256i x = _mm256_castps_si256(v);
    const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(1));
    const __m256i rounded = _mm256_srli_epi32(
        _mm256_add_epi32(x, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), 16);
    const __m256i quiet = _mm256_or_si256(_mm256_srli_epi32(x, 16), _mm256_set1_epi32(0x40));
    // abs(x) > inf as signed compare is safe: both sides are non-negative.
    const __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(x, _mm256_set1_epi32(0x7fffffff)),
                                           _mm256_set1_epi32(0x7f800000));
    const __m256i r = _mm256_blendv_epi8(rounded, quiet, nan);
    // Values fit 16 bits; packus works per 128-bit lane, so fix the order.
    const __m256i packed = _mm256_permute4x64_epi64(_mm256_packus_epi32(r, r), 0x08);
    _mm_storeu_si128(reinterpret_cast<__m128i*>(p), _mm256_castsi256_si128(packed));
  }
  static I And(I v, int m) { return _mm256_and_si256(v, _mm256_set1_epi32(m)); }
  static I Or(I a, I b) { return _mm256_or_si256(a, b); }
  static I Srl(I v, int n) { return _mm256_srl_epi32(v, _mm_cvtsi32_si128(n)); }
  static I Sll(I v, int n) { return _mm256_sll_epi32(v, _mm_cvtsi32_si128(n)); }
  static I SubI(I v, int k) { return _mm256_sub_epi32(v, _mm256_set1_epi32(k)); }
  static F Cvt(I v) { return _mm256_cvtepi32_ps(v); }
  // float(v & 15) and float((v & 15) - 8).
  static F Nibble(I v) { return Cvt(And(v, 0xf)); }
  // 1 + ((v >> shift) & 15) / 16, built as float bits (shift 0 or 4).
  static F UnitNibble(I v, int shift) {
    const __m256i m = _mm256_and_si256(Sll(v, 19 - shift), _mm256_set1_epi32(0x00780000));
    return _mm256_castsi256_ps(_mm256_or_si256(m, _mm256_set1_epi32(0x3f800000)));
  }
  static F NibbleMinus8(I v) { return Cvt(SubI(And(v, 0xf), 8)); }
};
using V = Avx2Ops;

}  // namespace
}  // namespace strata::cpu::internal

#include "model/backend/cpu/matmul_simd.h"

namespace strata::cpu::internal {
namespace {
constexpr KernelTable kAvx2Table = MakeTable("avx2");
}  // namespace
}  // namespace strata::cpu::internal

#pragma GCC pop_options

namespace strata::cpu::internal {
const KernelTable* Avx2Kernels() { return &kAvx2Table; }
}  // namespace strata::cpu::internal
