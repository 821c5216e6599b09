#pragma once
// Host memory that same-host peers can map: a memfd mapped MAP_SHARED.
//
// A segment allocated here (the peer tool's, the benchmark's; the host tier
// arena later) is what the shm transport reaches fastest: a peer that opens
// an export inside it maps exactly that range of the memfd (through
// /proc/<pid>/fd, which needs the same ptrace rights as cross-memory attach)
// and copies with memcpy; on revocation it unmaps the range. Exports of other
// memory are reached with process_vm_readv/writev instead.
//
// Thread-safety: FindShared may be called from any thread; a
// SharedHostMemory object is owned by one thread.

#include <cstdint>
#include <optional>
#include <string>

#include "common/status.h"

namespace strata::transfer {

class SharedHostMemory {
 public:
  // memfd_create + ftruncate + mmap(MAP_SHARED), pages touched.
  static Result<SharedHostMemory> Allocate(uint64_t bytes, const std::string& name);
  SharedHostMemory() = default;
  SharedHostMemory(SharedHostMemory&& o) noexcept { *this = std::move(o); }
  SharedHostMemory& operator=(SharedHostMemory&& o) noexcept;
  SharedHostMemory(const SharedHostMemory&) = delete;
  SharedHostMemory& operator=(const SharedHostMemory&) = delete;
  ~SharedHostMemory();

  uint8_t* data() const { return data_; }
  uint64_t size() const { return size_; }
  int fd() const { return fd_; }

 private:
  void Release();
  uint8_t* data_ = nullptr;
  uint64_t size_ = 0;
  int fd_ = -1;
};

// The memfd and offset of [p, p + len) when it lies inside one live
// SharedHostMemory of this process.
struct SharedRange {
  int fd = -1;
  uint64_t offset = 0;
};
std::optional<SharedRange> FindShared(const uint8_t* p, uint64_t len);

}  // namespace strata::transfer
