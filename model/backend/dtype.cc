#include "model/backend/dtype.h"

#include <array>
#include <cctype>
#include <string>

namespace strata {

namespace {
constexpr DTypeInfo kF32{"f32", 1, 4};
constexpr DTypeInfo kF16{"f16", 1, 2};
constexpr DTypeInfo kBF16{"bf16", 1, 2};
constexpr DTypeInfo kQ4_0{"q4_0", 32, 18};
constexpr DTypeInfo kQ8_0{"q8_0", 32, 34};
constexpr DTypeInfo kQ4_K{"q4_k", 256, 144};
constexpr DTypeInfo kQ5_K{"q5_k", 256, 176};
constexpr DTypeInfo kQ6_K{"q6_k", 256, 210};
constexpr std::array<DType, 8> kAll = {DType::kF32,  DType::kF16,  DType::kBF16, DType::kQ4_0,
                                       DType::kQ8_0, DType::kQ4_K, DType::kQ5_K, DType::kQ6_K};
}  // namespace

std::optional<DType> DTypeFromGgufId(uint32_t id) {
  for (DType t : kAll)
    if (static_cast<uint32_t>(t) == id) return t;
  return std::nullopt;
}

const DTypeInfo& GetDTypeInfo(DType t) {
  switch (t) {
    case DType::kF32: return kF32;
    case DType::kF16: return kF16;
    case DType::kBF16: return kBF16;
    case DType::kQ4_0: return kQ4_0;
    case DType::kQ8_0: return kQ8_0;
    case DType::kQ4_K: return kQ4_K;
    case DType::kQ5_K: return kQ5_K;
    case DType::kQ6_K: return kQ6_K;
  }
  return kF32;  // unreachable for valid enum values
}

std::optional<DType> DTypeFromName(std::string_view name) {
  std::string lower;
  for (char c : name) lower.push_back(static_cast<char>(std::tolower(static_cast<unsigned char>(c))));
  for (DType t : kAll)
    if (GetDTypeInfo(t).name == lower) return t;
  return std::nullopt;
}

}  // namespace strata
