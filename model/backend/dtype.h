#pragma once
// Element types of weights and KV caches. The numeric values are GGUF's
// (ggml_type) so a GGUF tensor's type field maps directly.

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace strata {

enum class DType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ8_0 = 8,
  kQ4_K = 12,
  kQ5_K = 13,
  kQ6_K = 14,
  kBF16 = 30,
};

struct DTypeInfo {
  std::string_view name;  // "f32", "f16", "bf16", "q8_0", "q4_0", "q4_k", "q5_k", "q6_k"
  int block_elems;        // elements per block (1 for plain types)
  int block_bytes;        // bytes per block
};

// nullopt for a GGUF type id Strata does not support.
std::optional<DType> DTypeFromGgufId(uint32_t id);
const DTypeInfo& GetDTypeInfo(DType t);
inline std::string_view DTypeName(DType t) { return GetDTypeInfo(t).name; }
// Parses "f32", "F16", "bf16", "q8_0", "Q4_K", ... (case-insensitive).
std::optional<DType> DTypeFromName(std::string_view name);
// Bytes of a row of n elements; n must be a multiple of block_elems.
inline size_t RowBytes(DType t, int64_t n) {
  const auto& i = GetDTypeInfo(t);
  return static_cast<size_t>(n / i.block_elems) * static_cast<size_t>(i.block_bytes);
}
inline bool IsQuantized(DType t) { return GetDTypeInfo(t).block_elems > 1; }

// How a quantizer chooses each block's scale (cpu::QuantizeRow).
enum class QuantFit {
  kGgml,          // ggml's reference quantizers: llama-quantize's bytes
  kLeastSquares,  // q8_0, q4_0: the scale of least squared error after
                  // decoding, of ggml's and a few others; other types as kGgml
};

}  // namespace strata
