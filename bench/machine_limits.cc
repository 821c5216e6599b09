#include "bench/machine_limits.h"

#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>

#include "model/backend/cpu/cpu_features.h"

namespace strata::bench {

namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

// ---- streaming read ---------------------------------------------------------

// Not _mm512_reduce_add_ps: g++ 12 warns (-Wuninitialized) inside it.
__attribute__((target("avx512f"))) float HorizontalSum(__m512 v) {
  alignas(64) float out[16];
  _mm512_store_ps(out, v);
  float s = 0;
  for (float x : out) s += x;
  return s;
}

// Sums n floats (n a multiple of 64) with independent accumulators, so the
// loop is bound by loads, not by the add latency.
__attribute__((target("avx512f"))) float SumAvx512(const float* p, size_t n) {
  __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i < n; i += 64) {
    a0 = _mm512_add_ps(a0, _mm512_load_ps(p + i));
    a1 = _mm512_add_ps(a1, _mm512_load_ps(p + i + 16));
    a2 = _mm512_add_ps(a2, _mm512_load_ps(p + i + 32));
    a3 = _mm512_add_ps(a3, _mm512_load_ps(p + i + 48));
  }
  return HorizontalSum(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
}

__attribute__((target("avx2"))) float SumAvx2(const float* p, size_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i < n; i += 32) {
    a0 = _mm256_add_ps(a0, _mm256_load_ps(p + i));
    a1 = _mm256_add_ps(a1, _mm256_load_ps(p + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_load_ps(p + i + 16));
    a3 = _mm256_add_ps(a3, _mm256_load_ps(p + i + 24));
  }
  alignas(32) float out[8];
  _mm256_store_ps(out, _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
  return out[0] + out[1] + out[2] + out[3] + out[4] + out[5] + out[6] + out[7];
}

float SumScalar(const float* p, size_t n) {
  float a[8] = {};
  for (size_t i = 0; i < n; i += 8)
    for (int k = 0; k < 8; ++k) a[k] += p[i + k];
  return a[0] + a[1] + a[2] + a[3] + a[4] + a[5] + a[6] + a[7];
}

float Sum(cpu::SimdLevel level, const float* p, size_t n) {
  switch (level) {
    case cpu::SimdLevel::kAvx512:
      return SumAvx512(p, n);
    case cpu::SimdLevel::kAvx2:
      return SumAvx2(p, n);
    case cpu::SimdLevel::kScalar:
      break;
  }
  return SumScalar(p, n);
}

struct FreeDeleter {
  void operator()(float* p) const { std::free(p); }
};

// Chunks are handed out dynamically, so a thread slowed by another process on
// a shared machine does not hold the pass back.
constexpr size_t kChunkFloats = size_t{1} << 20;  // 4 MiB

Result<double> ReadBandwidth(ThreadPool* pool, const LimitsOptions& o, cpu::SimdLevel level) {
  const size_t chunks = std::max<size_t>(1, o.buffer_bytes / (kChunkFloats * sizeof(float)));
  const size_t n = chunks * kChunkFloats;
  std::unique_ptr<float, FreeDeleter> buf(
      static_cast<float*>(std::aligned_alloc(64, n * sizeof(float))));
  if (!buf)
    return Status::ResourceExhausted("cannot allocate the " + std::to_string(n * 4) +
                                     "-byte bandwidth buffer");
  float* data = buf.get();
  const int tasks = static_cast<int>(chunks);
  pool->Run(tasks, [&](int c) {
    float* p = data + static_cast<size_t>(c) * kChunkFloats;
    for (size_t i = 0; i < kChunkFloats; ++i) p[i] = static_cast<float>(i & 7);
  });
  std::atomic<float> sink{0};
  double best = 0;
  for (int pass = 0; pass < std::max(1, o.passes) + 1; ++pass) {  // pass 0 warms up
    const auto t0 = Clock::now();
    pool->Run(tasks, [&](int c) {
      const float s = Sum(level, data + static_cast<size_t>(c) * kChunkFloats, kChunkFloats);
      sink.store(sink.load(std::memory_order_relaxed) + s, std::memory_order_relaxed);
    });
    const double t = Seconds(t0, Clock::now());
    if (pass > 0 && t > 0) best = std::max(best, static_cast<double>(n * sizeof(float)) / t / 1e9);
  }
  if (sink.load() < 0) return Status::Internal("impossible negative sum");  // keeps the sums alive
  return best;
}

// ---- FMA peak -----------------------------------------------------------------

// Independent chains: FMA latency (4 cycles) x 2 ports needs at least 8 in
// flight; 16 (AVX-512, 32 registers) and 12 (AVX2, 16 registers) leave room.
// acc = acc * m + c with m slightly below 1 converges to a normal number, so
// no denormals or infinities slow the loop down.
constexpr int kAvx512Chains = 16;
constexpr int kAvx2Chains = 12;
constexpr int kScalarChains = 8;

__attribute__((target("avx512f"))) float FmaAvx512(int64_t iters) {
  const __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-6f);
  __m512 a[kAvx512Chains];
  for (int k = 0; k < kAvx512Chains; ++k) a[k] = _mm512_set1_ps(static_cast<float>(k));
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 16
    for (int k = 0; k < kAvx512Chains; ++k) a[k] = _mm512_fmadd_ps(a[k], m, c);
  }
  __m512 s = a[0];
  for (int k = 1; k < kAvx512Chains; ++k) s = _mm512_add_ps(s, a[k]);
  return HorizontalSum(s);
}

__attribute__((target("avx2,fma"))) float FmaAvx2(int64_t iters) {
  const __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-6f);
  __m256 a[kAvx2Chains];
  for (int k = 0; k < kAvx2Chains; ++k) a[k] = _mm256_set1_ps(static_cast<float>(k));
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (int k = 0; k < kAvx2Chains; ++k) a[k] = _mm256_fmadd_ps(a[k], m, c);
  }
  __m256 s = a[0];
  for (int k = 1; k < kAvx2Chains; ++k) s = _mm256_add_ps(s, a[k]);
  alignas(32) float out[8];
  _mm256_store_ps(out, s);
  return out[0] + out[1] + out[2] + out[3] + out[4] + out[5] + out[6] + out[7];
}

float FmaScalar(int64_t iters) {
  float a[kScalarChains];
  for (int k = 0; k < kScalarChains; ++k) a[k] = static_cast<float>(k);
  for (int64_t i = 0; i < iters; ++i)
    for (int k = 0; k < kScalarChains; ++k) a[k] = a[k] * 0.999999f + 1e-6f;
  float s = 0;
  for (float v : a) s += v;
  return s;
}

// Flops of one iteration of the loop at `level`.
double FlopsPerIter(cpu::SimdLevel level) {
  switch (level) {
    case cpu::SimdLevel::kAvx512:
      return 2.0 * 16 * kAvx512Chains;
    case cpu::SimdLevel::kAvx2:
      return 2.0 * 8 * kAvx2Chains;
    case cpu::SimdLevel::kScalar:
      break;
  }
  return 2.0 * kScalarChains;
}

float Fma(cpu::SimdLevel level, int64_t iters) {
  switch (level) {
    case cpu::SimdLevel::kAvx512:
      return FmaAvx512(iters);
    case cpu::SimdLevel::kAvx2:
      return FmaAvx2(iters);
    case cpu::SimdLevel::kScalar:
      break;
  }
  return FmaScalar(iters);
}

double FmaPeak(ThreadPool* pool, const LimitsOptions& o, cpu::SimdLevel level) {
  const int threads = pool->num_threads();
  std::atomic<float> sink{0};
  // Calibrate one thread's iteration count to about o.fma_seconds.
  int64_t iters = 1 << 16;
  for (;;) {
    const auto t0 = Clock::now();
    sink.store(sink.load() + Fma(level, iters));
    const double t = Seconds(t0, Clock::now());
    if (t >= o.fma_seconds / 4 || iters >= (int64_t{1} << 40)) {
      iters = std::max<int64_t>(
          1, static_cast<int64_t>(static_cast<double>(iters) * o.fma_seconds / std::max(t, 1e-9)));
      break;
    }
    iters *= 4;
  }
  double best = 0;
  for (int pass = 0; pass < std::max(1, o.passes); ++pass) {
    const auto t0 = Clock::now();
    pool->Run(threads, [&](int) {
      const float s = Fma(level, iters);
      sink.store(sink.load(std::memory_order_relaxed) + s, std::memory_order_relaxed);
    });
    const double t = Seconds(t0, Clock::now());
    if (t > 0)
      best = std::max(best, FlopsPerIter(level) * static_cast<double>(iters) * threads / t / 1e9);
  }
  if (sink.load() < -1) best = 0;  // never true; keeps the results alive
  return best;
}

const char* LevelName(cpu::SimdLevel level) {
  switch (level) {
    case cpu::SimdLevel::kAvx512:
      return "avx512";
    case cpu::SimdLevel::kAvx2:
      return "avx2";
    case cpu::SimdLevel::kScalar:
      break;
  }
  return "scalar";
}

}  // namespace

Result<MachineLimits> MeasureMachineLimits(ThreadPool* pool, const LimitsOptions& options) {
  if (pool == nullptr) return Status::InvalidArgument("MeasureMachineLimits needs a thread pool");
  if (options.buffer_bytes < (size_t{1} << 20))
    return Status::InvalidArgument("the bandwidth buffer must be at least 1 MiB");
  // The detected level, not the active one: the limit is the machine's, even
  // when a test has capped the kernels.
  const cpu::SimdLevel level = cpu::DetectedSimdLevel();
  MachineLimits out;
  out.threads = pool->num_threads();
  out.simd = LevelName(level);
  STRATA_ASSIGN_OR_RETURN(out.read_bandwidth_gbs, ReadBandwidth(pool, options, level));
  out.fma_peak_gflops = FmaPeak(pool, options, level);
  return out;
}

MachineLimits Stronger(const MachineLimits& a, const MachineLimits& b) {
  MachineLimits out = a;
  out.read_bandwidth_gbs = std::max(a.read_bandwidth_gbs, b.read_bandwidth_gbs);
  out.fma_peak_gflops = std::max(a.fma_peak_gflops, b.fma_peak_gflops);
  return out;
}

}  // namespace strata::bench
