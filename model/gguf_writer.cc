#include "model/gguf_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <bit>
#include <cerrno>
#include <cstring>
#include <limits>

namespace strata {

namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF"
constexpr uint32_t kVersion = 3;
constexpr char kZeros[64] = {};

void AppendU32(std::string* out, uint32_t v) { out->append(reinterpret_cast<const char*>(&v), 4); }
void AppendU64(std::string* out, uint64_t v) { out->append(reinterpret_cast<const char*>(&v), 8); }

uint64_t AlignUp(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

Status EmitZeros(const GgufWriter::Sink& sink, uint64_t n) {
  while (n > 0) {
    const size_t chunk = n < sizeof kZeros ? static_cast<size_t>(n) : sizeof kZeros;
    STRATA_RETURN_IF_ERROR(sink(kZeros, chunk));
    n -= chunk;
  }
  return Status::Ok();
}

}  // namespace

void GgufWriter::SetValue(std::string key, GgufValue value) {
  auto it = kv_index_.find(key);
  if (it != kv_index_.end()) {
    kvs_[it->second].value = std::move(value);
    return;
  }
  kv_index_.emplace(key, kvs_.size());
  kvs_.push_back({std::move(key), std::move(value)});
}

Result<size_t> GgufWriter::CheckTensor(const std::string& name, DType type,
                                       const std::vector<int64_t>& ne) const {
  const std::string ctx = "GGUF tensor '" + name + "'";
  if (tensor_index_.contains(name)) return Status::InvalidArgument("duplicate " + ctx);
  if (ne.empty() || ne.size() > static_cast<size_t>(GgufFile::kMaxDims)) {
    return Status::InvalidArgument(ctx + ": " + std::to_string(ne.size()) + " dims, expected 1.." +
                                   std::to_string(GgufFile::kMaxDims));
  }
  int64_t elements = 1;
  for (int64_t d : ne) {
    if (d <= 0) return Status::InvalidArgument(ctx + ": dimension " + std::to_string(d) + " <= 0");
    if (__builtin_mul_overflow(elements, d, &elements)) {
      return Status::InvalidArgument(ctx + ": element count overflows int64");
    }
  }
  const DTypeInfo& info = GetDTypeInfo(type);
  if (ne[0] % info.block_elems != 0) {
    return Status::InvalidArgument(ctx + ": row length " + std::to_string(ne[0]) +
                                   " is not a multiple of the " + std::string(info.name) +
                                   " block size " + std::to_string(info.block_elems));
  }
  uint64_t nbytes = 0;
  if (__builtin_mul_overflow(static_cast<uint64_t>(elements / info.block_elems),
                             static_cast<uint64_t>(info.block_bytes), &nbytes)) {
    return Status::InvalidArgument(ctx + ": byte size overflows 64 bits");
  }
  return static_cast<size_t>(nbytes);
}

Status GgufWriter::Add(PendingTensor t) {
  tensor_index_.emplace(t.name, tensors_.size());
  tensors_.push_back(std::move(t));
  return Status::Ok();
}

Status GgufWriter::AddTensor(std::string name, DType type, std::vector<int64_t> ne,
                             const void* data, size_t nbytes) {
  STRATA_ASSIGN_OR_RETURN(size_t expected, CheckTensor(name, type, ne));
  if (nbytes != expected) {
    return Status::InvalidArgument("GGUF tensor '" + name + "': " + std::to_string(nbytes) +
                                   " bytes given, its shape and type need " +
                                   std::to_string(expected));
  }
  if (data == nullptr) return Status::InvalidArgument("GGUF tensor '" + name + "': null data");
  PendingTensor t{std::move(name), type, std::move(ne), nbytes, 0, data, {}, {}};
  return Add(std::move(t));
}

Status GgufWriter::AddTensorOwned(std::string name, DType type, std::vector<int64_t> ne,
                                  std::vector<uint8_t> data) {
  STRATA_ASSIGN_OR_RETURN(size_t expected, CheckTensor(name, type, ne));
  if (data.size() != expected) {
    return Status::InvalidArgument("GGUF tensor '" + name + "': " + std::to_string(data.size()) +
                                   " bytes given, its shape and type need " +
                                   std::to_string(expected));
  }
  PendingTensor t{std::move(name), type, std::move(ne), expected, 0, nullptr, std::move(data), {}};
  return Add(std::move(t));
}

Status GgufWriter::AddTensorProduced(std::string name, DType type, std::vector<int64_t> ne,
                                     Producer producer) {
  STRATA_ASSIGN_OR_RETURN(size_t expected, CheckTensor(name, type, ne));
  if (!producer) return Status::InvalidArgument("GGUF tensor '" + name + "': empty producer");
  PendingTensor t{std::move(name), type, std::move(ne),      expected, 0,
                  nullptr,         {},   std::move(producer)};
  return Add(std::move(t));
}

Result<uint32_t> GgufWriter::Alignment() const {
  auto it = kv_index_.find("general.alignment");
  if (it == kv_index_.end()) return GgufFile::kDefaultAlignment;
  const GgufValue& v = kvs_[it->second].value;
  auto a = v.AsUint();
  if (!a || *a == 0 || !std::has_single_bit(*a) || *a > (uint64_t{1} << 31)) {
    return Status::InvalidArgument(
        "general.alignment must be an unsigned power of two <= 2^31, got " +
        std::string(GgufTypeName(v.type())) + " " + v.Render());
  }
  return static_cast<uint32_t>(*a);
}

std::string GgufWriter::EncodeMeta(uint32_t alignment) const {
  std::string out;
  AppendU32(&out, kMagic);
  AppendU32(&out, kVersion);
  AppendU64(&out, tensors_.size());
  AppendU64(&out, kvs_.size());
  for (const auto& kv : kvs_) {
    AppendU64(&out, kv.key.size());
    out += kv.key;
    AppendU32(&out, static_cast<uint32_t>(kv.value.type()));
    kv.value.Encode(&out);
  }
  uint64_t offset = 0;
  for (const auto& t : tensors_) {
    AppendU64(&out, t.name.size());
    out += t.name;
    AppendU32(&out, static_cast<uint32_t>(t.ne.size()));
    for (int64_t d : t.ne) AppendU64(&out, static_cast<uint64_t>(d));
    AppendU32(&out, static_cast<uint32_t>(t.type));
    AppendU64(&out, offset);
    offset = AlignUp(offset + t.nbytes, alignment);
  }
  out.resize(AlignUp(out.size(), alignment), '\0');
  return out;
}

Status GgufWriter::Emit(const Sink& sink) const {
  STRATA_ASSIGN_OR_RETURN(uint32_t alignment, Alignment());
  const std::string meta = EncodeMeta(alignment);
  STRATA_RETURN_IF_ERROR(sink(meta.data(), meta.size()));
  for (const auto& t : tensors_) {
    if (t.producer) {
      size_t written = 0;
      const Sink counted = [&](const void* p, size_t n) -> Status {
        if (n > t.nbytes - written) {
          return Status::InvalidArgument("producer for GGUF tensor '" + t.name +
                                         "' gave more than its " + std::to_string(t.nbytes) +
                                         " bytes");
        }
        written += n;
        return sink(p, n);
      };
      STRATA_RETURN_IF_ERROR(t.producer(counted));
      if (written != t.nbytes) {
        return Status::InvalidArgument("producer for GGUF tensor '" + t.name + "' gave " +
                                       std::to_string(written) + " of its " +
                                       std::to_string(t.nbytes) + " bytes");
      }
    } else {
      const void* p = t.data != nullptr ? t.data : t.owned.data();
      STRATA_RETURN_IF_ERROR(sink(p, t.nbytes));
    }
    STRATA_RETURN_IF_ERROR(EmitZeros(sink, AlignUp(t.nbytes, alignment) - t.nbytes));
  }
  return Status::Ok();
}

Result<std::string> GgufWriter::WriteToString() const {
  std::string out;
  STRATA_RETURN_IF_ERROR(Emit([&out](const void* p, size_t n) {
    out.append(static_cast<const char*>(p), n);
    return Status::Ok();
  }));
  return out;
}

Status GgufWriter::Write(const std::string& path) const {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return Status::IoError("cannot create", tmp, errno);
  Status st = Emit([&](const void* data, size_t len) -> Status {
    const char* p = static_cast<const char*>(data);
    while (len > 0) {
      ssize_t n = ::write(fd, p, len);
      if (n < 0) {
        if (errno == EINTR) continue;
        return Status::IoError("cannot write", tmp, errno);
      }
      p += n;
      len -= static_cast<size_t>(n);
    }
    return Status::Ok();
  });
  if (st.ok() && ::fsync(fd) != 0) st = Status::IoError("cannot fsync", tmp, errno);
  if (::close(fd) != 0 && st.ok()) st = Status::IoError("cannot close", tmp, errno);
  if (st.ok() && ::rename(tmp.c_str(), path.c_str()) != 0) {
    st = Status::IoError("cannot rename into place", path, errno);
  }
  if (!st.ok()) ::unlink(tmp.c_str());
  return st;
}

}  // namespace strata
