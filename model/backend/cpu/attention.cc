// Attend: dispatch and the reference version. The AVX-512 kernel is in
// attention_avx512.cc.

#include "model/backend/cpu/attention.h"

#include <algorithm>

#include "model/backend/cpu/cpu_features.h"
#include "model/backend/cpu/kernels.h"

namespace strata::cpu {

namespace {

// One call per KV head of a multi-head call.
template <class Fn>
void PerHead(const AttnArgs& a, Fn&& fn) {
  const size_t heads_elems = static_cast<size_t>(a.group) * static_cast<size_t>(a.head_dim);
  for (int i = 0; i < a.kv_heads; ++i) {
    AttnArgs one = a;
    one.kv_heads = 1;
    one.q = a.q + static_cast<size_t>(i) * heads_elems;
    one.out = a.out + static_cast<size_t>(i) * heads_elems;
    one.k_offset = a.k_offset + static_cast<size_t>(i) * a.kv_head_bytes;
    one.v_offset = a.v_offset + static_cast<size_t>(i) * a.kv_head_bytes;
    fn(one);
  }
}

}  // namespace

void AttendReference(const AttnArgs& a) {
  if (a.kv_heads > 1) {
    PerHead(a, [](const AttnArgs& one) { AttendReference(one); });
    return;
  }
  const int n = a.n_ctx;
  const int hd = a.head_dim;
  for (int j = 0; j < n; ++j) {
    const uint8_t* blk = a.kv_base + static_cast<size_t>(a.block_table[j / a.block_size]) * a.block_bytes;
    const uint8_t* krow = blk + a.k_offset + static_cast<size_t>(j % a.block_size) * a.row_bytes;
    for (int h = 0; h < a.group; ++h) {
      a.scores[static_cast<size_t>(h) * n + j] = DotKv(a.q + static_cast<size_t>(h) * hd, krow, a.kv_type, hd) * a.scale;
    }
  }
  for (int h = 0; h < a.group; ++h) {
    Softmax(a.scores + static_cast<size_t>(h) * n, n);
    std::fill(a.out + static_cast<size_t>(h) * hd, a.out + static_cast<size_t>(h + 1) * hd, 0.0f);
  }
  for (int j = 0; j < n; ++j) {
    const uint8_t* blk = a.kv_base + static_cast<size_t>(a.block_table[j / a.block_size]) * a.block_bytes;
    const uint8_t* vrow = blk + a.v_offset + static_cast<size_t>(j % a.block_size) * a.row_bytes;
    for (int h = 0; h < a.group; ++h) {
      AxpyKv(a.scores[static_cast<size_t>(h) * n + j], vrow, a.kv_type, a.out + static_cast<size_t>(h) * hd, hd);
    }
  }
}


void Attend(const AttnArgs& a) {
  if (ActiveSimdLevel() == SimdLevel::kAvx512) {
    internal::AttendAvx512(a);
    return;
  }
  AttendReference(a);
}

}  // namespace strata::cpu
