// The BLAS sgemm behind MatMul's batched path: oneDNN (when built with it)
// and OpenBLAS, both always callable so they can be compared.

#include <cblas.h>
#include <dlfcn.h>

#include "model/backend/cpu/matmul_internal.h"

#if STRATA_BLAS_DNNL
#include <dnnl.h>
#endif

namespace strata::cpu::internal {

namespace {

#if STRATA_BLAS_DNNL
constexpr bool kHaveDnnl = true;
#else
constexpr bool kHaveDnnl = false;
#endif

#if STRATA_BLAS_DNNL
// oneDNN's sgemm uses as many threads as OpenMP offers the calling thread.
// The OpenMP runtime is loaded with libdnnl but we are not built with
// -fopenmp, so look its setter up at run time; the setting is per thread.
using OmpSetNumThreads = void (*)(int);
OmpSetNumThreads OmpSetter() {
  static const OmpSetNumThreads fn =
      reinterpret_cast<OmpSetNumThreads>(dlsym(RTLD_DEFAULT, "omp_set_num_threads"));
  return fn;
}
#endif

}  // namespace

BlasLibrary ResolveBlas(BlasLibrary lib) {
  if (lib == BlasLibrary::kDefault) {
#if STRATA_BLAS_DNNL
    return BlasLibrary::kDnnl;
#else
    return BlasLibrary::kOpenBlas;
#endif
  }
  if (!BlasAvailable(lib)) return BlasLibrary::kOpenBlas;
  return lib;
}

bool BlasAvailable(BlasLibrary lib) {
  switch (lib) {
    case BlasLibrary::kDefault:
    case BlasLibrary::kOpenBlas:
      return true;
    case BlasLibrary::kDnnl:
      return kHaveDnnl;
  }
  return false;
}

const char* BlasName(BlasLibrary lib) {
  switch (ResolveBlas(lib)) {
    case BlasLibrary::kDnnl:
      return "onednn";
    default:
      return "openblas";
  }
}

void SgemmNT(BlasLibrary lib, int threads, int64_t m, int64_t n, int64_t k, const float* a,
             int64_t lda, const float* b, int64_t ldb, float* c, int64_t ldc) {
  if (m <= 0 || n <= 0) return;
  if (threads < 1) threads = 1;
#if STRATA_BLAS_DNNL
  if (ResolveBlas(lib) == BlasLibrary::kDnnl) {
    if (OmpSetNumThreads set = OmpSetter()) set(threads);
    // Row-major, like cblas with CblasRowMajor. Arguments were checked by the
    // caller, so the status can only be OK.
    (void)dnnl_sgemm('N', 'T', m, n, k, 1.f, a, lda, b, ldb, 0.f, c, ldc);
    return;
  }
#endif
  (void)lib;
  // Process-wide in OpenBLAS; only this file sets it.
  if (openblas_get_num_threads() != threads) openblas_set_num_threads(threads);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<blasint>(m),
              static_cast<blasint>(n), static_cast<blasint>(k), 1.f, a, static_cast<blasint>(lda),
              b, static_cast<blasint>(ldb), 0.f, c, static_cast<blasint>(ldc));
}

}  // namespace strata::cpu::internal
