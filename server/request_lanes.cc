#include "server/request_lanes.h"

#include <algorithm>
#include <utility>

#include "common/logging.h"

namespace strata::server {

namespace {

RequestLanesOptions Clamp(RequestLanesOptions o) {
  for (LaneOptions* l : {&o.small, &o.large}) {
    l->threads = std::max(1, l->threads);
    l->max_queue = std::max(1, l->max_queue);
  }
  return o;
}

}  // namespace

RequestLanes::RequestLanes(RequestLanesOptions options) : options_(Clamp(std::move(options))) {
  const LaneOptions* opts[kNumLanes] = {&options_.small, &options_.large};
  for (size_t i = 0; i < kNumLanes; ++i) {
    State& s = lanes_[i];
    s.max_queue = opts[i]->max_queue;
    for (int t = 0; t < opts[i]->threads; ++t) s.workers.emplace_back([this, &s] { Work(&s); });
  }
}

RequestLanes::~RequestLanes() { Stop(); }

bool RequestLanes::Post(Lane lane, std::function<void()> work) {
  State& s = lanes_[static_cast<size_t>(lane)];
  {
    std::lock_guard<std::mutex> lock(s.mu);
    if (s.stopping || static_cast<int>(s.queue.size()) >= s.max_queue) {
      ++s.rejected;
      return false;
    }
    s.queue.push_back(std::move(work));
    ++s.accepted;
  }
  s.cv.notify_one();
  return true;
}

LaneStats RequestLanes::stats(Lane lane) const {
  const State& s = lanes_[static_cast<size_t>(lane)];
  std::lock_guard<std::mutex> lock(s.mu);
  LaneStats st;
  st.queued = static_cast<int>(s.queue.size());
  st.running = s.running;
  st.accepted = s.accepted;
  st.rejected = s.rejected;
  return st;
}

void RequestLanes::Work(State* s) {
  while (true) {
    std::function<void()> work;
    {
      std::unique_lock<std::mutex> lock(s->mu);
      s->cv.wait(lock, [&] { return s->stopping || !s->queue.empty(); });
      if (s->queue.empty()) return;  // stopping and drained
      work = std::move(s->queue.front());
      s->queue.pop_front();
      ++s->running;
    }
    try {
      work();
    } catch (const std::exception& e) {
      // The work's captures (an HTTP writer) are released: an unanswered
      // HTTP request gets 500. Never let one request end the process.
      STRATA_LOG_ERROR("request lane: a request failed: {}", e.what());
    } catch (...) {
      STRATA_LOG_ERROR("request lane: a request failed with an unknown exception");
    }
    std::lock_guard<std::mutex> lock(s->mu);
    --s->running;
  }
}

void RequestLanes::Stop() {
  for (State& s : lanes_) {
    std::lock_guard<std::mutex> lock(s.mu);
    s.stopping = true;
  }
  for (State& s : lanes_) {
    s.cv.notify_all();
    for (std::thread& t : s.workers)
      if (t.joinable()) t.join();
  }
}

}  // namespace strata::server
