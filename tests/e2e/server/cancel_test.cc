// Clients that hang up mid-stream leave nothing behind: 100 streaming clients
// (one thread each, server/http_client.h) close their connection after the
// first chunks of long generations, and 20 more close before any token came
// (while queued). Then /metrics must show no running or waiting request and
// no device KV block referenced by a request, every request finished (as
// "abort"), and the server still answers.

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "common/http_client.h"
#include "tests/e2e/server/serve_test_util.h"

namespace strata {
namespace {

using testing::json;

constexpr int kStreamingClients = 100;
constexpr int kImpatientClients = 20;

std::string LongStream(int i) {
  // Distinct prompts: each request holds blocks of its own.
  json j = {{"model", "tiny"},
            {"prompt", "Story number " + std::to_string(i) + ": once upon a time there was a little tree"},
            {"max_tokens", 400},
            {"ignore_eos", true},
            {"temperature", 1.0},
            {"stream", true}};
  return j.dump();
}

TEST(CancelTest, HungUpStreamsLeaveNoRequestAndNoBlockBehind) {
  auto server = testing::StartTinyServer({"--max-num-seqs", "32", "--kv-block-size", "4"});
  ASSERT_NE(server, nullptr);
  const int port = server->http_port();

  std::atomic<int> got_data{0}, hung_up{0}, bad_status{0};
  std::vector<std::string> errors(kStreamingClients);
  std::vector<std::thread> threads;
  for (int i = 0; i < kStreamingClients; ++i) {
    threads.emplace_back([&, i] {
      strata::SseParser sse;
      int events = 0;
      bool any_data = false;
      // A quarter leave at their very first bytes, the rest after 3 events.
      const int leave_after = i % 4 == 0 ? 1 : 3;
      auto r = strata::HttpStream(
          "127.0.0.1", port, "POST", "/v1/completions", LongStream(i), {{"Content-Type", "application/json"}},
          [&](std::string_view data) {
            any_data = true;
            sse.Feed(data);
            std::string event;
            while (sse.Next(&event)) ++events;
            if (i % 4 == 0) return false;
            return events < leave_after;
          },
          120);
      if (!r) {
        errors[i] = r.error().ToString();
        return;
      }
      if (r->status != 200) {
        ++bad_status;
        errors[i] = "status " + std::to_string(r->status);
        return;
      }
      if (any_data) ++got_data;
      ++hung_up;
    });
  }
  // Impatient clients: send the request, wait a moment, close without reading.
  for (int i = 0; i < kImpatientClients; ++i) {
    threads.emplace_back([&, i] {
      int fd = ::socket(AF_INET, SOCK_STREAM, 0);
      if (fd < 0) return;
      sockaddr_in addr{};
      addr.sin_family = AF_INET;
      addr.sin_port = htons(static_cast<uint16_t>(port));
      addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
      if (::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
        const std::string body = LongStream(1000 + i);
        const std::string req =
            "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            "Content-Length: " + std::to_string(body.size()) + "\r\n\r\n" + body;
        ::send(fd, req.data(), req.size(), MSG_NOSIGNAL);
        // Briefly: the tiny model decodes 400 tokens in well under 50 ms when
        // the server is otherwise idle, and such a request ends by "length".
        std::this_thread::sleep_for(std::chrono::milliseconds(2 + i % 8));
      }
      ::close(fd);
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < kStreamingClients; ++i) EXPECT_EQ(errors[i], "") << "client " << i;
  EXPECT_EQ(bad_status.load(), 0);
  EXPECT_EQ(hung_up.load(), kStreamingClients);
  EXPECT_EQ(got_data.load(), kStreamingClients);

  // The server notices every hang-up and releases the requests' blocks. (An
  // impatient client may close before the server read its request; then
  // there was no engine request, hence "at least" the streaming ones.)
  const int total = kStreamingClients + kImpatientClients;
  std::string m = testing::WaitForMetrics(port, [&](const std::string& text) {
    return testing::Gauge(text, "strata_num_requests_running") == 0 &&
           testing::Gauge(text, "strata_num_requests_waiting") == 0 &&
           testing::Gauge(text, "strata_kv_device_blocks_in_use") == 0 &&
           testing::MetricSum(text, "strata_requests_total") >= kStreamingClients;
  });
  EXPECT_EQ(testing::Gauge(m, "strata_num_requests_running"), 0) << m;
  EXPECT_EQ(testing::Gauge(m, "strata_num_requests_waiting"), 0) << m;
  EXPECT_EQ(testing::Gauge(m, "strata_kv_device_blocks_in_use"), 0) << m;
  const double finished = testing::MetricSum(m, "strata_requests_total");
  EXPECT_GE(finished, kStreamingClients) << m;
  EXPECT_LE(finished, total) << m;
  // 400 tokens each and the clients left after at most 3 events: every
  // request was cut short ("abort"), none ran to its length.
  EXPECT_EQ(testing::Gauge(m, "strata_requests_total", R"(finish_reason="abort")"), finished) << m;
  EXPECT_LT(testing::MetricSum(m, "strata_generation_tokens_total"), total * 400.0 / 2) << m;

  // Still serving.
  auto ok = testing::PostJson(port, "/v1/completions",
                              json{{"model", "tiny"}, {"prompt", "Once"}, {"max_tokens", 4}, {"temperature", 0}});
  EXPECT_EQ(ok.status, 200) << ok.raw;
  testing::StopCleanly(server.get());
}

}  // namespace
}  // namespace strata
