#pragma once
// io_uring and aligned memory for the disk tier. Internal to kvcache (the
// liburing types stay in disk_io.cc).
//
// Thread-safety: a DiskRing is used by one thread at a time.

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "common/status.h"

namespace strata::kvcache {

inline constexpr size_t kDiskAlign = 4096;  // O_DIRECT offset/length/address alignment

inline constexpr uint64_t AlignUp(uint64_t v, uint64_t a) { return (v + a - 1) / a * a; }
inline bool IsAligned(const void* p) { return reinterpret_cast<uintptr_t>(p) % kDiskAlign == 0; }

// A posix_memalign'ed buffer, kDiskAlign-aligned; owns its memory.
class AlignedBuffer {
 public:
  static Result<AlignedBuffer> Allocate(size_t bytes);
  AlignedBuffer() = default;
  ~AlignedBuffer();
  AlignedBuffer(AlignedBuffer&& o) noexcept;
  AlignedBuffer& operator=(AlignedBuffer&& o) noexcept;
  AlignedBuffer(const AlignedBuffer&) = delete;
  AlignedBuffer& operator=(const AlignedBuffer&) = delete;

  uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  std::span<uint8_t> span() const { return {data_, size_}; }

 private:
  uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

struct DiskCompletion {
  uint64_t user_data = 0;
  int32_t res = 0;  // bytes transferred, or -errno
};

// One io_uring. Buffers may be registered once (fixed buffers skip the
// per-I/O page pinning); an I/O names its fixed buffer by index, or -1.
class DiskRing {
 public:
  static Result<std::unique_ptr<DiskRing>> Create(unsigned entries);
  ~DiskRing();
  DiskRing(const DiskRing&) = delete;
  DiskRing& operator=(const DiskRing&) = delete;

  // Registers `bufs` as fixed buffers. Returns false (and keeps going without
  // them) when the kernel refuses, e.g. over RLIMIT_MEMLOCK.
  bool RegisterBuffers(std::span<const std::span<uint8_t>> bufs);

  // Queue a read/write; REQUIRES: a free submission entry (at most `entries`
  // in flight). Nothing reaches the kernel before Submit().
  void PrepRead(int fd, std::span<uint8_t> buf, uint64_t offset, int fixed_index,
                uint64_t user_data);
  void PrepWrite(int fd, std::span<const uint8_t> buf, uint64_t offset, int fixed_index,
                 uint64_t user_data);
  Status Submit();
  // Takes one finished I/O without waiting; false when none is ready.
  bool Peek(DiskCompletion* out);
  // Waits for one finished I/O. REQUIRES: at least one submitted.
  Status Wait(DiskCompletion* out);

  unsigned entries() const { return entries_; }

 private:
  struct Rep;
  DiskRing(std::unique_ptr<Rep> rep, unsigned entries);
  std::unique_ptr<Rep> rep_;
  unsigned entries_;
};

}  // namespace strata::kvcache
