// MatMul: validation, the choice between the dot-kernel path (small batches)
// and the tiled sgemm path (large batches), and how each is spread over the
// thread pool. The kernels are in matmul_kernels_*.cc, the BLAS wrapper in
// matmul_gemm.cc.

#include "model/backend/cpu/matmul.h"

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "common/aligned_vector.h"
#include "model/backend/cpu/matmul_internal.h"
#include "model/backend/cpu/matmul_kernels.h"
#include "model/backend/cpu/matmul_q8.h"
#include "model/backend/cpu/quant.h"

namespace strata::cpu {

namespace internal {

namespace {

// Below this many multiply-adds a task is not worth waking a thread for.
constexpr int64_t kMinTaskMacs = int64_t{1} << 16;
// Rows per dot task are rounded to this, so tasks touch whole cache lines of y
// for most shapes.
constexpr int64_t kRowAlign = 16;
// Target size of one dequantized sgemm tile (floats): 2 MiB, 256 rows of
// 2048. Measured (bench/blas_compare, oneDNN): 128-512 rows are within noise
// of each other at 64 tokens; 64 rows lose up to 2x at 16-64 tokens (per-call
// overhead), and bigger tiles help slightly at 512 tokens.
constexpr int64_t kTileFloats = int64_t{1} << 19;
// oneDNN's sgemm is fast for M <= 8 tokens and M >= 64 but about half as fast
// in between (M = 16: 53 GFLOP/s, M = 8: 112). Batches in that range are
// multiplied 8 tokens at a time (the tile stays in cache between chunks).
// OpenBLAS is slow at small M either way, and chunking makes it slower.
constexpr int64_t kGemmChunkTokens = 8;
constexpr int64_t kGemmNoChunkTokens = 64;

int64_t CeilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

// A per-thread, 64-byte aligned f32 buffer that only grows.
class Scratch {
 public:
  float* Get(int64_t n) {
    if (n > size_) {
      data_.reset(new (std::align_val_t{64}) float[static_cast<size_t>(n)]);
      size_ = n;
    }
    return data_.get();
  }

 private:
  struct Free {
    void operator()(float* p) const { ::operator delete[](p, std::align_val_t{64}); }
  };
  std::unique_ptr<float[], Free> data_;
  int64_t size_ = 0;
};

float* ThreadScratch(int64_t n) {
  thread_local Scratch scratch;
  return scratch.Get(n);
}

// A second per-thread buffer: one panel's partial products.
float* ThreadPartial(int64_t n) {
  thread_local Scratch partial;
  return partial.Get(n);
}

// Whether w carries a column-panel copy the f32-activation paths read.
bool HasPanels(const Tensor& w) {
  return w.panels != nullptr && w.panel_cols > 0 && w.panel_cols < w.cols();
}

// Row r of w decoded to f32 into dst (cols floats), from its panels when it
// has them.
void DecodeWeightRow(const Tensor& w, DequantRowFn dequant, int64_t r, float* dst) {
  if (!HasPanels(w)) {
    dequant(w.data + static_cast<size_t>(r) * RowBytes(w.type, w.cols()), dst, w.cols());
    return;
  }
  const int64_t np = w.panel_count();
  for (int64_t p = 0; p < np; ++p) {
    dequant(w.panel(p) + static_cast<size_t>(r) * w.panel_row_bytes(p), dst + p * w.panel_cols,
            w.panel_width(p));
  }
}

int64_t TileRows(int64_t cols, int64_t requested) {
  if (requested > 0) return requested;
  const int64_t r = (kTileFloats / std::max<int64_t>(cols, 1)) / kRowAlign * kRowAlign;
  return std::clamp<int64_t>(r, 64, 512);
}

// Runs `dot` over rows [b, e) of `base`, panel by panel where w has panels:
// panel 0 writes y, each later one writes this thread's buffer and is added
// in, in panel order (so a row's sum does not depend on the thread).
void DotRowRange(DotRowsFn dot, const Tensor& w, const DotArgs& base, int64_t b, int64_t e) {
  DotArgs a = base;
  a.row_begin = b;
  a.row_end = e;
  if (!HasPanels(w) || base.xsum != nullptr) {  // xsum is per whole row
    dot(a);
    return;
  }
  const int64_t np = w.panel_count();
  const int64_t xs = base.x_stride > 0 ? base.x_stride : base.cols;
  float* part = np > 1 ? ThreadPartial(base.n_tokens * base.y_stride) : nullptr;
  for (int64_t p = 0; p < np; ++p) {
    a.w = w.panel(p);
    a.row_bytes = w.panel_row_bytes(p);
    a.cols = w.panel_width(p);
    a.x = base.x + p * w.panel_cols;
    a.x_stride = xs;
    a.y = p == 0 ? base.y : part;
    dot(a);
    if (p == 0) continue;
    for (int64_t t = 0; t < base.n_tokens; ++t) {
      float* yt = base.y + t * base.y_stride;
      const float* pt = part + t * base.y_stride;
      for (int64_t r = b; r < e; ++r) yt[r] += pt[r];
    }
  }
}

void DotPath(const KernelTable& kernels, int type_index, bool tile, const Tensor& w, const DotArgs& base,
             ThreadPool& pool) {
  const DotRowsFn dot = tile ? kernels.tile[type_index] : kernels.dot[type_index];
  const int64_t scratch_floats = tile ? TileScratchFloats(base.cols) : 0;
  const int64_t rows = base.row_end;
  const int64_t macs_per_row = std::max<int64_t>(base.cols * base.n_tokens, 1);
  const int64_t min_rows = std::max<int64_t>(1, kMinTaskMacs / macs_per_row);
  const int64_t tasks = std::min<int64_t>(pool.num_threads(), CeilDiv(rows, min_rows));
  if (tasks <= 1) {
    DotArgs a = base;
    if (tile) a.scratch = ThreadScratch(scratch_floats);
    DotRowRange(dot, w, a, 0, rows);
    return;
  }
  int64_t per = CeilDiv(rows, tasks);
  if (per > kRowAlign) per = CeilDiv(per, kRowAlign) * kRowAlign;
  pool.Run(static_cast<int>(CeilDiv(rows, per)), [&](int task) {
    DotArgs a = base;
    if (tile) a.scratch = ThreadScratch(scratch_floats);
    DotRowRange(dot, w, a, task * per, std::min(rows, task * per + per));
  });
}

// sgemm of all n_tokens rows of x against n weight rows b (row-major, ldb),
// in token chunks where the BLAS is slow with the whole batch.
void SgemmTokens(BlasLibrary lib, int threads, int64_t n_tokens, int64_t n, int64_t k,
                 const float* x, const float* b, int64_t ldb, float* y, int64_t ldy) {
  const bool chunked = ResolveBlas(lib) == BlasLibrary::kDnnl && n_tokens > kGemmChunkTokens &&
                       n_tokens < kGemmNoChunkTokens;
  const int64_t chunk = chunked ? kGemmChunkTokens : n_tokens;
  for (int64_t t0 = 0; t0 < n_tokens; t0 += chunk) {
    const int64_t m = std::min(chunk, n_tokens - t0);
    SgemmNT(lib, threads, m, n, k, x + t0 * k, k, b, ldb, y + t0 * ldy, ldy);
  }
}

void GemmPath(const Tensor& w, int type_index, const float* x, int64_t n_tokens, float* y,
              ThreadPool& pool, const MatMulOptions& opt) {
  const int64_t rows = w.rows();
  const int64_t cols = w.cols();
  const size_t row_bytes = RowBytes(w.type, cols);
  const int threads = pool.num_threads();
  const BlasLibrary lib = opt.blas;

  // f32 rows are multiplied in place unless they are split into panels.
  const bool in_place = w.type == DType::kF32 && !HasPanels(w);
  if (in_place && (opt.threading == GemmThreading::kBlasThreads || threads == 1)) {
    SgemmTokens(lib, threads, n_tokens, rows, cols, x, reinterpret_cast<const float*>(w.data), cols,
                y, rows);
    return;
  }
  const DequantRowFn dequant = ActiveKernels().dequant[type_index];
  int64_t tile = TileRows(cols, opt.tile_rows);
  if (in_place && opt.tile_rows <= 0 && n_tokens >= kGemmNoChunkTokens) {
    // Unchunked f32: one sgemm per thread packs x the fewest times (~20%
    // faster at 512 tokens than 256-row tiles).
    tile = CeilDiv(CeilDiv(rows, threads), kRowAlign) * kRowAlign;
  }
  if (opt.threading == GemmThreading::kBlasThreads) {
    // One tile of `threads` ordinary tiles at a time: the pool decodes it, then
    // one multi-threaded sgemm multiplies it.
    const int64_t big = tile * threads;
    float* scratch = ThreadScratch(big * cols);
    for (int64_t r0 = 0; r0 < rows; r0 += big) {
      const int64_t nr = std::min(big, rows - r0);
      pool.ParallelFor(static_cast<size_t>(nr), static_cast<size_t>(kRowAlign),
                       [&](size_t b, size_t e) {
                         for (size_t r = b; r < e; ++r) {
                           DecodeWeightRow(w, dequant, r0 + static_cast<int64_t>(r),
                                           scratch + static_cast<int64_t>(r) * cols);
                         }
                       });
      SgemmTokens(lib, threads, n_tokens, nr, cols, x, scratch, cols, y + r0, rows);
    }
    return;
  }
  // Tiles are handed out dynamically (pool.Run's shared counter), so a slow
  // thread takes fewer of them. f32 tiles are used in place; tiling them too
  // keeps a tile in cache across the token chunks of SgemmTokens.
  pool.Run(static_cast<int>(CeilDiv(rows, tile)), [&](int task) {
    const int64_t r0 = task * tile;
    const int64_t nr = std::min(tile, rows - r0);
    const float* b;
    if (in_place) {
      b = reinterpret_cast<const float*>(w.data + r0 * row_bytes);
    } else {
      float* scratch = ThreadScratch(tile * cols);
      for (int64_t r = 0; r < nr; ++r) DecodeWeightRow(w, dequant, r0 + r, scratch + r * cols);
      b = scratch;
    }
    SgemmTokens(lib, 1, n_tokens, nr, cols, x, b, cols, y + r0, rows);
  });
}

}  // namespace

// Where dequantize + sgemm overtakes the tile kernels (bench/blas_compare
// and a single-thread driver, 5632x2048, CPU time, oneDNN): about equal at
// 64 tokens for f32, Q8_0 and Q4_K (86-91 GFLOP/s per thread), sgemm ahead
// by 5-15% from 128 on (its packing and cache blocking over tokens); the
// tile kernels ahead below 64 (oneDNN needs 8-token chunks there, and each
// chunk re-reads the tile). OpenBLAS is slower still at small batches.
int64_t DefaultGemmMinTokens(DType t, BlasLibrary lib) {
  (void)t;
  (void)lib;
  return 64;
}

// Where the tile kernels overtake the dot kernels (same driver, 1 thread,
// ms at 2/3/4/6 tokens, dot vs tile): f32 equal at 2 (both memory-bound),
// tile 1.3-1.7x faster from 3; F16 dot faster at 2 (1.4 vs 1.6), tile
// (fused) faster from 3; Q8_0 dot faster at 2 and 3 (1.0 vs 1.4, 2.4 vs
// 2.6), tile faster from 4; the K-quants' single-row dot kernels stay ahead
// up to 4 tokens (2.0 vs 2.3) and lose from 6 (2.9 vs 2.5).
int64_t DefaultTileMinTokens(DType t) {
  switch (t) {
    case DType::kF32:
      return 2;
    case DType::kF16:
    case DType::kBF16:
      return 3;
    case DType::kQ8_0:
    case DType::kQ4_0:
      return 4;
    case DType::kQ4_K:
    case DType::kQ5_K:
    case DType::kQ6_K:
      return 5;
  }
  return 4;
}

void MatMulWithOptions(const Tensor& w, const float* x, int64_t n_tokens, float* y,
                       ThreadPool& pool, const MatMulOptions& options) {
  if (n_tokens <= 0 || y == nullptr) return;
  const int type_index = TypeIndex(w.type);
  const int64_t rows = w.rows();
  const int64_t cols = w.cols();
  if (rows <= 0) return;
  const bool usable = type_index >= 0 && w.data != nullptr && x != nullptr && cols > 0 &&
                      cols % GetDTypeInfo(w.type).block_elems == 0;
  if (!usable) {
    std::fill(y, y + n_tokens * rows, std::numeric_limits<float>::quiet_NaN());
    return;
  }
  const ActivationMode mode = options.force_activations ? options.activations : GetActivationMode();
  const ActivationKind kind = ActivationsFor(w.type, mode);
  if (kind != ActivationKind::kF32) {
    // Every batch size: the invariance matmul_q8.h promises needs one path.
    MatMulQ8(w, x, n_tokens, y, pool, kind == ActivationKind::kWide);
    return;
  }
  const int64_t gemm_min = options.gemm_min_tokens > 0 ? options.gemm_min_tokens
                                                       : DefaultGemmMinTokens(w.type, options.blas);
  if (n_tokens >= gemm_min) {
    GemmPath(w, type_index, x, n_tokens, y, pool, options);
    return;
  }
  const int64_t tile_min =
      options.tile_min_tokens > 0 ? options.tile_min_tokens : DefaultTileMinTokens(w.type);
  const bool tile = n_tokens >= tile_min;
  DotArgs a;
  a.w = w.data;
  a.row_bytes = RowBytes(w.type, cols);
  a.cols = cols;
  a.row_begin = 0;
  a.row_end = rows;
  a.x = x;
  a.n_tokens = n_tokens;
  a.y = y;
  a.y_stride = rows;
  if (tile && (cols * sizeof(float)) % 4096 == 0 && n_tokens > 1) {
    // Tokens a multiple of 4 KiB apart share L1 sets (as many streams as
    // tokens in a tile, plus the weights): copy them a cache line apart.
    thread_local CacheAlignedVector<float> padded;
    const int64_t stride = TileRowStride(cols);
    padded.resize(static_cast<size_t>(n_tokens * stride));
    for (int64_t t = 0; t < n_tokens; ++t) {
      std::copy(x + t * cols, x + (t + 1) * cols, padded.data() + t * stride);
    }
    a.x = padded.data();
    a.x_stride = stride;
  } else if (!tile && reinterpret_cast<uintptr_t>(x) % 64 != 0) {
    // The dot kernels load x a vector at a time for every row: from an
    // address off a cache line each load spans two (4-9% slower one-token
    // products). A copy is a few KiB against the matrix's MiBs.
    thread_local CacheAlignedVector<float> aligned;
    aligned.assign(x, x + n_tokens * cols);
    a.x = aligned.data();
  }
  if (!tile && DotNeedsXSum(type_index)) {
    thread_local std::vector<float> xsum;
    const int64_t per_token = cols / 32;
    xsum.resize(static_cast<size_t>(n_tokens * per_token));
    for (int64_t i = 0; i < n_tokens * per_token; ++i) {
      float s = 0.f;
      for (int k = 0; k < 32; ++k) s += x[i * 32 + k];
      xsum[static_cast<size_t>(i)] = s;
    }
    a.xsum = xsum.data();
  }
  // One table for the whole call (tests switch levels between calls).
  const KernelTable& kernels = ActiveKernels();
  DotPath(kernels, type_index, tile, w, a, pool);
}

}  // namespace internal

namespace {
std::atomic<ActivationMode> g_activation_mode{ActivationMode::kAuto};
}  // namespace

namespace {
// A row of x (4 bytes a column) and of the weights up to this size is read
// at full speed one row after another; above it the streaming weights push
// x out of L1 before the next row reads it again. Measured on the AVX-512
// EPYC VM (docs/PERFORMANCE.md), one-token f16 products, 2 threads: 3,072
// columns (18 KiB) as fast as f16 x, 4,096 (24 KiB) 1.4-1.6x slower.
constexpr int64_t kPanelMaxBytes = 20 << 10;
// Panels are cut to about this much each.
constexpr int64_t kPanelTargetBytes = 18 << 10;
// Panel widths are a multiple of this many columns: every SIMD level's
// plain-type block and the Q4_0/Q8_0 block divide it.
constexpr int64_t kPanelColsAlign = 64;
}  // namespace

int64_t DecodePanelCols(DType t, int64_t cols) {
  switch (t) {
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
    case DType::kQ8_0:
    case DType::kQ4_0:
      break;
    default:
      return 0;  // the K-quants' f32-activation kernels read whole rows (xsum)
  }
  if (cols <= 0 || cols % GetDTypeInfo(t).block_elems != 0) return 0;
  const int64_t bytes = cols * static_cast<int64_t>(sizeof(float)) + static_cast<int64_t>(RowBytes(t, cols));
  if (bytes <= kPanelMaxBytes) return 0;
  const int64_t n = internal::CeilDiv(bytes, kPanelTargetBytes);
  const int64_t pc = internal::CeilDiv(internal::CeilDiv(cols, n), kPanelColsAlign) * kPanelColsAlign;
  return pc < cols ? pc : 0;
}

size_t PanelPackedBytes(const Tensor& w, int64_t panel_cols) {
  if (panel_cols <= 0 || panel_cols >= w.cols()) return 0;
  // The same bytes regrouped: panel widths are whole blocks.
  return static_cast<size_t>(w.rows()) * RowBytes(w.type, w.cols());
}

void PackPanels(const Tensor& w, int64_t panel_cols, uint8_t* out) {
  Tensor v = w;
  v.panels = out;
  v.panel_cols = panel_cols;
  const size_t row_bytes = RowBytes(w.type, w.cols());
  const int64_t rows = w.rows();
  for (int64_t p = 0; p < v.panel_count(); ++p) {
    const size_t offset = RowBytes(w.type, p * panel_cols);  // bytes before column p * panel_cols
    const size_t n = v.panel_row_bytes(p);
    uint8_t* dst = const_cast<uint8_t*>(v.panel(p));
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(dst + static_cast<size_t>(r) * n, w.data + static_cast<size_t>(r) * row_bytes + offset, n);
    }
  }
}

ActivationKind ActivationsFor(DType t, ActivationMode m) {
  if (!internal::Q8Supported(t)) return ActivationKind::kF32;
  switch (m) {
    case ActivationMode::kExact:
      return ActivationKind::kF32;
    case ActivationMode::kInt8:
      return ActivationKind::kInt8;
    case ActivationMode::kAuto: {
      const internal::Q8KernelTable& table = internal::ActiveQ8Kernels();
      if (t == DType::kQ8_0 && table.auto_wide && table.q8_0_wide != nullptr) return ActivationKind::kWide;
      return table.auto_int8[static_cast<size_t>(internal::TypeIndex(t))] ? ActivationKind::kInt8
                                                                         : ActivationKind::kF32;
    }
  }
  return ActivationKind::kF32;
}

bool UsesIntegerActivations(DType t, ActivationMode m) { return ActivationsFor(t, m) != ActivationKind::kF32; }

void SetActivationMode(ActivationMode mode) { g_activation_mode.store(mode); }
ActivationMode GetActivationMode() { return g_activation_mode.load(); }

Status ValidateMatMulWeight(const Tensor& w) {
  const std::string name = "weight '" + w.name + "'";
  if (internal::TypeIndex(w.type) < 0) {
    return Status::Unsupported(name + ": element type " +
                               std::to_string(static_cast<uint32_t>(w.type)));
  }
  if (w.ne.empty() || w.ne.size() > 4) return Status::InvalidArgument(name + ": needs 1 to 4 dims");
  int64_t rows = 1;
  for (size_t i = 0; i < w.ne.size(); ++i) {
    if (w.ne[i] <= 0) return Status::InvalidArgument(name + ": non-positive dimension");
    if (i > 0) {
      if (rows > std::numeric_limits<int64_t>::max() / w.ne[i]) {
        return Status::InvalidArgument(name + ": too many rows");
      }
      rows *= w.ne[i];
    }
  }
  const int block = GetDTypeInfo(w.type).block_elems;
  if (w.cols() % block != 0) {
    return Status::InvalidArgument(
        name + ": " + std::to_string(w.cols()) + " columns is not a multiple of the " +
        std::string(DTypeName(w.type)) + " block size " + std::to_string(block));
  }
  if (w.data == nullptr) return Status::InvalidArgument(name + ": no data");
  const size_t row_bytes = RowBytes(w.type, w.cols());
  if (static_cast<uint64_t>(rows) > w.nbytes / row_bytes) {
    return Status::InvalidArgument(name + ": " + std::to_string(w.nbytes) + " bytes do not hold " +
                                   std::to_string(rows) + " rows");
  }
  return Status::Ok();
}

void MatMul(const Tensor& w, const float* x, int64_t n_tokens, float* y, ThreadPool& pool) {
  internal::MatMulWithOptions(w, x, n_tokens, y, pool, internal::MatMulOptions{});
}

}  // namespace strata::cpu
