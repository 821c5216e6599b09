#include "common/blocking_pool.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

namespace strata {
namespace {

using namespace std::chrono_literals;

// Waits (up to 20 s, so that a broken pool fails rather than hangs) until
// `pred` holds.
template <typename Pred>
bool Eventually(Pred pred) {
  const auto until = std::chrono::steady_clock::now() + 20s;
  while (!pred()) {
    if (std::chrono::steady_clock::now() > until) return false;
    std::this_thread::sleep_for(1ms);
  }
  return true;
}

// n parties that each wait until all n arrived (or 20 s passed).
struct Rendezvous {
  explicit Rendezvous(int n) : want(n) {}
  bool Arrive() {
    std::unique_lock lock(mu);
    if (++arrived == want) cv.notify_all();
    return cv.wait_for(lock, 20s, [&] { return arrived >= want; });
  }
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  const int want;
};

TEST(BlockingPool, ClosuresThatWaitForEachOtherAllRunAtOnce) {
  BlockingPool pool(4);
  constexpr int kN = 12;  // more than the idle threads it keeps
  Rendezvous all(kN);
  std::atomic<int> met{0};
  for (int i = 0; i < kN; ++i) {
    ASSERT_TRUE(pool.Post([&] {
      if (all.Arrive()) met.fetch_add(1);
    }));
  }
  pool.Wait();
  EXPECT_EQ(met.load(), kN);  // queued behind each other, they would time out
  EXPECT_EQ(pool.counts().posted, static_cast<uint64_t>(kN));
}

TEST(BlockingPool, OneAfterAnotherReusesOneThread) {
  BlockingPool pool;
  std::set<std::thread::id> ran_on;
  for (int i = 0; i < 50; ++i) {
    ASSERT_TRUE(pool.Post([&] { ran_on.insert(std::this_thread::get_id()); }));
    pool.Wait();  // the thread is idle again before Wait returns
  }
  EXPECT_EQ(ran_on.size(), 1u);
  EXPECT_EQ(pool.counts().started, 1u);
  EXPECT_EQ(pool.counts().idle, 1u);
}

TEST(BlockingPool, KeepsAtMostMaxIdleThreads) {
  BlockingPool pool(/*max_idle=*/2);
  Rendezvous all(6);
  pool.RunAll(6, [&](size_t) { all.Arrive(); });
  EXPECT_EQ(pool.counts().started, 5u);  // fn(0) ran on this thread
  EXPECT_TRUE(Eventually([&] { return pool.counts().threads <= 2; }));
  EXPECT_LE(pool.counts().idle, 2u);
}

TEST(BlockingPool, AnIdleThreadLeavesAfterTheTimeoutAndANewOneStarts) {
  BlockingPool pool(32, 20ms);
  ASSERT_TRUE(pool.Post([] {}));
  pool.Wait();
  EXPECT_TRUE(Eventually([&] { return pool.counts().threads == 0; }));
  std::atomic<bool> ran{false};
  ASSERT_TRUE(pool.Post([&] { ran = true; }));
  pool.Wait();
  EXPECT_TRUE(ran.load());
  EXPECT_EQ(pool.counts().started, 2u);
}

TEST(BlockingPool, RunAllRunsEachIndexOnceAndTheFirstOnTheCaller) {
  BlockingPool pool;
  for (size_t n : {size_t{0}, size_t{1}, size_t{2}, size_t{7}}) {
    std::vector<std::atomic<int>> runs(n);
    std::thread::id first;
    pool.RunAll(n, [&](size_t i) {
      runs[i].fetch_add(1);
      if (i == 0) first = std::this_thread::get_id();
    });
    for (size_t i = 0; i < n; ++i) EXPECT_EQ(runs[i].load(), 1) << "n=" << n << " i=" << i;
    if (n > 0) {
      EXPECT_EQ(first, std::this_thread::get_id());
    }
  }
}

TEST(BlockingPool, WaitCoversClosuresPostedByClosures) {
  BlockingPool pool;
  std::atomic<int> ran{0};
  ASSERT_TRUE(pool.Post([&] {
    std::this_thread::sleep_for(5ms);
    ran.fetch_add(1);
    pool.Post([&] {
      std::this_thread::sleep_for(5ms);
      ran.fetch_add(1);
    });
  }));
  pool.Wait();
  EXPECT_EQ(ran.load(), 2);
}

TEST(BlockingPool, TheDestructorWaitsForRunningClosures) {
  std::atomic<bool> done{false};
  {
    BlockingPool pool;
    ASSERT_TRUE(pool.Post([&] {
      std::this_thread::sleep_for(30ms);
      done = true;
    }));
  }
  EXPECT_TRUE(done.load());
}

TEST(BlockingPool, ManyThreadsPostingAtOnce) {
  BlockingPool pool(8);
  std::atomic<int> ran{0};
  std::vector<std::thread> posters;
  for (int t = 0; t < 4; ++t) {
    posters.emplace_back([&] {
      for (int i = 0; i < 200; ++i) {
        pool.Post([&] { ran.fetch_add(1); });
        if (i % 50 == 0) pool.RunAll(3, [&](size_t) { ran.fetch_add(1); });
      }
    });
  }
  for (std::thread& t : posters) t.join();
  pool.Wait();
  EXPECT_EQ(ran.load(), 4 * (200 + 4 * 3));
  EXPECT_LE(pool.counts().idle, 8u);
}

}  // namespace
}  // namespace strata
