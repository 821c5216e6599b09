// Internal to the CPU backend: the SIMD kernels, written once against a small
// vector interface `V` and instantiated per ISA by matmul_kernels_avx2.cc and
// matmul_kernels_avx512.cc.
//
// Include contract: the including file has already included <immintrin.h>,
// quant.h and matmul_kernels.h, has switched on its target ISA with
// `#pragma GCC target`, and defines V. This file includes nothing itself, so
// no library code is compiled for the wider ISA, and everything here has
// internal linkage, so the per-ISA copies cannot be merged by the linker.
//
// V provides, for kLanes floats / int32s at a time: F, I, Zero, Set1, LoadF,
// StoreF, Fma(a, b, c) = a * b + c, Mul, Sub, ReduceAdd, LoadU8 / LoadI8
// (kLanes bytes widened to int32), LoadF16 / LoadBF16, StoreF16, StoreBF16,
// And, Or, Srl, Sll, SubI, Cvt (int32 -> float).
//
// Weight decoding mirrors the scalar codecs operation for operation (the same
// multiplies and subtracts in the same order, no contraction into FMA), so a
// weight decoded here equals DequantizeRow's; only the dot products'
// summation order differs.

// Not a header guard on purpose: each ISA file includes this once.
// NOLINTBEGIN(build/include_what_you_use)

namespace strata::cpu::internal {
namespace {

constexpr int kL = V::kLanes;
using VF = typename V::F;
using VI = typename V::I;

float ReduceAdd8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}


// ---- Block decoders: call emit(k, offset, w) for every kLanes-vector of
// weights w in a block, where k is the vector's index (0, 1, 2, ...) and
// offset its first element in the block.

struct DecF32 {
  static constexpr int kElems = 4 * kL;
  static constexpr size_t kBytes = kElems * 4;
  static constexpr bool kPlain = true;
  static VF One(const uint8_t* p) { return V::LoadF(reinterpret_cast<const float*>(p)); }
  template <class Emit>
  static void Decode(const uint8_t* p, Emit&& emit) {
    const auto* f = reinterpret_cast<const float*>(p);
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) emit(k, k * kL, V::LoadF(f + k * kL));
  }
  static float Scalar(const uint8_t* p) { return *reinterpret_cast<const float*>(p); }
};

struct DecF16 {
  static constexpr int kElems = 4 * kL;
  static constexpr size_t kBytes = kElems * 2;
  static constexpr bool kPlain = true;
  static VF One(const uint8_t* p) { return V::LoadF16(reinterpret_cast<const uint16_t*>(p)); }
  template <class Emit>
  static void Decode(const uint8_t* p, Emit&& emit) {
    const auto* h = reinterpret_cast<const uint16_t*>(p);
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) emit(k, k * kL, V::LoadF16(h + k * kL));
  }
  static float Scalar(const uint8_t* p) { return F16ToF32(*reinterpret_cast<const uint16_t*>(p)); }
};

struct DecBF16 {
  static constexpr int kElems = 4 * kL;
  static constexpr size_t kBytes = kElems * 2;
  static constexpr bool kPlain = true;
  static VF One(const uint8_t* p) { return V::LoadBF16(reinterpret_cast<const uint16_t*>(p)); }
  template <class Emit>
  static void Decode(const uint8_t* p, Emit&& emit) {
    const auto* h = reinterpret_cast<const uint16_t*>(p);
#pragma GCC unroll 4
    for (int k = 0; k < 4; ++k) emit(k, k * kL, V::LoadBF16(h + k * kL));
  }
  static float Scalar(const uint8_t* p) { return BF16ToF32(*reinterpret_cast<const uint16_t*>(p)); }
};

struct DecQ4_0 {
  static constexpr int kElems = kQK4_0;
  static constexpr size_t kBytes = sizeof(BlockQ4_0);
  static constexpr bool kPlain = false;
  template <class Emit>
  static void Decode(const uint8_t* p, Emit&& emit) {
    const auto* b = reinterpret_cast<const BlockQ4_0*>(p);
    const VF d = V::Set1(V::HalfToFloat(b->d));
#pragma GCC unroll 2
    for (int i = 0; i < 16 / kL; ++i) {
      const VI q = V::LoadU8(b->qs + i * kL);
      emit(2 * i, i * kL, V::Mul(V::NibbleMinus8(q), d));
      emit(2 * i + 1, 16 + i * kL, V::Mul(V::NibbleMinus8(V::Srl(q, 4)), d));
    }
  }
  // Single token: sum the block's (q - 8) * x, then scale once by d.
  static VF BlockSum(const uint8_t* p, const float* xb) {
    const auto* b = reinterpret_cast<const BlockQ4_0*>(p);
    VF s = V::Zero();
#pragma GCC unroll 2
    for (int i = 0; i < 16 / kL; ++i) {
      const VI q = V::LoadU8(b->qs + i * kL);
      s = V::Fma(V::NibbleMinus8(q), V::LoadF(xb + i * kL), s);
      s = V::Fma(V::NibbleMinus8(V::Srl(q, 4)), V::LoadF(xb + 16 + i * kL), s);
    }
    return s;
  }
  static float Scale(const uint8_t* p) {
    return V::HalfToFloat(reinterpret_cast<const BlockQ4_0*>(p)->d);
  }
};

struct DecQ8_0 {
  static constexpr int kElems = kQK8_0;
  static constexpr size_t kBytes = sizeof(BlockQ8_0);
  static constexpr bool kPlain = false;
  template <class Emit>
  static void Decode(const uint8_t* p, Emit&& emit) {
    const auto* b = reinterpret_cast<const BlockQ8_0*>(p);
    const VF d = V::Set1(V::HalfToFloat(b->d));
#pragma GCC unroll 4
    for (int i = 0; i < 32 / kL; ++i) emit(i, i * kL, V::Mul(V::Cvt(V::LoadI8(b->qs + i * kL)), d));
  }
  // Single token: sum the block's q * x, then scale once by d.
  static VF BlockSum(const uint8_t* p, const float* xb) {
    const auto* b = reinterpret_cast<const BlockQ8_0*>(p);
    VF s = V::Mul(V::Cvt(V::LoadI8(b->qs)), V::LoadF(xb));
#pragma GCC unroll 4
    for (int i = 1; i < 32 / kL; ++i)
      s = V::Fma(V::Cvt(V::LoadI8(b->qs + i * kL)), V::LoadF(xb + i * kL), s);
    return s;
  }
  static float Scale(const uint8_t* p) {
    return V::HalfToFloat(reinterpret_cast<const BlockQ8_0*>(p)->d);
  }
};

// Q4_K and Q5_K: per group g of 64 elements, sub-blocks 2g (low nibbles) and
// 2g + 1 (high nibbles) with their own scale and min.
template <bool kFive>
struct DecScaleMinK {
  using Block = std::conditional_t<kFive, BlockQ5_K, BlockQ4_K>;
  static constexpr int kElems = kQK_K;
  static constexpr size_t kBytes = sizeof(Block);
  static constexpr bool kPlain = false;

  // The quants (as floats) of elements 64g + l .. + kL (lo) and
  // 64g + 32 + l .. + kL (hi).
  static void Quants(const Block* b, int g, int l, VF* lo, VF* hi) {
    const VI q = V::LoadU8(b->qs + 32 * g + l);
    if constexpr (kFive) {
      const VI h = V::LoadU8(b->qh + l);
      *lo = V::Cvt(V::Or(V::And(q, 0xf), V::Sll(V::And(V::Srl(h, 2 * g), 1), 4)));
      *hi = V::Cvt(V::Or(V::Srl(q, 4), V::Sll(V::And(V::Srl(h, 2 * g + 1), 1), 4)));
    } else {
      *lo = V::Nibble(q);
      *hi = V::Nibble(V::Srl(q, 4));
    }
  }

  // Single-token dot product, rearranged to cut work per element:
  //   sum_j sum_l (d sc_j q - dmin m_j) x
  //     = sum_j d sc_j (sum_l q x) - sum_j dmin m_j xsum_j
  // with xsum_j, the sums of x over each 32-element sub-block, precomputed.
  // Q4_K goes further and never converts q: f = 1 + q / 16 is built directly
  // as float bits, so sum q x = 16 (sum f x - xsum_j). That moves the min
  // and offset terms into one 8-wide FMA per block and leaves one shift, one
  // logic op and one FMA per vector (decode is compute-bound: this matters).
  static constexpr float kFactor = kFive ? 1.f : 16.f;
  static constexpr float kOffset = kFive ? 0.f : 1.f;

  static void Quants1(const Block* b, int g, int l, VF* lo, VF* hi) {
    if constexpr (kFive) {
      Quants(b, g, l, lo, hi);
    } else {
      const VI q = V::LoadU8(b->qs + 32 * g + l);
      *lo = V::UnitNibble(q, 0);
      *hi = V::UnitNibble(q, 4);
    }
  }

  static float Dot1(const uint8_t* row, int64_t cols, const float* x, const float* xsum) {
    VF tot0 = V::Zero(), tot1 = V::Zero();
    __m256 offs = _mm256_setzero_ps();
    const int64_t nblocks = cols / kQK_K;
    for (int64_t blk = 0; blk < nblocks; ++blk) {
      const auto* b = reinterpret_cast<const Block*>(row) + blk;
      const float* xb = x + blk * kQK_K;
      uint64_t sc8, m8;
      UnpackAllScaleMinK4(b->scales, &sc8, &m8);
      alignas(32) float dsc[8];
      const __m256 sc = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<int64_t>(sc8))));
      const __m256 dscv = _mm256_mul_ps(sc, _mm256_set1_ps(V::HalfToFloat(b->d) * kFactor));
      _mm256_store_ps(dsc, dscv);
      const __m256 m = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_cvtsi64_si128(static_cast<int64_t>(m8))));
      // Per sub-block coefficient of xsum_j: kFactor kOffset d sc_j + dmin m_j.
      __m256 coef = _mm256_mul_ps(m, _mm256_set1_ps(V::HalfToFloat(b->dmin)));
      if constexpr (!kFive) coef = _mm256_add_ps(coef, dscv);
      offs = _mm256_fmadd_ps(coef, _mm256_loadu_ps(xsum + blk * 8), offs);
#pragma GCC unroll 4
      for (int g = 0; g < 4; ++g) {
        VF slo = V::Zero(), shi = V::Zero();
#pragma GCC unroll 4
        for (int i = 0; i < 32 / kL; ++i) {
          VF lo, hi;
          Quants1(b, g, i * kL, &lo, &hi);
          const VF xlo = V::LoadF(xb + 64 * g + i * kL);
          const VF xhi = V::LoadF(xb + 64 * g + 32 + i * kL);
          slo = i == 0 ? V::Mul(lo, xlo) : V::Fma(lo, xlo, slo);
          shi = i == 0 ? V::Mul(hi, xhi) : V::Fma(hi, xhi, shi);
        }
        tot0 = V::Fma(slo, V::Set1(dsc[2 * g]), tot0);
        tot1 = V::Fma(shi, V::Set1(dsc[2 * g + 1]), tot1);
      }
    }
    return V::ReduceAdd(V::Add(tot0, tot1)) - ReduceAdd8(offs);
  }
  template <class Emit>
  static void Decode(const uint8_t* p, Emit&& emit) {
    const auto* b = reinterpret_cast<const Block*>(p);
    const float d = V::HalfToFloat(b->d);
    const float dmin = V::HalfToFloat(b->dmin);
#pragma GCC unroll 4
    for (int g = 0; g < 4; ++g) {
      uint8_t sc, m;
      UnpackScaleMinK4(b->scales, 2 * g, &sc, &m);
      const VF d1 = V::Set1(d * sc), m1 = V::Set1(dmin * m);
      UnpackScaleMinK4(b->scales, 2 * g + 1, &sc, &m);
      const VF d2 = V::Set1(d * sc), m2 = V::Set1(dmin * m);
#pragma GCC unroll 4
      for (int i = 0; i < 32 / kL; ++i) {
        VF lo, hi;
        Quants(b, g, i * kL, &lo, &hi);
        const int k = g * (64 / kL) + i;
        emit(k, 64 * g + i * kL, V::Sub(V::Mul(d1, lo), m1));
        emit(k + 32 / kL, 64 * g + 32 + i * kL, V::Sub(V::Mul(d2, hi), m2));
      }
    }
  }
};

struct DecQ6_K {
  static constexpr int kElems = kQK_K;
  static constexpr size_t kBytes = sizeof(BlockQ6_K);
  static constexpr bool kPlain = false;
  template <class Emit>
  static void Decode(const uint8_t* p, Emit&& emit) {
    const auto* b = reinterpret_cast<const BlockQ6_K*>(p);
    const float d = V::HalfToFloat(b->d);
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
      const uint8_t* ql = b->ql + 64 * h;
      const uint8_t* qh = b->qh + 32 * h;
      const int8_t* sc = b->scales + 8 * h;
#pragma GCC unroll 4
      for (int i = 0; i < 32 / kL; ++i) {
        const int l = i * kL;
        const int is = l / 16;
        const VI a = V::LoadU8(ql + l);
        const VI c = V::LoadU8(ql + 32 + l);
        const VI hb = V::LoadU8(qh + l);
        const VI q1 = V::Or(V::And(a, 0xf), V::Sll(V::And(hb, 3), 4));
        const VI q2 = V::Or(V::And(c, 0xf), V::Sll(V::And(V::Srl(hb, 2), 3), 4));
        const VI q3 = V::Or(V::Srl(a, 4), V::Sll(V::And(V::Srl(hb, 4), 3), 4));
        const VI q4 = V::Or(V::Srl(c, 4), V::Sll(V::Srl(hb, 6), 4));
        const int k = h * (128 / kL) + i;
        constexpr int kStep = 32 / kL;
        emit(k, 128 * h + l, V::Mul(V::Set1(d * sc[is + 0]), V::Cvt(V::SubI(q1, 32))));
        emit(k + kStep, 128 * h + l + 32, V::Mul(V::Set1(d * sc[is + 2]), V::Cvt(V::SubI(q2, 32))));
        emit(k + 2 * kStep, 128 * h + l + 64,
             V::Mul(V::Set1(d * sc[is + 4]), V::Cvt(V::SubI(q3, 32))));
        emit(k + 3 * kStep, 128 * h + l + 96,
             V::Mul(V::Set1(d * sc[is + 6]), V::Cvt(V::SubI(q4, 32))));
      }
    }
  }
};

// ---- Dot products -----------------------------------------------------------

// out[t * out_stride] = dot(row, x + t * cols) for t < NT.
// One token against 32-element blocks with one scale each: two blocks per
// step on separate accumulators, so the scale FMAs do not form one chain.
template <class Dec>
inline float DotBlocks1(const uint8_t* row, int64_t cols, const float* x) {
  VF tot0 = V::Zero(), tot1 = V::Zero();
  const int64_t nblocks = cols / Dec::kElems;
  int64_t blk = 0;
  for (; blk + 2 <= nblocks; blk += 2) {
    const uint8_t* p = row + blk * Dec::kBytes;
    const float* xb = x + blk * Dec::kElems;
    tot0 = V::Fma(Dec::BlockSum(p, xb), V::Set1(Dec::Scale(p)), tot0);
    tot1 = V::Fma(Dec::BlockSum(p + Dec::kBytes, xb + Dec::kElems),
                  V::Set1(Dec::Scale(p + Dec::kBytes)), tot1);
  }
  if (blk < nblocks) {
    const uint8_t* p = row + blk * Dec::kBytes;
    tot0 = V::Fma(Dec::BlockSum(p, x + blk * Dec::kElems), V::Set1(Dec::Scale(p)), tot0);
  }
  return V::ReduceAdd(V::Add(tot0, tot1));
}

// Token t's activations start at x + t * xs (xs >= cols: MatMul may pad
// them, and a column panel's tokens are a whole row of x apart).
template <class Dec, int NT>
inline void DotRow(const uint8_t* row, int64_t cols, const float* x, int64_t xs, const float* xsum,
                   float* out, int64_t out_stride) {
  if constexpr (NT == 1 && requires { Dec::Dot1; }) {
    *out = Dec::Dot1(row, cols, x, xsum);
    return;
  } else if constexpr (NT == 1 && requires { Dec::BlockSum; }) {
    *out = DotBlocks1<Dec>(row, cols, x);
    return;
  }
  constexpr int kAcc = NT == 1 ? 4 : 2;
  VF acc[NT][kAcc];
  for (int t = 0; t < NT; ++t)
    for (int a = 0; a < kAcc; ++a) acc[t][a] = V::Zero();
  const int64_t nblocks = cols / Dec::kElems;
  const float* xb = x;
  for (int64_t blk = 0; blk < nblocks; ++blk, row += Dec::kBytes, xb += Dec::kElems) {
    Dec::Decode(row, [&](int k, int off, VF w) {
#pragma GCC unroll 4
      for (int t = 0; t < NT; ++t) {
        acc[t][k % kAcc] = V::Fma(w, V::LoadF(xb + t * xs + off), acc[t][k % kAcc]);
      }
    });
  }
  float tail[NT] = {};
  if constexpr (Dec::kPlain) {
    // Plain types have no block structure: finish with single vectors, then
    // single elements.
    constexpr size_t kElemBytes = Dec::kBytes / Dec::kElems;
    int64_t i = nblocks * Dec::kElems;
    for (; i + kL <= cols; i += kL, row += kL * kElemBytes, xb += kL) {
      const VF w = Dec::One(row);
      for (int t = 0; t < NT; ++t) acc[t][0] = V::Fma(w, V::LoadF(xb + t * xs), acc[t][0]);
    }
    for (; i < cols; ++i, row += kElemBytes, ++xb) {
      const float w = Dec::Scalar(row);
      for (int t = 0; t < NT; ++t) tail[t] += w * xb[t * xs];
    }
  }
  for (int t = 0; t < NT; ++t) {
    VF s = acc[t][0];
    for (int a = 1; a < kAcc; ++a) s = V::Add(s, acc[t][a]);
    out[t * out_stride] = V::ReduceAdd(s) + tail[t];
  }
}

// One token against 4 rows of a plain type at once, two accumulators per
// row: 4 weight streams in flight and each activation vector loaded once for
// the 4. Used for f32 with 256-bit vectors only, where it was measured: on
// the AVX2 EPYC VM, f32 weights streamed from DRAM at 2 threads ran at 0.99
// of the machine's streaming read this way against 0.93 one row at a time
// (median of 30 alternating runs), and bench-1b's f32 decode step took
// 148-162 ms against 176 ms; f16 and bf16 showed no gain there (their
// decoding, not the streams, bounds them), and the AVX-512 build keeps one
// row at a time, as measured on Zen 4. REQUIRES cols % Dec::kElems == 0.
template <class Dec>
inline void DotRows4x1(const uint8_t* row, size_t row_bytes, int64_t cols, const float* x, float* out) {
  constexpr size_t kElemBytes = Dec::kBytes / Dec::kElems;
  VF acc[4][2];
  for (int r = 0; r < 4; ++r) acc[r][0] = acc[r][1] = V::Zero();
  for (int64_t i = 0; i < cols; i += 2 * kL) {
    const VF x0 = V::LoadF(x + i), x1 = V::LoadF(x + i + kL);
#pragma GCC unroll 4
    for (int r = 0; r < 4; ++r) {
      const uint8_t* p = row + r * row_bytes + i * kElemBytes;
      acc[r][0] = V::Fma(Dec::One(p), x0, acc[r][0]);
      acc[r][1] = V::Fma(Dec::One(p + kL * kElemBytes), x1, acc[r][1]);
    }
  }
  for (int r = 0; r < 4; ++r) out[r] = V::ReduceAdd(V::Add(acc[r][0], acc[r][1]));
}

template <class Dec>
void DotRows(const DotArgs& a) {
  const int64_t xs = a.x_stride > 0 ? a.x_stride : a.cols;
  if constexpr (std::is_same_v<Dec, DecF32> && kL == 8) {
    if (a.n_tokens == 1 && a.cols % Dec::kElems == 0) {
      int64_t r = a.row_begin;
      for (; r + 4 <= a.row_end; r += 4) DotRows4x1<Dec>(a.w + r * a.row_bytes, a.row_bytes, a.cols, a.x, a.y + r);
      for (; r < a.row_end; ++r) DotRow<Dec, 1>(a.w + r * a.row_bytes, a.cols, a.x, xs, nullptr, a.y + r, a.y_stride);
      return;
    }
  }
  // Rows in small blocks, token groups inside: a block of weight rows stays
  // in L1/L2 while every token group passes over it.
  constexpr int64_t kRowBlock = 16;
  for (int64_t r0 = a.row_begin; r0 < a.row_end; r0 += kRowBlock) {
    const int64_t r1 = r0 + kRowBlock < a.row_end ? r0 + kRowBlock : a.row_end;
    int64_t t = 0;
    for (; t + kDotTokenGroup <= a.n_tokens; t += kDotTokenGroup) {
      for (int64_t r = r0; r < r1; ++r) {
        DotRow<Dec, kDotTokenGroup>(a.w + r * a.row_bytes, a.cols, a.x + t * xs, xs, nullptr,
                                    a.y + t * a.y_stride + r, a.y_stride);
      }
    }
    // The last 1-3 tokens in one pass too.
    const int64_t left = a.n_tokens - t;
    for (int64_t r = r0; r < r1 && left > 0; ++r) {
      const uint8_t* row = a.w + r * a.row_bytes;
      const float* x = a.x + t * xs;
      float* y = a.y + t * a.y_stride + r;
      if (left == 3) {
        DotRow<Dec, 3>(row, a.cols, x, xs, nullptr, y, a.y_stride);
      } else if (left == 2) {
        DotRow<Dec, 2>(row, a.cols, x, xs, nullptr, y, a.y_stride);
      } else {
        DotRow<Dec, 1>(row, a.cols, x, xs, a.xsum ? a.xsum + t * (a.cols / 32) : nullptr, y,
                       a.y_stride);
      }
    }
  }
}
static_assert(kDotTokenGroup == 4, "DotRows handles a remainder of 1 to 3 tokens");

// ---- Register-blocked tiles (2+ tokens) --------------------------------------

// The four horizontal sums of a, b, c, d as one 128-bit vector.
template <class T>
inline __m128 Reduce4(T a, T b, T c, T d) {
  if constexpr (sizeof(T) == 64) {
    const __m512 t = _mm512_add_ps(_mm512_unpacklo_ps(a, b), _mm512_unpackhi_ps(a, b));
    const __m512 u = _mm512_add_ps(_mm512_unpacklo_ps(c, d), _mm512_unpackhi_ps(c, d));
    // Per 128-bit lane: partial sums of a, b, c, d.
    const __m512 v = _mm512_add_ps(_mm512_shuffle_ps(t, u, 0x44), _mm512_shuffle_ps(t, u, 0xee));
    const __m256 h =
        _mm256_add_ps(_mm512_castps512_ps256(v),
                      _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
    return _mm_add_ps(_mm256_castps256_ps128(h), _mm256_extractf128_ps(h, 1));
  } else {
    const __m256 t = _mm256_add_ps(_mm256_unpacklo_ps(a, b), _mm256_unpackhi_ps(a, b));
    const __m256 u = _mm256_add_ps(_mm256_unpacklo_ps(c, d), _mm256_unpackhi_ps(c, d));
    const __m256 v = _mm256_add_ps(_mm256_shuffle_ps(t, u, 0x44), _mm256_shuffle_ps(t, u, 0xee));
    return _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  }
}

constexpr int kTileRows = 4;
// Accumulators kTileRows x kTileTokens plus kTileRows weight vectors and one
// x vector must fit the register file (32 zmm, 16 ymm).
constexpr int kTileTokens = kL == 16 ? 6 : 2;

// y[t * y_stride + r] = dot(w[r], x + t * x_stride) for t < NT, r < valid,
// over `cols` f32 elements (w[r] for r >= valid may repeat a valid row).
template <int NT>
inline void TileKernel(const float* const* w, int64_t cols, const float* x, int64_t x_stride,
                       float* y, int64_t y_stride, int valid) {
  VF acc[kTileRows][NT];
#pragma GCC unroll 4
  for (int r = 0; r < kTileRows; ++r)
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) acc[r][t] = V::Zero();
  const float* w0 = w[0];
  const float* w1 = w[1];
  const float* w2 = w[2];
  const float* w3 = w[3];
  int64_t k = 0;
  for (; k + kL <= cols; k += kL) {
    const VF a0 = V::LoadF(w0 + k), a1 = V::LoadF(w1 + k), a2 = V::LoadF(w2 + k),
             a3 = V::LoadF(w3 + k);
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) {
      const VF xv = V::LoadF(x + t * x_stride + k);
      acc[0][t] = V::Fma(a0, xv, acc[0][t]);
      acc[1][t] = V::Fma(a1, xv, acc[1][t]);
      acc[2][t] = V::Fma(a2, xv, acc[2][t]);
      acc[3][t] = V::Fma(a3, xv, acc[3][t]);
    }
  }
#pragma GCC unroll 8
  for (int t = 0; t < NT; ++t) {
    alignas(16) float s[kTileRows];
    _mm_store_ps(s, Reduce4(acc[0][t], acc[1][t], acc[2][t], acc[3][t]));
    const float* xt = x + t * x_stride;
    for (int64_t j = k; j < cols; ++j) {
      for (int r = 0; r < kTileRows; ++r) s[r] += w[r][j] * xt[j];
    }
    for (int r = 0; r < valid; ++r) y[t * y_stride + r] = s[r];
  }
}

// One kTileRows-row panel against tokens [0, n): tiles of at most
// kTileTokens tokens, sized evenly (8 tokens = 4 + 4, not 6 + 2).
inline void TilePanel(const float* const* w, int64_t cols, const float* x, int64_t x_stride,
                      int64_t n, float* y, int64_t y_stride, int valid) {
  const int64_t tiles = (n + kTileTokens - 1) / kTileTokens;
  int64_t t = 0;
  for (int64_t i = 0; i < tiles; ++i) {
    const int64_t len = (n - t + (tiles - i) - 1) / (tiles - i);
    const float* xt = x + t * x_stride;
    float* yt = y + t * y_stride;
    switch (len) {
      case 1:
        TileKernel<1>(w, cols, xt, x_stride, yt, y_stride, valid);
        break;
      case 2:
        TileKernel<2>(w, cols, xt, x_stride, yt, y_stride, valid);
        break;
      default:
        if constexpr (kTileTokens >= 6) {
          if (len == 3) {
            TileKernel<3>(w, cols, xt, x_stride, yt, y_stride, valid);
          } else if (len == 4) {
            TileKernel<4>(w, cols, xt, x_stride, yt, y_stride, valid);
          } else if (len == 5) {
            TileKernel<5>(w, cols, xt, x_stride, yt, y_stride, valid);
          } else {
            TileKernel<kTileTokens>(w, cols, xt, x_stride, yt, y_stride, valid);
          }
        }
        break;
    }
    t += len;
  }
}

// 4 rows x NT tokens decoded in registers (no scratch): each weight vector is
// decoded once and used for NT tokens. For small batches, where decoding into
// a buffer and reading it back would cost as much as the multiplies.
template <class Dec, int NT>
inline void FusedTile(const uint8_t* const* rows, int64_t cols, const float* x, int64_t x_stride,
                      float* y, int64_t y_stride, int valid) {
  VF acc[kTileRows][NT];
#pragma GCC unroll 4
  for (int r = 0; r < kTileRows; ++r)
#pragma GCC unroll 8
    for (int t = 0; t < NT; ++t) acc[r][t] = V::Zero();
  const int64_t nblocks = cols / Dec::kElems;
  for (int64_t blk = 0; blk < nblocks; ++blk) {
    const float* xb = x + blk * Dec::kElems;
#pragma GCC unroll 4
    for (int r = 0; r < kTileRows; ++r) {
      Dec::Decode(rows[r] + blk * Dec::kBytes, [&](int, int off, VF w) {
#pragma GCC unroll 8
        for (int t = 0; t < NT; ++t) {
          acc[r][t] = V::Fma(w, V::LoadF(xb + t * x_stride + off), acc[r][t]);
        }
      });
    }
  }
#pragma GCC unroll 8
  for (int t = 0; t < NT; ++t) {
    alignas(16) float s[kTileRows];
    _mm_store_ps(s, Reduce4(acc[0][t], acc[1][t], acc[2][t], acc[3][t]));
    if constexpr (Dec::kPlain) {
      constexpr size_t kElemBytes = Dec::kBytes / Dec::kElems;
      const float* xt = x + t * x_stride;
      for (int64_t j = nblocks * Dec::kElems; j < cols; ++j) {
        for (int r = 0; r < kTileRows; ++r) {
          s[r] += Dec::Scalar(rows[r] + static_cast<size_t>(j) * kElemBytes) * xt[j];
        }
      }
    }
    for (int r = 0; r < valid; ++r) y[t * y_stride + r] = s[r];
  }
}

// Tokens [0, n) against one 4-row panel with FusedTile, tiles of at most
// kFusedTokens tokens sized evenly.
constexpr int kFusedTokens = kL == 16 ? 4 : 2;
template <class Dec>
inline void FusedPanel(const uint8_t* const* rows, int64_t cols, const float* x, int64_t x_stride,
                       int64_t n, float* y, int64_t y_stride, int valid) {
  const int64_t tiles = (n + kFusedTokens - 1) / kFusedTokens;
  int64_t t = 0;
  for (int64_t i = 0; i < tiles; ++i) {
    const int64_t len = (n - t + (tiles - i) - 1) / (tiles - i);
    const float* xt = x + t * x_stride;
    float* yt = y + t * y_stride;
    if (len == 1) {
      FusedTile<Dec, 1>(rows, cols, xt, x_stride, yt, y_stride, valid);
    } else if (len == 2 || kFusedTokens == 2) {
      FusedTile<Dec, 2>(rows, cols, xt, x_stride, yt, y_stride, valid);
    } else if (len == 3) {
      FusedTile<Dec, 3>(rows, cols, xt, x_stride, yt, y_stride, valid);
    } else {
      FusedTile<Dec, kFusedTokens>(rows, cols, xt, x_stride, yt, y_stride, valid);
    }
    t += len;
  }
}

template <class Dec>
void DequantRow(const void* src, float* dst, int64_t n);

// DotRowsFn for 2+ tokens: blocks of kTileBlockRows rows are decoded into
// a.scratch (f32 rows are used in place), then every token passes over each
// 4-row panel of the block while it is in L1/L2. Each weight is read from
// memory and decoded once per call.
template <class Dec>
void TileRows(const DotArgs& a) {
  constexpr bool kInPlace = std::is_same_v<Dec, DecF32>;
  // Types cheap to decode in registers use FusedTile up to 8 tokens (single
  // thread, 5632x2048: 1.4-2x faster than decoding into scratch at 3-6
  // tokens, even at 8). The K-quants decode more slowly: they go through
  // the scratch, as do larger batches, where the panel's FMA loop wins.
  constexpr bool kFusedOk = std::is_same_v<Dec, DecF16> || std::is_same_v<Dec, DecBF16> ||
                            std::is_same_v<Dec, DecQ8_0> || std::is_same_v<Dec, DecQ4_0>;
  constexpr int64_t kFusedMaxTokens = 8;
  const int64_t cols = a.cols;
  // Rows are read one after another in short bursts between the stores of
  // their decoding, which leaves few loads in flight: fetch two blocks ahead,
  // into L2 only. Into L1 (_MM_HINT_T0, as this once did for blocks up to
  // 16 KiB) the prefetched rows evict the tokens' activations the panel loop
  // is reading: weights streamed from DRAM (32000x768, one thread) ran
  // 1.3-1.9x slower at 4-16 tokens and 1.15x at 32, every type.
  const size_t ahead_bytes = 2 * kTileBlockRows * a.row_bytes;
  for (int64_t r0 = a.row_begin; r0 < a.row_end; r0 += kTileBlockRows) {
    const int64_t nr = r0 + kTileBlockRows < a.row_end ? kTileBlockRows : a.row_end - r0;
    if (r0 + 3 * kTileBlockRows <= a.row_end) {
      const char* next = reinterpret_cast<const char*>(a.w + r0 * a.row_bytes) + ahead_bytes;
      const size_t len = kTileBlockRows * a.row_bytes;
      for (size_t off = 0; off < len; off += 64) _mm_prefetch(next + off, _MM_HINT_T1);
    }
    if constexpr (kFusedOk) {
      if (a.n_tokens <= kFusedMaxTokens) {
        const uint8_t* rows[kTileRows];
        for (int64_t p = 0; p < nr; p += kTileRows) {
          const int valid = static_cast<int>(p + kTileRows <= nr ? kTileRows : nr - p);
          for (int r = 0; r < kTileRows; ++r) {
            rows[r] = a.w + (r0 + p + (r < valid ? r : 0)) * a.row_bytes;
          }
          FusedPanel<Dec>(rows, cols, a.x, a.x_stride > 0 ? a.x_stride : cols, a.n_tokens,
                          a.y + r0 + p, a.y_stride, valid);
        }
        continue;
      }
    }
    const float* block;
    int64_t stride;
    if constexpr (kInPlace) {
      block = reinterpret_cast<const float*>(a.w + r0 * a.row_bytes);
      stride = static_cast<int64_t>(a.row_bytes / sizeof(float));
    } else {
      stride = TileRowStride(cols);
      for (int64_t r = 0; r < nr; ++r) {
        DequantRow<Dec>(a.w + (r0 + r) * a.row_bytes, a.scratch + r * stride, cols);
      }
      block = a.scratch;
    }
    for (int64_t p = 0; p < nr; p += kTileRows) {
      const int valid = static_cast<int>(p + kTileRows <= nr ? kTileRows : nr - p);
      const float* w[kTileRows];
      for (int r = 0; r < kTileRows; ++r) w[r] = block + (p + (r < valid ? r : 0)) * stride;
      TilePanel(w, cols, a.x, a.x_stride > 0 ? a.x_stride : cols, a.n_tokens, a.y + r0 + p,
                a.y_stride, valid);
    }
  }
}

// ---- Dequantization ----------------------------------------------------------

template <class Dec>
void DequantRow(const void* src, float* dst, int64_t n) {
  const auto* p = static_cast<const uint8_t*>(src);
  const int64_t nblocks = n / Dec::kElems;
  for (int64_t blk = 0; blk < nblocks; ++blk, p += Dec::kBytes, dst += Dec::kElems) {
    Dec::Decode(p, [&](int, int off, VF w) { V::StoreF(dst + off, w); });
  }
  if constexpr (Dec::kPlain) {
    constexpr size_t kElemBytes = Dec::kBytes / Dec::kElems;
    for (int64_t i = nblocks * Dec::kElems; i < n; ++i, p += kElemBytes) *dst++ = Dec::Scalar(p);
  }
}

void EncodeF16(const float* src, void* dst, int64_t n) {
  auto* h = static_cast<uint16_t*>(dst);
  int64_t i = 0;
  for (; i + kL <= n; i += kL) V::StoreF16(h + i, V::LoadF(src + i));
  for (; i < n; ++i) h[i] = F32ToF16(src[i]);
}

void EncodeBF16(const float* src, void* dst, int64_t n) {
  auto* h = static_cast<uint16_t*>(dst);
  int64_t i = 0;
  for (; i + kL <= n; i += kL) V::StoreBF16(h + i, V::LoadF(src + i));
  for (; i < n; ++i) h[i] = F32ToBF16(src[i]);
}

constexpr KernelTable MakeTable(const char* name) {
  return KernelTable{
      name,
      {&DotRows<DecF32>, &DotRows<DecF16>, &DotRows<DecBF16>, &DotRows<DecQ4_0>, &DotRows<DecQ8_0>,
       &DotRows<DecScaleMinK<false>>, &DotRows<DecScaleMinK<true>>, &DotRows<DecQ6_K>},
      {&TileRows<DecF32>, &TileRows<DecF16>, &TileRows<DecBF16>, &TileRows<DecQ4_0>,
       &TileRows<DecQ8_0>, &TileRows<DecScaleMinK<false>>, &TileRows<DecScaleMinK<true>>,
       &TileRows<DecQ6_K>},
      {&DequantRow<DecF32>, &DequantRow<DecF16>, &DequantRow<DecBF16>, &DequantRow<DecQ4_0>,
       &DequantRow<DecQ8_0>, &DequantRow<DecScaleMinK<false>>, &DequantRow<DecScaleMinK<true>>,
       &DequantRow<DecQ6_K>},
      &EncodeF16,
      &EncodeBF16,
  };
}

}  // namespace
}  // namespace strata::cpu::internal

// NOLINTEND(build/include_what_you_use)
