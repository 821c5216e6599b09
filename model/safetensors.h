#pragma once
// Reading and writing safetensors files (the Hugging Face weight format).
//
// Layout: an 8-byte little-endian header length N, N bytes of JSON
//   {"<name>": {"dtype": "F16", "shape": [out, in], "data_offsets": [begin, end]},
//    "__metadata__": {"<key>": "<string>", ...}}
// then the data region; offsets are relative to its start, end exclusive.
//
// Shape convention: safetensors shapes are row-major, outermost first. A
// Tensor's ne is the reverse (ne[0] innermost), over the same bytes: a linear
// layer stored as [out, in] becomes ne = {in, out}. A scalar (shape []) becomes
// ne = {1}.
//
// Only F32, F16 and BF16 tensors are supported; a file holding any other dtype
// fails to open with Unsupported naming the tensor and the dtype.

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/mapped_file.h"
#include "common/status.h"
#include "model/backend/dtype.h"
#include "model/tensor.h"

namespace strata {

// Headers larger than this are rejected as corrupt rather than parsed.
inline constexpr uint64_t kSafetensorsMaxHeaderBytes = 100ull << 20;

// "F32", "F16", "BF16"; Unsupported for other types (quantized ones).
Result<std::string_view> SafetensorsDTypeName(DType t);

// A parsed, memory-mapped safetensors file. Immutable after Open; safe to read
// from several threads. Tensors point into the mapping (no copies).
class SafetensorsFile {
 public:
  // Maps `path` read-only and validates the header: length within the file and
  // at most kSafetensorsMaxHeaderBytes, valid JSON, supported dtypes,
  // non-negative dims, data_offsets inside the data region and equal in size to
  // dtype x shape. Tensors may be stored in any order (even overlapping) as
  // long as each is in range. Errors name the file and, where one is at
  // fault, the tensor.
  static Result<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);
  // Same, over a file the caller has already mapped; takes ownership of it.
  static Result<std::unique_ptr<SafetensorsFile>> Parse(std::unique_ptr<MappedFile> file);

  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  // The tensor called `name`, or nullptr. The pointer lives as long as this
  // object; the tensor's data lives as long as the mapping (see ReleaseMapping).
  const Tensor* Find(std::string_view name) const;
  // All tensors, sorted by name.
  const std::vector<Tensor>& tensors() const { return tensors_; }
  // The "__metadata__" string map (empty if absent).
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path() const { return path_; }

  // Hands the mapping to the caller (e.g. into ModelWeights::files) so tensor
  // data copied out of tensors() stays valid after this object is destroyed.
  // After this call the object still answers Find()/tensors(), but their data
  // pointers are valid only while the returned mapping lives.
  std::unique_ptr<MappedFile> ReleaseMapping() { return std::move(file_); }

 private:
  SafetensorsFile() = default;
  Status ParseHeader();

  std::string path_;
  std::unique_ptr<MappedFile> file_;
  std::vector<Tensor> tensors_;  // sorted by name
  std::map<std::string, std::string> metadata_;
};

// Builds a safetensors file from caller-owned buffers and streams it to disk;
// nothing is copied, so the whole file never sits in memory.
//
// Thread: one thread at a time. Buffers passed to Add must stay valid and
// unchanged until Write returns.
class SafetensorsWriter {
 public:
  // Adds a tensor whose `shape` is in safetensors (row-major, outermost-first)
  // order. `nbytes` must equal dtype x shape. InvalidArgument on a duplicate or
  // empty name, a negative dim or a size mismatch; Unsupported for a dtype
  // other than F32/F16/BF16. A failed Add leaves the writer unchanged.
  Status Add(std::string name, DType type, std::vector<int64_t> shape, const void* data,
             size_t nbytes);
  // Adds `t` under `name` (t.name when empty), reversing t.ne into safetensors
  // order. Same errors as Add.
  Status AddTensor(const Tensor& t, std::string name = {});
  // Sets one "__metadata__" entry (Hugging Face expects {"format": "pt"}).
  void SetMetadata(std::string key, std::string value) {
    metadata_[std::move(key)] = std::move(value);
  }

  // Total bytes of tensor data added so far.
  uint64_t data_bytes() const { return data_bytes_; }
  size_t size() const { return entries_.size(); }

  // Writes the file: header (padded with spaces to a multiple of 8 so tensor
  // data is aligned), then tensors in the order added. The file appears at
  // `path` atomically (temp file + rename); on failure no file is left behind.
  Status Write(const std::string& path) const;

 private:
  struct Entry {
    std::string name;
    DType type;
    std::vector<int64_t> shape;
    const void* data;
    size_t nbytes;
  };
  std::vector<Entry> entries_;
  std::map<std::string, std::string> metadata_;
  uint64_t data_bytes_ = 0;
};

}  // namespace strata
