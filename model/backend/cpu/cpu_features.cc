#include "model/backend/cpu/cpu_features.h"

#include <algorithm>
#include <atomic>

namespace strata::cpu {

namespace {

CpuFeatures Detect() {
  CpuFeatures f;
#if defined(__x86_64__) || defined(__i386__)
  __builtin_cpu_init();
  // __builtin_cpu_supports also checks that the OS saves the wide registers
  // (XCR0), so a feature reported here is usable.
  f.avx2 = __builtin_cpu_supports("avx2");
  f.fma = __builtin_cpu_supports("fma");
  f.f16c = __builtin_cpu_supports("f16c");
  f.avx512f = __builtin_cpu_supports("avx512f");
  f.avx512bw = __builtin_cpu_supports("avx512bw");
  f.avx512vl = __builtin_cpu_supports("avx512vl");
  f.avx512dq = __builtin_cpu_supports("avx512dq");
  f.avx512_bf16 = __builtin_cpu_supports("avx512bf16");
  f.avx512_vnni = __builtin_cpu_supports("avx512vnni");
#endif
  return f;
}

SimdLevel LevelOf(const CpuFeatures& f) {
  const bool avx2 = f.avx2 && f.fma && f.f16c;
  if (avx2 && f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq) return SimdLevel::kAvx512;
  if (avx2) return SimdLevel::kAvx2;
  return SimdLevel::kScalar;
}

// -1 = no override, else the SimdLevel value.
std::atomic<int> g_override{-1};

}  // namespace

const CpuFeatures& GetCpuFeatures() {
  static const CpuFeatures features = Detect();
  return features;
}

std::string_view SimdLevelName(SimdLevel level) {
  switch (level) {
    case SimdLevel::kScalar:
      return "scalar";
    case SimdLevel::kAvx2:
      return "avx2";
    case SimdLevel::kAvx512:
      return "avx512";
  }
  return "unknown";
}

SimdLevel DetectedSimdLevel() {
  static const SimdLevel level = LevelOf(GetCpuFeatures());
  return level;
}

SimdLevel ActiveSimdLevel() {
  const int cap = g_override.load(std::memory_order_relaxed);
  const SimdLevel detected = DetectedSimdLevel();
  if (cap < 0) return detected;
  return static_cast<SimdLevel>(std::min(cap, static_cast<int>(detected)));
}

void SetSimdLevelOverride(std::optional<SimdLevel> level) {
  g_override.store(level ? static_cast<int>(*level) : -1, std::memory_order_relaxed);
}

}  // namespace strata::cpu
