#include "common/blocking_pool.h"

#include <memory>
#include <system_error>
#include <utility>

namespace strata {

BlockingPool::BlockingPool(size_t max_idle, std::chrono::milliseconds idle_timeout)
    : max_idle_(max_idle), idle_timeout_(idle_timeout) {}

BlockingPool::~BlockingPool() {
  Wait();
  std::map<uint64_t, std::thread> threads;
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  work_cv_.notify_all();
  {
    std::unique_lock lock(mu_);
    // Idle threads leave at once; none runs a closure (Wait returned and no
    // Post is taken after stopping_).
    done_cv_.wait(lock, [&] { return exited_.size() == threads_.size(); });
    threads.swap(threads_);
    exited_.clear();
  }
  for (auto& [id, t] : threads) t.join();
}

bool BlockingPool::Post(std::function<void()> fn) {
  JoinExited();
  std::lock_guard lock(mu_);
  if (stopping_) return false;
  // Every queued closure has an idle thread woken for it: one more idle
  // thread than queued closures takes this one too, else a new thread does.
  const bool idle_free = idle_ > queue_.size();
  queue_.push_back(std::move(fn));
  ++running_;
  ++posted_;
  if (idle_free) {
    work_cv_.notify_one();
    return true;
  }
  const uint64_t id = next_id_++;
  try {
    threads_.emplace(id, std::thread([this, id] { WorkerLoop(id); }));
  } catch (const std::system_error&) {
    queue_.pop_back();
    --running_;
    --posted_;
    if (running_ == 0) done_cv_.notify_all();
    return false;
  }
  ++started_;
  return true;
}

void BlockingPool::WorkerLoop(uint64_t id) {
  std::unique_lock lock(mu_);
  for (;;) {
    if (!queue_.empty()) {
      std::function<void()> fn = std::move(queue_.front());
      queue_.pop_front();
      lock.unlock();
      fn();
      fn = nullptr;  // what it captured goes before the pool counts it done
      lock.lock();
      if (--running_ == 0) done_cv_.notify_all();
      continue;
    }
    if (stopping_ || idle_ >= max_idle_) break;
    ++idle_;
    const bool woken = work_cv_.wait_for(lock, idle_timeout_, [&] { return !queue_.empty() || stopping_; });
    --idle_;
    if (!woken) break;  // nothing came for idle_timeout_
  }
  exited_.push_back(id);
  done_cv_.notify_all();
}

void BlockingPool::JoinExited() {
  std::vector<std::thread> done;
  {
    std::lock_guard lock(mu_);
    if (stopping_) return;  // the destructor joins them
    for (uint64_t id : exited_) {
      auto it = threads_.find(id);
      if (it == threads_.end()) continue;
      done.push_back(std::move(it->second));
      threads_.erase(it);
    }
    exited_.clear();
  }
  for (std::thread& t : done) t.join();
}

void BlockingPool::RunAll(size_t n, const std::function<void(size_t)>& fn) {
  if (n == 0) return;
  struct Left {
    std::mutex mu;
    std::condition_variable cv;
    size_t count = 0;
  };
  auto left = std::make_shared<Left>();
  left->count = n - 1;
  auto one_done = [](Left& l) {
    std::lock_guard lock(l.mu);
    if (--l.count == 0) l.cv.notify_all();
  };
  std::vector<size_t> not_posted;
  for (size_t i = 1; i < n; ++i) {
    // `fn` outlives the closure: this call returns only after it ran.
    if (!Post([&fn, i, left, one_done] {
          fn(i);
          one_done(*left);
        })) {
      not_posted.push_back(i);
    }
  }
  fn(0);
  for (size_t i : not_posted) {
    fn(i);
    one_done(*left);
  }
  std::unique_lock lock(left->mu);
  left->cv.wait(lock, [&] { return left->count == 0; });
}

void BlockingPool::Wait() {
  JoinExited();
  std::unique_lock lock(mu_);
  done_cv_.wait(lock, [&] { return running_ == 0; });
}

BlockingPool::Counts BlockingPool::counts() const {
  std::lock_guard lock(mu_);
  Counts c;
  c.threads = threads_.size() - exited_.size();
  c.idle = idle_;
  c.started = started_;
  c.posted = posted_;
  return c;
}

}  // namespace strata
