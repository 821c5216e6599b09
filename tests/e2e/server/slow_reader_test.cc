// Clients that stop reading cannot hold the engine (`strata serve` on the
// tiny model, real sockets): 64 streaming clients with long outputs and a
// 4 KiB receive buffer never read a byte. Their output fills the socket and
// then the per-connection buffer (--stream-buffer-bytes 4K), which holds
// their generation in the engine (it generates nothing more, keeps its
// place); after --write-timeout-seconds 2 each is closed and cancelled like
// a hang-up, counted in strata_stream_write_timeouts_total, and every device
// block returns to the pool. A normal client is served meanwhile.

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "tests/e2e/server/serve_test_util.h"

namespace strata::testing {
namespace {

// Connects with a 4 KiB receive buffer (set before connect, so the window is
// small from the start), sends one request and returns the socket unread.
int SendWithoutReading(int port, const std::string& body) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  const int rcvbuf = 4096;
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &rcvbuf, sizeof(rcvbuf));
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  if (connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
    close(fd);
    return -1;
  }
  const std::string req = "POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                          "Content-Length: " +
                          std::to_string(body.size()) + "\r\n\r\n" + body;
  size_t sent = 0;
  while (sent < req.size()) {
    const ssize_t n = send(fd, req.data() + sent, req.size() - sent, MSG_NOSIGNAL);
    if (n <= 0) {
      close(fd);
      return -1;
    }
    sent += static_cast<size_t>(n);
  }
  return fd;
}

TEST(SlowReaderTest, ClientsThatNeverReadAreCancelledAfterTheWriteTimeout) {
  auto server = StartTinyServer({"--write-timeout-seconds", "2", "--stream-buffer-bytes", "4K", "--max-num-seqs",
                                 "80"});
  ASSERT_NE(server, nullptr);
  const int port = server->port("http");
  // Long outputs with top logprobs: far more than the socket buffers and the
  // 4 KiB stream buffer hold.
  const std::string body = json{{"model", "tiny"},      {"prompt", "Once upon a time"},
                                {"max_tokens", 480},    {"ignore_eos", true},
                                {"stream", true},       {"logprobs", 5}}
                               .dump();
  std::vector<int> fds;
  for (int i = 0; i < 64; ++i) {
    const int fd = SendWithoutReading(port, body);
    ASSERT_GE(fd, 0) << "client " << i;
    fds.push_back(fd);
  }
  // While they are stuck, a normal client is served in full.
  JsonResponse normal = PostJson(port, "/v1/completions",
                                 json{{"model", "tiny"}, {"prompt", "Hello"}, {"max_tokens", 8}, {"ignore_eos", true}}, {},
                                 60);
  EXPECT_EQ(normal.status, 200) << normal.raw;
  EXPECT_EQ(normal.body["usage"]["completion_tokens"], 8);

  // Held, not spinning: while the clients are stuck, their requests stay
  // admitted but generate far less than they asked for.
  const std::string stuck = Metrics(port);
  EXPECT_LT(Gauge(stuck, "strata_generation_tokens_total"), 64.0 * 480 / 2) << stuck;

  // Every stuck stream times out and is cancelled; the pool empties.
  const std::string m = WaitForMetrics(
      port,
      [](const std::string& t) {
        return Gauge(t, "strata_stream_write_timeouts_total") >= 64 && Gauge(t, "strata_kv_device_blocks_in_use") == 0 &&
               Gauge(t, "strata_num_requests_running") == 0;
      },
      60);
  EXPECT_EQ(Gauge(m, "strata_stream_write_timeouts_total"), 64) << m;
  EXPECT_EQ(Gauge(m, "strata_kv_device_blocks_in_use"), 0);
  EXPECT_EQ(Gauge(m, "strata_num_requests_running"), 0);
  EXPECT_EQ(Gauge(m, "strata_requests_total", "finish_reason=\"abort\""), 64);
  for (int fd : fds) close(fd);
  // Still serving.
  EXPECT_EQ(PostJson(port, "/v1/completions", json{{"model", "tiny"}, {"prompt", "Hi"}, {"max_tokens", 2}}).status, 200);
  StopCleanly(server.get());
}

}  // namespace
}  // namespace strata::testing
