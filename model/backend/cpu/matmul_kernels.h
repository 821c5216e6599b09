#pragma once
// Internal to the CPU backend: per-ISA kernel tables. One table per SIMD
// level (scalar, AVX2, AVX-512); the wide ones live in translation units whose
// code is compiled for that ISA and are only handed out when the CPU has it.

#include <cstddef>
#include <cstdint>

#include "model/backend/dtype.h"

namespace strata::cpu::internal {

// Dense index of each supported DType, for the tables below.
inline constexpr int kNumTypes = 8;
// 0..kNumTypes-1, or -1 for a type the CPU backend does not handle.
inline int TypeIndex(DType t) {
  switch (t) {
    case DType::kF32:
      return 0;
    case DType::kF16:
      return 1;
    case DType::kBF16:
      return 2;
    case DType::kQ4_0:
      return 3;
    case DType::kQ8_0:
      return 4;
    case DType::kQ4_K:
      return 5;
    case DType::kQ5_K:
      return 6;
    case DType::kQ6_K:
      return 7;
  }
  return -1;
}

// y[t * y_stride + r] = dot(row r, x + t * cols) for r in [row_begin, row_end),
// t in [0, n_tokens). Rows are row_bytes apart starting at w.
struct DotArgs {
  const uint8_t* w = nullptr;
  size_t row_bytes = 0;
  int64_t cols = 0;
  int64_t row_begin = 0;
  int64_t row_end = 0;
  const float* x = nullptr;
  int64_t n_tokens = 0;
  float* y = nullptr;
  int64_t y_stride = 0;
  // Q4_K and Q5_K only: sums of x over each 32-element sub-block, cols / 32
  // per token, token t at xsum + t * (cols / 32).
  const float* xsum = nullptr;
  // Tile kernels only: this thread's buffer of TileScratchFloats(cols)
  // floats (64-byte aligned) for decoded weight rows, and the distance
  // between tokens in x (0 = cols; MatMul pads it to avoid 4 KiB aliasing).
  float* scratch = nullptr;
  int64_t x_stride = 0;
};

// Rows the tile kernels decode at a time into DotArgs::scratch (one panel:
// it stays in L1 while every token passes over it).
inline constexpr int64_t kTileBlockRows = 4;
// Decoded rows are this many floats apart: one spare cache line per row, so
// that rows a power of two apart do not compete for the same L1 sets.
inline int64_t TileRowStride(int64_t cols) { return cols + 16; }
inline int64_t TileScratchFloats(int64_t cols) { return kTileBlockRows * TileRowStride(cols); }

// Whether DotArgs::xsum must be set for type index i.
inline bool DotNeedsXSum(int type_index) { return type_index == 5 || type_index == 6; }

using DotRowsFn = void (*)(const DotArgs& args);
using DequantRowFn = void (*)(const void* src, float* dst, int64_t n);
using EncodeRowFn = void (*)(const float* src, void* dst, int64_t n);

struct KernelTable {
  const char* name;
  DotRowsFn dot[kNumTypes];
  // Register-blocked kernels for 2+ tokens, same contract as dot (plus
  // DotArgs::scratch): each weight row is decoded once (exactly as dequant
  // does) and multiplied with every token in tiles of 4 rows x up to 6 tokens
  // of f32 accumulators. The scalar table reuses its dot kernels here.
  DotRowsFn tile[kNumTypes];
  // Must give exactly the scalar codec's floats (tests check bit equality).
  DequantRowFn dequant[kNumTypes];
  EncodeRowFn f32_to_f16;
  EncodeRowFn f32_to_bf16;
};

const KernelTable& ScalarKernels();
// nullptr when the build has no such kernels; callers check the CPU first.
const KernelTable* Avx2Kernels();
const KernelTable* Avx512Kernels();

// The table for ActiveSimdLevel().
const KernelTable& ActiveKernels();

// How many tokens the SIMD dot kernels process per pass over a weight row.
inline constexpr int kDotTokenGroup = 4;

}  // namespace strata::cpu::internal
