// Attend: dispatch and the reference version. The AVX-512 kernel is in
// attention_avx512.cc.

#include "model/backend/cpu/attention.h"

#include <algorithm>
#include <cmath>

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
    if (a.lse != nullptr) one.lse = a.lse + static_cast<size_t>(i) * static_cast<size_t>(a.group);
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
  internal::SoftmaxRows(&Softmax, a.scores, a.group, n, a.lse);
  for (int h = 0; h < a.group; ++h) {
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


namespace internal {

void SoftmaxRows(void (*softmax)(float*, int), float* rows_data, int rows, int n, float* lse) {
  for (int r = 0; r < rows; ++r) {
    float* x = rows_data + static_cast<size_t>(r) * static_cast<size_t>(n);
    int at = 0;
    if (lse != nullptr) {
      for (int j = 1; j < n; ++j)
        if (x[j] > x[at]) at = j;
    }
    const float mx = x[at];
    softmax(x, n);
    if (lse != nullptr) lse[r] = mx - std::log(x[at]);
  }
}

}  // namespace internal

void MergeAttention(const float* out_p, const float* lse_p, int parts, int heads, int head_dim, float* out) {
  const size_t hd = static_cast<size_t>(head_dim);
  const size_t part_floats = static_cast<size_t>(heads) * hd;
  for (int h = 0; h < heads; ++h) {
    float top = lse_p[h];
    for (int p = 1; p < parts; ++p) top = std::max(top, lse_p[static_cast<size_t>(p) * heads + h]);
    float* o = out + static_cast<size_t>(h) * hd;
    std::fill(o, o + hd, 0.0f);
    float total = 0.0f;
    for (int p = 0; p < parts; ++p) {
      const float w = std::exp(lse_p[static_cast<size_t>(p) * heads + h] - top);
      total += w;
      const float* src = out_p + static_cast<size_t>(p) * part_floats + static_cast<size_t>(h) * hd;
      for (size_t d = 0; d < hd; ++d) o[d] += w * src[d];
    }
    const float inv = 1.0f / total;
    for (size_t d = 0; d < hd; ++d) o[d] *= inv;
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
