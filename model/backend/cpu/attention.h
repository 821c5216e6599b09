#pragma once
// Attention of one query token's head group over its KV cache, read in place
// from the block-major KV pool (model/backend/kv_layout.h) through the
// sequence's block table.
//
// One call handles the `group` query heads that share one KV head (GQA; 1 for
// MHA), so each K and V row is loaded and converted from its stored type once
// for the whole group. Two passes over the context: scores q·k × scale for
// every position (kept in `scores`, group × n_ctx floats: a row per head, not
// a T×T matrix), a softmax per head, then out = Σ p·v. The AVX-512 version
// keeps the group's queries and outputs in registers for head_dim a multiple
// of 16 up to 256, and specialises on the KV element type, so the inner loops
// carry no calls and no type switches (the old per-row DotKv/AxpyKv calls
// through the dispatcher were ~45% of prefill and decode time).
//
// Several KV heads per call (AttnArgs::kv_heads): the pool stores a
// position's heads side by side (kv_layout.h), so one head's rows are a whole
// row apart and a per-head walk reads 128 of every 1,536 bytes (bench-110m):
// at batch 32 that ran at about a third of the streaming bandwidth. Walking a
// position's heads together reads the blocks front to back. Results are
// bitwise the same as one call per head (the same operations in the same
// order per head).
//
// Thread safety: pure function of its arguments; callers run many at once
// on disjoint outputs and scores.

#include <cstddef>
#include <cstdint>

#include "model/backend/dtype.h"

namespace strata::cpu {

struct AttnArgs {
  const float* q = nullptr;  // group heads, head_dim floats each, contiguous
  int group = 1;
  int head_dim = 0;
  int n_ctx = 0;  // positions [0, n_ctx) attended (causal: query pos + 1)
  // Position j's K row: kv_base + block_table[j / block_size] * block_bytes
  //   + k_offset + (j % block_size) * row_bytes; V likewise with v_offset.
  const uint8_t* kv_base = nullptr;
  size_t block_bytes = 0;
  const int32_t* block_table = nullptr;
  int block_size = 16;
  size_t k_offset = 0;
  size_t v_offset = 0;
  size_t row_bytes = 0;  // bytes between consecutive positions in a block
  DType kv_type = DType::kF16;  // f32, f16 or bf16
  float scale = 1.0f;
  float* out = nullptr;     // kv_heads × group × head_dim floats, overwritten
  float* scores = nullptr;  // scratch, >= kv_heads × group × n_ctx floats
  // Consecutive KV heads this call covers (1 = one head group, as above).
  // KV head i's K row of position j is the one above + i × kv_head_bytes (V
  // likewise); its query heads are q + (i × group + h) × head_dim, its
  // outputs out + (i × group + h) × head_dim. With several, the AVX-512
  // kernel walks positions in the outer loop and the heads inside, so it
  // reads each position's heads as one contiguous run (see attention.h top).
  int kv_heads = 1;
  size_t kv_head_bytes = 0;
  // Optional, kv_heads × group floats in the order of `out`'s heads: each
  // query head's log Σ_j exp(score_j) over the scaled scores. With it, calls
  // over disjoint position ranges (block_table and n_ctx of a range starting
  // on a block boundary) combine exactly into the whole: MergeAttention.
  float* lse = nullptr;
};

// REQUIRES: n_ctx >= 1, head_dim >= 1, group >= 1, kv_type a KV type
// (IsKvDType), every pointer valid for the sizes above. Results agree with
// AttendReference to float rounding (a few ulps per accumulated term).
void Attend(const AttnArgs& a);

// The plain per-position version through DotKv/Softmax/AxpyKv of the active
// SIMD level (the pre-kernel behaviour), for tests and odd shapes.
void AttendReference(const AttnArgs& a);

// Attention over a context split into `parts` position ranges, from the
// range results: out_p (parts × heads × head_dim floats, part p at
// out_p + p × heads × head_dim) and lse_p (parts × heads, AttnArgs::lse).
// out[h] = Σ_p exp(lse_p[h] - L_h) out_p[h], L_h = log Σ_p exp(lse_p[h]):
// the softmax over every position, as one call over the whole context would
// give up to float rounding. REQUIRES: parts >= 1.
void MergeAttention(const float* out_p, const float* lse_p, int parts, int heads, int head_dim, float* out);

namespace internal {
// Softmax of each of `rows` rows of n floats in place with `softmax`; when
// lse is set, lse[r] = log Σ exp(row r) (its max minus the log of the
// softmax value at the max, which is 1 / Σ exp(x - max)).
void SoftmaxRows(void (*softmax)(float*, int), float* rows_data, int rows, int n, float* lse);

// The AVX-512 kernel; only call when the CPU has AVX-512 (tests compare it
// with AttendReference). Shapes it does not specialise fall back to
// AttendReference.
void AttendAvx512(const AttnArgs& a);
}  // namespace internal

}  // namespace strata::cpu
