#pragma once
// A fork-join thread pool for compute kernels: ParallelFor splits a range over
// the workers and the calling thread, and returns when every part is done.
//
// Thread-safety: one ParallelFor at a time per pool (the engine loop owns its
// pool). Calls from inside a running task execute serially on that thread.

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace strata {

class ThreadPool {
 public:
  // num_threads counts the caller: 1 means no worker threads. 0 = hardware.
  explicit ThreadPool(int num_threads = 0);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }

  // Calls fn(task_index) for task_index in [0, num_tasks), spread over the
  // threads; each task runs exactly once. Blocks until all have finished.
  void Run(int num_tasks, const std::function<void(int)>& fn);

  // Calls fn(begin, end) over [0, n) in contiguous chunks of at least `grain`.
  void ParallelFor(size_t n, size_t grain, const std::function<void(size_t, size_t)>& fn);

 private:
  void WorkerLoop(int worker_index);
  void DrainTasks();

  int num_threads_;
  std::vector<std::thread> workers_;

  std::mutex mu_;
  std::condition_variable cv_start_;
  std::condition_variable cv_done_;
  uint64_t generation_ = 0;  // guarded by mu_
  bool stop_ = false;        // guarded by mu_

  // The current job; written under mu_ before generation_ is bumped.
  const std::function<void(int)>* job_ = nullptr;
  int job_tasks_ = 0;
  std::atomic<int> next_task_{0};
  std::atomic<int> tasks_done_{0};
  std::atomic<int> active_workers_{0};
};

// Hardware threads available to this process (sched_getaffinity).
int HardwareThreads();

}  // namespace strata
