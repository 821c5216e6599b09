#pragma once
// Bounded worker lanes for the front end's CPU work (parsing request bodies,
// chat templates, tokenization, rendering whole responses), so the HTTP and
// gRPC I/O threads only move bytes. Requests are classified by body size
// into a small and a large lane, each with its own workers and queue limit:
// a flood of huge bodies fills the large lane and never delays a small
// request. A full lane refuses at once (the caller answers 503 with
// Retry-After) and counts it.
//
// Thread-safety: every method may be called from any thread. Work runs on
// the lane's worker threads, in FIFO order per lane; it must not block for
// long (it hands requests to the engine and returns).

#include <array>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <string_view>
#include <thread>
#include <vector>

namespace strata::server {

enum class Lane : uint8_t { kSmall, kLarge };
inline constexpr size_t kNumLanes = 2;

// "small", "large": the metrics' `lane` label and log name.
constexpr std::string_view LaneName(Lane l) { return l == Lane::kSmall ? "small" : "large"; }

struct LaneOptions {
  int threads = 2;       // >= 1 workers
  int max_queue = 1024;  // >= 1: waiting (not running) work beyond this is refused
};

struct RequestLanesOptions {
  uint64_t small_body_bytes = 256 << 10;  // bodies up to this size go to the small lane
  LaneOptions small{2, 1024};
  LaneOptions large{2, 16};
};

struct LaneStats {
  int queued = 0;          // waiting for a worker now
  int running = 0;         // on a worker now
  uint64_t accepted = 0;   // ever queued
  uint64_t rejected = 0;   // refused: the queue was full, or stopping
};

class RequestLanes {
 public:
  // Starts the workers. Options are clamped to their minimums.
  explicit RequestLanes(RequestLanesOptions options);
  // Stop(), then joins.
  ~RequestLanes();
  RequestLanes(const RequestLanes&) = delete;
  RequestLanes& operator=(const RequestLanes&) = delete;

  Lane Classify(uint64_t body_bytes) const {
    return body_bytes <= options_.small_body_bytes ? Lane::kSmall : Lane::kLarge;
  }
  // Queues `work` on `lane`; false (counted as rejected, `work` dropped)
  // when that lane's queue is full or the lanes are stopping.
  bool Post(Lane lane, std::function<void()> work);
  LaneStats stats(Lane lane) const;
  const RequestLanesOptions& options() const { return options_; }
  // Refuses new work, runs what is queued, joins the workers. Idempotent.
  void Stop();

 private:
  struct State {
    mutable std::mutex mu;
    std::condition_variable cv;
    std::deque<std::function<void()>> queue;
    std::vector<std::thread> workers;
    int max_queue = 1;
    int running = 0;
    uint64_t accepted = 0;
    uint64_t rejected = 0;
    bool stopping = false;
  };
  void Work(State* s);

  const RequestLanesOptions options_;
  std::array<State, kNumLanes> lanes_;
};

}  // namespace strata::server
