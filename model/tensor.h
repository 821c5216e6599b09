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
  // the CPU's 16-row int8 lane kernels (cpu::internal::PackLanes: Q4_0,
  // Q8_0, Q4_K, Q5_K, Q6_K), or nullptr. Set while loading (cpu::PackWeightsForInt8),
  // owned by the same ModelWeights; `data` stays valid and authoritative.
  const uint8_t* lanes = nullptr;
  // Optional second copy of all rows split into column panels
  // (cpu::PackPanels), or nullptr: panel p holds columns [p * panel_cols,
  // min(cols, (p + 1) * panel_cols)) of every row, rows one after another,
  // each in RowBytes(type, panel_width(p)) bytes; the panels follow each
  // other. A product then walks each panel front to back with that panel's
  // slice of x, which stays in L1 where a whole row's x would not
  // (cpu::DecodePanelCols says when). Set while loading
  // (PackWeightPanels), owned by the same ModelWeights; `data` stays valid
  // and authoritative.
  const uint8_t* panels = nullptr;
  int64_t panel_cols = 0;

  bool present() const { return data != nullptr; }
  int64_t cols() const { return ne.empty() ? 0 : ne[0]; }
  int64_t rows() const {
    int64_t r = 1;
    for (size_t i = 1; i < ne.size(); ++i) r *= ne[i];
    return r;
  }
  int64_t elements() const { return cols() * rows(); }
  const uint8_t* row(int64_t r) const { return data + static_cast<size_t>(r) * RowBytes(type, cols()); }

  // Panel addressing; REQUIRES panels != nullptr and 0 < panel_cols < cols().
  int64_t panel_count() const { return (cols() + panel_cols - 1) / panel_cols; }
  int64_t panel_width(int64_t p) const {
    const int64_t begin = p * panel_cols;
    return cols() - begin < panel_cols ? cols() - begin : panel_cols;
  }
  size_t panel_row_bytes(int64_t p) const { return RowBytes(type, panel_width(p)); }
  // Every panel but the last has the full width, so panel p starts after p
  // full-width panels.
  const uint8_t* panel(int64_t p) const {
    return panels + static_cast<size_t>(p) * static_cast<size_t>(rows()) * RowBytes(type, panel_cols);
  }
};

}  // namespace strata
