#include "kvcache/staging_buffers.h"

#include <new>
#include <string>

#include "common/logging.h"

namespace strata::kvcache {

namespace {
constexpr std::align_val_t kStagingAlign{4096};  // O_DIRECT
}  // namespace

void StagingBuffers::AlignedFree::operator()(uint8_t* p) const { ::operator delete[](p, kStagingAlign); }

StagingBuffers::StagingBuffers(SegmentTable* segments, uint64_t block_bytes, size_t max_buffers)
    : segments_(segments), block_bytes_(block_bytes), max_(max_buffers) {}

StagingBuffers::~StagingBuffers() {
  for (SegmentId id : segments_ids_) (void)segments_->Unregister(id);
}

int32_t StagingBuffers::Acquire() {
  if (free_.empty() && buffers_.size() < max_) {
    std::unique_ptr<uint8_t[], AlignedFree> p(
        static_cast<uint8_t*>(::operator new[](static_cast<size_t>(block_bytes_), kStagingAlign)));
    auto seg = segments_->Register(SegmentKind::kHost, p.get(), block_bytes_, "staging " + std::to_string(buffers_.size()));
    if (!seg) {  // cannot happen for fresh memory; without a segment the buffer is useless
      STRATA_LOG_WARN("kv manager: staging buffer not registered: {}", seg.error().ToString());
      return -1;
    }
    buffers_.push_back(std::move(p));
    segments_ids_.push_back(*seg);
    refs_.push_back(0);
    free_.push_back(static_cast<int32_t>(buffers_.size() - 1));
  }
  if (free_.empty()) return -1;
  const int32_t i = free_.back();
  free_.pop_back();
  return i;
}

void StagingBuffers::Release(int32_t i) {
  if (i < 0) return;
  if (--refs_[static_cast<size_t>(i)] == 0) free_.push_back(i);
}

void StagingBuffers::PutBack(int32_t i) {
  if (i >= 0 && refs_[static_cast<size_t>(i)] == 0) free_.push_back(i);
}

}  // namespace strata::kvcache
