#pragma once
// Element-wise and reduction kernels of the CPU forward pass.
//
// Each kernel has an AVX-512, an AVX2 and a scalar version; every call runs
// the one for ActiveSimdLevel() (cpu_features.h), so the binary needs only
// baseline x86-64 and SetSimdLevelOverride() switches these kernels along
// with the matmul ones.
//
// Thread safety: every kernel is a pure function of its arguments and may be
// called from any number of threads at once.
//
// Common contract: `n` (and the other sizes) are element counts; a size <= 0
// makes the call a no-op (DotKv returns 0). Pointers need only their
// element's natural alignment (4 bytes for f32, 2 for f16/bf16), no SIMD
// alignment. Results of different levels agree to a few float ulps, not
// bit for bit, except StoreKv, which is bit-exact on every level.

#include "model/backend/dtype.h"

namespace strata::cpu {

// y[i] = x[i] / sqrt(mean(x^2) + eps) * weight[i]. The sum of squares is
// accumulated in double, so long rows with large values do not lose precision.
// y may equal x (in place); otherwise the ranges must not overlap.
void RmsNorm(const float* x, const float* weight, float* y, int n, float eps);

// Rotary position embedding, in place, over n_heads consecutive heads of
// head_dim floats each. inv_freq holds head_dim/2 frequencies; pair i is
// rotated by angle = pos * inv_freq[i]:
//   !neox (GPT-J / original Llama GGUF order): pairs (2i, 2i+1)
//   neox (HF / NeoX order):                    pairs (i, i + head_dim/2)
// The angle, cos and sin are computed in double and rounded to float once per
// call, so large positions (100k+) keep their accuracy; the rotation itself is
// float arithmetic. REQUIRES: head_dim even (an odd last element is left as is).
void ApplyRope(float* x, int n_heads, int head_dim, int pos, const float* inv_freq, bool neox);

// out[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + exp(-g)).
// out may equal gate or up.
void SwiGlu(const float* gate, const float* up, float* out, int n);

// In place: x[i] = exp(x[i] - max) / sum. The sum is accumulated in double.
// -inf entries become exactly 0. If every entry is -inf (or one is NaN) the
// result is NaN.
void Softmax(float* x, int n);

// y[i] += x[i]. y may equal x.
void Add(float* y, const float* x, int n);

// True for the element types a KV cache may use with the *Kv kernels below:
// f32, f16, bf16.
bool IsKvDType(DType t);

// sum_i q[i] * k[i], with k stored as kv_type. Accumulates in float with
// several independent accumulators. Returns NaN if kv_type is not a KV type.
float DotKv(const float* q, const void* k, DType kv_type, int n);

// out[i] += a * v[i], with v stored as kv_type. No-op if kv_type is not a KV
// type.
void AxpyKv(float a, const void* v, DType kv_type, float* out, int n);

// dst[i] = src[i] converted to kv_type, rounding to nearest even (f16 and
// bf16; f16 overflows to inf, NaN stays NaN). No-op if kv_type is not a KV
// type.
void StoreKv(const float* src, void* dst, DType kv_type, int n);

}  // namespace strata::cpu
