// Load on 127.0.0.1 against `strata serve` (the tiny synthetic model):
//   - 1,000 streaming requests in flight at once (every connection open and
//     every request sent but its last byte, then all released together) all
//     complete with `data: [DONE]` and no error, /health and /metrics keep
//     answering meanwhile, and the server's resident memory stays within
//     1 GiB of what it held idle with the model loaded and the KV pool made;
//   - overload: with --max-num-seqs 1 and --max-waiting Q, 2Q requests at
//     once get Q - 1 (the excess) 429s within 5%, each with Retry-After and an
//     OpenAI error body, the waiting queue never holds more than Q, and no
//     429'd request is counted as a request the engine ran.
// One client thread drives every connection (stream_fleet.h, poll()).

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <functional>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "tests/e2e/server/serve_test_util.h"
#include "tests/e2e/server/stream_fleet.h"

namespace strata {
namespace {

using testing::json;

constexpr int kStreams = 1000;
constexpr int64_t kGiB = 1ll << 30;

// Samples a value on its own thread until stopped; keeps the maximum.
class Sampler {
 public:
  Sampler(std::function<double()> read, int period_ms) {
    thread_ = std::thread([this, read = std::move(read), period_ms] {
      while (!stop_.load()) {
        double v = read();
        {
          std::lock_guard<std::mutex> lock(mu_);
          max_ = std::max(max_, v);
          ++samples_;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(period_ms));
      }
    });
  }
  ~Sampler() { Stop(); }
  void Stop() {
    stop_.store(true);
    if (thread_.joinable()) thread_.join();
  }
  double max() {
    std::lock_guard<std::mutex> lock(mu_);
    return max_;
  }
  int samples() {
    std::lock_guard<std::mutex> lock(mu_);
    return samples_;
  }

 private:
  std::atomic<bool> stop_{false};
  std::mutex mu_;
  double max_ = -1;
  int samples_ = 0;
  std::thread thread_;
};

TEST(LoadTest, ThousandConcurrentStreamsCompleteWithBoundedMemory) {
  // 1,000 client sockets here, 1,000 server sockets in the child (which
  // inherits the limit).
  const long limit = testing::RaiseFdLimit(8192);
  ASSERT_GE(limit, kStreams + 200) << "RLIMIT_NOFILE too low for " << kStreams << " connections";
  auto server = testing::StartTinyServer({"--max-num-seqs", "64", "--max-waiting", "2000", "--kv-device-bytes",
                                          "64M", "--io-threads", "2"});
  ASSERT_NE(server, nullptr);
  const int port = server->http_port();

  // Warm up (first request paths, allocator arenas), then the idle figure.
  auto warm = testing::PostJson(port, "/v1/completions",
                                json{{"model", "tiny"}, {"prompt", "Once"}, {"max_tokens", 8}, {"stream", true}});
  ASSERT_EQ(warm.status, 200) << warm.raw;
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const auto idle = server->RssBytes();
  ASSERT_TRUE(idle.has_value());

  std::vector<testing::FleetRequest> requests(kStreams);
  for (int i = 0; i < kStreams; ++i) {
    json j = {{"model", "tiny"}, {"max_tokens", 8}, {"temperature", 0.8}, {"seed", i}, {"stream", true}};
    if (i % 2 == 0) {
      j["prompt"] = "Request " + std::to_string(i) + " says: once upon a time";
    } else {
      j["messages"] = json::array({{{"role", "user"}, {"content", "Stream " + std::to_string(i) + ", tell a story."}}});
    }
    if (i % 3 == 0) j["stream_options"] = {{"include_usage", true}};
    requests[i].raw = testing::RawPost(port, i % 2 == 0 ? "/v1/completions" : "/v1/chat/completions", j.dump());
  }

  // While the streams run: resident memory, and /health + /metrics answering.
  Sampler rss([&] { return static_cast<double>(server->RssBytes().value_or(0)); }, 10);
  std::atomic<int> health_ok{0}, health_bad{0};
  Sampler in_flight(
      [&] {
        auto h = testing::SimpleHttp(port, "GET", "/health", "", {}, 30);
        (h.status == 200 ? health_ok : health_bad)++;
        std::string m = testing::SimpleHttp(port, "GET", "/metrics", "", {}, 30).body;
        return testing::Gauge(m, "strata_num_requests_running") + testing::Gauge(m, "strata_num_requests_waiting");
      },
      20);
  testing::FleetOptions options;
  options.hold_last_byte = true;  // all 1,000 in flight before the first can finish
  options.timeout_seconds = 180;
  std::vector<testing::FleetResult> results = testing::RunFleet(port, requests, options);
  rss.Stop();
  in_flight.Stop();

  int failed = 0;
  for (int i = 0; i < kStreams && failed < 5; ++i) {
    const testing::FleetResult& r = results[i];
    SCOPED_TRACE("stream " + std::to_string(i));
    bool ok = r.error.empty() && r.status == 200 && r.complete && r.saw_done;
    testing::SseBody sse = testing::ParseSse(r.body);
    ok = ok && sse.done_last && !sse.events.empty() &&
         r.header("content-type").find("text/event-stream") != std::string::npos;
    // Every event is a chunk (no error), and the choice finishes ("length",
    // or "stop" when the random model samples its end-of-sequence token).
    bool finished = false;
    for (const json& e : sse.events) {
      ok = ok && e.is_object() && !e.contains("error") && e.contains("choices");
      if (!ok) break;
      for (const json& c : e["choices"]) finished = finished || c.value("finish_reason", json()).is_string();
    }
    ok = ok && finished;
    if (ok && i % 3 == 0) {
      const json& last = sse.events.back();
      ok = last.contains("usage") && last["usage"].is_object() &&
           last["usage"]["completion_tokens"].get<int>() >= 1 && last["usage"]["completion_tokens"].get<int>() <= 8;
    }
    if (!ok) {
      ++failed;
      ADD_FAILURE() << "status " << r.status << " error '" << r.error << "' complete " << r.complete << " [DONE] "
                    << r.saw_done << "\nheaders: " << r.headers << "\nbody: " << r.body.substr(0, 2000);
    }
  }
  EXPECT_EQ(failed, 0);
  EXPECT_EQ(health_bad.load(), 0) << "GET /health failed while the streams ran";
  EXPECT_GT(health_ok.load(), 0);

  const std::string m = testing::WaitForMetrics(port, [](const std::string& text) {
    return testing::Gauge(text, "strata_num_requests_running") == 0 &&
           testing::Gauge(text, "strata_num_requests_waiting") == 0;
  });
  EXPECT_GE(testing::MetricSum(m, "strata_requests_total"), kStreams + 1) << m;
  EXPECT_EQ(testing::MetricValue(m, "strata_request_errors_total", R"(code="429")").value_or(0), 0) << m;
  EXPECT_EQ(testing::MetricValue(m, "strata_request_errors_total", R"(code="500")").value_or(0), 0) << m;
  EXPECT_EQ(testing::Gauge(m, "strata_kv_device_blocks_in_use"), 0) << m;

  const double max_rss = std::max(rss.max(), static_cast<double>(server->RssBytes().value_or(0)));
  const double growth = max_rss - static_cast<double>(*idle);
  const double peak = static_cast<double>(server->PeakRssBytes().value_or(0));
  std::printf("load: idle RSS %.1f MiB, max RSS under load %.1f MiB (%d samples), growth %.1f MiB, VmHWM %.1f MiB, "
              "max running+waiting seen %.0f\n",
              *idle / 1048576.0, max_rss / 1048576.0, rss.samples(), growth / 1048576.0, peak / 1048576.0,
              in_flight.max());
  ::testing::Test::RecordProperty("idle_rss_bytes", std::to_string(*idle));
  ::testing::Test::RecordProperty("max_rss_bytes", std::to_string(static_cast<int64_t>(max_rss)));
  EXPECT_GT(rss.samples(), 0);
  EXPECT_LT(growth, static_cast<double>(kGiB)) << "resident memory beyond the idle server (model + KV pool) under "
                                               << kStreams << " streams";
  testing::StopCleanly(server.get());
}

TEST(LoadTest, OverloadAnswers429ForExactlyTheExcess) {
  constexpr int kQueue = 100;  // --max-waiting
  constexpr int kSent = 2 * kQueue;
  testing::RaiseFdLimit(8192);
  auto server = testing::StartTinyServer(
      {"--max-num-seqs", "1", "--max-waiting", std::to_string(kQueue), "--kv-block-size", "16"});
  ASSERT_NE(server, nullptr);
  const int port = server->http_port();

  // Long generations, so the one running request is still running while the
  // burst arrives; clients leave a second after the burst (once they have
  // their status) to keep the test short.
  std::vector<testing::FleetRequest> requests(kSent);
  for (int i = 0; i < kSent; ++i) {
    json j = {{"model", "tiny"},     {"prompt", "Overload " + std::to_string(i)},
              {"max_tokens", 480},   {"ignore_eos", true},
              {"temperature", 1.0},  {"stream", true}};
    requests[i].raw = testing::RawPost(port, "/v1/completions", j.dump());
    requests[i].hangup_after_seconds = 1.0;
  }
  Sampler waiting(
      [&] {
        return testing::Gauge(testing::SimpleHttp(port, "GET", "/metrics", "", {}, 30).body,
                              "strata_num_requests_waiting");
      },
      5);
  testing::FleetOptions options;
  options.hold_last_byte = true;
  options.timeout_seconds = 120;
  std::vector<testing::FleetResult> results = testing::RunFleet(port, requests, options);
  waiting.Stop();

  int n200 = 0, n429 = 0, other = 0;
  for (int i = 0; i < kSent; ++i) {
    const testing::FleetResult& r = results[i];
    SCOPED_TRACE("request " + std::to_string(i));
    if (r.status == 200) {
      ++n200;
      EXPECT_TRUE(r.error.empty()) << r.error;
    } else if (r.status == 429) {
      ++n429;
      const std::string retry = r.header("retry-after");
      EXPECT_FALSE(retry.empty()) << "429 without Retry-After: " << r.headers;
      EXPECT_TRUE(!retry.empty() && std::all_of(retry.begin(), retry.end(), ::isdigit)) << retry;
      json body = json::parse(r.body, nullptr, false);
      EXPECT_TRUE(testing::IsOpenAiError(body)) << r.body;
      EXPECT_TRUE(r.complete) << r.error;
    } else {
      ++other;
      ADD_FAILURE() << "status " << r.status << " error '" << r.error << "'\n" << r.headers << "\n" << r.body;
    }
  }
  // Accepted: Q waiting + the one running; the rest is the excess.
  const int excess = kSent - kQueue - 1;
  const int tolerance = std::max(1, static_cast<int>(std::ceil(0.05 * excess)));
  std::printf("overload: sent %d, 200: %d, 429: %d (excess %d +- %d), max waiting seen %.0f\n", kSent, n200, n429,
              excess, tolerance, waiting.max());
  EXPECT_EQ(other, 0);
  EXPECT_EQ(n200 + n429, kSent);
  EXPECT_NEAR(n429, excess, tolerance);
  EXPECT_LE(waiting.max(), kQueue) << "the waiting queue held more than --max-waiting";

  // Every accepted request ends (finished or cancelled when its client left);
  // none of the 429s was ever an engine request.
  const std::string m = testing::WaitForMetrics(port, [&](const std::string& text) {
    return testing::Gauge(text, "strata_num_requests_running") == 0 &&
           testing::Gauge(text, "strata_num_requests_waiting") == 0 &&
           testing::MetricSum(text, "strata_requests_total") >= n200;
  });
  EXPECT_EQ(testing::MetricSum(m, "strata_requests_total"), n200) << m;
  EXPECT_EQ(testing::MetricValue(m, "strata_request_errors_total", R"(code="429")").value_or(0), n429) << m;
  if (testing::HasMetric(m, "strata_requests_rejected_total")) {
    EXPECT_EQ(testing::MetricSum(m, "strata_requests_rejected_total"), n429) << m;
  }
  EXPECT_EQ(testing::Gauge(m, "strata_kv_device_blocks_in_use"), 0) << m;
  // Still serving after the storm.
  auto ok = testing::PostJson(port, "/v1/completions", json{{"model", "tiny"}, {"prompt", "Once"}, {"max_tokens", 4}});
  EXPECT_EQ(ok.status, 200) << ok.raw;
  testing::StopCleanly(server.get());
}

}  // namespace
}  // namespace strata
