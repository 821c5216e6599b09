#pragma once
// Random weight matrices and activation vectors for the CPU kernel tests.
// Deterministic by seed; values from a unit Gaussian (std::mt19937).

#include <cstdint>
#include <vector>

#include "model/backend/dtype.h"
#include "model/tensor.h"

namespace strata::testing {

// A weight of `rows` x `cols` random Gaussian values stored as `type`
// (quantized by the reference quantizer), with its exact f32 decode.
// `tensor` points into `bytes`: keep the TestWeight alive (and unmoved
// after taking `tensor`) while using it.
struct TestWeight {
  std::vector<uint8_t> bytes;
  std::vector<float> dense;  // DequantizeRow of bytes, row-major
  Tensor tensor;             // name "w", ne {cols, rows}
};
TestWeight MakeTestWeight(DType type, int64_t rows, int64_t cols, uint32_t seed);

// `n` unit Gaussian values.
std::vector<float> GaussianVector(int64_t n, uint32_t seed);

}  // namespace strata::testing
