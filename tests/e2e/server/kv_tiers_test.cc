// `strata serve` with the lower tiers listed in `kv.tiers` under names of
// the operator's choosing: the admin stats list them by name, kind and
// capacity; a prefix that only the disk tier still holds is served from it
// and reported under the disk kind in usage.cached_tokens_by_tier and the
// metrics' `tier` label (with the configured name in `tier_name`); a list
// given together with a shorthand flag, and a list entry of an unknown kind,
// stop the server at start with errors naming them.

#include <gtest/gtest.h>

#include <fstream>

#include "tests/e2e/server/serve_test_util.h"
#include "tests/support/run_command.h"
#include "tests/support/test_env.h"

namespace strata::testing {
namespace {

constexpr const char* kToken = "tiers-token";

std::string WriteYaml(const std::string& dir, const std::string& text) {
  const std::string path = dir + "/strata.yaml";
  std::ofstream(path) << text;
  return path;
}

// Blocks of 64 f32 tokens: >= 4 KiB on the tiny model (the disk tier's
// O_DIRECT unit). The load policy is pinned: the test asserts the disk path.
std::string TiersYaml(const std::string& disk_dir) {
  return "kv:\n  block_size: 64\n  dtype: f32\n  load_policy: always\n  tiers:\n"
         "    - {kind: host, name: ram, bytes: 16M, write_policy: write-through}\n"
         "    - {kind: disk, name: ssd, path: \"" + disk_dir + "\", bytes: 64M}\n";
}

std::vector<std::string> Admin() { return {"Authorization: Bearer " + std::string(kToken)}; }

TEST(KvTiers, ListedTiersAreNamedInStatsAndReportedByKind) {
  const std::string dir = MakeTempDir("kv-tiers");
  const std::string yaml = WriteYaml(dir, TiersYaml(dir + "/ssd"));
  auto server = StartTinyServer({"--config", yaml, "--admin-token", kToken});
  ASSERT_NE(server, nullptr);
  const int port = server->http_port();

  auto stats = SimpleHttp(port, "GET", "/admin/cache/stats", "", Admin());
  ASSERT_EQ(stats.status, 200) << stats.body;
  json s = json::parse(stats.body);
  ASSERT_EQ(s["tiers"].size(), 3u) << stats.body;
  EXPECT_EQ(s["tiers"][0]["name"], "device");
  EXPECT_EQ(s["tiers"][0]["kind"], "device");
  EXPECT_EQ(s["tiers"][1]["name"], "ram");
  EXPECT_EQ(s["tiers"][1]["kind"], "host");
  EXPECT_EQ(s["tiers"][1]["capacity_bytes"], 16 << 20);
  EXPECT_EQ(s["tiers"][2]["name"], "ssd");
  EXPECT_EQ(s["tiers"][2]["kind"], "disk");
  EXPECT_GT(s["tiers"][2]["capacity_bytes"].get<uint64_t>(), 0u);

  json req = {{"model", "tiny"}, {"prompt", std::string(300, 'a')}, {"max_tokens", 2}, {"temperature", 0}};
  JsonResponse first = PostJson(port, "/v1/completions", req);
  ASSERT_EQ(first.status, 200) << first.raw;
  const int prompt_tokens = first.body["usage"]["prompt_tokens"];
  ASSERT_GT(prompt_tokens, 128) << "the prompt should span several blocks";
  const int whole_blocks = (prompt_tokens - 1) / 64 * 64;
  // The disk writes are asynchronous (the host tier's finish at once): wait
  // until the disk tier holds as many bytes as the host tier, then keep only
  // the disk tier's copy.
  WaitForMetrics(
      port,
      [&](const std::string& m) {
        const double ram = MetricValue(m, "strata_kv_tier_bytes_written_total", R"(tier_name="ram")").value_or(0);
        return ram > 0 && MetricValue(m, "strata_kv_tier_bytes_written_total", R"(tier_name="ssd")").value_or(0) >= ram;
      },
      60);
  JsonResponse flushed = PostJson(port, "/admin/cache/flush", json{{"tiers", {"device", "ram"}}}, Admin());
  ASSERT_EQ(flushed.status, 200) << flushed.raw;
  EXPECT_TRUE(flushed.body["flushed_blocks"].contains("ram")) << flushed.raw;

  JsonResponse second = PostJson(port, "/v1/completions", req);
  ASSERT_EQ(second.status, 200) << second.raw;
  const json& d = second.body["usage"]["prompt_tokens_details"];
  EXPECT_EQ(d["cached_tokens"], whole_blocks) << second.raw;
  EXPECT_EQ(d["cached_tokens_by_tier"]["disk"], whole_blocks) << second.raw;
  EXPECT_EQ(d["cached_tokens_by_tier"]["host"], 0) << second.raw;
  EXPECT_EQ(d["cached_tokens_by_tier"]["device"], 0) << second.raw;
  EXPECT_EQ(second.body["choices"][0]["text"], first.body["choices"][0]["text"]);

  const std::string m = Metrics(port);
  EXPECT_EQ(MetricValue(m, "strata_prefix_cache_hits_total", R"(tier="disk",tier_name="ssd")"), whole_blocks) << m;
  EXPECT_EQ(MetricValue(m, "strata_kv_cache_capacity_bytes", R"(tier="host",tier_name="ram")"), 16 << 20);
  // Every device block is back in the pool once the tier writes the second
  // request caused (its promotion to "ram" holds its blocks until the
  // engine polls the completion, within 10 ms when idle) are settled.
  WaitForMetrics(
      port, [](const std::string& mm) { return MetricValue(mm, "strata_kv_device_blocks_in_use") == 0; }, 30);
  EXPECT_EQ(MetricValue(Metrics(port), "strata_kv_device_blocks_in_use"), 0);
  StopCleanly(server.get());
}

// The default host tier of a lone instance is exclusive: nothing goes down
// when a prompt is computed; what the device evicts goes down; a hit loads
// it back and the tier drops its copy; the answer is the computed one.
TEST(KvTiers, TheDefaultHostTierHoldsWhatTheDeviceEvictedOnly) {
  // 128 KiB of device: 32 blocks of 16 tokens (one 512-token context).
  auto server = StartTinyServer({"--kv-block-size", "16", "--kv-device-bytes", "128K", "--kv-host-bytes", "4M",
                                 "--kv-load-policy", "always", "--admin-token", kToken});
  ASSERT_NE(server, nullptr);
  const int port = server->http_port();
  auto prompt = [](int first, int n) {
    json ids = json::array();
    for (int i = 0; i < n; ++i) ids.push_back(3 + (first + i * 7) % 500);
    return ids;
  };
  auto complete = [&](const json& ids) {
    JsonResponse r = PostJson(port, "/v1/completions",
                              json{{"model", "tiny"}, {"prompt", ids}, {"max_tokens", 3}, {"temperature", 0}});
    EXPECT_EQ(r.status, 200) << r.raw;
    return r;
  };
  auto host_written = [&] {
    return MetricValue(Metrics(port), "strata_kv_tier_bytes_written_total", R"(tier="host")").value_or(0);
  };
  const json a = prompt(1, 100);  // 6 full blocks
  JsonResponse first = complete(a);
  EXPECT_EQ(host_written(), 0) << "nothing goes down on commit";
  for (int i = 0; i < 4; ++i) complete(prompt(100 + i, 300));  // 19 blocks each: evicts a
  EXPECT_GT(host_written(), 0) << "the device's evictions went down";

  JsonResponse again = complete(a);
  const json& d = again.body["usage"]["prompt_tokens_details"];
  EXPECT_EQ(d["cached_tokens"], 96) << again.raw;
  EXPECT_EQ(d["cached_tokens_by_tier"]["host"], 96) << again.raw;
  EXPECT_EQ(again.body["choices"][0]["text"], first.body["choices"][0]["text"]);
  const std::string m = Metrics(port);
  EXPECT_EQ(MetricValue(m, "strata_kv_tier_promotions_total", R"(tier="host")"), 6) << m;
  // The device evicted to make room for the loads: those write-backs waited
  // for the promotions, so the host tier lost nothing to them.
  EXPECT_GT(MetricValue(m, "strata_kv_tier_writebacks_deferred_total", R"(tier="host")").value_or(0), 0) << m;
  EXPECT_EQ(MetricValue(m, "strata_kv_tier_writebacks_dropped_total", R"(tier="host")").value_or(0), 0) << m;
  const std::string end = WaitForMetrics(
      port, [](const std::string& mm) { return MetricValue(mm, "strata_kv_device_blocks_in_use") == 0; }, 30);
  EXPECT_EQ(MetricValue(end, "strata_kv_device_blocks_in_use"), 0) << "the device pool is back to empty";
  StopCleanly(server.get());
}

TEST(KvTiers, ListAndShorthandTogetherOrAnUnknownKindStopTheStart) {
  const std::string dir = MakeTempDir("kv-tiers-bad");
  auto model = TinyModelPath();
  ASSERT_TRUE(model) << model.error().ToString();
  const std::string serve = StrataCli() + " serve --model " + ShellQuote(*model) + " --port 0 --grpc-port -1";

  const std::string yaml = WriteYaml(dir, TiersYaml(dir + "/ssd"));
  CommandResult both = RunCommand(serve + " --config " + ShellQuote(yaml) + " --kv-host-bytes 1M");
  EXPECT_EQ(both.exit_code, 2) << both.err;
  EXPECT_NE(both.err.find("kv.tiers"), std::string::npos) << both.err;
  EXPECT_NE(both.err.find("--kv-host-bytes"), std::string::npos) << both.err;

  const std::string bad = WriteYaml(dir, "kv:\n  tiers:\n    - {kind: nvme, bytes: 1G}\n");
  CommandResult unknown = RunCommand(serve + " --config " + ShellQuote(bad));
  EXPECT_EQ(unknown.exit_code, 2) << unknown.err;
  EXPECT_NE(unknown.err.find("kv.tiers[0]"), std::string::npos) << unknown.err;
  EXPECT_NE(unknown.err.find("unknown tier kind 'nvme'"), std::string::npos) << unknown.err;
}

}  // namespace
}  // namespace strata::testing
