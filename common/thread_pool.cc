#include "common/thread_pool.h"

#include <sched.h>

#include <algorithm>

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

ThreadPool::ThreadPool(int num_threads) {
  num_threads_ = num_threads > 0 ? num_threads : HardwareThreads();
  for (int i = 1; i < num_threads_; ++i) {
    workers_.emplace_back([this, i] { WorkerLoop(i); });
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
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

void ThreadPool::WorkerLoop(int /*worker_index*/) {
  uint64_t seen = 0;
  for (;;) {
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_start_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
      // A worker that wakes after the job already finished finds no job.
      if (job_ == nullptr) continue;
      active_workers_.fetch_add(1, std::memory_order_acq_rel);
    }
    tls_in_pool_task = true;
    DrainTasks();
    tls_in_pool_task = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      active_workers_.fetch_sub(1, std::memory_order_acq_rel);
    }
    cv_done_.notify_all();
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
    ++generation_;
  }
  cv_start_.notify_all();
  tls_in_pool_task = true;
  DrainTasks();
  tls_in_pool_task = false;
  // Wait for every task to finish and every worker to leave the job, so that
  // `fn` (owned by the caller) is not touched after we return.
  std::unique_lock<std::mutex> lock(mu_);
  cv_done_.wait(lock, [&] {
    return tasks_done_.load(std::memory_order_acquire) == job_tasks_ &&
           active_workers_.load(std::memory_order_acquire) == 0;
  });
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
