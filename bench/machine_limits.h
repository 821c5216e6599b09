#pragma once
// The two limits every kernel figure is compared against (issue "CPU backend
// speed"): streaming read bandwidth from DRAM and the FP32 fused-multiply-add
// peak of the widest vector unit, both with a given number of threads.
//
// Thread-safety: the measurements run on the caller's ThreadPool, so they
// follow its rule (one ParallelFor at a time); the functions hold no state.

#include <cstddef>
#include <string>

#include "common/status.h"
#include "common/thread_pool.h"

namespace strata::bench {

struct MachineLimits {
  double read_bandwidth_gbs = 0;  // 1e9 bytes per second
  double fma_peak_gflops = 0;     // 1e9 FP32 flops per second (an FMA counts 2)
  int threads = 0;
  std::string simd;  // vector unit the FMA loop used: "avx512", "avx2" or "scalar"
};

struct LimitsOptions {
  // Far larger than the last-level cache, so that the sum reads DRAM.
  size_t buffer_bytes = size_t{1} << 30;
  // Each figure is the best of this many passes (the machine may be shared).
  int passes = 5;
  // Length of one FMA pass per thread, roughly.
  double fma_seconds = 0.1;
};

// Streaming read bandwidth: each of the pool's threads sums its contiguous
// share of a buffer of `buffer_bytes` (first touched by the same thread), best
// of `passes`. The FMA peak: each thread runs a register-only loop of
// independent FMA chains on AVX-512 if present, else AVX2+FMA, else scalar.
// REQUIRES: pool != nullptr, buffer_bytes >= 1 MiB, passes >= 1.
// Fails with ResourceExhausted when the buffer cannot be allocated.
Result<MachineLimits> MeasureMachineLimits(ThreadPool* pool, const LimitsOptions& options = {});

// The higher bandwidth and the higher FMA peak of two measurements with the
// same threads. On a shared machine a measurement can only come out low (a
// neighbour takes bandwidth or shares a core), never high, so the maximum of
// two taken at different times is the better estimate of the limit, and
// shares computed from it are the conservative ones.
MachineLimits Stronger(const MachineLimits& a, const MachineLimits& b);

}  // namespace strata::bench
