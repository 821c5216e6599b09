// CPU GEMM and MatMul measurements (not a test: prints numbers, asserts
// nothing). Build: ninja blas_compare (not part of the default build).
//
//   blas_compare [--threads N] [--reps N] [--section bw|sgemm|decode|batch|shapes|all]
//                [--types f32,q8_0,...]   (batch and shapes: only these types)
//                [--activations auto|int8|exact]  (MatMul's ActivationMode; default auto)
//
// bw:     streaming-read bandwidth, 1 and N threads.
// sgemm:  oneDNN vs OpenBLAS sgemm 512x2048x2048 (M tokens x N rows x K cols),
//         1 thread, N BLAS threads, and N pool tasks of single-threaded sgemm.
// decode: MatMul at n_tokens = 1 for every type, 2048x2048 and 5632x2048,
//         as GB/s of weight bytes vs the streaming bandwidth.
// batch:  MatMul strategies (dot kernels, sgemm over pool tiles, sgemm with
//         BLAS threads) across batch sizes, to place the crossover.
// shapes: MatMul (default strategy) on the bench-110m shapes (768x768,
//         2048x768, 768x2048, 32000x768) for f32/f16/bf16/q8_0/q4_k at
//         n_tokens 1, 8, 32, 512: GB/s of weights, GFLOP/s, and the share of
//         the roofline max(bytes / bandwidth, flops / FMA peak), all by CPU
//         time (not in `all`: run it alone).
//
// Weights are cycled through several copies (> 4x L3) so that decode reads
// come from DRAM, as in a real model. Each number is the best of --reps runs.
// On a shared, loaded machine wall time mostly measures the other processes,
// so every figure is also given from process CPU time ("cpu": CPU seconds /
// threads used, i.e. the wall time the work would take on idle cores; it
// counts spinning threads too, so it is not flattering to OpenMP).

#include <immintrin.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <functional>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include "common/thread_pool.h"
#include "model/backend/cpu/cpu_features.h"
#include "model/backend/cpu/matmul.h"
#include "model/backend/cpu/matmul_internal.h"
#include "model/backend/cpu/quant.h"

namespace {

using namespace strata;
using namespace strata::cpu;
using Clock = std::chrono::steady_clock;

int g_reps = 7;
// --types: comma-separated type names to run (empty = all).
std::string g_types;

bool TypeSelected(DType t) {
  if (g_types.empty()) return true;
  const std::string list = "," + g_types + ",";
  return list.find("," + std::string(DTypeName(t)) + ",") != std::string::npos;
}

double CpuNow() {
  timespec ts;
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + 1e-9 * static_cast<double>(ts.tv_nsec);
}

struct Time {
  double wall = std::numeric_limits<double>::infinity();
  double cpu = std::numeric_limits<double>::infinity();  // CPU seconds / threads
  Time operator/(double d) const { return {wall / d, cpu / d}; }
};

Time Best(const std::function<void()>& fn, int threads, int reps = g_reps) {
  Time best;
  fn();  // warm-up (JIT, page faults, thread start)
  for (int i = 0; i < reps; ++i) {
    const double c0 = CpuNow();
    const auto t0 = Clock::now();
    fn();
    best.wall = std::min(best.wall, std::chrono::duration<double>(Clock::now() - t0).count());
    best.cpu = std::min(best.cpu, (CpuNow() - c0) / threads);
  }
  return best;
}

__attribute__((target("avx2"))) float SumAvx2(const float* p, size_t n) {
  __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i + 32 <= n; i += 32) {
    a0 = _mm256_add_ps(a0, _mm256_loadu_ps(p + i));
    a1 = _mm256_add_ps(a1, _mm256_loadu_ps(p + i + 8));
    a2 = _mm256_add_ps(a2, _mm256_loadu_ps(p + i + 16));
    a3 = _mm256_add_ps(a3, _mm256_loadu_ps(p + i + 24));
  }
  __m256 s = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
  float out[8];
  _mm256_storeu_ps(out, s);
  return out[0] + out[1] + out[2] + out[3] + out[4] + out[5] + out[6] + out[7];
}

// GB/s by wall time and by CPU time.
Time StreamBandwidth(ThreadPool& pool, int threads) {
  const size_t n = size_t{256} << 20 >> 2;  // 256 MiB of floats
  std::vector<float> buf(n, 1.f);
  volatile float sink = 0;
  const Time s = Best(
      [&] {
        pool.Run(threads, [&](int t) {
          const size_t per = n / threads;
          sink = sink + SumAvx2(buf.data() + t * per, per);
        });
      },
      threads);
  const double bytes = static_cast<double>(n * 4);
  return {bytes / s.wall / 1e9, bytes / s.cpu / 1e9};
}

void SectionBandwidth(ThreadPool& pool, Time* bw_all) {
  std::printf("\n== streaming read bandwidth (256 MiB, AVX2 loads), GB/s wall / cpu\n");
  ThreadPool one(1);
  const Time b1 = StreamBandwidth(one, 1);
  const Time bn = StreamBandwidth(pool, pool.num_threads());
  std::printf("1 thread: %.1f / %.1f   %d threads: %.1f / %.1f\n", b1.wall, b1.cpu,
              pool.num_threads(), bn.wall, bn.cpu);
  *bw_all = bn;
}

void SectionSgemm(ThreadPool& pool) {
  const int64_t m = 512, n = 2048, k = 2048;
  std::printf("\n== sgemm C[%ld x %ld] = A[%ld x %ld] * B[%ld x %ld]^T, GFLOP/s wall / cpu\n", m, n,
              m, k, n, k);
  std::vector<float> a(m * k), b(n * k), c(m * n);
  std::mt19937 rng(1);
  std::normal_distribution<float> g;
  for (auto& v : a) v = g(rng);
  for (auto& v : b) v = g(rng);
  const double flop = 2.0 * m * n * k;
  const int th = pool.num_threads();
  for (auto lib : {internal::BlasLibrary::kDnnl, internal::BlasLibrary::kOpenBlas}) {
    if (!internal::BlasAvailable(lib)) continue;
    const Time s1 =
        Best([&] { internal::SgemmNT(lib, 1, m, n, k, a.data(), k, b.data(), k, c.data(), n); }, 1);
    const Time sn = Best(
        [&] { internal::SgemmNT(lib, th, m, n, k, a.data(), k, b.data(), k, c.data(), n); }, th);
    const Time sp = Best(
        [&] {
          const int64_t per = n / th;
          pool.Run(th, [&](int t) {
            internal::SgemmNT(lib, 1, m, per, k, a.data(), k, b.data() + t * per * k, k,
                              c.data() + t * per, n);
          });
        },
        th);
    std::printf(
        "%-9s 1 thread %5.0f / %5.0f   %d BLAS threads %5.0f / %5.0f   %d pool tasks x 1 thread "
        "%5.0f / %5.0f\n",
        internal::BlasName(lib), flop / s1.wall / 1e9, flop / s1.cpu / 1e9, th,
        flop / sn.wall / 1e9, flop / sn.cpu / 1e9, th, flop / sp.wall / 1e9, flop / sp.cpu / 1e9);
  }
}

// Enough copies of a rows x cols weight of type t to exceed `min_bytes`.
struct WeightSet {
  std::vector<std::vector<uint8_t>> copies;
  std::vector<Tensor> tensors;
  size_t bytes_each = 0;
};

WeightSet MakeWeights(DType t, int64_t rows, int64_t cols, size_t min_bytes) {
  WeightSet ws;
  ws.bytes_each = RowBytes(t, cols) * rows;
  std::mt19937 rng(7);
  std::normal_distribution<float> g(0.f, 0.02f);
  std::vector<float> row(cols);
  std::vector<uint8_t> first(ws.bytes_each);
  for (int64_t r = 0; r < rows; ++r) {
    for (auto& v : row) v = g(rng);
    QuantizeRow(t, row.data(), first.data() + r * RowBytes(t, cols), cols);
  }
  const size_t count = std::max<size_t>(1, (min_bytes + ws.bytes_each - 1) / ws.bytes_each);
  ws.copies.assign(count, first);
  for (auto& c : ws.copies) {
    Tensor tensor;
    tensor.type = t;
    tensor.ne = {cols, rows};
    tensor.data = c.data();
    tensor.nbytes = c.size();
    ws.tensors.push_back(tensor);
  }
  return ws;
}

constexpr DType kTypes[] = {DType::kF32,  DType::kF16,  DType::kBF16, DType::kQ8_0,
                            DType::kQ4_0, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};

void SectionDecode(ThreadPool& pool, Time bw) {
  std::printf(
      "\n== decode MatMul, n_tokens = 1, %d threads, weights cycled from DRAM (wall / cpu)\n",
      pool.num_threads());
  std::printf("%-6s %-10s %17s %13s %11s\n", "type", "shape", "us/call", "GB/s", "of bw");
  for (DType t : kTypes) {
    for (int64_t rows : {2048, 5632}) {
      const int64_t cols = 2048;
      WeightSet ws = MakeWeights(t, rows, cols, size_t{160} << 20);
      std::vector<float> x(cols, 0.5f), y(rows);
      size_t next = 0;
      const size_t calls = ws.tensors.size();
      const Time s = Best(
                         [&] {
                           for (size_t i = 0; i < calls; ++i) {
                             MatMul(ws.tensors[next], x.data(), 1, y.data(), pool);
                             next = (next + 1) % calls;
                           }
                         },
                         pool.num_threads()) /
                     static_cast<double>(calls);
      const double b = static_cast<double>(ws.bytes_each) / 1e9;
      std::printf("%-6s %4ldx%-5ld %8.0f / %6.0f %6.1f / %4.1f %4.0f%% / %3.0f%%\n",
                  std::string(DTypeName(t)).c_str(), rows, cols, s.wall * 1e6, s.cpu * 1e6,
                  b / s.wall, b / s.cpu, 100 * b / s.wall / bw.wall, 100 * b / s.cpu / bw.cpu);
    }
  }
}

void SectionBatch(ThreadPool& pool) {
  std::printf("\n== batched MatMul 5632x2048, %d threads: cpu ms per call (GFLOP/s by cpu)\n",
              pool.num_threads());
  const int64_t rows = 5632, cols = 2048;
  using internal::GemmThreading;
  using internal::MatMulOptions;
  struct Strategy {
    const char* name;
    MatMulOptions o;
  };
  const Strategy strategies[] = {
      {"dot",
       {.gemm_min_tokens = std::numeric_limits<int64_t>::max(),
        .tile_min_tokens = std::numeric_limits<int64_t>::max()}},
      {"tile", {.gemm_min_tokens = std::numeric_limits<int64_t>::max(), .tile_min_tokens = 2}},
      {"default", {}},
      {"gemm-tiles", {.gemm_min_tokens = 1}},
      {"gemm-tiles512", {.gemm_min_tokens = 1, .tile_rows = 512}},
      {"gemm-blasthr", {.gemm_min_tokens = 1, .threading = GemmThreading::kBlasThreads}},
      {"openblas-tiles", {.gemm_min_tokens = 1, .blas = internal::BlasLibrary::kOpenBlas}},
  };
  for (DType t : kTypes) {
    if (!TypeSelected(t)) continue;
    WeightSet ws = MakeWeights(t, rows, cols, 0);
    std::printf("%s\n  %-14s", std::string(DTypeName(t)).c_str(), "n_tokens");
    const int64_t ns[] = {1, 2, 3, 4, 6, 8, 12, 16, 32, 48, 64, 512};
    for (int64_t n : ns) std::printf(" %14ld", n);
    std::printf("\n");
    for (const Strategy& s : strategies) {
      std::printf("  %-14s", s.name);
      for (int64_t n : ns) {
        const bool dot =
            std::strcmp(s.name, "dot") == 0 || (std::strcmp(s.name, "tile") == 0 && n < 512);
        const bool blasthr = std::strcmp(s.name, "gemm-blasthr") == 0;
        if ((dot && n > 64) || (!dot && n < 2) || (blasthr && n != 512)) {
          std::printf(" %14s", "-");
          continue;
        }
        std::vector<float> x(n * cols, 0.25f), y(n * rows);
        const double sec =
            Best(
                [&] {
                  internal::MatMulWithOptions(ws.tensors[0], x.data(), n, y.data(), pool, s.o);
                },
                pool.num_threads(), n >= 512 ? 3 : g_reps)
                .cpu;
        std::printf(" %7.2f(%5.0f)", sec * 1e3, 2.0 * n * rows * cols / sec / 1e9);
      }
      std::printf("\n");
    }
  }
}

// Independent AVX-512 FMA chains; returns their sum so nothing is dropped.
__attribute__((target("avx512f"))) float FmaChains(int64_t iters) {
  __m512 a[12];
  for (int i = 0; i < 12; ++i) a[i] = _mm512_set1_ps(0.5f + static_cast<float>(i));
  const __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-7f);
  for (int64_t it = 0; it < iters; ++it) {
#pragma GCC unroll 12
    for (int i = 0; i < 12; ++i) a[i] = _mm512_fmadd_ps(a[i], m, c);
  }
  __m512 t = a[0];
  for (int i = 1; i < 12; ++i) t = _mm512_add_ps(t, a[i]);
  float out[16];
  _mm512_storeu_ps(out, t);
  return out[0] + out[15];
}

// GFLOP/s of FmaChains on every pool thread (CPU time).
double FmaPeak(ThreadPool& pool) {
  const int th = pool.num_threads();
  constexpr int64_t kIters = 20'000'000;
  volatile float sink = 0;
  const Time s = Best([&] { pool.Run(th, [&](int) { sink = sink + FmaChains(kIters); }); }, th, 3);
  return 2.0 * 16 * 12 * static_cast<double>(kIters) * th / s.cpu / 1e9;
}

void SectionShapes(ThreadPool& pool, Time bw) {
  const bool avx512 = ActiveSimdLevel() == SimdLevel::kAvx512;
  const double peak = avx512 ? FmaPeak(pool) : 0;
  std::printf(
      "\n== MatMul on bench-110m shapes, %d threads, cpu time; bw %.1f GB/s, FMA peak %.0f "
      "GFLOP/s\n",
      pool.num_threads(), bw.cpu, peak);
  std::printf("%-6s %-10s %6s %10s %8s %9s %7s\n", "type", "shape", "tokens", "us/call", "GB/s",
              "GFLOP/s", "share");
  const DType types[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_K};
  const int64_t shapes[][2] = {{768, 768}, {2048, 768}, {768, 2048}, {32000, 768}};
  for (DType t : types) {
    if (!TypeSelected(t)) continue;
    for (const auto& sh : shapes) {
      const int64_t rows = sh[0], cols = sh[1];
      // Weights from DRAM as in a model: cycle copies beyond the caches.
      WeightSet ws = MakeWeights(t, rows, cols, size_t{96} << 20);
      for (int64_t n : {1, 8, 32, 512}) {
        std::vector<float> x(n * cols), y(n * rows);
        for (size_t i = 0; i < x.size(); ++i) x[i] = 0.25f + 1e-3f * static_cast<float>(i % 97);
        size_t next = 0;
        const size_t calls = n >= 512 ? 1 : ws.tensors.size();
        const Time s = Best(
                           [&] {
                             for (size_t i = 0; i < calls; ++i) {
                               MatMul(ws.tensors[next], x.data(), n, y.data(), pool);
                               next = (next + 1) % ws.tensors.size();
                             }
                           },
                           pool.num_threads(), n >= 512 ? 3 : g_reps) /
                       static_cast<double>(calls);
        const double bytes = static_cast<double>(ws.bytes_each);
        const double flop = 2.0 * static_cast<double>(n * rows * cols);
        const double roof = std::max(bytes / (bw.cpu * 1e9), peak > 0 ? flop / (peak * 1e9) : 0);
        std::printf("%-6s %5ldx%-5ld %6ld %10.1f %8.1f %9.1f %7.2f\n",
                    std::string(DTypeName(t)).c_str(), rows, cols, n, s.cpu * 1e6,
                    bytes / s.cpu / 1e9, flop / s.cpu / 1e9, roof / s.cpu);
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  int threads = 2;
  std::string section = "all";
  for (int i = 1; i + 1 < argc; i += 2) {
    if (!std::strcmp(argv[i], "--threads")) threads = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--reps")) g_reps = std::atoi(argv[i + 1]);
    if (!std::strcmp(argv[i], "--section")) section = argv[i + 1];
    if (!std::strcmp(argv[i], "--types")) g_types = argv[i + 1];
    if (!std::strcmp(argv[i], "--activations")) {
      const std::string a = argv[i + 1];
      strata::cpu::SetActivationMode(a == "exact"  ? strata::cpu::ActivationMode::kExact
                                     : a == "int8" ? strata::cpu::ActivationMode::kInt8
                                                   : strata::cpu::ActivationMode::kAuto);
    }
  }
  strata::ThreadPool pool(threads);
  std::printf("SIMD level %s, BLAS default %s, threads %d\n",
              std::string(SimdLevelName(ActiveSimdLevel())).c_str(),
              internal::BlasName(internal::BlasLibrary::kDefault), threads);
  Time bw;
  if (section == "all" || section == "bw" || section == "decode" || section == "shapes")
    SectionBandwidth(pool, &bw);
  if (section == "all" || section == "sgemm") SectionSgemm(pool);
  if (section == "all" || section == "decode") SectionDecode(pool, bw);
  if (section == "all" || section == "batch") SectionBatch(pool);
  if (section == "shapes") SectionShapes(pool, bw);
  return 0;
}
