#pragma once
// A view of a weight tensor as stored (GGUF order: ne[0] is the contiguous,
// innermost dimension). A linear layer's weight has ne = {in, out}: `out` rows
// of `in` elements each. Data is not owned: it points into a mapped model file
// or a buffer owned by ModelWeights.

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "model/backend/dtype.h"

namespace strata {

struct Tensor {
  std::string name;
  DType type = DType::kF32;
  std::vector<int64_t> ne;  // up to 4 dims, ne[0] innermost
  const uint8_t* data = nullptr;
  size_t nbytes = 0;
  // Optional second copy of the first rows() / 16 * 16 rows in the layout of
  // the CPU's 16-row int8 lane kernels (cpu::internal::PackLanes: Q4_0 and
  // Q8_0 only), or nullptr. Set while loading (cpu::PackWeightsForInt8),
  // owned by the same ModelWeights; `data` stays valid and authoritative.
  const uint8_t* lanes = nullptr;

  bool present() const { return data != nullptr; }
  int64_t cols() const { return ne.empty() ? 0 : ne[0]; }
  int64_t rows() const {
    int64_t r = 1;
    for (size_t i = 1; i < ne.size(); ++i) r *= ne[i];
    return r;
  }
  int64_t elements() const { return cols() * rows(); }
  const uint8_t* row(int64_t r) const { return data + static_cast<size_t>(r) * RowBytes(type, cols()); }
};

}  // namespace strata
