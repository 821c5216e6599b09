#include "tests/support/block_data.h"

#include <algorithm>
#include <cstring>
#include <random>

namespace strata::testing {

std::vector<uint8_t> BlockOf(uint64_t i, size_t bytes) {
  std::vector<uint8_t> v(bytes);
  std::mt19937_64 rng(i * 7919 + 1);
  for (size_t k = 0; k < bytes; k += 8) {
    uint64_t x = rng();
    std::memcpy(v.data() + k, &x, std::min<size_t>(8, bytes - k));
  }
  return v;
}

}  // namespace strata::testing
