#include "model/gguf.h"

#include <algorithm>
#include <bit>
#include <charconv>
#include <cstring>
#include <iterator>
#include <limits>
#include <type_traits>
#include <unordered_set>
#include <utility>

namespace strata {

static_assert(std::endian::native == std::endian::little,
              "GGUF values are read in place; big-endian hosts need byte swapping");

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as a little-endian u32
// Smallest possible encodings, used to reject counts before reserving memory.
constexpr uint64_t kMinKvBytes = 8 + 4 + 1;  // key length, type, u8 value
constexpr uint64_t kMinTensorInfoBytes =
    8 + 4 + 8 + 4 + 8;                            // name len, n_dims, 1 dim, type, offset
constexpr uint64_t kMinNestedArrayBytes = 4 + 8;  // element type, count
constexpr size_t kRenderMaxBytes = 64;

uint64_t LoadLE(const uint8_t* p, size_t n) {
  uint64_t v = 0;
  std::memcpy(&v, p, n);
  return v;
}

// Sign-extends the low `bytes` bytes of `bits`.
int64_t SignExtend(uint64_t bits, size_t bytes) {
  const unsigned shift = 64 - 8 * static_cast<unsigned>(bytes);
  return static_cast<int64_t>(bits << shift) >> shift;
}

bool IsSigned(GgufType t) {
  return t == GgufType::kI8 || t == GgufType::kI16 || t == GgufType::kI32 || t == GgufType::kI64;
}

// Decodes an integer of type t from its little-endian bits. Unsigned values
// go to *u, signed to *s; returns true for signed.
bool DecodeInteger(GgufType t, uint64_t bits, uint64_t* u, int64_t* s) {
  const size_t n = GgufFixedSize(t);
  if (IsSigned(t)) {
    *s = SignExtend(bits, n);
    return true;
  }
  *u = n == 8 ? bits : bits & ((uint64_t{1} << (8 * n)) - 1);
  return false;
}

std::optional<int64_t> IntFromBits(GgufType t, uint64_t bits) {
  if (!GgufIsInteger(t)) return std::nullopt;
  uint64_t u = 0;
  int64_t s = 0;
  if (DecodeInteger(t, bits, &u, &s)) return s;
  if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) return std::nullopt;
  return static_cast<int64_t>(u);
}

std::optional<uint64_t> UintFromBits(GgufType t, uint64_t bits) {
  if (!GgufIsInteger(t)) return std::nullopt;
  uint64_t u = 0;
  int64_t s = 0;
  if (DecodeInteger(t, bits, &u, &s)) {
    if (s < 0) return std::nullopt;
    return static_cast<uint64_t>(s);
  }
  return u;
}

std::optional<double> FloatFromBits(GgufType t, uint64_t bits) {
  if (t == GgufType::kF32)
    return static_cast<double>(std::bit_cast<float>(static_cast<uint32_t>(bits)));
  if (t == GgufType::kF64) return std::bit_cast<double>(bits);
  return std::nullopt;
}

template <typename T>
void AppendNumber(std::string* out, T v) {
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v);
  out->append(buf, r.ptr);
}

std::string RenderScalar(GgufType t, uint64_t bits) {
  std::string out;
  switch (t) {
    case GgufType::kBool:
      return bits != 0 ? "true" : "false";
    case GgufType::kF32:
      AppendNumber(&out, std::bit_cast<float>(static_cast<uint32_t>(bits)));
      return out;
    case GgufType::kF64:
      AppendNumber(&out, std::bit_cast<double>(bits));
      return out;
    default: {
      uint64_t u = 0;
      int64_t s = 0;
      if (DecodeInteger(t, bits, &u, &s)) {
        AppendNumber(&out, s);
      } else {
        AppendNumber(&out, u);
      }
      return out;
    }
  }
}

// Quoted, with non-printable bytes escaped, cut after kRenderMaxBytes.
std::string Quote(std::string_view s) {
  std::string out = "\"";
  const size_t n = std::min(s.size(), kRenderMaxBytes);
  for (size_t i = 0; i < n; ++i) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    if (c == '"' || c == '\\') {
      out.push_back('\\');
      out.push_back(static_cast<char>(c));
    } else if (c == '\n') {
      out += "\\n";
    } else if (c < 0x20 || c == 0x7f) {
      static constexpr char kHex[] = "0123456789abcdef";
      out += "\\x";
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    } else {
      out.push_back(static_cast<char>(c));  // UTF-8 bytes pass through
    }
  }
  out.push_back('"');
  if (s.size() > n) out += "...";
  return out;
}

void AppendU32(std::string* out, uint32_t v) { out->append(reinterpret_cast<const char*>(&v), 4); }
void AppendU64(std::string* out, uint64_t v) { out->append(reinterpret_cast<const char*>(&v), 8); }
void AppendGgufString(std::string* out, std::string_view s) {
  AppendU64(out, s.size());
  out->append(s);
}

template <typename T>
constexpr GgufType GgufTypeOf() {
  if constexpr (std::is_same_v<T, uint8_t>) return GgufType::kU8;
  if constexpr (std::is_same_v<T, int8_t>) return GgufType::kI8;
  if constexpr (std::is_same_v<T, uint16_t>) return GgufType::kU16;
  if constexpr (std::is_same_v<T, int16_t>) return GgufType::kI16;
  if constexpr (std::is_same_v<T, uint32_t>) return GgufType::kU32;
  if constexpr (std::is_same_v<T, int32_t>) return GgufType::kI32;
  if constexpr (std::is_same_v<T, uint64_t>) return GgufType::kU64;
  if constexpr (std::is_same_v<T, int64_t>) return GgufType::kI64;
  if constexpr (std::is_same_v<T, float>) return GgufType::kF32;
  if constexpr (std::is_same_v<T, double>) return GgufType::kF64;
}

}  // namespace

// ---------------------------------------------------------------- types

namespace {
// Indexed by GgufType id.
constexpr std::string_view kGgufTypeNames[] = {
    "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64"};
constexpr size_t kGgufFixedSizes[] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};
}  // namespace

std::string_view GgufTypeName(GgufType t) {
  const auto i = static_cast<uint32_t>(t);
  return i < std::size(kGgufTypeNames) ? kGgufTypeNames[i] : "invalid";
}

std::optional<GgufType> GgufTypeFromId(uint32_t id) {
  if (id > static_cast<uint32_t>(GgufType::kF64)) return std::nullopt;
  return static_cast<GgufType>(id);
}

size_t GgufFixedSize(GgufType t) {
  const auto i = static_cast<uint32_t>(t);
  return i < std::size(kGgufFixedSizes) ? kGgufFixedSizes[i] : 0;
}

bool GgufIsInteger(GgufType t) {
  switch (t) {
    case GgufType::kU8:
    case GgufType::kI8:
    case GgufType::kU16:
    case GgufType::kI16:
    case GgufType::kU32:
    case GgufType::kI32:
    case GgufType::kU64:
    case GgufType::kI64:
      return true;
    default:
      return false;
  }
}

bool GgufIsFloat(GgufType t) { return t == GgufType::kF32 || t == GgufType::kF64; }

std::string_view GgmlTypeName(uint32_t id) {
  static constexpr std::string_view kNames[] = {
      "f32",   "f16",        "q4_0",       "q4_1",       "q4_2",     "q4_3",     "q5_0",
      "q5_1",  "q8_0",       "q8_1",       "q2_k",       "q3_k",     "q4_k",     "q5_k",
      "q6_k",  "q8_k",       "iq2_xxs",    "iq2_xs",     "iq3_xxs",  "iq1_s",    "iq4_nl",
      "iq3_s", "iq2_s",      "iq4_xs",     "i8",         "i16",      "i32",      "i64",
      "f64",   "iq1_m",      "bf16",       "q4_0_4_4",   "q4_0_4_8", "q4_0_8_8", "tq1_0",
      "tq2_0", "iq4_nl_4_4", "iq4_nl_4_8", "iq4_nl_8_8", "mxfp4"};
  if (id >= std::size(kNames)) return "unknown";
  return kNames[id];
}

// ---------------------------------------------------------------- GgufValue

#define STRATA_GGUF_SCALAR_(Name, CType, Kind) \
  GgufValue GgufValue::Name(CType v) {         \
    uint64_t bits = 0;                         \
    std::memcpy(&bits, &v, sizeof v);          \
    return Scalar(GgufType::Kind, bits);       \
  }
STRATA_GGUF_SCALAR_(U8, uint8_t, kU8)
STRATA_GGUF_SCALAR_(I8, int8_t, kI8)
STRATA_GGUF_SCALAR_(U16, uint16_t, kU16)
STRATA_GGUF_SCALAR_(I16, int16_t, kI16)
STRATA_GGUF_SCALAR_(U32, uint32_t, kU32)
STRATA_GGUF_SCALAR_(I32, int32_t, kI32)
STRATA_GGUF_SCALAR_(U64, uint64_t, kU64)
STRATA_GGUF_SCALAR_(I64, int64_t, kI64)
STRATA_GGUF_SCALAR_(F32, float, kF32)
STRATA_GGUF_SCALAR_(F64, double, kF64)
#undef STRATA_GGUF_SCALAR_

GgufValue GgufValue::Bool(bool v) { return Scalar(GgufType::kBool, v ? 1 : 0); }

GgufValue GgufValue::String(std::string v) {
  GgufValue out;
  out.type_ = GgufType::kString;
  out.str_ = std::move(v);
  return out;
}

GgufValue GgufValue::StringArray(std::vector<std::string> v) {
  GgufValue out;
  out.type_ = GgufType::kArray;
  out.elem_type_ = GgufType::kString;
  out.count_ = v.size();
  out.strings_ = std::move(v);
  return out;
}

GgufValue GgufValue::BoolArray(const std::vector<bool>& v) {
  GgufValue out;
  out.type_ = GgufType::kArray;
  out.elem_type_ = GgufType::kBool;
  out.count_ = v.size();
  out.raw_.reserve(v.size());
  for (bool b : v) out.raw_.push_back(b ? 1 : 0);
  return out;
}

template <typename T>
GgufValue GgufValue::NumericArray(std::span<const T> v) {
  GgufValue out;
  out.type_ = GgufType::kArray;
  out.elem_type_ = GgufTypeOf<T>();
  out.count_ = v.size();
  const auto* p = reinterpret_cast<const uint8_t*>(v.data());
  out.raw_.assign(p, p + v.size_bytes());
  return out;
}

template GgufValue GgufValue::NumericArray<uint8_t>(std::span<const uint8_t>);
template GgufValue GgufValue::NumericArray<int8_t>(std::span<const int8_t>);
template GgufValue GgufValue::NumericArray<uint16_t>(std::span<const uint16_t>);
template GgufValue GgufValue::NumericArray<int16_t>(std::span<const int16_t>);
template GgufValue GgufValue::NumericArray<uint32_t>(std::span<const uint32_t>);
template GgufValue GgufValue::NumericArray<int32_t>(std::span<const int32_t>);
template GgufValue GgufValue::NumericArray<uint64_t>(std::span<const uint64_t>);
template GgufValue GgufValue::NumericArray<int64_t>(std::span<const int64_t>);
template GgufValue GgufValue::NumericArray<float>(std::span<const float>);
template GgufValue GgufValue::NumericArray<double>(std::span<const double>);

GgufValue GgufValue::ArrayOfArrays(std::vector<GgufValue> elems) {
  GgufValue out;
  out.type_ = GgufType::kArray;
  out.elem_type_ = GgufType::kArray;
  out.count_ = elems.size();
  out.arrays_ = std::move(elems);
  return out;
}

GgufValue GgufValue::Scalar(GgufType t, uint64_t bits) {
  GgufValue v;
  v.type_ = t;
  v.bits_ = bits;
  return v;
}

std::optional<int64_t> GgufValue::AsInt() const { return IntFromBits(type_, bits_); }
std::optional<uint64_t> GgufValue::AsUint() const { return UintFromBits(type_, bits_); }
std::optional<double> GgufValue::AsFloat() const { return FloatFromBits(type_, bits_); }
std::optional<bool> GgufValue::AsBool() const {
  if (type_ != GgufType::kBool) return std::nullopt;
  return bits_ != 0;
}
const std::string* GgufValue::AsString() const {
  return type_ == GgufType::kString ? &str_ : nullptr;
}

std::optional<int64_t> GgufValue::IntAt(uint64_t i) const {
  if (type_ != GgufType::kArray || i >= count_ || !GgufIsInteger(elem_type_)) return std::nullopt;
  const size_t n = GgufFixedSize(elem_type_);
  return IntFromBits(elem_type_, LoadLE(raw_.data() + i * n, n));
}

std::optional<double> GgufValue::FloatAt(uint64_t i) const {
  if (type_ != GgufType::kArray || i >= count_ || !GgufIsFloat(elem_type_)) return std::nullopt;
  const size_t n = GgufFixedSize(elem_type_);
  return FloatFromBits(elem_type_, LoadLE(raw_.data() + i * n, n));
}

std::string GgufValue::Render() const {
  if (type_ == GgufType::kString) return Quote(str_);
  if (type_ == GgufType::kArray) {
    std::string out = "[";
    out += GgufTypeName(elem_type_);
    out += " x ";
    AppendNumber(&out, count_);
    out += "]";
    return out;
  }
  return RenderScalar(type_, bits_);
}

void GgufValue::Encode(std::string* out) const {
  if (type_ == GgufType::kString) {
    AppendGgufString(out, str_);
    return;
  }
  if (type_ != GgufType::kArray) {
    out->append(reinterpret_cast<const char*>(&bits_), GgufFixedSize(type_));
    return;
  }
  AppendU32(out, static_cast<uint32_t>(elem_type_));
  AppendU64(out, count_);
  if (elem_type_ == GgufType::kString) {
    for (const auto& s : strings_) AppendGgufString(out, s);
  } else if (elem_type_ == GgufType::kArray) {
    for (const auto& a : arrays_) a.Encode(out);
  } else {
    out->append(reinterpret_cast<const char*>(raw_.data()), raw_.size());
  }
}

bool GgufValue::operator==(const GgufValue& o) const {
  return type_ == o.type_ && bits_ == o.bits_ && str_ == o.str_ && elem_type_ == o.elem_type_ &&
         count_ == o.count_ && raw_ == o.raw_ && strings_ == o.strings_ && arrays_ == o.arrays_;
}

// ---------------------------------------------------------------- parsing

// Reads one GGUF image front to back. Every read is bounds-checked against the
// bytes left; every count is checked against the bytes it would need before
// anything is reserved for it.
class GgufParser {
 public:
  GgufParser(GgufFile* f) : f_(f), data_(f->data_), size_(f->size_) {}

  Status Run() {
    STRATA_RETURN_IF_ERROR(ReadHeader());
    STRATA_RETURN_IF_ERROR(ReadMetadata());
    STRATA_RETURN_IF_ERROR(ReadAlignment());
    STRATA_RETURN_IF_ERROR(ReadTensorInfos());
    return PlaceTensorData();
  }

 private:
  Status Corrupt(std::string msg) const {
    return Status::Corrupt(f_->origin_ + ": " + std::move(msg));
  }
  Status Unsupported(std::string msg) const {
    return Status::Unsupported(f_->origin_ + ": " + std::move(msg));
  }
  size_t remaining() const { return size_ - pos_; }

  // `what` and `ctx` are joined only on failure, so the fast path allocates nothing.
  Status Need(uint64_t n, std::string_view what, std::string_view ctx = {}) const {
    if (n <= remaining()) return Status::Ok();
    std::string msg =
        "truncated at offset " + std::to_string(pos_) + " reading " + std::string(what);
    if (!ctx.empty()) msg += " of " + std::string(ctx);
    msg += ": needs " + std::to_string(n) + " bytes, " + std::to_string(remaining()) + " left";
    return Corrupt(std::move(msg));
  }
  Status ReadU32(uint32_t* v, std::string_view what, std::string_view ctx = {}) {
    STRATA_RETURN_IF_ERROR(Need(4, what, ctx));
    *v = static_cast<uint32_t>(LoadLE(data_ + pos_, 4));
    pos_ += 4;
    return Status::Ok();
  }
  Status ReadU64(uint64_t* v, std::string_view what, std::string_view ctx = {}) {
    STRATA_RETURN_IF_ERROR(Need(8, what, ctx));
    *v = LoadLE(data_ + pos_, 8);
    pos_ += 8;
    return Status::Ok();
  }
  Status ReadString(std::string* s, std::string_view what, std::string_view ctx = {}) {
    uint64_t len = 0;
    STRATA_RETURN_IF_ERROR(ReadU64(&len, what, ctx));
    if (len > remaining()) {
      std::string msg = "string length " + std::to_string(len) + " at offset " +
                        std::to_string(pos_ - 8) + " (" + std::string(what);
      if (!ctx.empty()) msg += " of " + std::string(ctx);
      msg += ") runs past the end of the file: " + std::to_string(remaining()) + " bytes left";
      return Corrupt(std::move(msg));
    }
    s->assign(reinterpret_cast<const char*>(data_ + pos_), len);
    pos_ += len;
    return Status::Ok();
  }

  Status ReadHeader() {
    uint32_t magic = 0;
    STRATA_RETURN_IF_ERROR(ReadU32(&magic, "magic"));
    if (magic != kMagic) {
      std::string seen(reinterpret_cast<const char*>(data_), 4);
      return Corrupt("not a GGUF file: bad magic " + Quote(seen) + ", expected \"GGUF\"");
    }
    uint32_t version = 0;
    STRATA_RETURN_IF_ERROR(ReadU32(&version, "version"));
    if (version == 2 || version == 3) {
      f_->version_ = version;
    } else {
      const uint32_t swapped = __builtin_bswap32(version);
      if (swapped >= 1 && swapped <= 3) {
        return Unsupported("big-endian GGUF (version " + std::to_string(swapped) +
                           ") is not supported");
      }
      return Unsupported("GGUF version " + std::to_string(version) +
                         " is not supported (only versions 2 and 3)");
    }
    STRATA_RETURN_IF_ERROR(ReadU64(&n_tensors_, "tensor count"));
    return ReadU64(&n_kv_, "metadata count");
  }

  Status ReadMetadata() {
    if (n_kv_ > remaining() / kMinKvBytes) {
      return Corrupt("metadata count " + std::to_string(n_kv_) + " is impossible: " +
                     std::to_string(remaining()) + " bytes left after the header");
    }
    std::unordered_set<std::string> seen;
    for (uint64_t i = 0; i < n_kv_; ++i) {
      const std::string ctx = "metadata entry " + std::to_string(i);
      GgufKeyValue kv;
      STRATA_RETURN_IF_ERROR(ReadString(&kv.key, "key", ctx));
      if (!seen.insert(kv.key).second) return Corrupt("duplicate key '" + kv.key + "'");
      const std::string key_ctx = "key '" + kv.key + "'";
      uint32_t type_id = 0;
      STRATA_RETURN_IF_ERROR(ReadU32(&type_id, "value type", key_ctx));
      auto type = GgufTypeFromId(type_id);
      if (!type) {
        return Corrupt(key_ctx + " has unknown value type id " + std::to_string(type_id));
      }
      STRATA_RETURN_IF_ERROR(ReadValue(*type, &kv.value, 0, key_ctx));
      f_->kvs_.push_back(std::move(kv));
    }
    return Status::Ok();
  }

  Status ReadValue(GgufType type, GgufValue* v, int depth, const std::string& ctx) {
    v->type_ = type;
    if (type == GgufType::kString) return ReadString(&v->str_, "string value", ctx);
    if (type == GgufType::kArray) return ReadArray(v, depth + 1, ctx);
    const size_t n = GgufFixedSize(type);
    STRATA_RETURN_IF_ERROR(Need(n, GgufTypeName(type), ctx));
    v->bits_ = LoadLE(data_ + pos_, n);
    pos_ += n;
    return Status::Ok();
  }

  Status ReadArray(GgufValue* v, int depth, const std::string& ctx) {
    if (depth > GgufFile::kMaxArrayDepth) {
      return Corrupt(ctx + ": arrays nested deeper than " +
                     std::to_string(GgufFile::kMaxArrayDepth) + " levels");
    }
    uint32_t elem_id = 0;
    STRATA_RETURN_IF_ERROR(ReadU32(&elem_id, "array element type", ctx));
    auto elem = GgufTypeFromId(elem_id);
    if (!elem)
      return Corrupt(ctx + ": array has unknown element type id " + std::to_string(elem_id));
    uint64_t count = 0;
    STRATA_RETURN_IF_ERROR(ReadU64(&count, "array length", ctx));
    const size_t fixed = GgufFixedSize(*elem);
    const uint64_t min_elem = fixed != 0                   ? fixed
                              : *elem == GgufType::kString ? 8
                                                           : kMinNestedArrayBytes;
    if (count > remaining() / min_elem) {
      return Corrupt(ctx + ": array of " + std::to_string(count) + " " +
                     std::string(GgufTypeName(*elem)) + " elements at offset " +
                     std::to_string(pos_) + " needs at least " + std::to_string(min_elem) +
                     " bytes each, only " + std::to_string(remaining()) + " left");
    }
    v->elem_type_ = *elem;
    v->count_ = count;
    if (fixed != 0) {
      v->raw_.assign(data_ + pos_, data_ + pos_ + count * fixed);
      pos_ += count * fixed;
    } else if (*elem == GgufType::kString) {
      v->strings_.resize(count);
      for (auto& s : v->strings_) STRATA_RETURN_IF_ERROR(ReadString(&s, "array string", ctx));
    } else {
      v->arrays_.resize(count);
      for (auto& a : v->arrays_)
        STRATA_RETURN_IF_ERROR(ReadValue(GgufType::kArray, &a, depth, ctx));
    }
    return Status::Ok();
  }

  Status ReadAlignment() {
    const GgufValue* v = nullptr;
    for (const auto& kv : f_->kvs_) {
      if (kv.key == "general.alignment") v = &kv.value;
    }
    if (v == nullptr) return Status::Ok();
    if (!GgufIsInteger(v->type())) {
      return Corrupt("general.alignment must be an unsigned integer, got " +
                     std::string(GgufTypeName(v->type())));
    }
    auto a = v->AsUint();
    if (!a || *a == 0 || *a > (uint64_t{1} << 31) || !std::has_single_bit(*a)) {
      return Corrupt("general.alignment " + v->Render() +
                     " is not a nonzero power of two (at most 2^31)");
    }
    f_->alignment_ = static_cast<uint32_t>(*a);
    return Status::Ok();
  }

  Status ReadTensorInfos() {
    if (n_tensors_ > remaining() / kMinTensorInfoBytes) {
      return Corrupt("tensor count " + std::to_string(n_tensors_) + " is impossible: " +
                     std::to_string(remaining()) + " bytes left after the metadata");
    }
    std::unordered_set<std::string> seen;
    f_->tensors_.reserve(n_tensors_);
    for (uint64_t i = 0; i < n_tensors_; ++i) {
      GgufTensor t;
      STRATA_RETURN_IF_ERROR(ReadString(&t.name, "name", "tensor " + std::to_string(i)));
      if (!seen.insert(t.name).second) return Corrupt("duplicate tensor '" + t.name + "'");
      const std::string ctx = "tensor '" + t.name + "'";
      uint32_t n_dims = 0;
      STRATA_RETURN_IF_ERROR(ReadU32(&n_dims, "n_dims", ctx));
      if (n_dims == 0 || n_dims > static_cast<uint32_t>(GgufFile::kMaxDims)) {
        return Corrupt(ctx + ": n_dims " + std::to_string(n_dims) + " is outside 1.." +
                       std::to_string(GgufFile::kMaxDims));
      }
      int64_t elements = 1;
      for (uint32_t d = 0; d < n_dims; ++d) {
        uint64_t dim = 0;
        STRATA_RETURN_IF_ERROR(ReadU64(&dim, "dimension", ctx));
        if (dim == 0 || dim > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
          return Corrupt(ctx + ": dimension " + std::to_string(d) + " is " +
                         (dim == 0 ? "0" : std::to_string(static_cast<int64_t>(dim))) +
                         " (must be positive)");
        }
        if (__builtin_mul_overflow(elements, static_cast<int64_t>(dim), &elements)) {
          return Corrupt(ctx + ": element count overflows int64");
        }
        t.ne.push_back(static_cast<int64_t>(dim));
      }
      uint32_t type_id = 0;
      STRATA_RETURN_IF_ERROR(ReadU32(&type_id, "type", ctx));
      auto dtype = DTypeFromGgufId(type_id);
      if (!dtype) {
        return Unsupported(ctx + " has type id " + std::to_string(type_id) + " (ggml '" +
                           std::string(GgmlTypeName(type_id)) +
                           "'), which Strata does not support");
      }
      t.type = *dtype;
      const DTypeInfo& info = GetDTypeInfo(t.type);
      if (t.ne[0] % info.block_elems != 0) {
        return Corrupt(ctx + ": row length " + std::to_string(t.ne[0]) +
                       " is not a multiple of the " + std::string(info.name) + " block size " +
                       std::to_string(info.block_elems));
      }
      uint64_t nbytes = 0;
      if (__builtin_mul_overflow(static_cast<uint64_t>(elements / info.block_elems),
                                 static_cast<uint64_t>(info.block_bytes), &nbytes)) {
        return Corrupt(ctx + ": byte size overflows 64 bits");
      }
      t.nbytes = nbytes;
      STRATA_RETURN_IF_ERROR(ReadU64(&t.offset, "data offset", ctx));
      if (t.offset % f_->alignment_ != 0) {
        return Corrupt(ctx + ": data offset " + std::to_string(t.offset) + " is not aligned to " +
                       std::to_string(f_->alignment_));
      }
      f_->tensors_.push_back(std::move(t));
    }
    return Status::Ok();
  }

  Status PlaceTensorData() {
    const uint64_t a = f_->alignment_;
    f_->data_offset_ = (static_cast<uint64_t>(pos_) + a - 1) / a * a;
    for (auto& t : f_->tensors_) {
      uint64_t begin = 0, end = 0;
      if (__builtin_add_overflow(f_->data_offset_, t.offset, &begin) ||
          __builtin_add_overflow(begin, static_cast<uint64_t>(t.nbytes), &end) || end > size_) {
        return Corrupt("tensor '" + t.name + "' data (offset " + std::to_string(t.offset) + ", " +
                       std::to_string(t.nbytes) + " bytes, data section at " +
                       std::to_string(f_->data_offset_) + ") is past the end of the file (" +
                       std::to_string(size_) + " bytes)");
      }
      t.data = data_ + begin;
    }
    return Status::Ok();
  }

  GgufFile* f_;
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
  uint64_t n_tensors_ = 0;
  uint64_t n_kv_ = 0;
};

// ---------------------------------------------------------------- GgufFile

Tensor GgufTensor::ToTensor() const {
  Tensor t;
  t.name = name;
  t.type = type;
  t.ne = ne;
  t.data = data;
  t.nbytes = nbytes;
  return t;
}

Result<std::unique_ptr<GgufFile>> GgufFile::Open(const std::string& path) {
  STRATA_ASSIGN_OR_RETURN(auto mapped, MappedFile::Open(path));
  const uint8_t* data = mapped->data();
  const size_t size = mapped->size();
  STRATA_ASSIGN_OR_RETURN(auto file, Parse(data, size, path));
  file->file_ = std::move(mapped);
  return file;
}

Result<std::unique_ptr<GgufFile>> GgufFile::Parse(const uint8_t* data, size_t size,
                                                  std::string origin) {
  std::unique_ptr<GgufFile> f(new GgufFile());
  f->origin_ = std::move(origin);
  f->data_ = data;
  f->size_ = data == nullptr ? 0 : size;
  GgufParser parser(f.get());
  STRATA_RETURN_IF_ERROR(parser.Run());
  // Indexes are built last: the views must not see the vectors reallocate.
  for (size_t i = 0; i < f->kvs_.size(); ++i) f->kv_index_.emplace(f->kvs_[i].key, i);
  for (size_t i = 0; i < f->tensors_.size(); ++i) f->tensor_index_.emplace(f->tensors_[i].name, i);
  return f;
}

const GgufValue* GgufFile::Find(std::string_view key) const {
  auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kvs_[it->second].value;
}

const GgufTensor* GgufFile::FindTensor(std::string_view name) const {
  auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

std::vector<GgufKeyInfo> GgufFile::ListKeys() const {
  std::vector<GgufKeyInfo> out;
  out.reserve(kvs_.size());
  for (const auto& kv : kvs_) {
    std::string type(GgufTypeName(kv.value.type()));
    if (kv.value.is_array()) type += "[" + std::string(GgufTypeName(kv.value.elem_type())) + "]";
    out.push_back({kv.key, std::move(type), kv.value.Render()});
  }
  return out;
}

namespace {
std::string TypeLabel(const GgufValue& v) {
  std::string s(GgufTypeName(v.type()));
  if (v.is_array()) s += " of " + std::string(GgufTypeName(v.elem_type()));
  return s;
}
}  // namespace

// Looks up `key` and checks its type with `ok`; errors name both types.
#define STRATA_GGUF_LOOKUP_(v, key, ok, expected)                                             \
  const GgufValue* v = Find(key);                                                             \
  if (v == nullptr) {                                                                         \
    return Status::NotFound(origin_ + ": metadata key '" + std::string(key) + "' not found"); \
  }                                                                                           \
  if (!(ok)) {                                                                                \
    return Status::InvalidArgument(origin_ + ": key '" + std::string(key) + "' is " +         \
                                   TypeLabel(*v) + ", expected " + (expected));               \
  }

Result<std::string> GgufFile::GetString(std::string_view key) const {
  STRATA_GGUF_LOOKUP_(v, key, v->type() == GgufType::kString, "string");
  return *v->AsString();
}

Result<int64_t> GgufFile::GetInt(std::string_view key) const {
  STRATA_GGUF_LOOKUP_(v, key, GgufIsInteger(v->type()), "an integer");
  auto i = v->AsInt();
  if (!i) {
    return Status::OutOfRange(origin_ + ": key '" + std::string(key) + "' value " + v->Render() +
                              " does not fit int64");
  }
  return *i;
}

Result<uint64_t> GgufFile::GetUint(std::string_view key) const {
  STRATA_GGUF_LOOKUP_(v, key, GgufIsInteger(v->type()), "an integer");
  auto u = v->AsUint();
  if (!u) {
    return Status::OutOfRange(origin_ + ": key '" + std::string(key) + "' value " + v->Render() +
                              " is negative, expected an unsigned integer");
  }
  return *u;
}

Result<double> GgufFile::GetFloat(std::string_view key) const {
  STRATA_GGUF_LOOKUP_(v, key, GgufIsFloat(v->type()), "f32 or f64");
  return *v->AsFloat();
}

Result<bool> GgufFile::GetBool(std::string_view key) const {
  STRATA_GGUF_LOOKUP_(v, key, v->type() == GgufType::kBool, "bool");
  return *v->AsBool();
}

Result<const std::vector<std::string>*> GgufFile::GetStringArray(std::string_view key) const {
  STRATA_GGUF_LOOKUP_(v, key, v->is_array() && v->elem_type() == GgufType::kString,
                      "array of string");
  return &v->strings();
}

Result<std::vector<float>> GgufFile::GetFloatArray(std::string_view key) const {
  STRATA_GGUF_LOOKUP_(v, key, v->is_array() && GgufIsFloat(v->elem_type()), "array of f32 or f64");
  std::vector<float> out(v->size());
  for (uint64_t i = 0; i < v->size(); ++i) out[i] = static_cast<float>(*v->FloatAt(i));
  return out;
}

Result<std::vector<int64_t>> GgufFile::GetIntArray(std::string_view key) const {
  STRATA_GGUF_LOOKUP_(v, key, v->is_array() && GgufIsInteger(v->elem_type()), "array of integers");
  std::vector<int64_t> out(v->size());
  for (uint64_t i = 0; i < v->size(); ++i) {
    auto x = v->IntAt(i);
    if (!x) {
      return Status::OutOfRange(origin_ + ": key '" + std::string(key) + "' element " +
                                std::to_string(i) + " does not fit int64");
    }
    out[i] = *x;
  }
  return out;
}

#undef STRATA_GGUF_LOOKUP_

}  // namespace strata
