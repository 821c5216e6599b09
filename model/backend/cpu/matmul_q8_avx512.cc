// AVX-512 VNNI int8-activation kernels (matmul_q8.h): the 256-bit kernels of
// matmul_q8_simd.h with block sums by vpdpbusd (u8 x s8, 4 products into each
// int32 lane, exact), and the 32 vector registers AVX-512VL gives for bigger
// tiles. 256-bit rather than 512-bit vectors: measured faster on Zen 4, where
// a 512-bit operation takes two 256-bit pipes and pairing blocks cost extra
// shuffles. Only reached through Avx512VnniQ8Kernels(), which checks the CPU.

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

#include "model/backend/cpu/cpu_features.h"
#include "model/backend/cpu/matmul_q8.h"

#pragma GCC push_options
#pragma GCC target("avx512f,avx512bw,avx512vl,avx512dq,avx512vnni,avx2,fma,f16c")

namespace strata::cpu::internal {
namespace {
struct Q8Ops {
  static constexpr int kMaxRows = 4;
  static constexpr int kMaxTokens = 4;
  static __m256i Dot(__m256i aw, __m256i sx) {
    return _mm256_dpbusd_epi32(_mm256_setzero_si256(), aw, sx);
  }
};
}  // namespace
}  // namespace strata::cpu::internal

#include "model/backend/cpu/matmul_q8_simd.h"

namespace strata::cpu::internal {
namespace {
constexpr Q8KernelTable kTable = MakeQ8Table("avx512-vnni");
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
