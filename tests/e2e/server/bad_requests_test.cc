// Bad requests against `strata serve`, table-driven: each gets the right
// status code and OpenAI's error body {"error": {"message", "type", "param",
// "code"}} (naming the field where there is one), none is a 500, and
// afterwards a good request still works and the process is alive.

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "tests/e2e/server/serve_test_util.h"

namespace strata {
namespace {

using testing::json;
using testing::ServerProcess;

constexpr const char* kKey = "sk-bad-requests-test";
constexpr int kMaxBody = 65536;  // --max-body-bytes
const std::string kAuth = std::string("Authorization: Bearer ") + kKey;

struct Case {
  std::string name;
  std::string method;
  std::string path;
  std::string body;
  int status = 0;
  std::string param;                     // expected error.param; empty = not checked
  std::vector<std::string> message_has;  // substrings of error.message
  std::vector<std::string> headers;      // sent as given (the API key by default)
};

Case C(std::string name, std::string method, std::string path, std::string body, int status, std::string param = "",
       std::vector<std::string> message_has = {}, std::vector<std::string> headers = {kAuth}) {
  return Case{std::move(name), std::move(method), std::move(path), std::move(body),
              status,          std::move(param),  std::move(message_has), std::move(headers)};
}

std::string Chat(const std::string& extra) {
  return R"({"model":"tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":4)" +
         (extra.empty() ? std::string() : "," + extra) + "}";
}

std::string Completion(const std::string& extra) {
  return R"({"model":"tiny","prompt":"Once upon a time","max_tokens":4)" +
         (extra.empty() ? std::string() : "," + extra) + "}";
}

// Token ids 3..: byte tokens of the synthetic vocabulary, all valid.
std::string Ids(int n) {
  std::string s = "[";
  for (int i = 0; i < n; ++i) s += (i ? "," : "") + std::to_string(3 + i % 200);
  return s + "]";
}

std::vector<Case> Cases() {
  const std::string chat = "/v1/chat/completions";
  const std::string comp = "/v1/completions";
  std::vector<Case> c = {
      // Malformed bodies.
      C("malformed json", "POST", chat, R"({"model":"tiny","messages":[)", 400),
      C("not json at all", "POST", comp, "hello there", 400),
      C("empty body", "POST", chat, "", 400),
      C("body is an array", "POST", chat, "[1,2,3]", 400),
      C("trailing garbage", "POST", comp, Completion("") + "}}", 400),
      // Missing or wrongly typed fields.
      C("messages missing", "POST", chat, R"({"model":"tiny","max_tokens":4})", 400, "messages"),
      C("messages not an array", "POST", chat, R"({"model":"tiny","messages":"hi"})", 400, "messages"),
      C("messages empty", "POST", chat, R"({"model":"tiny","messages":[]})", 400, "messages"),
      C("unknown role", "POST", chat, R"({"model":"tiny","messages":[{"role":"wizard","content":"hi"}]})", 400),
      C("content is a number", "POST", chat, R"({"model":"tiny","messages":[{"role":"user","content":5}]})", 400),
      C("model is a number", "POST", chat, R"({"model":123,"messages":[{"role":"user","content":"hi"}]})", 400,
       "model"),
      C("prompt missing", "POST", comp, R"({"model":"tiny","max_tokens":4})", 400, "prompt"),
      C("prompt is an object", "POST", comp, R"({"model":"tiny","prompt":{"a":1}})", 400, "prompt"),
      C("max_tokens is a string", "POST", comp, R"({"model":"tiny","prompt":"hi","max_tokens":"10"})", 400,
       "max_tokens"),
      C("stream is a string", "POST", chat, Chat(R"("stream":"yes")"), 400, "stream"),
      C("priority is a string", "POST", comp, Completion(R"("priority":"high")"), 400, "priority"),
      C("logit_bias is a string", "POST", comp, Completion(R"("logit_bias":"x")"), 400, "logit_bias"),
      C("stop is a number", "POST", comp, Completion(R"("stop":7)"), 400, "stop"),
      // Out of OpenAI's ranges.
      C("temperature 3", "POST", chat, Chat(R"("temperature":3)"), 400, "temperature"),
      C("temperature negative", "POST", comp, Completion(R"("temperature":-0.5)"), 400, "temperature"),
      C("top_p 0", "POST", comp, Completion(R"("top_p":0)"), 400, "top_p"),
      C("top_p above 1", "POST", chat, Chat(R"("top_p":1.5)"), 400, "top_p"),
      C("top_k -2", "POST", comp, Completion(R"("top_k":-2)"), 400, "top_k"),
      C("presence_penalty 3", "POST", comp, Completion(R"("presence_penalty":3)"), 400, "presence_penalty"),
      C("frequency_penalty -3", "POST", chat, Chat(R"("frequency_penalty":-3)"), 400, "frequency_penalty"),
      C("top_logprobs 21", "POST", chat, Chat(R"("logprobs":true,"top_logprobs":21)"), 400, "top_logprobs"),
      C("max_tokens 0", "POST", comp, R"({"model":"tiny","prompt":"hi","max_tokens":0})", 400, "max_tokens"),
      C("max_tokens negative", "POST", chat,
       R"({"model":"tiny","messages":[{"role":"user","content":"hi"}],"max_tokens":-5})", 400, "max_tokens"),
      C("n 0", "POST", comp, Completion(R"("n":0)"), 400, "n"),
      C("n above --max-n", "POST", chat, Chat(R"("n":5)"), 400, "n"),
      C("five stop strings", "POST", comp, Completion(R"("stop":["a","b","c","d","e"])"), 400, "stop"),
      C("token id outside the vocabulary", "POST", comp, R"({"model":"tiny","prompt":[1,99999],"max_tokens":2})",
       400, "prompt"),
      C("empty token-id prompt", "POST", comp, R"({"model":"tiny","prompt":[],"max_tokens":2})", 400, "prompt"),
      // OpenAI fields Strata does not implement: a 400 naming the field.
      C("tools", "POST", chat,
       Chat(R"("tools":[{"type":"function","function":{"name":"f","parameters":{}}}])"), 400, "tools", {"tools"}),
      C("tool_choice", "POST", chat, Chat(R"("tool_choice":"auto")"), 400, "tool_choice", {"tool_choice"}),
      C("functions", "POST", chat, Chat(R"("functions":[{"name":"f"}])"), 400, "functions", {"functions"}),
      C("response_format json_object", "POST", chat, Chat(R"("response_format":{"type":"json_object"})"), 400,
       "response_format", {"response_format"}),
      C("audio", "POST", chat, Chat(R"("audio":{"voice":"alloy","format":"wav"})"), 400, "audio", {"audio"}),
      // Prompts that do not fit the context (512): both numbers in the message.
      C("prompt of 600 tokens", "POST", comp, R"({"model":"tiny","prompt":)" + Ids(600) + "}", 400, "",
       {"600", "512"}),
      C("prompt + max_tokens beyond the context", "POST", comp,
       R"({"model":"tiny","prompt":)" + Ids(500) + R"(,"max_tokens":100})", 400, "", {"500", "512"}),
      // Model, route, method.
      C("unknown model (chat)", "POST", chat,
       R"({"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]})", 404, "", {"gpt-4o"}),
      C("unknown model (completions)", "POST", comp, R"({"model":"llama","prompt":"hi"})", 404),
      C("unknown route", "GET", "/v1/nothing-here", "", 404),
      C("unknown route (POST)", "POST", "/v2/completions", Completion(""), 404),
      C("GET on a POST route", "GET", chat, "", 405),
      C("DELETE /v1/models", "DELETE", "/v1/models", "", 405),
      // Size limit.
      C("body over --max-body-bytes", "POST", comp,
       R"({"model":"tiny","prompt":")" + std::string(kMaxBody + 1000, 'a') + R"("})", 413),
      // Authentication.
      C("no api key", "POST", comp, Completion(""), 401, "", {}, {}),
      C("wrong api key", "POST", chat, Chat(""), 401, "", {}, {"Authorization: Bearer sk-wrong"}),
      C("basic auth instead of bearer", "POST", comp, Completion(""), 401, "", {}, {"Authorization: Basic dXNlcjpwYXNz"}),
      C("no api key on /v1/models", "GET", "/v1/models", "", 401, "", {}, {}),
      // Tokenizer routes.
      C("tokenize without prompt or messages", "POST", "/tokenize", R"({"model":"tiny"})", 400),
      C("detokenize with ids outside the vocabulary", "POST", "/detokenize", R"({"model":"tiny","tokens":[5,70000]})",
       400),
      C("detokenize tokens not an array", "POST", "/detokenize", R"({"model":"tiny","tokens":"abc"})", 400, "tokens"),
  };
  return c;
}

class BadRequestsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = testing::StartTinyServer({"--api-key", kKey, "--max-body-bytes", std::to_string(kMaxBody), "--max-n",
                                        "4"})
                  .release();
  }
  static void TearDownTestSuite() {
    if (server_ != nullptr) testing::StopCleanly(server_);
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(server_, nullptr) << "the server did not start (see the first failure)"; }
  static ServerProcess* server_;
};
ServerProcess* BadRequestsTest::server_ = nullptr;

TEST_F(BadRequestsTest, EachGetsItsStatusAndAnOpenAiErrorBody) {
  const std::vector<Case> cases = Cases();
  ASSERT_GE(cases.size(), 30u);
  int client_errors_400 = 0;
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    auto r = testing::SimpleHttp(server_->http_port(), c.method, c.path, c.body, c.headers, 60);
    ASSERT_NE(r.status, 0) << "no response: " << r.error << "\n--- server stderr (tail) ---\n" << server_->stderr_tail();
    EXPECT_EQ(r.status, c.status) << c.method << " " << c.path << " " << c.body.substr(0, 300) << "\n-> " << r.body;
    EXPECT_LT(r.status, 500) << "a client mistake answered with a server error: " << r.body;
    json body = json::parse(r.body, nullptr, false);
    EXPECT_TRUE(testing::IsOpenAiError(body)) << "status " << r.status;
    EXPECT_NE(r.header("x-request-id"), "") << "no x-request-id on an error response";
    if (body.is_object() && body.contains("error") && body["error"].is_object()) {
      if (!c.param.empty()) {
        EXPECT_EQ(body["error"].value("param", json()), c.param) << r.body;
      }
      const std::string message = body["error"].value("message", "");
      for (const auto& s : c.message_has) EXPECT_NE(message.find(s), std::string::npos) << "'" << s << "' in: " << message;
    }
    if (r.status == 400 && c.path.rfind("/v1/", 0) == 0) ++client_errors_400;
    ASSERT_TRUE(server_->alive()) << "the server died\n" << server_->stderr_tail();
  }

  // The errors are counted by code.
  const std::string metrics = testing::Metrics(server_->http_port());
  EXPECT_GE(testing::Gauge(metrics, "strata_request_errors_total", R"(code="400")"), client_errors_400) << metrics;
  EXPECT_GE(testing::Gauge(metrics, "strata_request_errors_total", R"(code="401")"), 4) << metrics;
  EXPECT_GE(testing::Gauge(metrics, "strata_request_errors_total", R"(code="404")"), 2) << metrics;

  // A good request still works, on both routes.
  auto good = testing::PostJson(server_->http_port(), "/v1/completions", Completion(""), {kAuth});
  EXPECT_EQ(good.status, 200) << good.raw;
  EXPECT_TRUE(good.body.is_object() && good.body.contains("choices")) << good.raw;
  auto chat = testing::PostJson(server_->http_port(), "/v1/chat/completions", Chat(R"("stream":true)"), {kAuth});
  EXPECT_EQ(chat.status, 200) << chat.raw;
  EXPECT_TRUE(testing::ParseSse(chat.raw).done_last) << chat.raw;
  EXPECT_TRUE(server_->alive());
}

// A client's x-request-id comes back.
TEST_F(BadRequestsTest, ErrorResponsesEchoTheRequestId) {
  auto r = testing::SimpleHttp(server_->http_port(), "POST", "/v1/completions", Completion(R"("temperature":9)"),
                               {kAuth, "X-Request-Id: my-request-42"});
  EXPECT_EQ(r.status, 400) << r.body;
  EXPECT_EQ(r.header("x-request-id"), "my-request-42");
}

// Bytes that are not HTTP, and a request cut off mid-body, get a 400 or a
// closed connection, never a crash.
TEST_F(BadRequestsTest, GarbageOnTheSocketLeavesTheServerUp) {
  auto send_raw = [&](const std::string& bytes) {
    int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<uint16_t>(server_->http_port()));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
    ASSERT_EQ(::send(fd, bytes.data(), bytes.size(), MSG_NOSIGNAL), static_cast<ssize_t>(bytes.size()));
    ::shutdown(fd, SHUT_WR);
    timeval tv{5, 0};
    ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    std::string got;
    char buf[4096];
    ssize_t n;
    while ((n = ::recv(fd, buf, sizeof buf, 0)) > 0) got.append(buf, static_cast<size_t>(n));
    ::close(fd);
    if (!got.empty()) {
      EXPECT_EQ(got.rfind("HTTP/1.1 4", 0), 0u) << got.substr(0, 200);
    }
  };
  send_raw("THIS IS NOT HTTP\r\n\r\n");
  send_raw(std::string("\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03", 11));  // a TLS ClientHello start
  send_raw("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{\"model\":");
  send_raw("POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n");
  send_raw("GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + std::string(200000, 'h') + "\r\n\r\n");
  ASSERT_TRUE(server_->alive()) << server_->stderr_tail();
  auto health = testing::SimpleHttp(server_->http_port(), "GET", "/health");
  EXPECT_EQ(health.status, 200) << health.error;
  auto good = testing::PostJson(server_->http_port(), "/v1/completions", Completion(""), {kAuth});
  EXPECT_EQ(good.status, 200) << good.raw;
}

}  // namespace
}  // namespace strata
