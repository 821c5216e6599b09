// The portable kernel table (no ISA extensions), and the choice of table by
// the active SIMD level.

#include <algorithm>
#include <cstring>
#include <memory>

#include "model/backend/cpu/cpu_features.h"
#include "model/backend/cpu/matmul_kernels.h"
#include "model/backend/cpu/quant.h"
#include "model/backend/cpu/quant_internal.h"

namespace strata::cpu::internal {

namespace {

void DequantF32(const void* src, float* dst, int64_t n) {
  std::memcpy(dst, src, static_cast<size_t>(n) * sizeof(float));
}

constexpr DequantRowFn kScalarDequant[kNumTypes] = {
    &DequantF32,
    &DequantizeRowF16Scalar,
    &DequantizeRowBF16Scalar,
    &DequantizeRowQ4_0Scalar,
    &DequantizeRowQ8_0Scalar,
    &DequantizeRowQ4_KScalar,
    &DequantizeRowQ5_KScalar,
    &DequantizeRowQ6_KScalar,
};

float Dot(const float* a, const float* b, int64_t n) {
  float s[4] = {0.f, 0.f, 0.f, 0.f};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4) {
    for (int k = 0; k < 4; ++k) s[k] += a[i + k] * b[i + k];
  }
  for (; i < n; ++i) s[0] += a[i] * b[i];
  return (s[0] + s[1]) + (s[2] + s[3]);
}

// Decodes each row once into a thread-local buffer, then dots it with every
// token: simple and obviously right, the reference for the SIMD kernels.
template <int kIndex>
void ScalarDotRows(const DotArgs& a) {
  thread_local std::unique_ptr<float[]> buf;
  thread_local int64_t buf_size = 0;
  if (buf_size < a.cols) {
    buf.reset(new float[static_cast<size_t>(a.cols)]);
    buf_size = a.cols;
  }
  // Also the scalar table's tile kernel, so x may be padded (x_stride).
  const int64_t x_stride = a.x_stride > 0 ? a.x_stride : a.cols;
  for (int64_t r = a.row_begin; r < a.row_end; ++r) {
    kScalarDequant[kIndex](a.w + r * a.row_bytes, buf.get(), a.cols);
    for (int64_t t = 0; t < a.n_tokens; ++t) {
      a.y[t * a.y_stride + r] = Dot(buf.get(), a.x + t * x_stride, a.cols);
    }
  }
}

constexpr KernelTable kScalarTable = {
    "scalar",
    {&ScalarDotRows<0>, &ScalarDotRows<1>, &ScalarDotRows<2>, &ScalarDotRows<3>, &ScalarDotRows<4>,
     &ScalarDotRows<5>, &ScalarDotRows<6>, &ScalarDotRows<7>},
    {&ScalarDotRows<0>, &ScalarDotRows<1>, &ScalarDotRows<2>, &ScalarDotRows<3>, &ScalarDotRows<4>,
     &ScalarDotRows<5>, &ScalarDotRows<6>, &ScalarDotRows<7>},
    {kScalarDequant[0], kScalarDequant[1], kScalarDequant[2], kScalarDequant[3], kScalarDequant[4],
     kScalarDequant[5], kScalarDequant[6], kScalarDequant[7]},
    &QuantizeRowF16Scalar,
    &QuantizeRowBF16Scalar,
};

}  // namespace

const KernelTable& ScalarKernels() { return kScalarTable; }

const KernelTable& ActiveKernels() {
  switch (ActiveSimdLevel()) {
    case SimdLevel::kAvx512:
      if (const KernelTable* t = Avx512Kernels()) return *t;
      [[fallthrough]];
    case SimdLevel::kAvx2:
      if (const KernelTable* t = Avx2Kernels()) return *t;
      [[fallthrough]];
    case SimdLevel::kScalar:
      break;
  }
  return kScalarTable;
}

}  // namespace strata::cpu::internal
