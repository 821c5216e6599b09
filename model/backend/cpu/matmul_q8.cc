// Int8-activation products: activation quantization, the scalar kernels (the
// reference the SIMD ones are tested against), the choice of table, and the
// driver MatMul calls.

#include "model/backend/cpu/matmul_q8.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "model/backend/cpu/cpu_features.h"
#include "model/backend/cpu/quant.h"

namespace strata::cpu::internal {

namespace {

constexpr int kIdxQ4_0 = 3;
constexpr int kIdxQ8_0 = 4;
// Rows per pool task are rounded to this (whole cache lines of y).
constexpr int64_t kRowAlign = 16;
// Tokens per pass over a task's rows: their codes (64 x cols bytes) stay in
// L2 while each group of weight rows is reused from L1.
constexpr int64_t kTokenChunk = 64;
constexpr int64_t kMinTaskMacs = int64_t{1} << 16;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// The 32 signed integer codes of block `b` of a Q8_0 or Q4_0 row, and its
// scale.
float BlockCodes(int type_index, const uint8_t* row, int64_t b, int8_t codes[32]) {
  if (type_index == kIdxQ8_0) {
    const auto* blk = reinterpret_cast<const BlockQ8_0*>(row) + b;
    std::copy(blk->qs, blk->qs + 32, codes);
    return F16ToF32(blk->d);
  }
  const auto* blk = reinterpret_cast<const BlockQ4_0*>(row) + b;
  for (int j = 0; j < 16; ++j) {
    codes[j] = static_cast<int8_t>((blk->qs[j] & 15) - 8);
    codes[j + 16] = static_cast<int8_t>((blk->qs[j] >> 4) - 8);
  }
  return F16ToF32(blk->d);
}

template <int kIndex>
void ScalarRows(const Q8Args& a) {
  const int64_t nb = a.cols / kQ8ActBlock;
  int8_t codes[32];
  for (int64_t r = a.row_begin; r < a.row_end; ++r) {
    const uint8_t* row = a.w + r * a.row_bytes;
    for (int64_t t = 0; t < a.n_tokens; ++t) {
      const int8_t* xq = a.xq + t * a.cols;
      const float* xd = a.xd + t * nb;
      float acc = 0.f;
      for (int64_t b = 0; b < nb; ++b) {
        const float dw = BlockCodes(kIndex, row, b, codes);
        int32_t isum = 0;
        for (int j = 0; j < 32; ++j) isum += int32_t{codes[j]} * xq[b * 32 + j];
        acc += static_cast<float>(isum) * (dw * xd[b]);
      }
      a.y[t * a.y_stride + r] = acc;
    }
  }
}

constexpr Q8KernelTable kScalarQ8 = {
    "scalar",
    {nullptr, nullptr, nullptr, &ScalarRows<kIdxQ4_0>, &ScalarRows<kIdxQ8_0>, nullptr, nullptr,
     nullptr}};

}  // namespace

void QuantizeActivationRow(const float* x, int64_t cols, int8_t* q, float* d) {
  for (int64_t b = 0; b < cols / kQ8ActBlock; ++b) {
    const float* xb = x + b * kQ8ActBlock;
    float amax = 0.f;
    bool finite = true;
    for (int j = 0; j < kQ8ActBlock; ++j) {
      finite = finite && std::isfinite(xb[j]);
      amax = std::max(amax, std::fabs(xb[j]));
    }
    int8_t* qb = q + b * kQ8ActBlock;
    if (!finite) {
      d[b] = std::numeric_limits<float>::quiet_NaN();
      std::fill(qb, qb + kQ8ActBlock, int8_t{0});
      continue;
    }
    // ggml's quantize_row_q8_0_ref: d = amax / 127, q = round(x / d).
    const float db = amax / 127.f;
    const float id = db != 0.f ? 1.f / db : 0.f;
    d[b] = db;
    for (int j = 0; j < kQ8ActBlock; ++j) {
      qb[j] = static_cast<int8_t>(std::clamp(std::lround(xb[j] * id), -127L, 127L));
    }
  }
}

void QuantizeActivations(const float* x, int64_t n_tokens, int64_t cols, int64_t x_stride,
                         Q8Activations* out, ThreadPool* pool) {
  out->cols = cols;
  out->n_tokens = n_tokens;
  const int64_t nb = cols / kQ8ActBlock;
  out->q.resize(static_cast<size_t>(n_tokens * cols));
  out->d.resize(static_cast<size_t>(n_tokens * nb));
  auto rows = [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      QuantizeActivationRow(x + t * x_stride, cols, out->q.data() + t * cols,
                            out->d.data() + t * nb);
    }
  };
  if (pool == nullptr || pool->num_threads() <= 1 || n_tokens * cols < (int64_t{1} << 16)) {
    rows(0, n_tokens);
    return;
  }
  pool->ParallelFor(static_cast<size_t>(n_tokens), 1, [&](size_t b, size_t e) {
    rows(static_cast<int64_t>(b), static_cast<int64_t>(e));
  });
}

const Q8KernelTable& ScalarQ8Kernels() { return kScalarQ8; }

const Q8KernelTable& ActiveQ8Kernels() {
  const SimdLevel level = ActiveSimdLevel();
  if (level >= SimdLevel::kAvx512) {
    if (const Q8KernelTable* t = Avx512VnniQ8Kernels()) return *t;
  }
  if (level >= SimdLevel::kAvx2) {
    if (const Q8KernelTable* t = Avx2Q8Kernels()) return *t;
  }
  return kScalarQ8;
}

bool Q8Supported(DType t) { return t == DType::kQ8_0 || t == DType::kQ4_0; }

double Q8ReferenceDot(DType t, const uint8_t* row, int64_t cols, const int8_t* q, const float* d) {
  const int index = TypeIndex(t);
  int8_t codes[32];
  double sum = 0.0;
  for (int64_t b = 0; b < cols / kQ8ActBlock; ++b) {
    const double dw = BlockCodes(index, row, b, codes);
    int64_t isum = 0;
    for (int j = 0; j < 32; ++j) isum += int64_t{codes[j]} * q[b * 32 + j];
    sum += static_cast<double>(isum) * dw * static_cast<double>(d[b]);
  }
  return sum;
}

void MatMulQ8(const Tensor& w, const float* x, int64_t n_tokens, float* y, ThreadPool& pool) {
  const int64_t rows = w.rows();
  const int64_t cols = w.cols();
  // The caller's buffer; named through a plain reference because a lambda
  // naming a thread_local would reach each pool thread's own instance.
  thread_local Q8Activations caller_act;
  Q8Activations& act = caller_act;
  QuantizeActivations(x, n_tokens, cols, cols, &act, &pool);
  const Q8RowsFn fn = ActiveQ8Kernels().rows[TypeIndex(w.type)];
  Q8Args base;
  base.w = w.data;
  base.row_bytes = RowBytes(w.type, cols);
  base.cols = cols;
  base.y_stride = rows;
  const int64_t nb = cols / kQ8ActBlock;
  auto run = [&](int64_t r0, int64_t r1) {
    for (int64_t t0 = 0; t0 < n_tokens; t0 += kTokenChunk) {
      Q8Args a = base;
      a.row_begin = r0;
      a.row_end = r1;
      a.n_tokens = std::min(kTokenChunk, n_tokens - t0);
      a.xq = act.q.data() + t0 * cols;
      a.xd = act.d.data() + t0 * nb;
      a.y = y + t0 * rows;
      fn(a);
    }
  };
  const int64_t macs_per_row = std::max<int64_t>(cols * n_tokens, 1);
  const int64_t min_rows = std::max<int64_t>(1, kMinTaskMacs / macs_per_row);
  const int64_t tasks = std::min<int64_t>(pool.num_threads(), CeilDiv(rows, min_rows));
  if (tasks <= 1) {
    run(0, rows);
    return;
  }
  // Small batches: one contiguous range per thread. Large ones: more, smaller
  // tasks handed out dynamically, so a slow thread takes fewer.
  const int64_t pieces = n_tokens >= kTokenChunk ? tasks * 4 : tasks;
  int64_t per = CeilDiv(rows, pieces);
  if (per > kRowAlign) per = CeilDiv(per, kRowAlign) * kRowAlign;
  pool.Run(static_cast<int>(CeilDiv(rows, per)), [&](int task) {
    const int64_t r0 = task * per;
    run(r0, std::min(rows, r0 + per));
  });
}

}  // namespace strata::cpu::internal
