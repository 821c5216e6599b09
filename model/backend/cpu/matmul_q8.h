#pragma once
// Internal to the CPU backend, and to its tests and benchmarks: products of
// quantized weights with int8-quantized activations ("int8 activations").
//
// The activation rows are quantized per token, in blocks of 32 or 256
// (d = max|x| / 127, q = round(x / d), as ggml's Q8_0 / Q8_K), and the
// weights' integer codes are multiplied with them in integer arithmetic
// (AVX-512 VNNI vpdpbusd / vpdpwssd, AVX2 vpmaddubsw / vpmaddwd, or scalar),
// exact per block; each block's integer sum is then scaled by d_w * d_x in
// f32.
//
// Invariance, by construction: a token's row is quantized on its own, and
// each kernel computes one (weight row, token) output with the same sequence
// of operations whatever the rows and tokens around it (the tile kernels
// interleave several rows and tokens, each with its own accumulator). So at a
// given SIMD level the result for a token does not depend on the batch, the
// chunking of a prompt, the thread count or the code path; tests check the
// logits bitwise. Levels differ only in f32 rounding of the block sums.
//
// Weight types: Q8_0 and Q4_0 (activation blocks of 32), and Q4_K, Q5_K and
// Q6_K (activation blocks of 256, one scale each, as ggml's Q8_K: the integer
// sum then spans a super-block, the weights' sub-scales applied in
// integers). Q8Supported says which.
//
// Int16 activations ("wide", Q8_0 only): with 8-bit weights the int8
// activation step is the larger error (stories260K: top-1 agreement with the
// f32 model 0.987, against 0.992 with f32 activations). A wide row is
// quantized per block of 32 to 16-bit codes, d = max|x| / kWideMax,
// q = round(x / d), |q| <= kWideMax, held as two int8 planes,
// q = 255 * hi + lo with |hi|, |lo| <= 127, so the same int8 block sums
// serve: a block's integer sum is 255 * dot(w, hi) + dot(w, lo), exact in
// int32 (at most 256 * 32 * 128 * 127 < 2^31), then scaled by d_w * d_x in
// f32. Each element's error is at most d / 2, 1/256 of int8's. The same
// invariance holds: a token's row is quantized on its own.

#include <array>
#include <cstdint>
#include <vector>

#include "common/thread_pool.h"
#include "model/backend/cpu/matmul_kernels.h"
#include "model/tensor.h"

namespace strata::cpu::internal {

// TypeIndex of the weight types with int8 kernels (template arguments).
inline constexpr int kIdxQ4_0 = 3;
inline constexpr int kIdxQ8_0 = 4;
inline constexpr int kIdxQ4_K = 5;
inline constexpr int kIdxQ5_K = 6;
inline constexpr int kIdxQ6_K = 7;

// Q8KernelTable::auto_int8 of the tables whose only faster kernels are the
// K-quants' (the 256-bit Q8_0/Q4_0 kernels measured slower than f32).
inline constexpr std::array<bool, kNumTypes> kAutoInt8KQuants = {false, false, false, false, false, true, true, true};

// Elements per activation scale for weights of type t (32 or 256).
int Q8ActBlockFor(DType t);

// Quantized activation rows: token t's codes at q[t * cols ...], its block
// scales at d[t * (cols / block) ...], and the sums of its codes over each
// 32 elements at bsum[t * (cols / 32) ...] (for Q4_K/Q5_K's minimums) and
// over each 16 at bsum16[t * (cols / 16) ...] (for Q6_K's offset of 32).
// Wide rows (block 32): q holds the high plane and bsum its sums, ql the low
// plane and lbsum its sums; bsum16 is not written.
struct Q8Activations {
  int64_t cols = 0;
  int64_t n_tokens = 0;
  int block = 32;
  bool wide = false;
  std::vector<int8_t> q;
  std::vector<float> d;
  std::vector<int16_t> bsum;
  std::vector<int16_t> bsum16;
  std::vector<int8_t> ql;
  std::vector<int16_t> lbsum;
};

// The largest wide code: 255 * 127 + 127.
inline constexpr int kWideMax = 32512;

// Quantizes row x[0..cols) (cols % block == 0, block 32 or 256) into q (cols
// codes), d (cols / block scales: d = max|x| / 127, q = round(x / d)) and
// bsum (cols / 32 sums of codes) and bsum16 (cols / 16). Scalar and
// deterministic: the same codes at every SIMD level. A block with a NaN or
// infinity gets scale NaN (so products with it are NaN, as they would be in
// f32), codes 0.
void QuantizeActivationRow(const float* x, int64_t cols, int block, int8_t* q, float* d, int16_t* bsum,
                           int16_t* bsum16);

// All n_tokens rows of x (x_stride floats apart), with the active table's
// quantizer, over `pool` when large.
void QuantizeActivations(const float* x, int64_t n_tokens, int64_t cols, int64_t x_stride, int block,
                         Q8Activations* out, ThreadPool* pool);

// Quantizes row x[0..cols) (cols % 32 == 0) to wide codes (above): per block
// of 32, d (d = max|x| / kWideMax), the planes hi and lo (cols codes each,
// q = round(x / d) = 255 * hi + lo, hi = q / 255 rounded to nearest) and the
// planes' sums over each 32, hbsum and lbsum. Scalar and deterministic: each
// table's quantize_wide gives the same bytes. A block with a NaN or infinity
// gets scale NaN, codes 0.
void QuantizeActivationRowWide(const float* x, int64_t cols, int8_t* hi, int8_t* lo, float* d, int16_t* hbsum,
                               int16_t* lbsum);
// All n_tokens rows of x, wide (out->wide set), with the active table's
// quantize_wide, over `pool` when large.
void QuantizeActivationsWide(const float* x, int64_t n_tokens, int64_t cols, int64_t x_stride, Q8Activations* out,
                             ThreadPool* pool);

// y[t * y_stride + r] = the int8 product of weight row r with token t, for
// r in [row_begin, row_end), t in [0, n_tokens).
struct Q8Args {
  const uint8_t* w = nullptr;
  // Tensor::lanes: the rows of w, 16 at a time, in PackLanes's layout, or
  // nullptr. Kernel tables with reads_lanes use it for whole 16-row groups
  // starting at a multiple of 16; every other row is read from w.
  const uint8_t* lanes = nullptr;
  size_t row_bytes = 0;
  int64_t cols = 0;
  int64_t row_begin = 0;
  int64_t row_end = 0;
  const int8_t* xq = nullptr;     // n_tokens * cols codes
  const float* xd = nullptr;      // n_tokens * cols / block scales
  const int16_t* xbsum = nullptr;    // n_tokens * cols / 32 code sums
  const int16_t* xbsum16 = nullptr;  // n_tokens * cols / 16 code sums
  // Wide kernels only: xq / xbsum are the high plane, these the low one.
  const int8_t* xql = nullptr;       // n_tokens * cols codes
  const int16_t* xlbsum = nullptr;   // n_tokens * cols / 32 code sums
  int64_t n_tokens = 0;
  float* y = nullptr;
  int64_t y_stride = 0;
};

using Q8RowsFn = void (*)(const Q8Args& args);
// QuantizeActivationRow's contract; every table's gives the same bytes.
using Q8QuantizeFn = void (*)(const float* x, int64_t cols, int block, int8_t* q, float* d, int16_t* bsum,
                              int16_t* bsum16);

using Q8QuantizeWideFn = void (*)(const float* x, int64_t cols, int8_t* hi, int8_t* lo, float* d, int16_t* hbsum,
                                  int16_t* lbsum);

struct Q8KernelTable {
  const char* name;
  // Indexed by TypeIndex; nullptr where the type has no int8 kernel.
  Q8RowsFn rows[kNumTypes];
  Q8QuantizeFn quantize;
  // The types whose kernels here measured faster than f32 activations: what
  // `engine.activations: auto` takes int8 for (docs/PERFORMANCE.md).
  std::array<bool, kNumTypes> auto_int8;
  // Whether the Q8_0 / Q4_0 kernels read Q8Args::lanes.
  bool reads_lanes = false;
  // Q8_0 with wide activations (Q8Args::xql / xlbsum set; reads lanes as
  // the Q8_0 kernel does), or nullptr: only the AVX-512 VNNI table has one
  // (at AVX2, vpmaddubsw's two planes measured slower than f32
  // activations: docs/PERFORMANCE.md).
  Q8RowsFn q8_0_wide = nullptr;
  // QuantizeActivationRowWide's contract; every table's gives the same bytes.
  Q8QuantizeWideFn quantize_wide = nullptr;
  // Whether `engine.activations: auto` takes wide activations for Q8_0
  // (measured faster than f32 activations here).
  bool auto_wide = false;
  // Whether the Q4_K, Q5_K and Q6_K kernels read Q8Args::lanes (PackLanes's
  // K-quant layouts).
  bool reads_k_lanes = false;
};

const Q8KernelTable& ScalarQ8Kernels();
// nullptr when the build or the CPU lacks the ISA (AVX2: AVX2 + FMA; the
// AVX-512 table needs VNNI as well as F/BW/VL).
const Q8KernelTable* Avx2Q8Kernels();
const Q8KernelTable* Avx512VnniQ8Kernels();
// The widest table ActiveSimdLevel() allows.
const Q8KernelTable& ActiveQ8Kernels();

// Whether weights of type t have int8 kernels.
bool Q8Supported(DType t);

// ---- Weights repacked for the 16-row lane kernels ---------------------------
//
// The AVX-512 VNNI Q8_0 / Q4_0 / Q4_K / Q5_K / Q6_K kernels put 16 weight rows in
// the 16 lanes of a vector (the AVX2 Q8_0 / Q4_0 one, 8 rows in each half of
// a group). From the file's layout they transpose every block of rows on
// each call; PackLanes does that once, at load. Group g (rows 16g..16g+15)
// starts at g * LaneGroupBytes(type, cols).
//
// Q8_0 / Q4_0: the same bytes as those rows in the file (LaneGroupBytes =
// 16 * row_bytes), laid out as:
//   - nb * 32 bytes of scales: block b's 16 f16 scales at 32b, row i's at 2i;
//   - then block b's codes at nb * 32 + b * C (C = 256 for Q4_0, 512 for
//     Q8_0): C / 64 vectors of 64 bytes; vector k holds in bytes 4i..4i+3
//     row i's code bytes 4k..4k+3 (Q4_0: the file's nibble pairs as they
//     are; Q8_0: each code + 128, as an unsigned byte).
// The K-quants: LaneSuperBytes(type) per super-block s, at s times that.
// Q4_K (the 6-bit scales and mins unpacked to bytes: 64 bytes more per 16
// rows and super-block than the file's 16 * 144):
//   - 0: the 16 f16 d, row i's at 2i; 32: the 16 f16 dmin;
//   - 64: the scales, sub-block j's of row i at 64 + 16j + i;
//   - 192: the mins in pairs, sub-blocks 2p and 2p + 1 of row i at
//     192 + 32p + 2i and + 1 (one int16 pair per lane once widened);
//   - 320: the codes, group q (elements 64q..64q+63) at 320 + 512q: 8
//     vectors of 64 bytes; vector k holds in bytes 4i..4i+3 row i's qs bytes
//     32q + 4k..32q + 4k + 3 (low nibbles: elements 64q + 4k.., high:
//     64q + 32 + 4k..).
// Q5_K: Q4_K's layout, then at 2368 the qh bytes: 8 vectors, vector k
//   holding row i's qh bytes 4k..4k+3 at 4i (bit j of qh[l] is bit 4 of
//   sub-block j's element l; 64 bytes more than the file's 16 * 176).
// Q6_K (the file's size, 16 * 210):
//   - 0: the 16 f16 d; 32: the int8 scales, sub-block j's of row i at
//     32 + 16j + i;
//   - 288 + 1536h, for half h (elements 128h..128h+127): 8 vectors of ql
//     bytes 64h + 4k.. (at + 64k), 8 of ql bytes 64h + 32 + 4k.. (+ 512),
//     8 of qh bytes 32h + 4k.. (+ 1024), row i's 4 bytes at 4i of each.
// Rows past the last whole group are not packed (the kernels read them from
// the file's layout). The kernels give the same bits either way.
inline constexpr int kLaneRows = 16;

// Whether PackLanes handles type t (Q8_0, Q4_0, Q4_K, Q5_K, Q6_K).
bool LanePackable(DType t);
// Whether table's kernel for type t reads Q8Args::lanes (so loading should
// pack them).
bool ReadsLanes(const Q8KernelTable& table, DType t);
// Q4_K / Q5_K / Q6_K: bytes of one super-block of a packed group.
constexpr int64_t LaneSuperBytes(DType t) {
  return t == DType::kQ4_K ? 320 + 4 * 512 : t == DType::kQ5_K ? 320 + 4 * 512 + 512 : 288 + 2 * 1536;
}
// Bytes of one 16-row group of a type-t matrix with `cols` columns.
// REQUIRES LanePackable(t).
int64_t LaneGroupBytes(DType t, int64_t cols);
// Bytes PackLanes writes for w: rows() / 16 groups.
size_t LanePackedBytes(const Tensor& w);
// Writes w's whole 16-row groups in the layout above to out
// (LanePackedBytes(w) bytes). REQUIRES LanePackable(w.type), w.data valid.
void PackLanes(const Tensor& w, uint8_t* out);
// One Q4_K, Q5_K or Q6_K group in the layout above, from 16 file rows of
// `cols` columns (a row may repeat: the kernels fill a tail group's unused
// lanes so). REQUIRES t is Q4_K, Q5_K or Q6_K.
void PackKLaneGroup(DType t, const uint8_t* const* rows, int64_t cols, uint8_t* out);

// The exact value the kernels approximate, for tests, in double from exact
// integer sums: Q8_0/Q4_0, per 32-block, (integer dot of the codes) * d_w *
// d_x; Q4_K/Q5_K, per super-block, d_x * (d * sum_j sc_j * dot_j - dmin *
// sum_j m_j * bsum_j); Q6_K, d_x * d * sum_j sc_j * (dot_j - 32 bsum16_j)
// over its 16-element sub-blocks. Weight row `row` of type t, token codes q,
// scales d (Q8ActBlockFor(t) elements each) and code sums bsum, bsum16.
double Q8ReferenceDot(DType t, const uint8_t* row, int64_t cols, const int8_t* q, const float* d,
                      const int16_t* bsum, const int16_t* bsum16);

// The value the wide Q8_0 kernels approximate, in double from exact integer
// sums: per 32-block, (255 * dot(codes, hi) + dot(codes, lo)) * d_w * d_x.
double Q8ReferenceDotWide(const uint8_t* row, int64_t cols, const int8_t* hi, const int8_t* lo, const float* d);

// MatMul's integer paths: quantizes x (wide: QuantizeActivationsWide), then
// runs the active table's kernel for w.type over `pool`. REQUIRES
// Q8Supported(w.type) (wide: w.type == Q8_0 and the table has q8_0_wide) and
// MatMul's REQUIRES.
void MatMulQ8(const Tensor& w, const float* x, int64_t n_tokens, float* y, ThreadPool& pool, bool wide = false);

}  // namespace strata::cpu::internal
