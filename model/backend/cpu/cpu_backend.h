#pragma once
// The CPU backend (model/backend/backend.h): the KV pool is page-aligned
// host memory, copies are memcpy (CpuCopyEngine, inline), and the forward
// pass is ForwardEngine over the pool on a ThreadPool.
//
// Built into the model library (it runs ForwardEngine, model/forward.h),
// while the interface it implements lives with the backends.
//
// Thread-safety: as Backend.

#include <memory>
#include <string_view>
#include <vector>

#include "common/copy_engine.h"
#include "common/memory_segment.h"
#include "common/thread_pool.h"
#include "model/backend/backend.h"

namespace strata {

class CpuBackend final : public Backend {
 public:
  // `threads` runs the forward passes; it must outlive the backend.
  explicit CpuBackend(ThreadPool* threads);
  // Unregisters and frees the pools.
  ~CpuBackend() override;
  CpuBackend(const CpuBackend&) = delete;
  CpuBackend& operator=(const CpuBackend&) = delete;

  std::string_view name() const override { return "cpu"; }
  SegmentTable& segments() override { return segments_; }
  CopyEngine& copy_engine() override { return copy_; }
  // Page-aligned (O_DIRECT reads and memcpy into blocks run at full speed
  // only with an aligned destination) and zeroed.
  Result<KvPool> AllocateKvPool(const KvLayout& layout, int num_blocks) override;
  Result<std::unique_ptr<ForwardPass>> CreateForward(const ModelWeights& weights, const KvPool& pool) override;

 private:
  struct FreeAligned {
    void operator()(uint8_t* p) const;
  };
  ThreadPool* const threads_;
  SegmentTable segments_;  // before copy_, which reads it until destroyed
  CpuCopyEngine copy_;
  std::vector<std::unique_ptr<uint8_t[], FreeAligned>> pools_;
  std::vector<SegmentId> pool_segments_;
};

}  // namespace strata
