// MatMul: validation, the choice between the dot-kernel path (small batches)
// and the tiled sgemm path (large batches), and how each is spread over the
// thread pool. The kernels are in matmul_kernels_*.cc, the BLAS wrapper in
// matmul_gemm.cc.

#include "model/backend/cpu/matmul.h"

#include <algorithm>
#include <cstdlib>
#include <limits>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "model/backend/cpu/matmul_internal.h"
#include "model/backend/cpu/matmul_kernels.h"

namespace strata::cpu {

namespace internal {

namespace {

// Below this many multiply-adds a task is not worth waking a thread for.
constexpr int64_t kMinTaskMacs = int64_t{1} << 16;
// Rows per dot task are rounded to this, so tasks touch whole cache lines of y
// for most shapes.
constexpr int64_t kRowAlign = 16;
// Target size of one dequantized sgemm tile (floats): about 512 KiB, half an
// L2 on current x86 cores, so the tile stays cached while sgemm packs it.
constexpr int64_t kTileFloats = int64_t{1} << 17;

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

int64_t TileRows(int64_t cols, int64_t requested) {
  if (requested > 0) return requested;
  const int64_t r = (kTileFloats / std::max<int64_t>(cols, 1)) / kRowAlign * kRowAlign;
  return std::clamp<int64_t>(r, kRowAlign, 256);
}

void DotPath(int type_index, const DotArgs& base, ThreadPool& pool) {
  const DotRowsFn dot = ActiveKernels().dot[type_index];
  const int64_t rows = base.row_end;
  const int64_t macs_per_row = std::max<int64_t>(base.cols * base.n_tokens, 1);
  const int64_t min_rows = std::max<int64_t>(1, kMinTaskMacs / macs_per_row);
  const int64_t tasks = std::min<int64_t>(pool.num_threads(), CeilDiv(rows, min_rows));
  if (tasks <= 1) {
    dot(base);
    return;
  }
  int64_t per = CeilDiv(rows, tasks);
  if (per > kRowAlign) per = CeilDiv(per, kRowAlign) * kRowAlign;
  pool.Run(static_cast<int>(CeilDiv(rows, per)), [&](int task) {
    DotArgs a = base;
    a.row_begin = task * per;
    a.row_end = std::min(rows, a.row_begin + per);
    dot(a);
  });
}

void GemmPath(const Tensor& w, int type_index, const float* x, int64_t n_tokens, float* y,
              ThreadPool& pool, const MatMulOptions& opt) {
  const int64_t rows = w.rows();
  const int64_t cols = w.cols();
  const size_t row_bytes = RowBytes(w.type, cols);
  const int threads = pool.num_threads();
  const BlasLibrary lib = opt.blas;

  if (w.type == DType::kF32) {
    const auto* wf = reinterpret_cast<const float*>(w.data);
    if (opt.threading == GemmThreading::kBlasThreads || threads == 1) {
      SgemmNT(lib, threads, n_tokens, rows, cols, x, cols, wf, cols, y, rows);
      return;
    }
    const int64_t per = CeilDiv(CeilDiv(rows, threads), kRowAlign) * kRowAlign;
    pool.Run(static_cast<int>(CeilDiv(rows, per)), [&](int task) {
      const int64_t r0 = task * per;
      const int64_t nr = std::min(rows, r0 + per) - r0;
      SgemmNT(lib, 1, n_tokens, nr, cols, x, cols, wf + r0 * cols, cols, y + r0, rows);
    });
    return;
  }

  const DequantRowFn dequant = ActiveKernels().dequant[type_index];
  const int64_t tile = TileRows(cols, opt.tile_rows);
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
                           dequant(w.data + (r0 + static_cast<int64_t>(r)) * row_bytes,
                                   scratch + static_cast<int64_t>(r) * cols, cols);
                         }
                       });
      SgemmNT(lib, threads, n_tokens, nr, cols, x, cols, scratch, cols, y + r0, rows);
    }
    return;
  }
  // Tiles are handed out dynamically (pool.Run's shared counter), so a slow
  // thread takes fewer of them.
  pool.Run(static_cast<int>(CeilDiv(rows, tile)), [&](int task) {
    const int64_t r0 = task * tile;
    const int64_t nr = std::min(tile, rows - r0);
    float* scratch = ThreadScratch(tile * cols);
    for (int64_t r = 0; r < nr; ++r)
      dequant(w.data + (r0 + r) * row_bytes, scratch + r * cols, cols);
    SgemmNT(lib, 1, n_tokens, nr, cols, x, cols, scratch, cols, y + r0, rows);
  });
}

}  // namespace

int64_t DefaultGemmMinTokens(DType t) {
  switch (t) {
    case DType::kF32:
      return 8;
    default:
      return 8;
  }
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
  const int64_t gemm_min =
      options.gemm_min_tokens > 0 ? options.gemm_min_tokens : DefaultGemmMinTokens(w.type);
  if (n_tokens >= gemm_min) {
    GemmPath(w, type_index, x, n_tokens, y, pool, options);
    return;
  }
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
  if (DotNeedsXSum(type_index)) {
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
  DotPath(type_index, a, pool);
}

}  // namespace internal

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
