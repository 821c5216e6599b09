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
  static float Scalar(const uint8_t* p) {
    return F16ToF32(*reinterpret_cast<const uint16_t*>(p));
  }
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
  static float Scalar(const uint8_t* p) {
    return BF16ToF32(*reinterpret_cast<const uint16_t*>(p));
  }
};

struct DecQ4_0 {
  static constexpr int kElems = kQK4_0;
  static constexpr size_t kBytes = sizeof(BlockQ4_0);
  static constexpr bool kPlain = false;
  template <class Emit>
  static void Decode(const uint8_t* p, Emit&& emit) {
    const auto* b = reinterpret_cast<const BlockQ4_0*>(p);
    const VF d = V::Set1(F16ToF32(b->d));
#pragma GCC unroll 2
    for (int i = 0; i < 16 / kL; ++i) {
      const VI q = V::LoadU8(b->qs + i * kL);
      emit(2 * i, i * kL, V::Mul(V::Cvt(V::SubI(V::And(q, 0xf), 8)), d));
      emit(2 * i + 1, 16 + i * kL, V::Mul(V::Cvt(V::SubI(V::Srl(q, 4), 8)), d));
    }
  }
};

struct DecQ8_0 {
  static constexpr int kElems = kQK8_0;
  static constexpr size_t kBytes = sizeof(BlockQ8_0);
  static constexpr bool kPlain = false;
  template <class Emit>
  static void Decode(const uint8_t* p, Emit&& emit) {
    const auto* b = reinterpret_cast<const BlockQ8_0*>(p);
    const VF d = V::Set1(F16ToF32(b->d));
#pragma GCC unroll 4
    for (int i = 0; i < 32 / kL; ++i) emit(i, i * kL, V::Mul(V::Cvt(V::LoadI8(b->qs + i * kL)), d));
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
  template <class Emit>
  static void Decode(const uint8_t* p, Emit&& emit) {
    const auto* b = reinterpret_cast<const Block*>(p);
    const float d = F16ToF32(b->d);
    const float dmin = F16ToF32(b->dmin);
#pragma GCC unroll 4
    for (int g = 0; g < 4; ++g) {
      uint8_t sc, m;
      UnpackScaleMinK4(b->scales, 2 * g, &sc, &m);
      const VF d1 = V::Set1(d * sc), m1 = V::Set1(dmin * m);
      UnpackScaleMinK4(b->scales, 2 * g + 1, &sc, &m);
      const VF d2 = V::Set1(d * sc), m2 = V::Set1(dmin * m);
#pragma GCC unroll 4
      for (int i = 0; i < 32 / kL; ++i) {
        const VI q = V::LoadU8(b->qs + 32 * g + i * kL);
        VI lo = V::And(q, 0xf);
        VI hi = V::Srl(q, 4);
        if constexpr (kFive) {
          const VI h = V::LoadU8(b->qh + i * kL);
          lo = V::Or(lo, V::Sll(V::And(V::Srl(h, 2 * g), 1), 4));
          hi = V::Or(hi, V::Sll(V::And(V::Srl(h, 2 * g + 1), 1), 4));
        }
        const int k = g * (64 / kL) + i;
        emit(k, 64 * g + i * kL, V::Sub(V::Mul(d1, V::Cvt(lo)), m1));
        emit(k + 32 / kL, 64 * g + 32 + i * kL, V::Sub(V::Mul(d2, V::Cvt(hi)), m2));
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
    const float d = F16ToF32(b->d);
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
        emit(k + 2 * kStep, 128 * h + l + 64, V::Mul(V::Set1(d * sc[is + 4]), V::Cvt(V::SubI(q3, 32))));
        emit(k + 3 * kStep, 128 * h + l + 96, V::Mul(V::Set1(d * sc[is + 6]), V::Cvt(V::SubI(q4, 32))));
      }
    }
  }
};

// ---- Dot products -----------------------------------------------------------

// out[t * out_stride] = dot(row, x + t * cols) for t < NT.
template <class Dec, int NT>
inline void DotRow(const uint8_t* row, int64_t cols, const float* x, float* out,
                   int64_t out_stride) {
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
        acc[t][k % kAcc] = V::Fma(w, V::LoadF(xb + t * cols + off), acc[t][k % kAcc]);
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
      for (int t = 0; t < NT; ++t) acc[t][0] = V::Fma(w, V::LoadF(xb + t * cols), acc[t][0]);
    }
    for (; i < cols; ++i, row += kElemBytes, ++xb) {
      const float w = Dec::Scalar(row);
      for (int t = 0; t < NT; ++t) tail[t] += w * xb[t * cols];
    }
  }
  for (int t = 0; t < NT; ++t) {
    VF s = acc[t][0];
    for (int a = 1; a < kAcc; ++a) s = V::Add(s, acc[t][a]);
    out[t * out_stride] = V::ReduceAdd(s) + tail[t];
  }
}

template <class Dec>
void DotRows(const DotArgs& a) {
  // Rows in small blocks, token groups inside: a block of weight rows stays
  // in L1/L2 while every token group passes over it.
  constexpr int64_t kRowBlock = 16;
  for (int64_t r0 = a.row_begin; r0 < a.row_end; r0 += kRowBlock) {
    const int64_t r1 = r0 + kRowBlock < a.row_end ? r0 + kRowBlock : a.row_end;
    int64_t t = 0;
    for (; t + kDotTokenGroup <= a.n_tokens; t += kDotTokenGroup) {
      for (int64_t r = r0; r < r1; ++r) {
        DotRow<Dec, kDotTokenGroup>(a.w + r * a.row_bytes, a.cols, a.x + t * a.cols,
                                    a.y + t * a.y_stride + r, a.y_stride);
      }
    }
    const int64_t left = a.n_tokens - t;
    for (int64_t r = r0; r < r1; ++r) {
      const uint8_t* row = a.w + r * a.row_bytes;
      int64_t u = t;
      if (left & 2) {
        DotRow<Dec, 2>(row, a.cols, a.x + u * a.cols, a.y + u * a.y_stride + r, a.y_stride);
        u += 2;
      }
      if (left & 1) {
        DotRow<Dec, 1>(row, a.cols, a.x + u * a.cols, a.y + u * a.y_stride + r, a.y_stride);
      }
    }
  }
}
static_assert(kDotTokenGroup == 4, "DotRows handles the remainder as 2 + 1");

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
      {&DotRows<DecF32>, &DotRows<DecF16>, &DotRows<DecBF16>, &DotRows<DecQ4_0>,
       &DotRows<DecQ8_0>, &DotRows<DecScaleMinK<false>>, &DotRows<DecScaleMinK<true>>,
       &DotRows<DecQ6_K>},
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
