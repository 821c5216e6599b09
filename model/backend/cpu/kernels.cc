// Dispatch of the kernels in kernels.h, and their scalar versions (the
// fallback on CPUs without AVX2, and the reference the SIMD ones are tested
// against).

#include "model/backend/cpu/kernels.h"

#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "model/backend/cpu/kernels_internal.h"

namespace strata::cpu {
namespace internal {
namespace {

void RmsNormScalar(const float* x, const float* weight, float* y, int n, float eps) {
  double ss = 0.0;
  for (int i = 0; i < n; ++i) ss += static_cast<double>(x[i]) * x[i];
  const float scale = static_cast<float>(1.0 / std::sqrt(ss / n + eps));
  for (int i = 0; i < n; ++i) y[i] = x[i] * scale * weight[i];
}

void RopeScalar(float* x, int n_heads, int head_dim, const float* cos, const float* sin,
                bool neox) {
  const int half = head_dim / 2;
  for (int h = 0; h < n_heads; ++h) {
    float* v = x + static_cast<size_t>(h) * head_dim;
    for (int i = 0; i < half; ++i) {
      const int i0 = neox ? i : 2 * i;
      const int i1 = neox ? i + half : 2 * i + 1;
      const float a = v[i0];
      const float b = v[i1];
      v[i0] = a * cos[i] - b * sin[i];
      v[i1] = b * cos[i] + a * sin[i];
    }
  }
}

void SwiGluScalar(const float* gate, const float* up, float* out, int n) {
  for (int i = 0; i < n; ++i) {
    const float g = gate[i];
    out[i] = g / (1.0f + std::exp(-g)) * up[i];
  }
}

void SoftmaxScalar(float* x, int n) {
  float m = -std::numeric_limits<float>::infinity();
  // fmax skips a NaN, but its exp then makes the sum, and so every output, NaN.
  for (int i = 0; i < n; ++i) m = std::fmax(m, x[i]);
  double sum = 0.0;
  for (int i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - m);
    sum += x[i];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int i = 0; i < n; ++i) x[i] *= inv;
}

void AddScalar(float* y, const float* x, int n) {
  for (int i = 0; i < n; ++i) y[i] += x[i];
}

float LoadKvScalar(const void* p, DType t, int i) {
  switch (t) {
    case DType::kF16:
      return HalfBitsToFloat(static_cast<const uint16_t*>(p)[i]);
    case DType::kBF16:
      return Bf16BitsToFloat(static_cast<const uint16_t*>(p)[i]);
    default:
      return static_cast<const float*>(p)[i];
  }
}

float DotKvScalar(const float* q, const void* k, DType kv_type, int n) {
  double acc = 0.0;
  for (int i = 0; i < n; ++i) acc += static_cast<double>(q[i]) * LoadKvScalar(k, kv_type, i);
  return static_cast<float>(acc);
}

void AxpyKvScalar(float a, const void* v, DType kv_type, float* out, int n) {
  for (int i = 0; i < n; ++i) out[i] += a * LoadKvScalar(v, kv_type, i);
}

void StoreKvScalar(const float* src, void* dst, DType kv_type, int n) {
  switch (kv_type) {
    case DType::kF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (int i = 0; i < n; ++i) d[i] = FloatToHalfBits(src[i]);
      break;
    }
    case DType::kBF16: {
      auto* d = static_cast<uint16_t*>(dst);
      for (int i = 0; i < n; ++i) d[i] = FloatToBf16Bits(src[i]);
      break;
    }
    default:
      std::memmove(dst, src, static_cast<size_t>(n) * sizeof(float));
      break;
  }
}

void ExpScalar(const float* x, float* y, int n) {
  for (int i = 0; i < n; ++i) y[i] = std::exp(x[i]);
}

}  // namespace

const ElemKernels& ScalarElemKernels() {
  static constexpr ElemKernels kTable = {
      SimdLevel::kScalar, RmsNormScalar, RopeScalar,   SwiGluScalar,  SoftmaxScalar,
      AddScalar,          DotKvScalar,   AxpyKvScalar, StoreKvScalar, ExpScalar,
  };
  return kTable;
}

}  // namespace internal

const ElemKernels* ElemKernelsFor(SimdLevel level) {
  if (static_cast<int>(level) > static_cast<int>(DetectedSimdLevel())) return nullptr;
  switch (level) {
    case SimdLevel::kAvx512:
      return &internal::Avx512ElemKernels();
    case SimdLevel::kAvx2:
      return &internal::Avx2ElemKernels();
    default:
      return &internal::ScalarElemKernels();
  }
}

namespace {

// Looked up on every call (an atomic load), so SetSimdLevelOverride takes
// effect for the next call. ActiveSimdLevel never exceeds what the CPU has.
const ElemKernels& Active() { return *ElemKernelsFor(ActiveSimdLevel()); }

}  // namespace

bool IsKvDType(DType t) { return t == DType::kF32 || t == DType::kF16 || t == DType::kBF16; }

void RmsNorm(const float* x, const float* weight, float* y, int n, float eps) {
  if (n <= 0) return;
  Active().rms_norm(x, weight, y, n, eps);
}

void ApplyRope(float* x, int n_heads, int head_dim, int pos, const float* inv_freq, bool neox) {
  if (n_heads <= 0 || head_dim < 2) return;
  const int half = head_dim / 2;
  // Llama heads are 64..256 wide; the heap is only for unusual shapes.
  constexpr int kStackPairs = 512;
  float stack[2 * kStackPairs];
  std::vector<float> heap;
  float* cs = stack;
  if (half > kStackPairs) {
    heap.resize(2 * static_cast<size_t>(half));
    cs = heap.data();
  }
  for (int i = 0; i < half; ++i) {
    const double angle = static_cast<double>(pos) * static_cast<double>(inv_freq[i]);
    cs[i] = static_cast<float>(std::cos(angle));
    cs[half + i] = static_cast<float>(std::sin(angle));
  }
  Active().rope(x, n_heads, head_dim, cs, cs + half, neox);
}

void SwiGlu(const float* gate, const float* up, float* out, int n) {
  if (n <= 0) return;
  Active().swiglu(gate, up, out, n);
}

void Softmax(float* x, int n) {
  if (n <= 0) return;
  Active().softmax(x, n);
}

void Add(float* y, const float* x, int n) {
  if (n <= 0) return;
  Active().add(y, x, n);
}

float DotKv(const float* q, const void* k, DType kv_type, int n) {
  if (!IsKvDType(kv_type)) return std::numeric_limits<float>::quiet_NaN();
  if (n <= 0) return 0.0f;
  return Active().dot_kv(q, k, kv_type, n);
}

void AxpyKv(float a, const void* v, DType kv_type, float* out, int n) {
  if (n <= 0 || !IsKvDType(kv_type)) return;
  Active().axpy_kv(a, v, kv_type, out, n);
}

void StoreKv(const float* src, void* dst, DType kv_type, int n) {
  if (n <= 0 || !IsKvDType(kv_type)) return;
  Active().store_kv(src, dst, kv_type, n);
}

}  // namespace strata::cpu
