#pragma once
// The block-major KV layout (DESIGN.md decision 1): one block holds K and V of
// every layer for `block_size` tokens, contiguous, so moving a block between
// tiers or nodes is one copy. Inside a block:
//
//   [layer 0: K[block_size][kv_dim], V[block_size][kv_dim]] [layer 1: ...] ...
//
// with kv_dim = n_kv_heads * head_dim, elements in `dtype` (f32, f16, bf16).

#include <cstddef>
#include <cstdint>

#include "model/backend/dtype.h"

namespace strata {

struct KvLayout {
  int n_layers = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int block_size = 16;
  DType dtype = DType::kF16;

  int kv_dim() const { return n_kv_heads * head_dim; }
  size_t elem_bytes() const { return GetDTypeInfo(dtype).block_bytes; }
  // Bytes of one token's K (or V) in one layer.
  size_t row_bytes() const { return static_cast<size_t>(kv_dim()) * elem_bytes(); }
  size_t block_bytes() const {
    return static_cast<size_t>(n_layers) * 2 * static_cast<size_t>(block_size) * row_bytes();
  }
  // KV bytes per token over all layers (what a cached token costs).
  size_t token_bytes() const { return static_cast<size_t>(n_layers) * 2 * row_bytes(); }
  // Offset inside a block of token `slot`'s K (kv = 0) or V (kv = 1) in `layer`.
  size_t Offset(int layer, int kv, int slot) const {
    return ((static_cast<size_t>(layer) * 2 + static_cast<size_t>(kv)) * static_cast<size_t>(block_size) +
            static_cast<size_t>(slot)) * row_bytes();
  }
};

}  // namespace strata
