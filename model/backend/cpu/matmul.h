#pragma once
// The CPU matrix product of a weight tensor (in its stored type) with a batch
// of f32 activation rows: the linear layers of a transformer.
//
// Weights are never expanded to a full f32 copy. Single tokens (and 2 to 4
// depending on the type) use SIMD dot kernels that decode weight blocks in
// registers, each thread on a contiguous range of rows. From there up to 63
// tokens, register-blocked tile kernels read and decode each weight once per
// call and multiply it with every token in tiles of 4 rows x up to 6 tokens
// of f32 accumulators (decoding in registers, or into a 4-row L1 panel).
// From 64 tokens (prefill) tiles of ~256 rows are dequantized into a
// per-thread f32 scratch and multiplied with the BLAS sgemm (oneDNN when
// built with it, else OpenBLAS), single-threaded inside each of the pool's
// tasks, so BLAS threads never compete with the pool's (measured faster than
// one multi-threaded sgemm on 2 cores). f32 weights go to sgemm directly,
// split by rows over the pool.

#include <cstdint>

#include "common/status.h"
#include "common/thread_pool.h"
#include "model/backend/dtype.h"
#include "model/tensor.h"

namespace strata::cpu {

// OK when MatMul can use `w`: a supported type, 1 to 4 dims, cols > 0 and a
// multiple of the type's block size, data present and nbytes covering every
// row. Loaders call this once per weight so that MatMul need not fail.
Status ValidateMatMulWeight(const Tensor& w);

// How MatMul treats the activations x for quantized weights.
//
// With int8 activations (see matmul_q8.h) x is quantized per token (blocks of
// 32 for Q8_0/Q4_0, 256 for the K-quants; d = max|x| / 127) and multiplied
// with the weights' codes in integer arithmetic, at every batch size. Wide
// (int16) activations, for Q8_0: 16-bit codes per block of 32 (d = max|x| /
// 32512), held as two int8 planes, the same integer products twice. A
// token's result then depends only on its own row: the same bits in any
// batch, chunk, thread count or code path at a given SIMD level.
// f32/f16/bf16 weights always keep f32 activations.
enum class ActivationMode {
  // Default (`engine.activations: auto`): int8 for the K-quants (Q4_K,
  // Q5_K, Q6_K) and, where AVX2 or AVX-512 VNNI is active, Q4_0, where it
  // measured faster at every batch size (Q4_0 with its weights packed at
  // load: model/weight_pack.h); wide (int16) for Q8_0 where AVX-512 VNNI is
  // active: int8 misses stories260K's 0.99 top-1 agreement with the f32
  // model (0.987), wide meets it as f32 does (0.992) and runs faster than
  // f32 activations from 2 tokens on (docs/PERFORMANCE.md); f32 for Q8_0
  // elsewhere. Each kernel table says which (auto_int8, auto_wide).
  kAuto,
  // `--exact-activations`: every product uses x in f32.
  kExact,
  // `--int8-activations`: int8 for every type that has kernels (Q8_0, Q4_0
  // too).
  kInt8,
};

// What MatMul multiplies weights of one type with.
enum class ActivationKind {
  kF32,
  kInt8,
  kWide,  // int16 codes as two int8 planes (Q8_0)
};
ActivationKind ActivationsFor(DType t, ActivationMode m);

// Whether ActivationsFor(t, m) is an integer kind (int8 or wide): the weights
// take the integer kernels (and their packed copy), and the results are
// batch-invariant.
bool UsesIntegerActivations(DType t, ActivationMode m);

// Process-wide, read at the start of each MatMul; set it at start-up (CLI
// flags) or, in tests, while no MatMul runs.
void SetActivationMode(ActivationMode mode);
ActivationMode GetActivationMode();

// Column panels (Tensor::panels). A one-token product reads each weight row
// once and all of x once per row; when x (4 bytes a column) and a row
// together outgrow L1's share, the streaming rows evict x before the next
// row reads it, and the product runs well under the memory bandwidth (f16,
// 5,632 columns: 1.3-1.8x slower than with x half the size). Split into
// panels of fewer columns, each panel is still read front to back while its
// slice of x stays in L1. Every MatMul path reads the panels when a tensor
// has them (the rows are then summed panel by panel, in panel order).
//
// The panel width to give w (a multiple of 64 columns), or 0 when its rows
// are narrow enough or its type's f32-activation kernels need whole rows
// (the K-quants). For f32, f16, bf16, Q8_0 and Q4_0 weights multiplied with
// f32 activations.
int64_t DecodePanelCols(DType t, int64_t cols);
// Bytes PackPanels writes for w at that width (0 if it is not < cols).
size_t PanelPackedBytes(const Tensor& w, int64_t panel_cols);
// Writes w's rows as column panels of panel_cols (Tensor::panels' layout)
// to out, which has PanelPackedBytes(w, panel_cols) bytes.
// REQUIRES 0 < panel_cols < w.cols(), panel_cols a multiple of the type's
// block; w.data valid.
void PackPanels(const Tensor& w, int64_t panel_cols, uint8_t* out);

// y[t * w.rows() + r] = sum_k W[r][k] * x[t * w.cols() + k]
// for t in [0, n_tokens), r in [0, w.rows()), where W is w decoded to f32
// (DequantizeRow's values). Where UsesIntegerActivations is false, x is used
// in full f32 precision; code paths, SIMD levels and thread counts differ
// only in float rounding: each output is within ~1e-6 * sum_k |W[r][k] x[k]|
// (tests allow 1e-5 for f32, 1e-4 for the others) of the exact sum. Where it
// is true, x is replaced by its int8 quantization (an error
// of up to half a step, max|x| / 254, per element of each 32- or 256-block).
//
// REQUIRES: ValidateMatMulWeight(w).ok(); x holds n_tokens * cols floats and
// y room for n_tokens * rows; x and y do not overlap. If w is invalid anyway,
// y is filled with NaN (nothing is read from w). n_tokens <= 0 does nothing.
//
// Uses `pool` for the whole call (one MatMul at a time per pool, as the pool
// requires) and thread-local scratch that grows to tile_rows * cols floats per
// pool thread and is kept for reuse. Safe to call concurrently with distinct
// pools.
void MatMul(const Tensor& w, const float* x, int64_t n_tokens, float* y, ThreadPool& pool);

}  // namespace strata::cpu
