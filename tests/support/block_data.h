#pragma once
// Deterministic test contents for KV blocks.

#include <cstddef>
#include <cstdint>
#include <vector>

namespace strata::testing {

// `bytes` pseudo-random bytes that depend only on `i` (distinct blocks differ).
std::vector<uint8_t> BlockOf(uint64_t i, size_t bytes);

}  // namespace strata::testing
