#include "transfer/shared_memory.h"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>

namespace strata::transfer {
namespace {
std::mutex g_mu;
std::map<uintptr_t, std::pair<uint64_t, int>>& Registry() {  // base → (size, fd)
  static auto* r = new std::map<uintptr_t, std::pair<uint64_t, int>>();
  return *r;
}
}  // namespace

Result<SharedHostMemory> SharedHostMemory::Allocate(uint64_t bytes, const std::string& name) {
  if (bytes == 0) return Status::InvalidArgument("shared memory of 0 bytes");
  int fd = memfd_create(("strata:" + name).c_str(), MFD_CLOEXEC);
  if (fd < 0) return Status::IoError("memfd_create", name, errno);
  if (ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    int err = errno;
    ::close(fd);
    return Status::IoError("ftruncate", name, err);
  }
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  if (p == MAP_FAILED) {
    int err = errno;
    ::close(fd);
    return Status::IoError("mmap", name, err);
  }
  SharedHostMemory m;
  m.data_ = static_cast<uint8_t*>(p);
  m.size_ = bytes;
  m.fd_ = fd;
  std::lock_guard lock(g_mu);
  Registry()[reinterpret_cast<uintptr_t>(p)] = {bytes, fd};
  return m;
}

SharedHostMemory& SharedHostMemory::operator=(SharedHostMemory&& o) noexcept {
  if (this != &o) {
    Release();
    data_ = o.data_;
    size_ = o.size_;
    fd_ = o.fd_;
    o.data_ = nullptr;
    o.size_ = 0;
    o.fd_ = -1;
  }
  return *this;
}

SharedHostMemory::~SharedHostMemory() { Release(); }

void SharedHostMemory::Release() {
  if (!data_) return;
  {
    std::lock_guard lock(g_mu);
    Registry().erase(reinterpret_cast<uintptr_t>(data_));
  }
  munmap(data_, size_);
  ::close(fd_);
  data_ = nullptr;
  fd_ = -1;
  size_ = 0;
}

std::optional<SharedRange> FindShared(const uint8_t* p, uint64_t len) {
  std::lock_guard lock(g_mu);
  auto& r = Registry();
  auto it = r.upper_bound(reinterpret_cast<uintptr_t>(p));
  if (it == r.begin()) return std::nullopt;
  --it;
  uintptr_t base = it->first;
  uintptr_t q = reinterpret_cast<uintptr_t>(p);
  if (q < base || q - base > it->second.first || len > it->second.first - (q - base)) return std::nullopt;
  return SharedRange{it->second.second, q - base};
}

}  // namespace strata::transfer
