#include "kvcache/disk_io.h"

#include <liburing.h>
#include <sys/uio.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace strata::kvcache {

Result<AlignedBuffer> AlignedBuffer::Allocate(size_t bytes) {
  void* p = nullptr;
  size_t n = AlignUp(bytes == 0 ? 1 : bytes, kDiskAlign);
  int rc = posix_memalign(&p, kDiskAlign, n);
  if (rc != 0) {
    return Status::ResourceExhausted("posix_memalign of " + std::to_string(n) +
                                     " bytes: " + std::strerror(rc));
  }
  AlignedBuffer b;
  b.data_ = static_cast<uint8_t*>(p);
  b.size_ = n;
  return b;
}

AlignedBuffer::~AlignedBuffer() { std::free(data_); }

AlignedBuffer::AlignedBuffer(AlignedBuffer&& o) noexcept : data_(o.data_), size_(o.size_) {
  o.data_ = nullptr;
  o.size_ = 0;
}

AlignedBuffer& AlignedBuffer::operator=(AlignedBuffer&& o) noexcept {
  if (this != &o) {
    std::free(data_);
    data_ = o.data_;
    size_ = o.size_;
    o.data_ = nullptr;
    o.size_ = 0;
  }
  return *this;
}

struct DiskRing::Rep {
  io_uring ring;
  bool buffers_registered = false;
};

DiskRing::DiskRing(std::unique_ptr<Rep> rep, unsigned entries)
    : rep_(std::move(rep)), entries_(entries) {}

DiskRing::~DiskRing() {
  if (rep_->buffers_registered) io_uring_unregister_buffers(&rep_->ring);
  io_uring_queue_exit(&rep_->ring);
}

Result<std::unique_ptr<DiskRing>> DiskRing::Create(unsigned entries) {
  auto rep = std::make_unique<Rep>();
  int rc = io_uring_queue_init(entries, &rep->ring, 0);
  if (rc < 0) return Status::IoError("io_uring_queue_init", std::to_string(entries), -rc);
  return std::unique_ptr<DiskRing>(new DiskRing(std::move(rep), entries));
}

bool DiskRing::RegisterBuffers(std::span<const std::span<uint8_t>> bufs) {
  std::vector<iovec> iov;
  iov.reserve(bufs.size());
  for (const auto& b : bufs) iov.push_back(iovec{b.data(), b.size()});
  int rc = io_uring_register_buffers(&rep_->ring, iov.data(), static_cast<unsigned>(iov.size()));
  rep_->buffers_registered = rc == 0;
  return rep_->buffers_registered;
}

void DiskRing::PrepRead(int fd, std::span<uint8_t> buf, uint64_t offset, int fixed_index,
                        uint64_t user_data) {
  io_uring_sqe* sqe = io_uring_get_sqe(&rep_->ring);
  // The caller keeps at most `entries` in flight, so an entry is always free.
  if (sqe == nullptr) std::abort();
  if (fixed_index >= 0) {
    io_uring_prep_read_fixed(sqe, fd, buf.data(), static_cast<unsigned>(buf.size()), offset,
                             fixed_index);
  } else {
    io_uring_prep_read(sqe, fd, buf.data(), static_cast<unsigned>(buf.size()), offset);
  }
  io_uring_sqe_set_data64(sqe, user_data);
}

void DiskRing::PrepWrite(int fd, std::span<const uint8_t> buf, uint64_t offset, int fixed_index,
                         uint64_t user_data) {
  io_uring_sqe* sqe = io_uring_get_sqe(&rep_->ring);
  if (sqe == nullptr) std::abort();
  if (fixed_index >= 0) {
    io_uring_prep_write_fixed(sqe, fd, buf.data(), static_cast<unsigned>(buf.size()), offset,
                              fixed_index);
  } else {
    io_uring_prep_write(sqe, fd, buf.data(), static_cast<unsigned>(buf.size()), offset);
  }
  io_uring_sqe_set_data64(sqe, user_data);
}

Status DiskRing::Submit() {
  for (;;) {
    int rc = io_uring_submit(&rep_->ring);
    if (rc >= 0) return Status::Ok();
    if (rc == -EINTR || rc == -EAGAIN) continue;
    return Status::IoError("io_uring_submit", "", -rc);
  }
}

bool DiskRing::Peek(DiskCompletion* out) {
  io_uring_cqe* cqe = nullptr;
  if (io_uring_peek_cqe(&rep_->ring, &cqe) != 0 || cqe == nullptr) return false;
  out->user_data = io_uring_cqe_get_data64(cqe);
  out->res = cqe->res;
  io_uring_cqe_seen(&rep_->ring, cqe);
  return true;
}

Status DiskRing::Wait(DiskCompletion* out) {
  io_uring_cqe* cqe = nullptr;
  for (;;) {
    int rc = io_uring_wait_cqe(&rep_->ring, &cqe);
    if (rc == 0) break;
    if (rc == -EINTR) continue;
    return Status::IoError("io_uring_wait_cqe", "", -rc);
  }
  out->user_data = io_uring_cqe_get_data64(cqe);
  out->res = cqe->res;
  io_uring_cqe_seen(&rep_->ring, cqe);
  return Status::Ok();
}

}  // namespace strata::kvcache
