#include "tests/support/test_weights.h"

#include <random>

#include "model/backend/cpu/quant.h"

namespace strata::testing {

TestWeight MakeTestWeight(DType type, int64_t rows, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.f, 1.f);
  std::vector<float> src(static_cast<size_t>(rows * cols));
  for (auto& v : src) v = g(rng);
  TestWeight w;
  const size_t row_bytes = RowBytes(type, cols);
  w.bytes.resize(row_bytes * static_cast<size_t>(rows));
  w.dense.resize(static_cast<size_t>(rows * cols));
  for (int64_t r = 0; r < rows; ++r) {
    uint8_t* row = w.bytes.data() + static_cast<size_t>(r) * row_bytes;
    cpu::QuantizeRow(type, src.data() + r * cols, row, cols);
    cpu::DequantizeRow(type, row, w.dense.data() + r * cols, cols);
  }
  w.tensor.name.assign(1, 'w');  // (= "w" trips GCC 12's false -Wrestrict here)
  w.tensor.type = type;
  w.tensor.ne = {cols, rows};
  w.tensor.data = w.bytes.data();
  w.tensor.nbytes = w.bytes.size();
  return w;
}

std::vector<float> GaussianVector(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> g(0.f, 1.f);
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) v = g(rng);
  return x;
}

}  // namespace strata::testing
