// `strata cache stats|lookup|flush` and GET /metrics against a real
// `strata serve` (the tiny synthetic model, a device pool and a host tier,
// an admin token): what the CLI reports matches what requests did, flushing
// moves the prefix down or away, the admin token is enforced, each tier's
// eviction policy (s3fifo here) reports its decisions, and Prometheus's
// promtool accepts the live exposition.

#include <cstdlib>
#include <fstream>
#include <string>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "tests/support/run_command.h"
#include "tests/support/server_process.h"
#include "tests/support/test_env.h"

namespace strata::testing {
namespace {

using nlohmann::json;

constexpr const char* kToken = "op-token";
const std::string kPrompt = "the quick brown fox jumps over the lazy dog and the cat";

class AdminCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto model = TinyModelPath();
    ASSERT_TRUE(model.ok()) << model.error().ToString();
    // Write-through: the host tier holds the prompt's blocks as computed.
    auto s = ServerProcess::Start({"--model", *model, "--admin-token", kToken, "--kv-block-size", "4",
                                   "--kv-host-bytes", "16M", "--kv-host-write-policy", "write-through",
                                   "--kv-load-policy", "always", "--kv-eviction-policy", "s3fifo",
                                   "--threads", "1"});
    ASSERT_TRUE(s.ok()) << s.error().ToString();
    server_ = std::move(s).value();
  }

  // Runs `strata cache <args> --url ...`; with `json_out`, parses stdout.
  CommandResult Cache(const std::string& args, json* json_out = nullptr,
                      const std::string& token = kToken) {
    std::string cmd = ShellQuote(StrataCli()) + " cache " + args + " --url " + server_->base_url();
    if (!token.empty()) cmd += " --admin-token " + ShellQuote(token);
    CommandResult r = RunCommand("env -u STRATA_ADMIN_TOKEN " + cmd);
    if (json_out != nullptr) {
      *json_out = json::parse(r.out, nullptr, false);
      EXPECT_TRUE(json_out->is_object()) << cmd << "\nstdout: " << r.out << "\nstderr: " << r.err;
    }
    return r;
  }

  int Complete(const std::string& prompt) {
    json body = {{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 4}, {"temperature", 0}};
    auto r = SimpleHttp(server_->http_port(), "POST", "/v1/completions", body.dump(),
                        {"Content-Type: application/json"});
    EXPECT_EQ(r.status, 200) << r.body;
    json j = json::parse(r.body, nullptr, false);
    return j.is_object() ? j["usage"]["prompt_tokens"].get<int>() : 0;
  }

  std::unique_ptr<ServerProcess> server_;
};

TEST_F(AdminCliTest, StatsLookupFlushAndMetrics) {
  const int n = Complete(kPrompt);
  ASSERT_GT(n, 8);
  Complete(kPrompt);
  const int cached = (n - 1) / 4 * 4;

  json j;
  CommandResult r = Cache("stats --json", &j);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(j["model"], "tiny");
  EXPECT_EQ(j["prefix_cache"]["queries"], 2);
  EXPECT_EQ(j["prefix_cache"]["hit_tokens"], cached);
  EXPECT_EQ(j["device_blocks"]["in_use"], 0);
  ASSERT_EQ(j["tiers"].size(), 2u);
  EXPECT_EQ(j["tiers"][1]["name"], "host");
  EXPECT_GT(j["tiers"][1]["bytes_written"].get<double>(), 0);
  // The policies' decisions: the device pool stored the prompt's blocks and
  // the second request hit them; the host tier stored what was written down.
  const json& dp = j["tiers"][0]["eviction_policy"];
  EXPECT_EQ(dp["name"], "s3fifo");
  EXPECT_GE(dp["inserted"].get<int>(), cached / 4);
  // The second request's hits, and its recomputed copies of held blocks
  // (the last prompt block when n is a multiple of 4, the same generated
  // tokens) count as uses too.
  EXPECT_GE(dp["hits"].get<int>(), cached / 4);
  EXPECT_EQ(dp["evicted"].get<int>(), 0);
  const json& hp = j["tiers"][1]["eviction_policy"];
  EXPECT_EQ(hp["name"], "s3fifo");
  EXPECT_GE(hp["inserted"].get<int>(), cached / 4);
  r = Cache("stats");  // the table
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("host"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("s3fifo"), std::string::npos) << r.out;

  r = Cache("lookup --json --prompt " + ShellQuote(kPrompt), &j);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(j["prompt_tokens"], n);
  EXPECT_EQ(j["cached_tokens"], cached);
  EXPECT_EQ(j["by_tier"]["device"], cached);
  r = Cache("lookup --json --cache-salt other --prompt " + ShellQuote(kPrompt), &j);
  EXPECT_EQ(j["cached_tokens"], 0);

  // The token is enforced: no token, wrong token.
  r = Cache("stats", nullptr, "");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("401"), std::string::npos) << r.err;
  r = Cache("flush", nullptr, "nope");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("401"), std::string::npos) << r.err;

  // Device flushed: the prefix now comes from host.
  r = Cache("flush --json --tier device", &j);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_GE(j["flushed_blocks"]["device"].get<int>(), cached / 4);
  r = Cache("lookup --json --prompt " + ShellQuote(kPrompt), &j);
  EXPECT_EQ(j["by_tier"]["device"], 0);
  EXPECT_EQ(j["by_tier"]["host"], cached);
  // A request now loads it from host.
  Complete(kPrompt);
  // Everything flushed: nothing hits.
  r = Cache("flush --json", &j);
  ASSERT_EQ(r.exit_code, 0) << r.err;
  r = Cache("lookup --json --prompt " + ShellQuote(kPrompt), &j);
  EXPECT_EQ(j["cached_tokens"], 0);
  r = Cache("flush --tier gpu");
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("unknown tier"), std::string::npos) << r.err;

  auto m = SimpleHttp(server_->http_port(), "GET", "/metrics");
  ASSERT_EQ(m.status, 200);
  EXPECT_NE(m.header("content-type").find("text/plain"), std::string::npos);
  EXPECT_EQ(MetricValue(m.body, "strata_requests_total", R"(finish_reason="length")"), 3);
  EXPECT_EQ(MetricValue(m.body, "strata_prefix_cache_hits_total", R"(tier="device")"), cached);
  EXPECT_EQ(MetricValue(m.body, "strata_prefix_cache_hits_total", R"(tier="host")"), cached);
  EXPECT_GE(MetricValue(m.body, "strata_request_errors_total", R"(code="401")").value_or(0), 2);
  EXPECT_EQ(MetricValue(m.body, "strata_num_requests_running"), 0);
  EXPECT_EQ(MetricValue(m.body, "strata_kv_device_blocks_in_use"), 0);
  EXPECT_GE(MetricValue(m.body, "strata_kv_policy_decisions_total",
                        R"(tier="device",policy="s3fifo",decision="inserted")").value_or(0),
            cached / 4);
  EXPECT_GE(MetricValue(m.body, "strata_kv_policy_decisions_total",
                        R"(tier="device",policy="s3fifo",decision="removed")").value_or(0),
            cached / 4)
      << "the flushes removed the device blocks";
  EXPECT_GE(MetricValue(m.body, "strata_kv_policy_decisions_total",
                        R"(tier="host",policy="s3fifo",decision="hit")").value_or(0),
            cached / 4)
      << "the load from host counts as a hit";

  if (RunCommand("command -v promtool").exit_code != 0) {
    const char* require = std::getenv("STRATA_REQUIRE_REFS");
    if (require != nullptr && std::string(require) == "1") FAIL() << "promtool not found";
    GTEST_SKIP() << "promtool not found: install Debian's `prometheus` package";
  }
  const std::string path = MakeTempDir("strata-admin-cli") + "/metrics.txt";
  std::ofstream(path, std::ios::binary) << m.body;
  CommandResult p = RunCommand("promtool check metrics < " + ShellQuote(path));
  EXPECT_EQ(p.exit_code, 0) << p.out << p.err;
  EXPECT_EQ(p.out + p.err, "");
}

}  // namespace
}  // namespace strata::testing
