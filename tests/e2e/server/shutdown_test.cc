// SIGTERM on `strata serve` while streams are in flight: with a long enough
// --shutdown-grace-seconds every stream runs to its end (`data: [DONE]`, all
// its tokens) and the process exits 0; with a short one the rest are
// cancelled, each client still gets a properly ended response, and the
// process exits 0. New requests during the drain are refused (503 or a closed
// listener), never queued.

#include <gtest/gtest.h>

#include <signal.h>

#include <chrono>
#include <regex>
#include <string>
#include <thread>
#include <vector>

#include "tests/e2e/server/serve_test_util.h"
#include "tests/e2e/server/stream_fleet.h"

namespace strata {
namespace {

using testing::json;

std::vector<testing::FleetRequest> LongStreams(int port, int count, int max_tokens) {
  std::vector<testing::FleetRequest> requests(count);
  for (int i = 0; i < count; ++i) {
    json j = {{"model", "tiny"},
              {"prompt", "Shutdown story " + std::to_string(i)},
              {"max_tokens", max_tokens},
              {"ignore_eos", true},
              {"temperature", 1.0},
              {"stream", true},
              {"stream_options", {{"include_usage", true}}}};
    requests[i].raw = testing::RawPost(port, "/v1/completions", j.dump());
  }
  return requests;
}

// Waits (bounded) until the engine has requests both running and waiting, so
// the signal surely lands while work is in flight.
bool WaitUntilBusy(int port) {
  const std::string m = testing::WaitForMetrics(
      port,
      [](const std::string& text) {
        return testing::Gauge(text, "strata_num_requests_running") >= 1 &&
               testing::Gauge(text, "strata_num_requests_waiting") >= 1;
      },
      60);
  return testing::Gauge(m, "strata_num_requests_running") >= 1;
}

// Joins the client thread when a test ends early (a failed ASSERT): kills
// the server first so the clients' connections end at once.
class ClientsGuard {
 public:
  ClientsGuard(testing::ServerProcess* server, std::thread* clients) : server_(server), clients_(clients) {}
  ~ClientsGuard() {
    if (!clients_->joinable()) return;
    server_->Signal(SIGKILL);
    clients_->join();
  }

 private:
  testing::ServerProcess* server_;
  std::thread* clients_;
};

// Polls /health (bounded) until the server stops answering 200: it has taken
// the signal and is draining.
void WaitUntilDraining(int port) {
  for (int i = 0; i < 600; ++i) {
    if (testing::SimpleHttp(port, "GET", "/health", "", {}, 5).status != 200) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ADD_FAILURE() << "/health still 200 30 s after SIGTERM";
}

// The count in the server's "received SIGTERM: draining (..., N requests
// unfinished)" log line, or -1.
int UnfinishedAtSignal(const std::string& log) {
  std::smatch m;
  static const std::regex re(R"(draining \(.*?(\d+) requests unfinished\))");
  return std::regex_search(log, m, re) ? std::stoi(m[1]) : -1;
}

TEST(ShutdownTest, InFlightStreamsFinishWithinTheGracePeriod) {
  auto server = testing::StartTinyServer({"--max-num-seqs", "4", "--shutdown-grace-seconds", "120"});
  ASSERT_NE(server, nullptr);
  const int port = server->http_port();
  constexpr int kStreams = 16, kTokens = 400;
  std::vector<testing::FleetResult> results;
  std::thread clients([&] { results = testing::RunFleet(port, LongStreams(port, kStreams, kTokens)); });
  ClientsGuard guard(server.get(), &clients);
  ASSERT_TRUE(WaitUntilBusy(port)) << "the streams never ran";

  ASSERT_TRUE(server->Signal(SIGTERM));
  WaitUntilDraining(port);
  // While draining, a new request is refused, never queued.
  auto late = testing::SimpleHttp(port, "POST", "/v1/completions",
                                  json{{"model", "tiny"}, {"prompt", "late"}, {"max_tokens", 2}}.dump(), {}, 30);
  EXPECT_TRUE(late.status == 0 || late.status == 503) << "a request during the drain got " << late.status << " "
                                                       << late.body;
  auto code = server->Wait(180);
  clients.join();
  ASSERT_TRUE(code) << code.error().ToString();
  EXPECT_EQ(*code, 0) << server->stderr_tail();
  const int unfinished = UnfinishedAtSignal(server->stderr_text());
  EXPECT_GT(unfinished, 0) << "the signal came after the work was done; the test proved nothing\n"
                           << server->stderr_tail();

  ASSERT_EQ(results.size(), static_cast<size_t>(kStreams));
  for (int i = 0; i < kStreams; ++i) {
    const testing::FleetResult& r = results[i];
    SCOPED_TRACE("stream " + std::to_string(i));
    EXPECT_EQ(r.status, 200);
    EXPECT_TRUE(r.complete) << r.error;
    EXPECT_TRUE(r.saw_done) << r.body.substr(r.body.size() > 600 ? r.body.size() - 600 : 0);
    testing::SseBody sse = testing::ParseSse(r.body);
    ASSERT_FALSE(sse.events.empty());
    const json& last = sse.events.back();
    ASSERT_TRUE(last.contains("usage") && last["usage"].is_object()) << last.dump();
    EXPECT_EQ(last["usage"]["completion_tokens"], kTokens) << "cut short during the grace period: " << last.dump();
  }
}

TEST(ShutdownTest, AfterTheGracePeriodStreamsAreCancelledAndEndedProperly) {
  auto server = testing::StartTinyServer({"--max-num-seqs", "1", "--shutdown-grace-seconds", "0.1"});
  ASSERT_NE(server, nullptr);
  const int port = server->http_port();
  // Enough work that one sequence at a time cannot finish it within the
  // grace period even on a fast machine (the tiny model decodes ~20k tok/s
  // here: 8 streams were once enough, and stopped being after a speed-up).
  constexpr int kStreams = 64;
  std::vector<testing::FleetResult> results;
  testing::FleetOptions options;
  options.timeout_seconds = 120;
  std::thread clients([&] { results = testing::RunFleet(port, LongStreams(port, kStreams, 480), options); });
  ClientsGuard guard(server.get(), &clients);
  ASSERT_TRUE(WaitUntilBusy(port)) << "the streams never ran";
  auto code = server->Stop(120);
  clients.join();
  ASSERT_TRUE(code) << code.error().ToString();
  EXPECT_EQ(*code, 0) << server->stderr_tail();
  EXPECT_GT(UnfinishedAtSignal(server->stderr_text()), 0) << server->stderr_tail();

  // 64 x 480 tokens one at a time cannot finish in 0.1 s: some were cut. Every
  // client that got a 200 still sees its stream end (the last chunk and the
  // chunked terminator), not a connection torn down mid-chunk; one that got
  // no answer yet sees a refusal.
  int cut = 0;
  for (int i = 0; i < kStreams; ++i) {
    const testing::FleetResult& r = results[i];
    SCOPED_TRACE("stream " + std::to_string(i));
    EXPECT_NE(r.error, "timeout");
    if (r.status == 200) {
      EXPECT_TRUE(r.complete) << "stream " << r.header("x-request-id") << " torn down: " << r.error << "\n"
                              << r.body.substr(r.body.size() > 600 ? r.body.size() - 600 : 0)
                              << "\n--- server stderr (tail) ---\n"
                              << server->stderr_tail(3000);
      testing::SseBody sse = testing::ParseSse(r.body);
      const bool full = !sse.events.empty() && sse.events.back().is_object() &&
                        sse.events.back().contains("usage") && sse.events.back()["usage"].is_object() &&
                        sse.events.back()["usage"].value("completion_tokens", 0) == 480;
      if (!full) ++cut;
    } else {
      EXPECT_TRUE(r.status == 0 || r.status == 503) << r.status << " " << r.body;
      ++cut;
    }
  }
  EXPECT_GT(cut, 0);
}

}  // namespace
}  // namespace strata
