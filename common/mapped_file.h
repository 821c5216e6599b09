#pragma once
// A read-only memory-mapped file. Model weights are used in place from the map.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "common/status.h"

namespace strata {

class MappedFile {
 public:
  // Maps the whole file read-only. An empty file maps to size() == 0.
  static Result<std::unique_ptr<MappedFile>> Open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  // Whether [p, p + n) lies inside the mapping.
  bool Contains(const void* p, size_t n) const;
  // Gives back the pages wholly inside [p, p + n) (madvise MADV_DONTNEED):
  // they leave this process's resident memory, and a later read brings the
  // file's bytes back. For data copied elsewhere and rarely read again.
  // REQUIRES Contains(p, n).
  void DropPages(const void* p, size_t n) const;

 private:
  MappedFile() = default;
  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

// Reads a whole (small) file into a string.
Result<std::string> ReadFileToString(const std::string& path);
// Writes a file atomically (temp file + rename).
Status WriteFileAtomic(const std::string& path, const void* data, size_t len);

}  // namespace strata
