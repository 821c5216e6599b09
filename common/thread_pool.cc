#include "common/thread_pool.h"

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>

namespace strata {

namespace {
thread_local bool tls_in_pool_task = false;
}

int HardwareThreads() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) {
    int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  unsigned n = std::thread::hardware_concurrency();
  return n == 0 ? 1 : static_cast<int>(n);
}

namespace {

inline void CpuRelax() {
#if defined(__x86_64__) || defined(__i386__)
  __builtin_ia32_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

int SpinMicrosFromEnv(int requested) {
  if (requested >= 0) return requested;
  if (const char* e = std::getenv("STRATA_POOL_SPIN_US"); e != nullptr && *e != '\0') {
    char* end = nullptr;
    long v = std::strtol(e, &end, 10);
    if (end != e && *end == '\0' && v >= 0 && v <= 1000000) return static_cast<int>(v);
  }
  return ThreadPool::kDefaultSpinMicros;
}

// Polls `done` with pause for up to `micros`; true if it became true.
template <typename Pred>
bool SpinUntil(int micros, Pred done) {
  if (micros <= 0) return done();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::microseconds(micros);
  for (unsigned i = 1;; ++i) {
    if (done()) return true;
    CpuRelax();
    if ((i & 63u) == 0 && std::chrono::steady_clock::now() >= deadline) return done();
  }
}

}  // namespace

ThreadPool::ThreadPool(int num_threads, int spin_micros) {
  num_threads_ = num_threads > 0 ? num_threads : HardwareThreads();
  spin_micros_ = SpinMicrosFromEnv(spin_micros);
  for (int i = 1; i < num_threads_; ++i) {
    workers_.emplace_back([this, i] { WorkerLoop(i); });
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    generation_.fetch_add(1, std::memory_order_release);
  }
  cv_start_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::DrainTasks() {
  const auto& fn = *job_;
  for (;;) {
    int t = next_task_.fetch_add(1, std::memory_order_relaxed);
    if (t >= job_tasks_) break;
    fn(t);
    tasks_done_.fetch_add(1, std::memory_order_acq_rel);
  }
}

bool ThreadPool::JobFinished() const {
  return tasks_done_.load(std::memory_order_acquire) == job_tasks_ &&
         active_workers_.load(std::memory_order_acquire) == 0;
}

void ThreadPool::WorkerLoop(int /*worker_index*/) {
  uint64_t seen = 0;
  for (;;) {
    // Watch for the next job without the lock for a while; then sleep.
    SpinUntil(spin_micros_, [&] { return generation_.load(std::memory_order_acquire) != seen; });
    {
      std::unique_lock<std::mutex> lock(mu_);
      if (!stop_ && generation_.load(std::memory_order_relaxed) == seen) {
        ++sleepers_;
        cv_start_.wait(lock, [&] { return stop_ || generation_.load(std::memory_order_relaxed) != seen; });
        --sleepers_;
      }
      if (stop_) return;
      seen = generation_.load(std::memory_order_relaxed);
      // A worker that arrives after the job already finished finds no job.
      // Joining happens only under mu_ while job_ is set; the caller clears
      // job_ under mu_ only once no worker is in it, so a joined worker's
      // job_ stays valid until it leaves.
      if (job_ == nullptr) continue;
      active_workers_.fetch_add(1, std::memory_order_acq_rel);
    }
    tls_in_pool_task = true;
    DrainTasks();
    tls_in_pool_task = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      active_workers_.fetch_sub(1, std::memory_order_acq_rel);
      if (caller_waiting_) cv_done_.notify_all();
    }
  }
}

void ThreadPool::Run(int num_tasks, const std::function<void(int)>& fn) {
  if (num_tasks <= 0) return;
  if (num_tasks == 1 || workers_.empty() || tls_in_pool_task) {
    for (int t = 0; t < num_tasks; ++t) fn(t);
    return;
  }
  {
    std::lock_guard<std::mutex> lock(mu_);
    job_ = &fn;
    job_tasks_ = num_tasks;
    next_task_.store(0, std::memory_order_relaxed);
    tasks_done_.store(0, std::memory_order_relaxed);
    generation_.fetch_add(1, std::memory_order_release);
    if (sleepers_ > 0) cv_start_.notify_all();
  }
  tls_in_pool_task = true;
  DrainTasks();
  tls_in_pool_task = false;
  // Wait for every task to finish and every worker to leave the job, so that
  // `fn` (owned by the caller) is not touched after we return. The decisive
  // check is made under mu_, where workers join and leave.
  SpinUntil(spin_micros_, [&] { return JobFinished(); });
  std::unique_lock<std::mutex> lock(mu_);
  if (!JobFinished()) {
    caller_waiting_ = true;
    cv_done_.wait(lock, [&] { return JobFinished(); });
    caller_waiting_ = false;
  }
  job_ = nullptr;
}

void ThreadPool::ParallelFor(size_t n, size_t grain, const std::function<void(size_t, size_t)>& fn) {
  if (n == 0) return;
  grain = std::max<size_t>(grain, 1);
  size_t max_chunks = (n + grain - 1) / grain;
  size_t chunks = std::min<size_t>(max_chunks, static_cast<size_t>(num_threads_));
  if (chunks <= 1) {
    fn(0, n);
    return;
  }
  size_t per = (n + chunks - 1) / chunks;
  Run(static_cast<int>(chunks), [&](int c) {
    size_t b = static_cast<size_t>(c) * per;
    size_t e = std::min(n, b + per);
    if (b < e) fn(b, e);
  });
}

}  // namespace strata
