#pragma once
// A fork-join thread pool for compute kernels: ParallelFor splits a range over
// the workers and the calling thread, and returns when every part is done.
//
// Thread-safety: one ParallelFor at a time per pool (the engine loop owns its
// pool). Calls from inside a running task execute serially on that thread.
//
// Waking: a forward pass dispatches ~13 jobs per layer, each a few tens of
// microseconds long. Sleeping on a condition variable between them costs a
// futex wake and a context switch per job on each side (measured: 3-8 ms of a
// 17 ms decode step on 2 threads). So after a job, workers spin (with pause)
// for up to `spin_micros` watching for the next one before they sleep, and the
// caller spins the same way waiting for the workers to finish. The condition
// variables stay as the fallback: an idle pool sleeps and burns no CPU.

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
  // spin_micros: how long an idle worker (and a waiting caller) polls before
  // sleeping; 0 = always sleep at once (the old behaviour). The default is
  // kDefaultSpinMicros, overridden by the environment variable
  // STRATA_POOL_SPIN_US when set.
  explicit ThreadPool(int num_threads = 0, int spin_micros = -1);
  static constexpr int kDefaultSpinMicros = 200;
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }
  int spin_micros() const { return spin_micros_; }

  // Calls fn(task_index) for task_index in [0, num_tasks), spread over the
  // threads; each task runs exactly once. Blocks until all have finished.
  void Run(int num_tasks, const std::function<void(int)>& fn);

  // Calls fn(begin, end) over [0, n) in contiguous chunks of at least `grain`.
  void ParallelFor(size_t n, size_t grain, const std::function<void(size_t, size_t)>& fn);

 private:
  void WorkerLoop(int worker_index);
  void DrainTasks();
  bool JobFinished() const;

  int num_threads_;
  int spin_micros_;
  std::vector<std::thread> workers_;

  std::mutex mu_;
  std::condition_variable cv_start_;
  std::condition_variable cv_done_;
  // Bumped (under mu_) for each job and for stop; read without the lock by
  // spinning workers, which then take mu_ to join the job.
  std::atomic<uint64_t> generation_{0};
  bool stop_ = false;        // guarded by mu_
  int sleepers_ = 0;         // workers waiting on cv_start_; guarded by mu_
  bool caller_waiting_ = false;  // the caller waits on cv_done_; guarded by mu_

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
