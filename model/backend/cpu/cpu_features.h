#pragma once
// What the CPU we run on can execute, detected once at first use, and the
// SIMD level the CPU kernels dispatch on.
//
// The binaries are built for plain x86-64; kernels for wider ISAs carry
// per-function target attributes and are chosen at run time from
// ActiveSimdLevel(). SetSimdLevelOverride() lowers that level process-wide so
// that tests and benchmarks can run (and compare) the narrower paths.
//
// Thread-safety: every function may be called from any thread. An override
// changes which kernels calls started afterwards use; set it while no kernel
// is running.

#include <optional>
#include <string_view>

namespace strata::cpu {

struct CpuFeatures {
  bool avx2 = false;
  bool fma = false;
  bool f16c = false;
  bool avx512f = false;
  bool avx512bw = false;
  bool avx512vl = false;
  bool avx512dq = false;
  bool avx512_bf16 = false;
  bool avx512_vnni = false;
};

// The features of this CPU (as reported by cpuid, including OS support).
const CpuFeatures& GetCpuFeatures();

// Kernel families, ordered: a level includes everything below it.
enum class SimdLevel {
  kScalar = 0,  // portable C++, no ISA extensions beyond x86-64 baseline
  kAvx2 = 1,    // AVX2 + FMA + F16C
  kAvx512 = 2,  // AVX-512 F/BW/VL/DQ (+ AVX2 + FMA + F16C)
};

std::string_view SimdLevelName(SimdLevel level);

// The highest level this CPU supports.
SimdLevel DetectedSimdLevel();

// The level kernels use now: DetectedSimdLevel(), lowered by an override.
SimdLevel ActiveSimdLevel();

// Caps ActiveSimdLevel() at `level` (never raises it above what the CPU
// supports); nullopt removes the cap. Meant for tests and benchmarks.
void SetSimdLevelOverride(std::optional<SimdLevel> level);

}  // namespace strata::cpu
