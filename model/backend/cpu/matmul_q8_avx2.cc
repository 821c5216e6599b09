// AVX2 int8-activation kernels (matmul_q8.h), for CPUs without AVX-512 VNNI.
// Compiled for AVX2 + FMA + F16C; only reached through Avx2Q8Kernels(), which
// checks the CPU. Block sums by vpmaddubsw (pairs of u8 x s8, at most
// 2 * 128 * 127 < 2^15, so never saturating) and vpmaddwd (exact).

#include <immintrin.h>

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
constexpr Q8KernelTable kTable = MakeQ8Table("avx2");
}  // namespace
}  // namespace strata::cpu::internal

#pragma GCC pop_options

namespace strata::cpu::internal {
const Q8KernelTable* Avx2Q8Kernels() {
  const CpuFeatures& f = GetCpuFeatures();
  return f.avx2 && f.fma && f.f16c ? &kTable : nullptr;
}
}  // namespace strata::cpu::internal
