#pragma once
// Time for the KV cache's policy code, injected so that the cluster simulator
// (bench) can drive the very same code on simulated time.
//
// Thread-safety: every Clock may be read from any thread. ManualClock's
// setters may race with readers; readers see either the old or the new time.

#include <atomic>
#include <chrono>
#include <cstdint>

namespace strata::kvcache {

class Clock {
 public:
  virtual ~Clock() = default;
  // Nanoseconds since an arbitrary fixed origin; never decreases.
  virtual int64_t NowNanos() const = 0;
};

// std::chrono::steady_clock.
class SteadyClock final : public Clock {
 public:
  int64_t NowNanos() const override {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(
               std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
};

// Time that moves only when told to (simulator, tests).
class ManualClock final : public Clock {
 public:
  explicit ManualClock(int64_t start_nanos = 0) : now_(start_nanos) {}
  int64_t NowNanos() const override { return now_.load(std::memory_order_relaxed); }
  // REQUIRES: delta_nanos >= 0 (time never goes back).
  void Advance(int64_t delta_nanos) { now_.fetch_add(delta_nanos, std::memory_order_relaxed); }

 private:
  std::atomic<int64_t> now_;
};

// A process-wide SteadyClock (never destroyed).
inline Clock* RealClock() {
  static SteadyClock* clock = new SteadyClock();
  return clock;
}

}  // namespace strata::kvcache
