// The blocking HTTP client's pure parts: SSE splitting and URL parsing; and
// its reading of responses a server may legally send (chunk extensions,
// trailers, body to EOF, split reads), against a scripted raw-socket server.

#include "common/http_client.h"
#include "tests/support/ports.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

namespace strata::server {
namespace {

TEST(SseParserTest, SplitsEventsAcrossFeeds) {
  SseParser p;
  std::string d;
  p.Feed("data: {\"a\":1}\n");
  EXPECT_FALSE(p.Next(&d));  // event not finished
  p.Feed("\ndata: two\r\n\r\n: a comment\n\nda");
  ASSERT_TRUE(p.Next(&d));
  EXPECT_EQ(d, "{\"a\":1}");
  ASSERT_TRUE(p.Next(&d));
  EXPECT_EQ(d, "two");
  EXPECT_FALSE(p.Next(&d));  // the comment event has no data
  p.Feed("ta:x\ndata: y\n\n");
  ASSERT_TRUE(p.Next(&d));
  EXPECT_EQ(d, "x\ny");
  EXPECT_FALSE(p.Next(&d));
}

TEST(SseParserTest, ManyEventsKeepsWorkingAfterCompaction) {
  SseParser p;
  std::string d;
  for (int i = 0; i < 5000; ++i) {
    p.Feed("data: " + std::to_string(i) + "\n\n");
    ASSERT_TRUE(p.Next(&d));
    ASSERT_EQ(d, std::to_string(i));
  }
  EXPECT_FALSE(p.Next(&d));
}

TEST(ParseHttpUrlTest, AcceptsAndRejects) {
  auto a = ParseHttpUrl("http://127.0.0.1:8000");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->host, "127.0.0.1");
  EXPECT_EQ(a->port, 8000);
  EXPECT_EQ(a->path, "/");
  auto b = ParseHttpUrl("localhost:9/v1/models");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->host, "localhost");
  EXPECT_EQ(b->port, 9);
  EXPECT_EQ(b->path, "/v1/models");
  auto c = ParseHttpUrl("http://[::1]:8080/x");
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->host, "::1");
  EXPECT_EQ(c->port, 8080);
  auto d = ParseHttpUrl("HTTP://example");
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->port, 80);
  for (const char* bad : {"https://x:1", "http://:80", "http://x:", "http://x:0", "http://x:70000", "http://x:8a",
                          "ftp://x"}) {
    auto r = ParseHttpUrl(bad);
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) {
      EXPECT_EQ(r.error().code(), StatusCode::kInvalidArgument);
    }
  }
}

// A one-shot server that answers the first request with `reply`, in pieces.
class ScriptedServer {
 public:
  explicit ScriptedServer(std::vector<std::string> pieces) {
    fd_ = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd_, reinterpret_cast<sockaddr*>(&a), sizeof(a));
    ::listen(fd_, 4);
    socklen_t len = sizeof(a);
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&a), &len);
    port_ = ntohs(a.sin_port);
    thread_ = std::thread([this, pieces = std::move(pieces)] {
      int c = ::accept(fd_, nullptr, nullptr);
      if (c < 0) return;
      std::string req;
      char buf[4096];
      while (req.find("\r\n\r\n") == std::string::npos) {
        ssize_t n = ::recv(c, buf, sizeof(buf), 0);
        if (n <= 0) break;
        req.append(buf, static_cast<size_t>(n));
      }
      request_ = req;
      for (const auto& p : pieces) {
        ::send(c, p.data(), p.size(), MSG_NOSIGNAL);
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      ::close(c);
    });
  }
  ~ScriptedServer() {
    ::shutdown(fd_, SHUT_RDWR);
    thread_.join();
    ::close(fd_);
  }
  int port() const { return port_; }
  const std::string& request() const { return request_; }

 private:
  int fd_ = -1;
  int port_ = 0;
  std::string request_;
  std::thread thread_;
};

TEST(HttpClientTest, DecodesChunksWithExtensionsAndTrailers) {
  std::vector<std::string> got;
  {
    ScriptedServer s({"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\nX-A: 1\r\nx-a: 2\r\n\r\n",
                      "5;ext=1\r\nhel", "lo\r\n", "6\r\n world\r\n0\r\nTrailer: t\r\n\r\n"});
    auto r = HttpStream("127.0.0.1", s.port(), "POST", "/p", "{}", {{"X-Test", "yes"}}, [&](std::string_view d) {
      got.emplace_back(d);
      return true;
    });
    ASSERT_TRUE(r.ok()) << r.error().ToString();
    EXPECT_EQ(r->status, 200);
    EXPECT_EQ(r->header("x-a"), "1, 2");
    EXPECT_TRUE(r->body.empty());
    EXPECT_NE(s.request().find("X-Test: yes\r\n"), std::string::npos);
    EXPECT_NE(s.request().find("Content-Length: 2\r\n"), std::string::npos);
  }
  std::string all;
  for (auto& g : got) all += g;
  EXPECT_EQ(all, "hello world");
  EXPECT_GE(got.size(), 3u);  // delivered as it arrived, not at the end
}

TEST(HttpClientTest, BodyToEofAndContentLength) {
  {
    ScriptedServer s({"HTTP/1.0 200 OK\r\n\r\nuntil", " the end"});
    auto r = HttpCall("127.0.0.1", s.port(), "GET", "/");
    ASSERT_TRUE(r.ok()) << r.error().ToString();
    EXPECT_EQ(r->body, "until the end");
  }
  {
    ScriptedServer s({"HTTP/1.1 404 Not Found\r\nContent-Length: 4\r\n\r\nno", "pe"});
    auto r = HttpCall("127.0.0.1", s.port(), "GET", "/");
    ASSERT_TRUE(r.ok()) << r.error().ToString();
    EXPECT_EQ(r->status, 404);
    EXPECT_EQ(r->body, "nope");
  }
  {
    ScriptedServer s({"SSH-2.0-OpenSSH\r\n\r\n"});
    auto r = HttpCall("127.0.0.1", s.port(), "GET", "/");
    ASSERT_FALSE(r.ok());
    EXPECT_EQ(r.error().code(), StatusCode::kCorrupt);
  }
  {
    ScriptedServer s({"HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\nshort"});
    auto r = HttpCall("127.0.0.1", s.port(), "GET", "/");
    EXPECT_FALSE(r.ok());
  }
}

TEST(HttpClientTest, ConnectRefusedAndTimeout) {
  int port = 0;
  int fd = strata::testing::BoundSocket(&port);
  auto refused = HttpCall("127.0.0.1", port, "GET", "/", "", {}, 5);  // bound, not listening
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.error().code(), StatusCode::kUnavailable);
  ::listen(fd, 1);  // listening, never answering
  auto slow = HttpCall("127.0.0.1", port, "GET", "/", "", {}, 0.2);
  ASSERT_FALSE(slow.ok());
  EXPECT_EQ(slow.error().code(), StatusCode::kResourceExhausted);
  ::close(fd);
}

}  // namespace
}  // namespace strata::server
