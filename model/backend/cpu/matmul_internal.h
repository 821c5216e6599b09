#pragma once
// Internal to the CPU backend, and to its tests and benchmarks: MatMul with
// its strategy choices exposed, and the raw BLAS sgemm wrapper.

#include <cstdint>

#include "common/thread_pool.h"
#include "model/backend/cpu/matmul.h"
#include "model/tensor.h"

namespace strata::cpu::internal {

enum class BlasLibrary {
  kDefault,  // oneDNN when built with it (STRATA_BLAS_DNNL), else OpenBLAS
  kDnnl,
  kOpenBlas,
};

// True when `lib` is compiled in (kDefault always is).
bool BlasAvailable(BlasLibrary lib);
// The library `lib` stands for: kDefault resolved, unavailable ones replaced
// by OpenBLAS.
BlasLibrary ResolveBlas(BlasLibrary lib);
const char* BlasName(BlasLibrary lib);

enum class GemmThreading {
  // Each pool task runs single-threaded sgemm on its own tile of rows.
  kPoolTiles,
  // The caller runs one sgemm per tile with pool.num_threads() BLAS threads
  // (the pool only dequantizes the tile).
  kBlasThreads,
};

struct MatMulOptions {
  // n_tokens at or above which the sgemm path is taken; <= 0 = per-type
  // default. 1 forces sgemm always, INT64_MAX never.
  int64_t gemm_min_tokens = 0;
  // Below gemm_min_tokens: n_tokens at or above which the register-blocked
  // tile kernels replace the dot kernels; <= 0 = default (2). INT64_MAX =
  // dot kernels only.
  int64_t tile_min_tokens = 0;
  // Rows dequantized per sgemm tile; <= 0 = chosen from cols.
  int64_t tile_rows = 0;
  GemmThreading threading = GemmThreading::kPoolTiles;
  BlasLibrary blas = BlasLibrary::kDefault;
  // Overrides GetActivationMode() for this call when set.
  bool force_activations = false;
  ActivationMode activations = ActivationMode::kAuto;
};

// The n_tokens thresholds MatMul uses for `t` by default with `lib`.
int64_t DefaultGemmMinTokens(DType t, BlasLibrary lib = BlasLibrary::kDefault);
int64_t DefaultTileMinTokens(DType t);

void MatMulWithOptions(const Tensor& w, const float* x, int64_t n_tokens, float* y,
                       ThreadPool& pool, const MatMulOptions& options);

// C[m x n] = A[m x k] * B[n x k]^T, all row-major with leading dimensions
// lda, ldb, ldc, using `threads` BLAS threads (set for the calling thread
// with oneDNN/OpenMP; process-wide with OpenBLAS).
void SgemmNT(BlasLibrary lib, int threads, int64_t m, int64_t n, int64_t k, const float* a,
             int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc);

}  // namespace strata::cpu::internal
