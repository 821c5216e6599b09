// `strata serve` as a process: graceful shutdown lets an in-flight stream
// finish, a zero grace period cancels it cleanly; the config file's server.*
// and engine.* keys apply and a misspelt key is refused by name; a taken
// port is a clear error; the disk KV tier carries a prefix across a restart
// of the server (cached_tokens_by_tier.disk on the second run), also the
// hottest prompt a full disk had given up to the tiers above (written down
// at the stop: kv.stop_write_down_seconds).

#include <gtest/gtest.h>

#include <fstream>
#include <thread>

#include "tests/e2e/server/serve_test_util.h"
#include "tests/support/run_command.h"
#include "tests/support/test_env.h"

namespace strata::testing {
namespace {

// A model slow enough (bench-110m shapes, q8_0, one thread: tens of ms per
// token) that a request of a few hundred tokens is surely still running
// when the test signals the server. Written once per test process.
const std::string& MediumModel() {
  static const std::string path = [] {
    const std::string p = MakeTempDir("serve-medium") + "/medium.gguf";
    CommandResult r = RunCommand(StrataCli() + " model synth --preset bench-110m --dtype q8_0 --out " + ShellQuote(p));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return p;
  }();
  return path;
}

std::unique_ptr<ServerProcess> StartMediumServer(std::vector<std::string> extra) {
  std::vector<std::string> args = {"--model", MediumModel(), "--threads", "1"};
  args.insert(args.end(), extra.begin(), extra.end());
  auto server = ServerProcess::Start(args);
  EXPECT_TRUE(server) << server.error().ToString();
  return server ? std::move(*server) : nullptr;
}

json Completion(int max_tokens, bool stream) {
  return json{{"model", "medium"},
              {"prompt", "The quick brown fox jumps over the lazy dog and keeps running far away"},
              {"max_tokens", max_tokens},
              {"temperature", 0},
              {"ignore_eos", true},
              {"stream", stream}};
}

TEST(ServeLifecycle, SigtermLetsInFlightStreamFinish) {
  auto server = StartMediumServer({"--shutdown-grace-seconds", "120"});
  ASSERT_NE(server, nullptr);
  const int port = server->http_port();
  SimpleHttpResponse streamed;
  std::thread client([&] { streamed = SimpleHttp(port, "POST", "/v1/completions", Completion(40, true).dump(), {}, 300); });
  // Wait until the request runs, then ask the server to stop.
  WaitForMetrics(port, [](const std::string& m) { return Gauge(m, "strata_num_requests_running") >= 1; }, 60);
  ASSERT_EQ(kill(server->pid(), SIGTERM), 0);
  client.join();
  EXPECT_EQ(streamed.status, 200) << streamed.error;
  SseBody sse = ParseSse(streamed.body);
  EXPECT_TRUE(sse.done_last) << streamed.body.substr(0, 400);
  ASSERT_FALSE(sse.events.empty());
  // The last choice chunk says "length": the request ran to max_tokens.
  std::string reason;
  for (const json& e : sse.events)
    if (e.is_object() && e.contains("choices"))
      for (const json& c : e["choices"])
        if (c.contains("finish_reason") && c["finish_reason"].is_string()) reason = c["finish_reason"];
  EXPECT_EQ(reason, "length");
  auto code = server->Stop(60);
  ASSERT_TRUE(code) << code.error().ToString();
  EXPECT_EQ(*code, 0) << server->stderr_tail();
}

TEST(ServeLifecycle, ZeroGraceCancelsInFlightAndExitsZero) {
  auto server = StartMediumServer({"--shutdown-grace-seconds", "0"});
  ASSERT_NE(server, nullptr);
  const int port = server->http_port();
  SimpleHttpResponse streamed;
  std::thread client([&] { streamed = SimpleHttp(port, "POST", "/v1/completions", Completion(400, true).dump(), {}, 300); });
  WaitForMetrics(port, [](const std::string& m) { return Gauge(m, "strata_num_requests_running") >= 1; }, 60);
  auto code = server->Stop(60);
  client.join();
  ASSERT_TRUE(code) << code.error().ToString();
  EXPECT_EQ(*code, 0) << server->stderr_tail();
  // The stream ended in order: the request was cancelled ("abort" or an
  // error chunk), not run to its 400 tokens, and [DONE] came last.
  EXPECT_NE(server->stderr_text().find("SIGTERM"), std::string::npos);
  SseBody sse = ParseSse(streamed.body);
  EXPECT_TRUE(sse.done_last) << streamed.error << streamed.body.substr(0, 400);
  EXPECT_LT(StreamedText(sse).size(), 400u * 8);
  bool length = false;
  for (const json& e : sse.events)
    if (e.is_object() && e.contains("choices"))
      for (const json& c : e["choices"]) length |= c.value("finish_reason", json()) == "length";
  EXPECT_FALSE(length) << "the request ran to completion despite a zero grace period";
}

TEST(ServeLifecycle, ConfigFileKeysApplyAndTyposAreRefused) {
  const std::string dir = MakeTempDir("serve-config");
  const std::string good = dir + "/good.yaml";
  {
    std::ofstream f(good);
    f << "engine:\n  max_num_seqs: 3\n  max_waiting: 7\nserver:\n  served_model_name: from-yaml\n  max_n: 2\n";
  }
  auto server = StartTinyServer({"--config", good});
  ASSERT_NE(server, nullptr);
  JsonResponse models = PostJson(server->http_port(), "/v1/completions",
                                 json{{"model", "from-yaml"}, {"prompt", "hi"}, {"max_tokens", 2}, {"n", 3}});
  // n = 3 exceeds server.max_n = 2: a 400 naming n, against the YAML's model name.
  EXPECT_EQ(models.status, 400) << models.raw;
  EXPECT_EQ(models.body["error"]["param"], "n") << models.raw;
  JsonResponse ok = PostJson(server->http_port(), "/v1/completions",
                             json{{"model", "from-yaml"}, {"prompt", "hi"}, {"max_tokens", 2}, {"n", 2}});
  EXPECT_EQ(ok.status, 200) << ok.raw;
  StopCleanly(server.get());

  const std::string bad = dir + "/bad.yaml";
  {
    std::ofstream f(bad);
    f << "server:\n  prot: 9000\n";
  }
  auto model = TinyModelPath();
  ASSERT_TRUE(model) << model.error().ToString();
  CommandResult r = RunCommand(StrataCli() + " serve --model " + ShellQuote(*model) + " --config " + ShellQuote(bad) +
                               " --port 0 --grpc-port -1");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("server.prot"), std::string::npos) << r.err;
}

TEST(ServeLifecycle, TakenPortIsAClearError) {
  auto server = StartTinyServer({});
  ASSERT_NE(server, nullptr);
  auto model = TinyModelPath();
  ASSERT_TRUE(model) << model.error().ToString();
  CommandResult r = RunCommand(StrataCli() + " serve --model " + ShellQuote(*model) + " --port " +
                               std::to_string(server->http_port()) + " --grpc-port -1");
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find(std::to_string(server->http_port())), std::string::npos) << r.err;
  StopCleanly(server.get());
}

TEST(ServeLifecycle, DiskTierServesPrefixAfterRestart) {
  const std::string disk = MakeTempDir("serve-disk");
  // Blocks of 64 tokens so one block is >= 4 KiB on the tiny model (the
  // disk tier's O_DIRECT unit). The load policy is pinned: this test asserts
  // the disk path, and `auto` may rightly prefer recomputing a model this
  // small, depending on the machine's load at start (KvLoadPolicy tests
  // cover that decision with fixed rates).
  const std::vector<std::string> flags = {"--kv-block-size", "64",   "--kv-dtype",       "f32",
                                          "--kv-disk-path",  disk,   "--kv-disk-bytes",  "64M",
                                          "--kv-load-policy", "always"};
  json req = {{"model", "tiny"}, {"prompt", std::string(300, 'a')}, {"max_tokens", 2}, {"temperature", 0}};
  int prompt_tokens = 0;
  {
    auto server = StartTinyServer(flags);
    ASSERT_NE(server, nullptr);
    JsonResponse first = PostJson(server->http_port(), "/v1/completions", req);
    ASSERT_EQ(first.status, 200) << first.raw;
    prompt_tokens = first.body["usage"]["prompt_tokens"];
    EXPECT_EQ(first.body["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
    StopCleanly(server.get());  // drains the disk tier's writes
  }
  ASSERT_GT(prompt_tokens, 128) << "the prompt should span several blocks";
  auto server = StartTinyServer(flags);
  ASSERT_NE(server, nullptr);
  JsonResponse second = PostJson(server->http_port(), "/v1/completions", req);
  ASSERT_EQ(second.status, 200) << second.raw;
  const json& details = second.body["usage"]["prompt_tokens_details"];
  const int whole_blocks = (prompt_tokens - 1) / 64 * 64;
  EXPECT_EQ(details["cached_tokens"], whole_blocks) << second.raw;
  EXPECT_EQ(details["cached_tokens_by_tier"]["disk"], whole_blocks) << second.raw;
  EXPECT_EQ(details["cached_tokens_by_tier"]["device"], 0) << second.raw;
  StopCleanly(server.get());
}

// Every request done: no device block is still referenced.
void ExpectDevicePoolEmpty(int port) {
  const std::string m = WaitForMetrics(
      port, [](const std::string& t) { return Gauge(t, "strata_kv_device_blocks_in_use") == 0; }, 30);
  EXPECT_EQ(Gauge(m, "strata_kv_device_blocks_in_use"), 0) << m;
}

// A full disk under the one policy holds what the device and host tiers do
// not; the hot prompt lives there, so without the write-down at the stop a
// restart recomputes it, and with it (the default) the disk serves it.
TEST(ServeLifecycle, StopWritesTheHotPrefixDownToAFullDisk) {
  auto prompt = [](char c) {
    return json{{"model", "tiny"}, {"prompt", std::string(300, c)}, {"max_tokens", 2}, {"temperature", 0}};
  };
  // 32 KiB blocks of 64 tokens: device 16 blocks, host 8, disk 16.
  auto run = [&](const std::string& write_down_seconds) -> json {
    const std::string disk = MakeTempDir("serve-write-down");
    const std::vector<std::string> flags = {
        "--kv-block-size",  "64",   "--kv-dtype",      "f32",  "--kv-device-bytes", "512K", "--kv-host-bytes",
        "256K",             "--kv-disk-path", disk,    "--kv-disk-bytes", "512K", "--kv-load-policy", "always",
        "--kv-stop-write-down-seconds", write_down_seconds};
    {
      auto server = StartTinyServer(flags);
      if (server == nullptr) return json();
      // The hot prompt between every other one: it stays on the device, and
      // its disk copy, the oldest, is the first the full disk gives up.
      for (char c : std::string("bcdefgh")) {
        JsonResponse hot = PostJson(server->http_port(), "/v1/completions", prompt('a'));
        EXPECT_EQ(hot.status, 200) << hot.raw;
        JsonResponse r = PostJson(server->http_port(), "/v1/completions", prompt(c));
        EXPECT_EQ(r.status, 200) << r.raw;
      }
      JsonResponse hot = PostJson(server->http_port(), "/v1/completions", prompt('a'));
      EXPECT_EQ(hot.status, 200) << hot.raw;
      EXPECT_GT(hot.body["usage"]["prompt_tokens_details"]["cached_tokens_by_tier"]["device"], 0) << hot.raw;
      ExpectDevicePoolEmpty(server->http_port());
      StopCleanly(server.get());
    }
    auto server = StartTinyServer(flags);
    if (server == nullptr) return json();
    JsonResponse again = PostJson(server->http_port(), "/v1/completions", prompt('a'));
    EXPECT_EQ(again.status, 200) << again.raw;
    ExpectDevicePoolEmpty(server->http_port());
    StopCleanly(server.get());
    return again.body["usage"];
  };
  const json off = run("0");
  const json on = run("30");
  ASSERT_TRUE(off.is_object() && on.is_object());
  const int whole_blocks = (off["prompt_tokens"].get<int>() - 1) / 64 * 64;
  ASSERT_GE(whole_blocks, 256);
  EXPECT_LT(off["prompt_tokens_details"]["cached_tokens"].get<int>(), whole_blocks)
      << "without the write-down the full disk lacks the hot prompt: " << off.dump();
  EXPECT_EQ(on["prompt_tokens_details"]["cached_tokens"], whole_blocks) << on.dump();
  EXPECT_EQ(on["prompt_tokens_details"]["cached_tokens_by_tier"]["disk"], whole_blocks) << on.dump();
}

}  // namespace
}  // namespace strata::testing
