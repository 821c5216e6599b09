// Int8-activation products: activation quantization, the scalar kernels (the
// reference the SIMD ones are tested against), the choice of table, and the
// driver MatMul calls.

#include "model/backend/cpu/matmul_q8.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <type_traits>

#include "model/backend/cpu/cpu_features.h"
#include "model/backend/cpu/quant.h"

namespace strata::cpu::internal {

namespace {

// Rows per pool task are rounded to this (whole cache lines of y).
constexpr int64_t kRowAlign = 16;
// Tokens per pass over a task's rows: their codes (tokens x cols bytes, about
// 24 KiB) stay in L1 while each weight row is decoded and used. Measured on
// bench-110m Q4_K prefill: 64 tokens (48 KiB at 768 columns) 0.79x of exact,
// 32: 0.85x, 16: 0.88x.
constexpr int64_t kTokenChunkBytes = 24 << 10;
int64_t TokenChunk(int64_t cols) { return std::clamp<int64_t>(kTokenChunkBytes / cols / 8 * 8, 8, 64); }
constexpr int64_t kMinTaskMacs = int64_t{1} << 16;

constexpr int kQ8ActBlock32 = 32;

// roundf (halves away from zero) for |v| <= 127.5, clamped to [-127, 127],
// without a libm call: truncate, then step by the exact remainder.
inline int8_t RoundHalfAway(float v) {
  int i = static_cast<int>(v);
  const float frac = v - static_cast<float>(i);
  if (frac >= 0.5f) ++i;
  if (frac <= -0.5f) --i;
  return static_cast<int8_t>(std::clamp(i, -127, 127));
}

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// RoundHalfAway for |v| <= kWideMax + 0.5, clamped to [-kWideMax, kWideMax].
inline int RoundHalfAwayWide(float v) {
  int i = static_cast<int>(v);
  const float frac = v - static_cast<float>(i);
  if (frac >= 0.5f) ++i;
  if (frac <= -0.5f) --i;
  return std::clamp(i, -kWideMax, kWideMax);
}

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

// The 256 codes (0..15 or 0..31) of super-block s of a Q4_K / Q5_K row, its
// sub-block scales and mins, d and dmin.
void SuperBlockCodes(int type_index, const uint8_t* row, int64_t s, uint8_t codes[256], uint8_t sc[8],
                     uint8_t m[8], float* d, float* dmin) {
  const uint8_t* qs;
  const uint8_t* scales;
  const uint8_t* qh = nullptr;
  if (type_index == kIdxQ4_K) {
    const auto* blk = reinterpret_cast<const BlockQ4_K*>(row) + s;
    qs = blk->qs;
    scales = blk->scales;
    *d = F16ToF32(blk->d);
    *dmin = F16ToF32(blk->dmin);
  } else {
    const auto* blk = reinterpret_cast<const BlockQ5_K*>(row) + s;
    qs = blk->qs;
    qh = blk->qh;
    scales = blk->scales;
    *d = F16ToF32(blk->d);
    *dmin = F16ToF32(blk->dmin);
  }
  for (int j = 0; j < 8; ++j) UnpackScaleMinK4(scales, j, &sc[j], &m[j]);
  for (int g = 0; g < 4; ++g) {
    for (int l = 0; l < 32; ++l) {
      uint8_t lo = qs[32 * g + l] & 15, hi = qs[32 * g + l] >> 4;
      if (qh != nullptr) {
        lo = static_cast<uint8_t>(lo | (((qh[l] >> (2 * g)) & 1) << 4));
        hi = static_cast<uint8_t>(hi | (((qh[l] >> (2 * g + 1)) & 1) << 4));
      }
      codes[64 * g + l] = lo;
      codes[64 * g + 32 + l] = hi;
    }
  }
}

// Per super-block: acc += (d_x d) * sum_j sc_j dot_j and
// mins += (d_x dmin) * sum_j m_j bsum_j (integer sums exact); the row's value
// is acc - mins.
template <int kIndex>
void ScalarKRows(const Q8Args& a) {
  const int64_t nsb = a.cols / 256;
  uint8_t codes[256], sc[8], m[8];
  for (int64_t r = a.row_begin; r < a.row_end; ++r) {
    const uint8_t* row = a.w + r * a.row_bytes;
    for (int64_t t = 0; t < a.n_tokens; ++t) {
      const int8_t* xq = a.xq + t * a.cols;
      float acc = 0.f, mins = 0.f;
      for (int64_t s = 0; s < nsb; ++s) {
        float d = 0.f, dmin = 0.f;
        SuperBlockCodes(kIndex, row, s, codes, sc, m, &d, &dmin);
        int32_t i1 = 0, i2 = 0;
        for (int j = 0; j < 8; ++j) {
          int32_t dot = 0;
          for (int l = 0; l < 32; ++l) dot += int32_t{codes[32 * j + l]} * xq[256 * s + 32 * j + l];
          i1 += int32_t{sc[j]} * dot;
          i2 += int32_t{m[j]} * a.xbsum[t * (a.cols / 32) + 8 * s + j];
        }
        const float dx = a.xd[t * nsb + s];
        acc += (dx * d) * static_cast<float>(i1);
        mins += (dx * dmin) * static_cast<float>(i2);
      }
      a.y[t * a.y_stride + r] = acc - mins;
    }
  }
}

// The 256 codes (0..63) of super-block s of a Q6_K row, its 16 scales and d.
void Q6Codes(const uint8_t* row, int64_t s, uint8_t codes[256], int8_t sc[16], float* d) {
  const auto* blk = reinterpret_cast<const BlockQ6_K*>(row) + s;
  *d = F16ToF32(blk->d);
  std::copy(blk->scales, blk->scales + 16, sc);
  for (int h = 0; h < 2; ++h) {
    const uint8_t* ql = blk->ql + 64 * h;
    const uint8_t* qh = blk->qh + 32 * h;
    for (int l = 0; l < 32; ++l) {
      codes[128 * h + l] = static_cast<uint8_t>((ql[l] & 15) | (((qh[l] >> 0) & 3) << 4));
      codes[128 * h + l + 32] = static_cast<uint8_t>((ql[l + 32] & 15) | (((qh[l] >> 2) & 3) << 4));
      codes[128 * h + l + 64] = static_cast<uint8_t>((ql[l] >> 4) | (((qh[l] >> 4) & 3) << 4));
      codes[128 * h + l + 96] = static_cast<uint8_t>((ql[l + 32] >> 4) | (((qh[l] >> 6) & 3) << 4));
    }
  }
}

// Per super-block: acc += (d_x d) * sum_j sc_j (dot_j - 32 bsum16_j), the
// integer sum exact.
void ScalarQ6Rows(const Q8Args& a) {
  const int64_t nsb = a.cols / 256;
  uint8_t codes[256];
  int8_t sc[16];
  for (int64_t r = a.row_begin; r < a.row_end; ++r) {
    const uint8_t* row = a.w + r * a.row_bytes;
    for (int64_t t = 0; t < a.n_tokens; ++t) {
      const int8_t* xq = a.xq + t * a.cols;
      float acc = 0.f;
      for (int64_t s = 0; s < nsb; ++s) {
        float d = 0.f;
        Q6Codes(row, s, codes, sc, &d);
        int32_t isum = 0;
        for (int j = 0; j < 16; ++j) {
          int32_t dot = 0;
          for (int l = 0; l < 16; ++l) dot += int32_t{codes[16 * j + l]} * xq[256 * s + 16 * j + l];
          isum += sc[j] * (dot - 32 * a.xbsum16[t * (a.cols / 16) + 16 * s + j]);
        }
        acc += (a.xd[t * nsb + s] * d) * static_cast<float>(isum);
      }
      a.y[t * a.y_stride + r] = acc;
    }
  }
}

template <int kIndex>
void ScalarRows(const Q8Args& a) {
  const int64_t nb = a.cols / kQ8ActBlock32;
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
    {nullptr, nullptr, nullptr, &ScalarRows<kIdxQ4_0>, &ScalarRows<kIdxQ8_0>, &ScalarKRows<kIdxQ4_K>,
     &ScalarKRows<kIdxQ5_K>, &ScalarQ6Rows},
    &QuantizeActivationRow,
    kAutoInt8KQuants,
    /*reads_lanes=*/false,
    /*q8_0_wide=*/nullptr,
    &QuantizeActivationRowWide,
    /*auto_wide=*/false};

}  // namespace

int Q8ActBlockFor(DType t) {
  return t == DType::kQ4_K || t == DType::kQ5_K || t == DType::kQ6_K ? 256 : kQ8ActBlock32;
}

void QuantizeActivationRow(const float* x, int64_t cols, int block, int8_t* q, float* d, int16_t* bsum,
                           int16_t* bsum16) {
  for (int64_t b = 0; b < cols / block; ++b) {
    const float* xb = x + b * block;
    float amax = 0.f;
    bool finite = true;
    for (int j = 0; j < block; ++j) {
      finite = finite && std::isfinite(xb[j]);
      amax = std::max(amax, std::fabs(xb[j]));
    }
    int8_t* qb = q + b * block;
    if (!finite) {
      d[b] = std::numeric_limits<float>::quiet_NaN();
      std::fill(qb, qb + block, int8_t{0});
    } else {
      // ggml's quantize_row_q8_0_ref: d = amax / 127, q = round(x * (1 / d)).
      // Where d is subnormal, 1 / d overflows: x / d instead (ggml's code
      // would round infinities there).
      const float db = amax / 127.f;
      const float id = db != 0.f ? 1.f / db : 0.f;
      d[b] = db;
      const bool tiny = !std::isfinite(id);
      for (int j = 0; j < block; ++j) qb[j] = RoundHalfAway(tiny ? xb[j] / db : xb[j] * id);
    }
  }
  for (int64_t k = 0; k < cols / 16; ++k) {
    int sum = 0;
    for (int j = 0; j < 16; ++j) sum += q[k * 16 + j];
    bsum16[k] = static_cast<int16_t>(sum);
    if (k % 2 == 1) bsum[k / 2] = static_cast<int16_t>(bsum16[k - 1] + sum);
  }
}

void QuantizeActivations(const float* x, int64_t n_tokens, int64_t cols, int64_t x_stride, int block,
                         Q8Activations* out, ThreadPool* pool) {
  out->cols = cols;
  out->n_tokens = n_tokens;
  out->block = block;
  out->wide = false;
  out->q.resize(static_cast<size_t>(n_tokens * cols));
  out->d.resize(static_cast<size_t>(n_tokens * (cols / block)));
  out->bsum.resize(static_cast<size_t>(n_tokens * (cols / kQ8ActBlock32)));
  out->bsum16.resize(static_cast<size_t>(n_tokens * (cols / 16)));
  const Q8QuantizeFn quantize = ActiveQ8Kernels().quantize;
  auto rows = [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      quantize(x + t * x_stride, cols, block, out->q.data() + t * cols,
                            out->d.data() + t * (cols / block), out->bsum.data() + t * (cols / kQ8ActBlock32),
                            out->bsum16.data() + t * (cols / 16));
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

void QuantizeActivationRowWide(const float* x, int64_t cols, int8_t* hi, int8_t* lo, float* d, int16_t* hbsum,
                               int16_t* lbsum) {
  for (int64_t b = 0; b < cols / kQ8ActBlock32; ++b) {
    const float* xb = x + b * kQ8ActBlock32;
    int8_t* hb = hi + b * kQ8ActBlock32;
    int8_t* lb = lo + b * kQ8ActBlock32;
    float amax = 0.f;
    bool finite = true;
    for (int j = 0; j < kQ8ActBlock32; ++j) {
      finite = finite && std::isfinite(xb[j]);
      amax = std::max(amax, std::fabs(xb[j]));
    }
    int hsum = 0, lsum = 0;
    if (!finite) {
      d[b] = std::numeric_limits<float>::quiet_NaN();
      std::fill(hb, hb + kQ8ActBlock32, int8_t{0});
      std::fill(lb, lb + kQ8ActBlock32, int8_t{0});
    } else {
      const float db = amax / static_cast<float>(kWideMax);
      const float id = db != 0.f ? 1.f / db : 0.f;
      d[b] = db;
      const bool tiny = !std::isfinite(id);  // d subnormal: as QuantizeActivationRow
      for (int j = 0; j < kQ8ActBlock32; ++j) {
        const int q = RoundHalfAwayWide(tiny ? xb[j] / db : xb[j] * id);
        // hi = q / 255 rounded to nearest (255 is odd: no ties), |lo| <= 127.
        const int h = q >= 0 ? (q + 127) / 255 : -((127 - q) / 255);
        hb[j] = static_cast<int8_t>(h);
        lb[j] = static_cast<int8_t>(q - 255 * h);
        hsum += hb[j];
        lsum += lb[j];
      }
    }
    hbsum[b] = static_cast<int16_t>(hsum);
    lbsum[b] = static_cast<int16_t>(lsum);
  }
}

void QuantizeActivationsWide(const float* x, int64_t n_tokens, int64_t cols, int64_t x_stride, Q8Activations* out,
                             ThreadPool* pool) {
  out->cols = cols;
  out->n_tokens = n_tokens;
  out->block = kQ8ActBlock32;
  out->wide = true;
  const int64_t nb = cols / kQ8ActBlock32;
  out->q.resize(static_cast<size_t>(n_tokens * cols));
  out->ql.resize(static_cast<size_t>(n_tokens * cols));
  out->d.resize(static_cast<size_t>(n_tokens * nb));
  out->bsum.resize(static_cast<size_t>(n_tokens * nb));
  out->lbsum.resize(static_cast<size_t>(n_tokens * nb));
  const Q8QuantizeWideFn quantize = ActiveQ8Kernels().quantize_wide;
  auto rows = [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      quantize(x + t * x_stride, cols, out->q.data() + t * cols, out->ql.data() + t * cols,
                                out->d.data() + t * nb, out->bsum.data() + t * nb, out->lbsum.data() + t * nb);
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

bool Q8Supported(DType t) {
  return t == DType::kQ8_0 || t == DType::kQ4_0 || t == DType::kQ4_K || t == DType::kQ5_K || t == DType::kQ6_K;
}

namespace {
bool IsKLaneType(DType t) { return t == DType::kQ4_K || t == DType::kQ5_K || t == DType::kQ6_K; }
}  // namespace

bool LanePackable(DType t) {
  return t == DType::kQ8_0 || t == DType::kQ4_0 || IsKLaneType(t);
}

bool ReadsLanes(const Q8KernelTable& table, DType t) {
  if (IsKLaneType(t)) return table.reads_k_lanes;
  return table.reads_lanes && LanePackable(t);
}

int64_t LaneGroupBytes(DType t, int64_t cols) {
  if (IsKLaneType(t)) return cols / 256 * LaneSuperBytes(t);
  return kLaneRows * static_cast<int64_t>(RowBytes(t, cols));
}

size_t LanePackedBytes(const Tensor& w) {
  return static_cast<size_t>(w.rows() / kLaneRows * LaneGroupBytes(w.type, w.cols()));
}

namespace {

// Row i's 4 bytes at src + 4k into vector k (64 bytes apart) of dst, k = 0..7.
void Transpose32(const uint8_t* src, int i, uint8_t* dst) {
  for (int k = 0; k < 8; ++k) std::memcpy(dst + 64 * k + 4 * i, src + 4 * k, 4);
}

// Q4_K's layout, and Q5_K's (the same, then the qh bytes).
template <class Block>
void PackQ45KSuperBlock(const uint8_t* const* rows, int64_t s, uint8_t* o) {
  for (int i = 0; i < kLaneRows; ++i) {
    const auto* blk = reinterpret_cast<const Block*>(rows[i]) + s;
    std::memcpy(o + 2 * i, &blk->d, 2);
    std::memcpy(o + 32 + 2 * i, &blk->dmin, 2);
    for (int j = 0; j < 8; ++j) {
      uint8_t sc = 0, m = 0;
      UnpackScaleMinK4(blk->scales, j, &sc, &m);
      o[64 + 16 * j + i] = sc;
      o[192 + 32 * (j / 2) + 2 * i + j % 2] = m;
    }
    for (int q = 0; q < 4; ++q) Transpose32(blk->qs + 32 * q, i, o + 320 + 512 * q);
    if constexpr (std::is_same_v<Block, BlockQ5_K>) Transpose32(blk->qh, i, o + 320 + 4 * 512);
  }
}

void PackQ6KSuperBlock(const uint8_t* const* rows, int64_t s, uint8_t* o) {
  for (int i = 0; i < kLaneRows; ++i) {
    const auto* blk = reinterpret_cast<const BlockQ6_K*>(rows[i]) + s;
    std::memcpy(o + 2 * i, &blk->d, 2);
    for (int j = 0; j < 16; ++j) o[32 + 16 * j + i] = static_cast<uint8_t>(blk->scales[j]);
    for (int h = 0; h < 2; ++h) {
      uint8_t* half = o + 288 + 1536 * h;
      Transpose32(blk->ql + 64 * h, i, half);
      Transpose32(blk->ql + 64 * h + 32, i, half + 512);
      Transpose32(blk->qh + 32 * h, i, half + 1024);
    }
  }
}

}  // namespace

void PackKLaneGroup(DType t, const uint8_t* const* rows, int64_t cols, uint8_t* out) {
  const int64_t bytes = LaneSuperBytes(t);
  for (int64_t s = 0; s < cols / 256; ++s) {
    if (t == DType::kQ4_K) {
      PackQ45KSuperBlock<BlockQ4_K>(rows, s, out + s * bytes);
    } else if (t == DType::kQ5_K) {
      PackQ45KSuperBlock<BlockQ5_K>(rows, s, out + s * bytes);
    } else {
      PackQ6KSuperBlock(rows, s, out + s * bytes);
    }
  }
}

void PackLanes(const Tensor& w, uint8_t* out) {
  if (IsKLaneType(w.type)) {
    const int64_t group_bytes = LaneGroupBytes(w.type, w.cols());
    for (int64_t g = 0; g < w.rows() / kLaneRows; ++g) {
      const uint8_t* rows[kLaneRows];
      for (int i = 0; i < kLaneRows; ++i) rows[i] = w.row(g * kLaneRows + i);
      PackKLaneGroup(w.type, rows, w.cols(), out + g * group_bytes);
    }
    return;
  }
  const bool q4 = w.type == DType::kQ4_0;
  const int64_t cols = w.cols();
  const int64_t nb = cols / kQ8ActBlock32;
  const size_t row_bytes = RowBytes(w.type, cols);
  const size_t block_bytes = q4 ? sizeof(BlockQ4_0) : sizeof(BlockQ8_0);
  const int code_bytes = q4 ? 16 : 32;  // per row and block
  const uint8_t flip = q4 ? 0 : 0x80;   // Q8_0's codes as unsigned bytes
  for (int64_t g = 0; g < w.rows() / kLaneRows; ++g) {
    uint8_t* scales = out + static_cast<size_t>(g * kLaneRows) * row_bytes;
    uint8_t* codes = scales + nb * 32;
    for (int64_t b = 0; b < nb; ++b) {
      uint8_t* bc = codes + b * kLaneRows * code_bytes;
      for (int i = 0; i < kLaneRows; ++i) {
        const uint8_t* blk = w.row(g * kLaneRows + i) + b * block_bytes;
        std::memcpy(scales + b * 32 + 2 * i, blk, 2);  // the f16 scale leads each block
        for (int k = 0; k < code_bytes / 4; ++k) {
          for (int c = 0; c < 4; ++c) bc[64 * k + 4 * i + c] = static_cast<uint8_t>(blk[2 + 4 * k + c] ^ flip);
        }
      }
    }
  }
}

double Q8ReferenceDot(DType t, const uint8_t* row, int64_t cols, const int8_t* q, const float* d,
                      const int16_t* bsum, const int16_t* bsum16) {
  const int index = TypeIndex(t);
  double sum = 0.0;
  if (index == kIdxQ6_K) {
    uint8_t codes[256];
    int8_t sc[16];
    for (int64_t s = 0; s < cols / 256; ++s) {
      float dw = 0.f;
      Q6Codes(row, s, codes, sc, &dw);
      int64_t isum = 0;
      for (int j = 0; j < 16; ++j) {
        int64_t dot = 0;
        for (int l = 0; l < 16; ++l) dot += int64_t{codes[16 * j + l]} * q[256 * s + 16 * j + l];
        isum += sc[j] * (dot - 32 * int64_t{bsum16[16 * s + j]});
      }
      sum += static_cast<double>(d[s]) * double{dw} * static_cast<double>(isum);
    }
    return sum;
  }
  if (index == kIdxQ4_K || index == kIdxQ5_K) {
    uint8_t codes[256], sc[8], m[8];
    for (int64_t s = 0; s < cols / 256; ++s) {
      float dw = 0.f, dmin = 0.f;
      SuperBlockCodes(index, row, s, codes, sc, m, &dw, &dmin);
      int64_t i1 = 0, i2 = 0;
      for (int j = 0; j < 8; ++j) {
        int64_t dot = 0;
        for (int l = 0; l < 32; ++l) dot += int64_t{codes[32 * j + l]} * q[256 * s + 32 * j + l];
        i1 += sc[j] * dot;
        i2 += int64_t{m[j]} * bsum[8 * s + j];
      }
      sum += static_cast<double>(d[s]) * (double{dw} * static_cast<double>(i1) - double{dmin} * static_cast<double>(i2));
    }
    return sum;
  }
  int8_t codes[32];
  for (int64_t b = 0; b < cols / kQ8ActBlock32; ++b) {
    const double dw = BlockCodes(index, row, b, codes);
    int64_t isum = 0;
    for (int j = 0; j < 32; ++j) isum += int64_t{codes[j]} * q[b * 32 + j];
    sum += static_cast<double>(isum) * dw * static_cast<double>(d[b]);
  }
  return sum;
}

double Q8ReferenceDotWide(const uint8_t* row, int64_t cols, const int8_t* hi, const int8_t* lo, const float* d) {
  int8_t codes[32];
  double sum = 0.0;
  for (int64_t b = 0; b < cols / kQ8ActBlock32; ++b) {
    const double dw = BlockCodes(kIdxQ8_0, row, b, codes);
    int64_t isum = 0;
    for (int j = 0; j < 32; ++j) isum += int64_t{codes[j]} * (255 * int64_t{hi[b * 32 + j]} + lo[b * 32 + j]);
    sum += static_cast<double>(isum) * dw * static_cast<double>(d[b]);
  }
  return sum;
}

void MatMulQ8(const Tensor& w, const float* x, int64_t n_tokens, float* y, ThreadPool& pool, bool wide) {
  const int64_t rows = w.rows();
  const int64_t cols = w.cols();
  // The caller's buffer; named through a plain reference because a lambda
  // naming a thread_local would reach each pool thread's own instance.
  thread_local Q8Activations caller_act;
  Q8Activations& act = caller_act;
  const int block = Q8ActBlockFor(w.type);
  if (wide) {
    QuantizeActivationsWide(x, n_tokens, cols, cols, &act, &pool);
  } else {
    QuantizeActivations(x, n_tokens, cols, cols, block, &act, &pool);
  }
  const Q8RowsFn fn = wide ? ActiveQ8Kernels().q8_0_wide : ActiveQ8Kernels().rows[TypeIndex(w.type)];
  Q8Args base;
  base.w = w.data;
  base.lanes = w.lanes;
  base.row_bytes = RowBytes(w.type, cols);
  base.cols = cols;
  base.y_stride = rows;
  const int64_t chunk = TokenChunk(wide ? 2 * cols : cols);  // wide: two planes
  auto run = [&](int64_t r0, int64_t r1) {
    for (int64_t t0 = 0; t0 < n_tokens; t0 += chunk) {
      Q8Args a = base;
      a.row_begin = r0;
      a.row_end = r1;
      a.n_tokens = std::min(chunk, n_tokens - t0);
      a.xq = act.q.data() + t0 * cols;
      a.xd = act.d.data() + t0 * (cols / block);
      a.xbsum = act.bsum.data() + t0 * (cols / kQ8ActBlock32);
      if (wide) {
        a.xql = act.ql.data() + t0 * cols;
        a.xlbsum = act.lbsum.data() + t0 * (cols / kQ8ActBlock32);
      } else {
        a.xbsum16 = act.bsum16.data() + t0 * (cols / 16);
      }
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
  const int64_t pieces = n_tokens >= 64 ? tasks * 4 : tasks;
  int64_t per = CeilDiv(rows, pieces);
  if (per > kRowAlign) per = CeilDiv(per, kRowAlign) * kRowAlign;
  pool.Run(static_cast<int>(CeilDiv(rows, per)), [&](int task) {
    const int64_t r0 = task * per;
    run(r0, std::min(rows, r0 + per));
  });
}

}  // namespace strata::cpu::internal
