#include "common/copy_engine.h"

#include <cstring>

namespace strata {

CpuCopyEngine::CpuCopyEngine(const SegmentTable* segments, Mode mode) : segments_(segments), mode_(mode) {
  if (mode_ == Mode::kWorker) worker_ = std::thread([this] { Run(); });
}

CpuCopyEngine::~CpuCopyEngine() {
  if (worker_.joinable()) {
    {
      std::lock_guard<std::mutex> lock(mu_);
      stop_ = true;
    }
    cv_.notify_all();
    worker_.join();
  }
}

Status CpuCopyEngine::Submit(const Region& dst, const Region& src, uint64_t tag) {
  if (dst.length != src.length)
    return Status::InvalidArgument("copy: destination length " + std::to_string(dst.length) +
                                   " differs from source length " + std::to_string(src.length));
  auto d = segments_->Resolve(dst);
  if (!d) return d.error().WithContext("copy destination");
  auto s = segments_->Resolve(src);
  if (!s) return s.error().WithContext("copy source");
  if (dst.segment == src.segment && dst.offset < src.offset + src.length && src.offset < dst.offset + dst.length)
    return Status::InvalidArgument("copy: source and destination overlap in segment " +
                                   std::to_string(dst.segment.value()));
  Job job{*d, *s, tag, ++submitted_};
  if (mode_ == Mode::kInline) {
    std::memcpy(job.dst.data(), job.src.data(), job.dst.size());
    std::lock_guard<std::mutex> lock(mu_);
    done_.push_back({tag, Status::Ok()});
    completed_ = job.seq;
    return Status::Ok();
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(job);
  }
  cv_.notify_all();
  return Status::Ok();
}

void CpuCopyEngine::Run() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || !queue_.empty(); });
    if (queue_.empty()) return;  // stop_ with nothing left: every copy finished
    Job job = queue_.front();
    queue_.pop_front();
    lock.unlock();
    std::memcpy(job.dst.data(), job.src.data(), job.dst.size());
    lock.lock();
    done_.push_back({job.tag, Status::Ok()});
    completed_ = job.seq;
    cv_.notify_all();
  }
}

CopyFence CpuCopyEngine::Fence() { return CopyFence{submitted_}; }

bool CpuCopyEngine::Reached(CopyFence fence) const {
  std::lock_guard<std::mutex> lock(mu_);
  return completed_ >= fence.seq;
}

void CpuCopyEngine::Wait(CopyFence fence) {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return completed_ >= fence.seq; });
}

size_t CpuCopyEngine::Poll(std::vector<CopyCompletion>* out) {
  std::lock_guard<std::mutex> lock(mu_);
  const size_t n = done_.size();
  for (auto& c : done_) out->push_back(std::move(c));
  done_.clear();
  return n;
}

}  // namespace strata
