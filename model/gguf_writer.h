#pragma once
// Writing GGUF v3 files in the standard layout that llama.cpp and the Python
// `gguf` package read: header, metadata in insertion order, tensor infos in
// insertion order, zero padding to the alignment, then each tensor's data at
// an aligned offset (zero padding between tensors).
//
// Tensor data is not copied into an in-memory image: Write() streams each
// tensor to the file from wherever it lives (a caller buffer, a buffer the
// writer owns, or a producer callback), so multi-gigabyte synthetic models
// need no more memory than their largest buffer.
//
// Thread-safety: none; use one writer from one thread at a time.

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "model/backend/dtype.h"
#include "model/gguf.h"

namespace strata {

class GgufWriter {
 public:
  // Receives a tensor's bytes in order; returns non-OK to abort the write.
  using Sink = std::function<Status(const void* data, size_t nbytes)>;
  // Called once during Write(); must pass exactly the tensor's nbytes to
  // `sink` in total, in one or more calls.
  using Producer = std::function<Status(const Sink& sink)>;

  GgufWriter() = default;
  GgufWriter(const GgufWriter&) = delete;
  GgufWriter& operator=(const GgufWriter&) = delete;

  // Metadata. Setting a key that exists replaces its value and keeps its
  // position; new keys are appended. "general.alignment" (a power of two,
  // u32 per GGUF) changes the alignment Write() uses; by default it is 32 and
  // not written.
  void SetValue(std::string key, GgufValue value);
  void SetU8(std::string key, uint8_t v) { SetValue(std::move(key), GgufValue::U8(v)); }
  void SetI8(std::string key, int8_t v) { SetValue(std::move(key), GgufValue::I8(v)); }
  void SetU16(std::string key, uint16_t v) { SetValue(std::move(key), GgufValue::U16(v)); }
  void SetI16(std::string key, int16_t v) { SetValue(std::move(key), GgufValue::I16(v)); }
  void SetU32(std::string key, uint32_t v) { SetValue(std::move(key), GgufValue::U32(v)); }
  void SetI32(std::string key, int32_t v) { SetValue(std::move(key), GgufValue::I32(v)); }
  void SetU64(std::string key, uint64_t v) { SetValue(std::move(key), GgufValue::U64(v)); }
  void SetI64(std::string key, int64_t v) { SetValue(std::move(key), GgufValue::I64(v)); }
  void SetF32(std::string key, float v) { SetValue(std::move(key), GgufValue::F32(v)); }
  void SetF64(std::string key, double v) { SetValue(std::move(key), GgufValue::F64(v)); }
  void SetBool(std::string key, bool v) { SetValue(std::move(key), GgufValue::Bool(v)); }
  void SetString(std::string key, std::string v) {
    SetValue(std::move(key), GgufValue::String(std::move(v)));
  }
  void SetStringArray(std::string key, std::vector<std::string> v) {
    SetValue(std::move(key), GgufValue::StringArray(std::move(v)));
  }
  void SetF32Array(std::string key, std::span<const float> v) {
    SetValue(std::move(key), GgufValue::NumericArray<float>(v));
  }
  void SetI32Array(std::string key, std::span<const int32_t> v) {
    SetValue(std::move(key), GgufValue::NumericArray<int32_t>(v));
  }
  void SetU32Array(std::string key, std::span<const uint32_t> v) {
    SetValue(std::move(key), GgufValue::NumericArray<uint32_t>(v));
  }
  void SetI64Array(std::string key, std::span<const int64_t> v) {
    SetValue(std::move(key), GgufValue::NumericArray<int64_t>(v));
  }
  bool Has(std::string_view key) const { return kv_index_.contains(std::string(key)); }

  // Tensors. Each checks: a new, unique name; 1..4 dims, all positive, whose
  // product fits int64; ne[0] a multiple of the type's block; nbytes equal to
  // the size the shape implies. On error nothing is added.
  //
  // References `data`: the caller's buffer must stay valid and unchanged
  // until Write() returns.
  Status AddTensor(std::string name, DType type, std::vector<int64_t> ne, const void* data,
                   size_t nbytes);
  // Takes ownership of `data`.
  Status AddTensorOwned(std::string name, DType type, std::vector<int64_t> ne,
                        std::vector<uint8_t> data);
  // Data comes from `producer` at Write() time (e.g. generated weights).
  Status AddTensorProduced(std::string name, DType type, std::vector<int64_t> ne,
                           Producer producer);

  size_t tensor_count() const { return tensors_.size(); }

  // Writes the file atomically: a temporary file next to `path`, fsync, then
  // rename. On failure `path` is untouched and the temporary file removed.
  // May be called more than once (producers are called again each time).
  Status Write(const std::string& path) const;
  // The same bytes in memory, for tests and small files.
  Result<std::string> WriteToString() const;

 private:
  struct PendingTensor {
    std::string name;
    DType type;
    std::vector<int64_t> ne;
    size_t nbytes = 0;
    uint64_t offset = 0;  // in the data section
    const void* data = nullptr;
    std::vector<uint8_t> owned;
    Producer producer;
  };

  // Checks the shape and computes the byte size.
  Result<size_t> CheckTensor(const std::string& name, DType type,
                             const std::vector<int64_t>& ne) const;
  Status Add(PendingTensor t);
  Result<uint32_t> Alignment() const;
  // Header, metadata and tensor infos, padded to the alignment.
  std::string EncodeMeta(uint32_t alignment) const;
  // Streams the whole file to `sink`.
  Status Emit(const Sink& sink) const;

  std::vector<GgufKeyValue> kvs_;
  std::unordered_map<std::string, size_t> kv_index_;
  std::vector<PendingTensor> tensors_;
  std::unordered_map<std::string, size_t> tensor_index_;
};

}  // namespace strata
