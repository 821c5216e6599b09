#pragma once
// Threads kept for blocking work (HTTP calls to other processes): each
// posted closure starts at once on a thread of its own, an idle kept one
// when there is one, else a new one. Threads that finish wait a while for
// more work instead of exiting, so a steady stream of short blocking calls
// (the router's lookups, reservations, requests) does not create and join a
// thread for each.
//
// Unlike ThreadPool (fork-join compute over a fixed set of workers), a
// posted closure never waits behind another: closures may block on each
// other or on the network without starving. The cost is one thread per
// closure running at once; the caller bounds how many it posts.
//
// Thread-safety: every method may be called from any thread, including from
// inside a posted closure (but Wait and the destructor not from inside one:
// they would wait for themselves).

#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

namespace strata {

class BlockingPool {
 public:
  // At most `max_idle` threads wait for work; one that has waited
  // `idle_timeout` without any exits.
  explicit BlockingPool(size_t max_idle = 32, std::chrono::milliseconds idle_timeout = std::chrono::seconds(10));
  // Wait(), then ends the idle threads.
  ~BlockingPool();
  BlockingPool(const BlockingPool&) = delete;
  BlockingPool& operator=(const BlockingPool&) = delete;

  // Runs `fn` on a thread of the pool, starting now. False (and `fn` is
  // dropped without running) when no thread could be had: none idle and
  // the system refused a new one, or the pool is being destroyed.
  bool Post(std::function<void()> fn);

  // Runs fn(0) .. fn(n-1) at once, fn(0) on the calling thread and the rest
  // on the pool (on the calling thread, after the others, when no thread
  // could be had), and returns when all have returned.
  void RunAll(size_t n, const std::function<void(size_t)>& fn);

  // Blocks until every closure posted so far has returned.
  void Wait();

  struct Counts {
    size_t threads = 0;   // alive: running a closure or idle
    size_t idle = 0;      // waiting for work
    uint64_t started = 0; // threads ever started
    uint64_t posted = 0;  // closures ever run
  };
  Counts counts() const;

 private:
  void WorkerLoop(uint64_t id);
  void JoinExited();  // REQUIRES: mu_ not held

  const size_t max_idle_;
  const std::chrono::milliseconds idle_timeout_;

  mutable std::mutex mu_;
  std::condition_variable work_cv_;  // a closure queued, or stopping
  std::condition_variable done_cv_;  // running_ reached 0, or a thread exited
  std::deque<std::function<void()>> queue_;  // each has an idle thread woken for it
  size_t idle_ = 0;
  size_t running_ = 0;  // closures queued or running
  bool stopping_ = false;
  uint64_t next_id_ = 0;
  uint64_t started_ = 0;
  uint64_t posted_ = 0;
  std::map<uint64_t, std::thread> threads_;
  std::vector<uint64_t> exited_;  // threads that left WorkerLoop, to join
};

}  // namespace strata
