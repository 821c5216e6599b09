#include "model/safetensors.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>

namespace strata {

namespace {

using nlohmann::json;

constexpr size_t kMaxDims = 4;  // Tensor holds up to 4 dims

struct DTypeEntry {
  std::string_view name;
  DType type;
};
constexpr DTypeEntry kDTypes[] = {
    {"F32", DType::kF32},
    {"F16", DType::kF16},
    {"BF16", DType::kBF16},
};

std::optional<DType> ParseDType(std::string_view s) {
  for (const auto& e : kDTypes)
    if (e.name == s) return e.type;
  return std::nullopt;
}

size_t ElementBytes(DType t) { return static_cast<size_t>(GetDTypeInfo(t).block_bytes); }

// elements x element size of `shape`, or nullopt on a negative dim or overflow.
std::optional<uint64_t> ShapeBytes(const std::vector<int64_t>& shape, DType t) {
  uint64_t n = ElementBytes(t);
  for (int64_t d : shape) {
    if (d < 0) return std::nullopt;
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n)) return std::nullopt;
  }
  return n;
}

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

Status WriteAll(int fd, const void* data, size_t len, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (len > 0) {
    ssize_t n = ::write(fd, p, len);
    if (n < 0) {
      if (errno == EINTR) continue;
      return Status::IoError("cannot write", path, errno);
    }
    p += n;
    len -= static_cast<size_t>(n);
  }
  return Status::Ok();
}

}  // namespace

Result<std::string_view> SafetensorsDTypeName(DType t) {
  for (const auto& e : kDTypes)
    if (e.type == t) return e.name;
  return Status::Unsupported("dtype " + std::string(DTypeName(t)) +
                             " cannot be stored in safetensors (F32, F16, BF16 can)");
}

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  STRATA_ASSIGN_OR_RETURN(auto file, MappedFile::Open(path));
  return Parse(std::move(file));
}

Result<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Parse(std::unique_ptr<MappedFile> file) {
  if (file == nullptr) return Status::InvalidArgument("SafetensorsFile::Parse: no file");
  std::unique_ptr<SafetensorsFile> f(new SafetensorsFile());
  f->path_ = file->path();
  f->file_ = std::move(file);
  Status s;
  try {
    s = f->ParseHeader();
  } catch (const std::exception& e) {  // nlohmann::json or allocation failures
    s = Status::Corrupt(std::string("cannot parse header: ") + e.what());
  }
  if (!s.ok()) return s.WithContext("safetensors file '" + f->path_ + "'");
  return f;
}

Status SafetensorsFile::ParseHeader() {
  const uint8_t* base = file_->data();
  const uint64_t size = file_->size();
  if (size < 8)
    return Status::Corrupt("truncated: " + std::to_string(size) +
                           " bytes is too short for the 8-byte header length");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | base[i];
  if (header_len > kSafetensorsMaxHeaderBytes)
    return Status::Corrupt("header length " + std::to_string(header_len) +
                           " is absurd (more than " + std::to_string(kSafetensorsMaxHeaderBytes) +
                           " bytes)");
  if (header_len > size - 8)
    return Status::Corrupt("header length " + std::to_string(header_len) +
                           " runs past the end of the file (" + std::to_string(size) + " bytes)");
  if (header_len < 2)
    return Status::Corrupt("header of " + std::to_string(header_len) + " bytes is too short");

  const char* hdr = reinterpret_cast<const char*>(base + 8);
  json j;
  try {
    j = json::parse(hdr, hdr + header_len);
  } catch (const json::parse_error& e) {
    return Status::Corrupt(std::string("header is not valid JSON: ") + e.what());
  }
  if (!j.is_object()) return Status::Corrupt("header is not a JSON object");

  const uint8_t* data = base + 8 + header_len;
  const uint64_t data_size = size - 8 - header_len;
  for (const auto& [name, v] : j.items()) {
    if (name == "__metadata__") {
      if (v.is_null()) continue;
      if (!v.is_object()) return Status::Corrupt("'__metadata__' is not an object");
      for (const auto& [k, mv] : v.items()) {
        if (!mv.is_string())
          return Status::Corrupt("metadata value for '" + k + "' is not a string");
        metadata_[k] = mv.get<std::string>();
      }
      continue;
    }
    auto bad = [&](const std::string& what) {
      return Status::Corrupt("tensor '" + name + "': " + what);
    };
    if (!v.is_object()) return bad("entry is not an object");
    auto dt = v.find("dtype");
    auto sh = v.find("shape");
    auto off = v.find("data_offsets");
    if (dt == v.end() || !dt->is_string()) return bad("missing or non-string 'dtype'");
    if (sh == v.end() || !sh->is_array()) return bad("missing or non-array 'shape'");
    if (off == v.end() || !off->is_array() || off->size() != 2)
      return bad("'data_offsets' must be an array [begin, end]");

    const std::string dtype_name = dt->get<std::string>();
    std::optional<DType> type = ParseDType(dtype_name);
    if (!type)
      return Status::Unsupported("tensor '" + name + "' has dtype " + dtype_name +
                                 ", which Strata does not support (F32, F16, BF16)");
    std::vector<int64_t> shape;
    for (const auto& d : *sh) {
      if (!d.is_number_integer()) return bad("shape " + sh->dump() + " holds a non-integer");
      if (d.is_number_unsigned() && d.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
        return bad("shape " + sh->dump() + " has a dimension out of range");
      int64_t x = d.get<int64_t>();
      if (x < 0) return bad("shape " + sh->dump() + " has a negative dimension");
      shape.push_back(x);
    }
    if (shape.size() > kMaxDims)
      return Status::Unsupported("tensor '" + name + "' has " + std::to_string(shape.size()) +
                                 " dimensions (at most 4 are supported)");
    for (const auto& o : *off)
      if (!o.is_number_unsigned()) return bad("data_offsets must be non-negative integers");
    const uint64_t begin = (*off)[0].get<uint64_t>();
    const uint64_t end = (*off)[1].get<uint64_t>();
    if (begin > end)
      return bad("data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                 ") are reversed");
    if (end > data_size)
      return bad("data_offsets [" + std::to_string(begin) + ", " + std::to_string(end) +
                 ") run past the end of the data (" + std::to_string(data_size) + " bytes)");
    std::optional<uint64_t> want = ShapeBytes(shape, *type);
    if (!want) return bad("shape " + ShapeString(shape) + " is too large");
    if (*want != end - begin)
      return bad("data_offsets cover " + std::to_string(end - begin) + " bytes but " + dtype_name +
                 " " + ShapeString(shape) + " needs " + std::to_string(*want));

    Tensor t;
    t.name = name;
    t.type = *type;
    t.ne.assign(shape.rbegin(), shape.rend());
    if (t.ne.empty()) t.ne.push_back(1);
    t.data = data + begin;
    t.nbytes = static_cast<size_t>(end - begin);
    tensors_.push_back(std::move(t));
  }
  std::sort(tensors_.begin(), tensors_.end(),
            [](const Tensor& a, const Tensor& b) { return a.name < b.name; });
  return Status::Ok();
}

const Tensor* SafetensorsFile::Find(std::string_view name) const {
  auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name,
                             [](const Tensor& t, std::string_view n) { return t.name < n; });
  if (it == tensors_.end() || it->name != name) return nullptr;
  return &*it;
}

Status SafetensorsWriter::Add(std::string name, DType type, std::vector<int64_t> shape,
                              const void* data, size_t nbytes) {
  if (name.empty()) return Status::InvalidArgument("safetensors tensor name is empty");
  if (name == "__metadata__")
    return Status::InvalidArgument("'__metadata__' is reserved and cannot name a tensor");
  STRATA_ASSIGN_OR_RETURN(std::string_view dtype_name, SafetensorsDTypeName(type));
  (void)dtype_name;
  for (const auto& e : entries_)
    if (e.name == name) return Status::InvalidArgument("tensor '" + name + "' added twice");
  std::optional<uint64_t> want = ShapeBytes(shape, type);
  if (!want)
    return Status::InvalidArgument("tensor '" + name + "': shape " + ShapeString(shape) +
                                   " has a negative dimension or is too large");
  if (*want != nbytes)
    return Status::InvalidArgument("tensor '" + name + "': " + std::to_string(nbytes) +
                                   " bytes given but " + std::string(DTypeName(type)) + " " +
                                   ShapeString(shape) + " needs " + std::to_string(*want));
  if (data == nullptr && nbytes > 0)
    return Status::InvalidArgument("tensor '" + name + "' has no data");
  data_bytes_ += nbytes;
  entries_.push_back(Entry{std::move(name), type, std::move(shape), data, nbytes});
  return Status::Ok();
}

Status SafetensorsWriter::AddTensor(const Tensor& t, std::string name) {
  if (name.empty()) name = t.name;
  std::vector<int64_t> shape(t.ne.rbegin(), t.ne.rend());
  return Add(std::move(name), t.type, std::move(shape), t.data, t.nbytes);
}

Status SafetensorsWriter::Write(const std::string& path) const {
  std::string header;
  try {
    nlohmann::ordered_json h = nlohmann::ordered_json::object();
    if (!metadata_.empty()) {
      nlohmann::ordered_json m = nlohmann::ordered_json::object();
      for (const auto& [k, v] : metadata_) m[k] = v;
      h["__metadata__"] = std::move(m);
    }
    uint64_t offset = 0;
    for (const auto& e : entries_) {
      nlohmann::ordered_json t = nlohmann::ordered_json::object();
      t["dtype"] = std::string(*SafetensorsDTypeName(e.type));
      t["shape"] = e.shape;
      t["data_offsets"] = {offset, offset + e.nbytes};
      h[e.name] = std::move(t);
      offset += e.nbytes;
    }
    header = h.dump();
  } catch (const std::exception& e) {  // e.g. a name that is not valid UTF-8
    return Status::InvalidArgument("cannot build safetensors header for '" + path +
                                   "': " + e.what());
  }
  // Pad so the data region (and with it every tensor of 4-byte-multiple size)
  // starts 8-byte aligned in the file.
  while ((8 + header.size()) % 8 != 0) header.push_back(' ');

  uint8_t len_le[8];
  for (int i = 0; i < 8; ++i)
    len_le[i] = static_cast<uint8_t>(static_cast<uint64_t>(header.size()) >> (8 * i));

  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Status::IoError("cannot create", tmp, errno);
  Status s = WriteAll(fd, len_le, sizeof len_le, tmp);
  if (s.ok()) s = WriteAll(fd, header.data(), header.size(), tmp);
  for (const auto& e : entries_) {
    if (!s.ok()) break;
    s = WriteAll(fd, e.data, e.nbytes, tmp);
  }
  if (::close(fd) != 0 && s.ok()) s = Status::IoError("cannot close", tmp, errno);
  if (s.ok() && ::rename(tmp.c_str(), path.c_str()) != 0)
    s = Status::IoError("cannot rename into place", path, errno);
  if (!s.ok()) ::unlink(tmp.c_str());
  return s;
}

}  // namespace strata
