#pragma once
// CopyEngine: moves bytes between regions of registered memory
// (common/memory_segment.h) with submit / poll, like the block stores, and
// fences a caller can wait on. The KV cache's tier mover copies through one
// (it never calls memcpy itself); the CPU backend's is CpuCopyEngine below,
// a CUDA backend's will run on a copy stream, the transfer engine's over
// the network, each behind this interface. In common/ because backends,
// the KV cache and the transfer engine all implement or use it.
//
// Ordering: copies complete in submission order, and a fence is reached
// once every copy submitted before it has completed (OK or not).
//
// Thread-safety: one thread (the owner, e.g. the engine loop) calls
// everything; an implementation may copy on threads of its own.

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string_view>
#include <thread>
#include <vector>

#include "common/memory_segment.h"
#include "common/status.h"

namespace strata {

struct CopyCompletion {
  uint64_t tag = 0;  // the caller's tag from Submit
  Status status;
};

// Every copy submitted before the fence was made (0: none, reached at once).
struct CopyFence {
  uint64_t seq = 0;
};

class CopyEngine {
 public:
  virtual ~CopyEngine() = default;
  virtual std::string_view name() const = 0;

  // Queues a copy of src into dst. Refused at once, with nothing queued or
  // copied and an error naming the region: an unregistered segment, a zero
  // length, a region out of its segment's bounds, lengths that differ,
  // overlapping regions of one segment, or kinds of memory this engine cannot
  // move. The regions' memory must stay registered and untouched by others
  // until the copy completes.
  virtual Status Submit(const Region& dst, const Region& src, uint64_t tag) = 0;
  // A fence over every copy submitted so far.
  virtual CopyFence Fence() = 0;
  virtual bool Reached(CopyFence fence) const = 0;
  // Blocks until `fence` is reached.
  virtual void Wait(CopyFence fence) = 0;
  // Appends finished copies to `out`; returns how many. Never blocks.
  virtual size_t Poll(std::vector<CopyCompletion>* out) = 0;
};

// memcpy between host-addressable segments (host, pinned host); device and
// file memory are refused (a CUDA backend and the stores move those).
// kInline copies inside Submit (the completion still comes through Poll);
// kWorker copies on one thread of its own, so Submit returns at once.
class CpuCopyEngine final : public CopyEngine {
 public:
  enum class Mode { kInline, kWorker };
  // `segments` must outlive the engine.
  explicit CpuCopyEngine(const SegmentTable* segments, Mode mode = Mode::kInline);
  // Finishes every submitted copy, then stops the worker.
  ~CpuCopyEngine() override;
  CpuCopyEngine(const CpuCopyEngine&) = delete;
  CpuCopyEngine& operator=(const CpuCopyEngine&) = delete;

  std::string_view name() const override { return "cpu memcpy"; }
  Status Submit(const Region& dst, const Region& src, uint64_t tag) override;
  CopyFence Fence() override;
  bool Reached(CopyFence fence) const override;
  void Wait(CopyFence fence) override;
  size_t Poll(std::vector<CopyCompletion>* out) override;

 private:
  struct Job {
    std::span<uint8_t> dst;
    std::span<const uint8_t> src;
    uint64_t tag = 0;
    uint64_t seq = 0;
  };
  void Run();

  const SegmentTable* const segments_;
  const Mode mode_;
  uint64_t submitted_ = 0;  // owner thread only
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<Job> queue_;                // kWorker: waiting to be copied
  std::vector<CopyCompletion> done_;     // finished, not yet polled
  uint64_t completed_ = 0;               // seq of the last finished copy
  bool stop_ = false;
  std::thread worker_;
};

}  // namespace strata
