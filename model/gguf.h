#pragma once
// Reading GGUF files (ggml's model container, versions 2 and 3, little-endian).
//
// Layout: "GGUF" magic, u32 version, u64 tensor count, u64 metadata count,
// metadata key/value pairs, tensor infos (name, dims, type, offset), padding to
// `alignment`, then the tensor data section. Offsets in tensor infos are
// relative to the start of the data section.
//
// Every malformed input yields a Status (never a crash; every count is checked
// against the bytes left before anything is reserved, so memory stays within
// a small multiple of the input size) whose message names the origin, the byte
// offset, and the key or tensor involved. Codes: kCorrupt for format
// violations and truncation, kUnsupported for valid GGUF that Strata cannot
// use (version 1, big-endian files, tensor types DType does not cover).
//
// Thread-safety: a GgufFile is immutable after Open()/Parse(); any number of
// threads may read it concurrently.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/mapped_file.h"
#include "common/status.h"
#include "model/backend/dtype.h"
#include "model/tensor.h"

namespace strata {

// GGUF metadata value types; the numeric values are the file's type ids.
enum class GgufType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};

// "u8", "i32", "f32", "bool", "string", "array", ...
std::string_view GgufTypeName(GgufType t);
// nullopt for an id outside 0..12.
std::optional<GgufType> GgufTypeFromId(uint32_t id);
// Encoded size of a fixed-size type; 0 for kString and kArray.
size_t GgufFixedSize(GgufType t);
bool GgufIsInteger(GgufType t);  // u8..i64 (not bool)
bool GgufIsFloat(GgufType t);    // f32, f64

// One metadata value: a scalar, a string, or an array (of scalars, strings, or
// arrays, whose element types may differ from one sub-array to the next).
// Values own their data; they do not point into the file.
class GgufValue {
 public:
  GgufValue() = default;  // u8 0
  static GgufValue U8(uint8_t v);
  static GgufValue I8(int8_t v);
  static GgufValue U16(uint16_t v);
  static GgufValue I16(int16_t v);
  static GgufValue U32(uint32_t v);
  static GgufValue I32(int32_t v);
  static GgufValue U64(uint64_t v);
  static GgufValue I64(int64_t v);
  static GgufValue F32(float v);
  static GgufValue F64(double v);
  static GgufValue Bool(bool v);
  static GgufValue String(std::string v);
  static GgufValue StringArray(std::vector<std::string> v);
  static GgufValue BoolArray(const std::vector<bool>& v);
  // T is one of uint8_t, int8_t, uint16_t, int16_t, uint32_t, int32_t,
  // uint64_t, int64_t, float, double (anything else fails to link).
  template <typename T>
  static GgufValue NumericArray(std::span<const T> v);
  // An array whose elements are themselves arrays.
  // REQUIRES: every element is an array.
  static GgufValue ArrayOfArrays(std::vector<GgufValue> elems);

  GgufType type() const { return type_; }
  bool is_array() const { return type_ == GgufType::kArray; }

  // Scalar reads. nullopt when the type does not fit: AsInt takes any integer
  // type whose value fits int64; AsUint any non-negative integer; AsFloat
  // f32/f64; AsBool bool; AsString string.
  std::optional<int64_t> AsInt() const;
  std::optional<uint64_t> AsUint() const;
  std::optional<double> AsFloat() const;
  std::optional<bool> AsBool() const;
  const std::string* AsString() const;  // null unless type() == kString

  // Arrays (REQUIRES: is_array(); on a scalar these return empty/kU8/0).
  GgufType elem_type() const { return elem_type_; }
  uint64_t size() const { return count_; }
  // elem_type() == kString: the strings; otherwise empty.
  const std::vector<std::string>& strings() const { return strings_; }
  // elem_type() == kArray: the sub-arrays; otherwise empty.
  const std::vector<GgufValue>& arrays() const { return arrays_; }
  // Fixed-size elements (numbers, bool) packed little-endian as in the file:
  // size() * GgufFixedSize(elem_type()) bytes; otherwise empty.
  std::span<const uint8_t> raw() const { return raw_; }
  // Element i of a numeric array as int64 / uint64 / double; nullopt if the
  // element type is not integer (or float for FloatAt) or the value does not fit.
  std::optional<int64_t> IntAt(uint64_t i) const;
  std::optional<double> FloatAt(uint64_t i) const;

  // Short printable form for listings: 42, 1e-05, true, "llama" (quoted,
  // escaped, cut after 64 bytes), arrays as "[string x 512]".
  std::string Render() const;

  // Appends the GGUF encoding of the value (without its leading type id; an
  // array's element type and count are included) to `out`.
  void Encode(std::string* out) const;

  bool operator==(const GgufValue& o) const;

 private:
  friend class GgufParser;
  static GgufValue Scalar(GgufType t, uint64_t bits);

  GgufType type_ = GgufType::kU8;
  uint64_t bits_ = 0;  // scalar numbers/bool: the value's little-endian bytes
  std::string str_;
  GgufType elem_type_ = GgufType::kU8;
  uint64_t count_ = 0;
  std::vector<uint8_t> raw_;
  std::vector<std::string> strings_;
  std::vector<GgufValue> arrays_;
};

struct GgufKeyValue {
  std::string key;
  GgufValue value;
};

// For listings (`strata model info`).
struct GgufKeyInfo {
  std::string key;
  std::string type;      // "u32", "string", "array[string]", ...
  std::string rendered;  // GgufValue::Render()
};

struct GgufTensor {
  std::string name;
  DType type = DType::kF32;
  std::vector<int64_t> ne;        // 1..4 dims, ne[0] innermost, all > 0
  uint64_t offset = 0;            // relative to the data section; aligned
  const uint8_t* data = nullptr;  // points into the GgufFile's bytes
  size_t nbytes = 0;

  // A view sharing `data`; valid as long as the GgufFile's bytes are.
  Tensor ToTensor() const;
};

class GgufFile {
 public:
  static constexpr uint32_t kDefaultAlignment = 32;
  static constexpr int kMaxArrayDepth = 8;  // arrays nested deeper are rejected
  static constexpr int kMaxDims = 4;

  // Maps `path` and parses it. The returned object keeps the mapping alive;
  // tensor data pointers stay valid for the object's lifetime.
  static Result<std::unique_ptr<GgufFile>> Open(const std::string& path);
  // Parses bytes the caller owns; `data` must outlive the returned object
  // (tensor data pointers point into it). `origin` names the input in errors.
  static Result<std::unique_ptr<GgufFile>> Parse(const uint8_t* data, size_t size,
                                                 std::string origin);

  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& origin() const { return origin_; }
  uint32_t version() const { return version_; }
  uint32_t alignment() const { return alignment_; }
  // Start of the tensor data section (aligned). May equal or, for a file
  // without tensors, exceed the file size.
  uint64_t data_offset() const { return data_offset_; }
  // The whole file's bytes.
  const uint8_t* bytes() const { return data_; }
  // The mapping behind bytes() (Open), or nullptr (Parse).
  const MappedFile* mapped_file() const { return file_.get(); }
  size_t size() const { return size_; }

  // Metadata in file order.
  const std::vector<GgufKeyValue>& metadata() const { return kvs_; }
  std::vector<GgufKeyInfo> ListKeys() const;
  bool Has(std::string_view key) const { return Find(key) != nullptr; }
  const GgufValue* Find(std::string_view key) const;  // null when absent

  // Typed getters. kNotFound when the key is absent; kInvalidArgument naming
  // the key, the expected and the actual type on a mismatch; kOutOfRange when
  // an integer does not fit the result type.
  Result<std::string> GetString(std::string_view key) const;
  Result<int64_t> GetInt(std::string_view key) const;    // any integer type
  Result<uint64_t> GetUint(std::string_view key) const;  // any integer type, >= 0
  Result<double> GetFloat(std::string_view key) const;   // f32 or f64
  Result<bool> GetBool(std::string_view key) const;
  // Never null on success; points into this object.
  Result<const std::vector<std::string>*> GetStringArray(std::string_view key) const;
  Result<std::vector<float>> GetFloatArray(std::string_view key) const;  // f32/f64 elems
  Result<std::vector<int64_t>> GetIntArray(std::string_view key) const;  // integer elems

  // Tensors in file order.
  const std::vector<GgufTensor>& tensors() const { return tensors_; }
  const GgufTensor* FindTensor(std::string_view name) const;  // null when absent

 private:
  friend class GgufParser;
  GgufFile() = default;

  std::unique_ptr<MappedFile> file_;  // set by Open(); null after Parse()
  std::string origin_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  uint32_t version_ = 0;
  uint32_t alignment_ = kDefaultAlignment;
  uint64_t data_offset_ = 0;
  std::vector<GgufKeyValue> kvs_;
  std::unordered_map<std::string_view, size_t> kv_index_;  // views into kvs_ keys
  std::vector<GgufTensor> tensors_;
  std::unordered_map<std::string_view, size_t> tensor_index_;
};

// Name of a ggml tensor type id, including the ones Strata does not support
// ("q5_0", "iq2_xxs", ...); "unknown" outside ggml's range.
std::string_view GgmlTypeName(uint32_t id);

}  // namespace strata
