#pragma once
// Shared pieces of the `strata serve` end-to-end tests: starting a server on
// the tiny synthetic model, JSON requests, SSE bodies, /metrics and the
// OpenAI error-body shape. Header-only (one executable per *_test.cc).

#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/server_process.h"

namespace strata::testing {

using json = nlohmann::json;

// The tiny model's context length (SynthPresetConfig("tiny")).
inline constexpr int kTinyContext = 512;

// Starts `strata serve --model <tiny> --threads 1 <extra>`; fails the current
// test (and returns null) with the server's stderr when it does not come up.
// The model id is "tiny" unless `extra` names another.
inline std::unique_ptr<ServerProcess> StartTinyServer(const std::vector<std::string>& extra) {
  auto model = TinyModelPath();
  if (!model) {
    ADD_FAILURE() << "writing the tiny model: " << model.error().ToString();
    return nullptr;
  }
  // One compute thread: the machine has two cores, shared with the client.
  std::vector<std::string> args = {"--model", *model, "--threads", "1"};
  args.insert(args.end(), extra.begin(), extra.end());
  auto server = ServerProcess::Start(args);
  if (!server) {
    ADD_FAILURE() << server.error().ToString();
    return nullptr;
  }
  return std::move(*server);
}

struct JsonResponse {
  int status = 0;
  json body;              // null when the body is not JSON
  std::string raw;        // the body as received
  SimpleHttpResponse http;
};

inline JsonResponse PostJson(int port, const std::string& path, const std::string& body,
                             const std::vector<std::string>& headers = {}, double timeout_seconds = 120) {
  JsonResponse r;
  r.http = SimpleHttp(port, "POST", path, body, headers, timeout_seconds);
  r.status = r.http.status;
  r.raw = r.http.body;
  r.body = json::parse(r.raw, nullptr, /*allow_exceptions=*/false);
  if (r.body.is_discarded()) r.body = nullptr;
  return r;
}

inline JsonResponse PostJson(int port, const std::string& path, const json& body,
                             const std::vector<std::string>& headers = {}, double timeout_seconds = 120) {
  return PostJson(port, path, body.dump(), headers, timeout_seconds);
}

// The data events of an SSE body, parsed; `done` says whether "data: [DONE]"
// came last. Events that are not JSON are returned as strings.
struct SseBody {
  std::vector<json> events;
  bool done = false;
  bool done_last = false;
};

inline SseBody ParseSse(const std::string& body) {
  SseBody out;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t end = body.find("\n\n", pos);
    std::string event = body.substr(pos, end == std::string::npos ? std::string::npos : end - pos);
    pos = end == std::string::npos ? body.size() : end + 2;
    size_t b = event.find_first_not_of("\r\n");
    if (b == std::string::npos || event.compare(b, 5, "data:") != 0) continue;
    std::string payload = event.substr(b + 5);
    if (!payload.empty() && payload[0] == ' ') payload.erase(0, 1);
    while (!payload.empty() && (payload.back() == '\r' || payload.back() == '\n')) payload.pop_back();
    if (payload == "[DONE]") {
      out.done = true;
      out.done_last = true;
      continue;
    }
    out.done_last = false;
    json j = json::parse(payload, nullptr, false);
    out.events.push_back(j.is_discarded() ? json(payload) : j);
  }
  return out;
}

// Concatenated text of choice `index` over streamed chunks (chat delta
// content or completion text).
inline std::string StreamedText(const SseBody& sse, int index = 0) {
  std::string text;
  for (const json& e : sse.events) {
    if (!e.is_object() || !e.contains("choices") || !e["choices"].is_array()) continue;
    for (const json& c : e["choices"]) {
      if (c.value("index", -1) != index) continue;
      if (c.contains("delta") && c["delta"].is_object() && c["delta"].contains("content") &&
          c["delta"]["content"].is_string()) {
        text += c["delta"]["content"].get<std::string>();
      } else if (c.contains("text") && c["text"].is_string()) {
        text += c["text"].get<std::string>();
      }
    }
  }
  return text;
}

// Checks OpenAI's error body: {"error": {"message": non-empty string, "type":
// string, "param": string|null, "code": string|number|null}}.
inline ::testing::AssertionResult IsOpenAiError(const json& body) {
  if (!body.is_object() || !body.contains("error") || !body["error"].is_object()) {
    return ::testing::AssertionFailure() << "no \"error\" object in: " << body.dump();
  }
  const json& e = body["error"];
  for (const char* key : {"message", "type", "param", "code"}) {
    if (!e.contains(key)) return ::testing::AssertionFailure() << "error has no \"" << key << "\": " << body.dump();
  }
  if (!e["message"].is_string() || e["message"].get<std::string>().empty()) {
    return ::testing::AssertionFailure() << "error.message is not a non-empty string: " << body.dump();
  }
  if (!e["type"].is_string() || e["type"].get<std::string>().empty()) {
    return ::testing::AssertionFailure() << "error.type is not a non-empty string: " << body.dump();
  }
  if (!e["param"].is_string() && !e["param"].is_null()) {
    return ::testing::AssertionFailure() << "error.param is neither string nor null: " << body.dump();
  }
  if (!e["code"].is_string() && !e["code"].is_null() && !e["code"].is_number()) {
    return ::testing::AssertionFailure() << "error.code is neither string, number nor null: " << body.dump();
  }
  return ::testing::AssertionSuccess();
}

inline std::string Metrics(int port) {
  SimpleHttpResponse r = SimpleHttp(port, "GET", "/metrics", "", {}, 30);
  EXPECT_EQ(r.status, 200) << r.error << r.body;
  return r.body;
}

// Polls /metrics until `done(text)` holds or `timeout_seconds` pass; returns
// the last exposition read. Bounded, so a server that never gets there fails
// the test instead of hanging it.
inline std::string WaitForMetrics(int port, const std::function<bool(const std::string&)>& done,
                                  double timeout_seconds = 60) {
  const auto t0 = std::chrono::steady_clock::now();
  std::string text;
  while (true) {
    text = SimpleHttp(port, "GET", "/metrics", "", {}, 10).body;
    if (done(text)) return text;
    if (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() > timeout_seconds) return text;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
}

inline double Gauge(const std::string& metrics, const std::string& name, const std::string& labels = "") {
  auto v = MetricValue(metrics, name, labels);
  return v ? *v : -1;
}

// SIGTERM; the exit code must be 0 (graceful shutdown).
inline void StopCleanly(ServerProcess* server) {
  if (server == nullptr) return;
  auto code = server->Stop(60);
  ASSERT_TRUE(code) << code.error().ToString();
  EXPECT_EQ(*code, 0) << "exit code after SIGTERM\n--- server stderr (tail) ---\n" << server->stderr_tail();
}

}  // namespace strata::testing
