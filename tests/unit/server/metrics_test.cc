// ServerMetrics: synthetic engine events and an engine snapshot in, the
// Prometheus text exposition out. Checks every required family's values and
// runs Prometheus's own `promtool check metrics` over the text.

#include "server/metrics.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>
#include <string>

#include "tests/support/run_command.h"
#include "tests/support/test_env.h"

namespace strata::server {
namespace {

constexpr int64_t kSec = 1'000'000'000;

// series (name plus labels, as printed) → value.
std::map<std::string, double> Parse(const std::string& text) {
  std::map<std::string, double> out;
  std::istringstream in(text);
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t sp = line.rfind(' ');
    if (sp == std::string::npos) continue;
    out[line.substr(0, sp)] = std::stod(line.substr(sp + 1));
  }
  return out;
}

// Looks up a series; fails the test when absent.
double Get(const std::map<std::string, double>& m, const std::string& series) {
  auto it = m.find(series);
  EXPECT_NE(it, m.end()) << "missing series " << series;
  return it == m.end() ? -1 : it->second;
}

scheduler::RequestOutput Event(uint64_t id, int n_tokens, int32_t prompt, int32_t completion) {
  scheduler::RequestOutput ev;
  ev.id = RequestId(id);
  for (int i = 0; i < n_tokens; ++i) ev.token_ids.push_back(100 + i);
  ev.prompt_tokens = prompt;
  ev.completion_tokens = completion;
  return ev;
}

scheduler::EngineStats Snapshot(uint64_t scale) {
  scheduler::EngineStats s;
  s.num_running = 3;
  s.num_waiting = 2;
  s.preemptions = 1 * scale;
  s.rejected_queue_full = 4 * scale;
  s.device_blocks_in_use = 7;
  using kvcache::TierKind;
  s.tiers = {{"device", TierKind::kDevice, 1000, 250, 0.25},
             {"host", TierKind::kHost, 4000, 1000, 0.25},
             {"disk", TierKind::kDisk, 8000, 6000, 0.75}};
  s.kv.query_tokens = 100 * scale;
  s.kv.device.tokens = 32 * scale;
  s.kv.device_pool.in_use = 7;
  s.kv.device_pool.cached = 5;
  s.kv.device_pool.free = 4;
  s.kv.device_pool.evictions = 9 * scale;
  kvcache::LowerTierStats host;
  host.name = "host";
  host.hits.tokens = 16 * scale;
  host.bytes_down = 4096 * scale;
  host.bytes_up = 2048 * scale;
  host.loads_failed = 0;
  host.load_nanos = static_cast<int64_t>(scale) * kSec / 2;
  host.load_latency[3] = 2 * scale;   // <= 1 ms
  host.load_latency[12] = 1 * scale;  // > 1 s (the open bucket)
  kvcache::LowerTierStats disk;
  disk.name = "disk";
  disk.kind = TierKind::kDisk;
  disk.hits.tokens = 8 * scale;
  disk.bytes_down = 8192 * scale;
  disk.bytes_up = 1024 * scale;
  disk.loads_failed = 2 * scale;
  disk.writes_failed = 1 * scale;
  disk.writes_refused = 3 * scale;
  disk.writebacks = 6 * scale;
  disk.write_latency[0] = 4 * scale;  // <= 100 us
  disk.write_nanos = static_cast<int64_t>(scale) * kSec / 1000;
  disk.corrupt_blocks = 2 * scale;
  disk.writebacks_dropped = 1 * scale;
  s.kv.tiers = {host, disk};
  s.prefetches_started = 5 * scale;
  s.prefetches_used = 3 * scale;
  s.prefetches_released = 1 * scale;
  s.prefetched_blocks = 12 * scale;
  return s;
}

// Feeds two requests: one that streams four tokens in three events and
// stops, one aborted while waiting.
void FeedRequests(ServerMetrics& m) {
  auto e1 = Event(1, 1, 10, 1);
  e1.timings.arrival = 1 * kSec;
  e1.timings.scheduled = 1 * kSec + kSec / 2;
  e1.timings.first_token = 2 * kSec;  // TTFT 1.0 s
  e1.timings.last_token = 2 * kSec;
  m.OnEvent(e1);
  auto e2 = Event(1, 2, 10, 3);
  e2.timings = e1.timings;
  e2.timings.last_token = 2 * kSec + kSec / 5;  // two tokens in 0.2 s: 0.1 s each
  m.OnEvent(e2);
  auto e3 = Event(1, 1, 10, 4);
  e3.timings = e2.timings;
  e3.timings.last_token = 2 * kSec + kSec / 2;  // one token in 0.3 s
  e3.timings.finished = 2 * kSec + kSec / 2;    // e2e 1.5 s
  e3.timings.queue_seconds = 0.5;
  e3.timings.prefill_seconds = 0.5;
  e3.timings.decode_seconds = 0.6;
  e3.finished = true;
  e3.finish_reason = FinishReason::kStop;
  EXPECT_EQ(m.tracked_requests(), 1u);
  m.OnEvent(e3);

  auto a = Event(2, 0, 5, 0);
  a.timings.arrival = 3 * kSec;
  a.timings.finished = 3 * kSec + kSec / 4;
  a.finished = true;
  a.finish_reason = FinishReason::kAbort;
  m.OnEvent(a);
}

TEST(ServerMetricsTest, EventsBecomeHistogramsAndCounters) {
  ServerMetrics metrics("tiny", 2048);
  FeedRequests(metrics);
  EXPECT_EQ(metrics.tracked_requests(), 0u);  // per-request state is dropped at the end
  const auto m = Parse(metrics.Render(scheduler::EngineStats{}));
  const std::string l = "{model_name=\"tiny\"}";

  EXPECT_EQ(Get(m, "strata_time_to_first_token_seconds_count" + l), 1);
  EXPECT_DOUBLE_EQ(Get(m, "strata_time_to_first_token_seconds_sum" + l), 1.0);
  EXPECT_EQ(Get(m, "strata_time_to_first_token_seconds_bucket{model_name=\"tiny\",le=\"0.75\"}"),
            0);
  EXPECT_EQ(Get(m, "strata_time_to_first_token_seconds_bucket{model_name=\"tiny\",le=\"1\"}"), 1);
  EXPECT_EQ(Get(m, "strata_time_to_first_token_seconds_bucket{model_name=\"tiny\",le=\"+Inf\"}"),
            1);

  // Three gaps after the first token: 0.1, 0.1, 0.3.
  EXPECT_EQ(Get(m, "strata_inter_token_latency_seconds_count" + l), 3);
  EXPECT_NEAR(Get(m, "strata_inter_token_latency_seconds_sum" + l), 0.5, 1e-9);
  EXPECT_EQ(Get(m, "strata_inter_token_latency_seconds_bucket{model_name=\"tiny\",le=\"0.1\"}"), 2);
  EXPECT_EQ(Get(m, "strata_inter_token_latency_seconds_bucket{model_name=\"tiny\",le=\"0.3\"}"), 3);
  // Per request: decode 0.6 s over 3 tokens after the first.
  EXPECT_EQ(Get(m, "strata_time_per_output_token_seconds_count" + l), 1);
  EXPECT_NEAR(Get(m, "strata_time_per_output_token_seconds_sum" + l), 0.2, 1e-9);

  // Both requests end; only the one that ran was queued, prefilled, decoded.
  EXPECT_EQ(Get(m, "strata_e2e_request_latency_seconds_count" + l), 2);
  EXPECT_NEAR(Get(m, "strata_e2e_request_latency_seconds_sum" + l), 1.75, 1e-9);
  EXPECT_EQ(Get(m, "strata_request_queue_time_seconds_count" + l), 1);
  EXPECT_DOUBLE_EQ(Get(m, "strata_request_queue_time_seconds_sum" + l), 0.5);
  EXPECT_EQ(Get(m, "strata_request_prefill_time_seconds_count" + l), 1);
  EXPECT_DOUBLE_EQ(Get(m, "strata_request_prefill_time_seconds_sum" + l), 0.5);
  EXPECT_EQ(Get(m, "strata_request_decode_time_seconds_count" + l), 1);
  EXPECT_DOUBLE_EQ(Get(m, "strata_request_decode_time_seconds_sum" + l), 0.6);

  EXPECT_EQ(Get(m, "strata_request_prompt_tokens_count" + l), 2);
  EXPECT_EQ(Get(m, "strata_request_prompt_tokens_sum" + l), 15);
  EXPECT_EQ(Get(m, "strata_request_prompt_tokens_bucket{model_name=\"tiny\",le=\"5\"}"), 1);
  EXPECT_EQ(Get(m, "strata_request_prompt_tokens_bucket{model_name=\"tiny\",le=\"10\"}"), 2);
  // 1-2-5 buckets up to the context length.
  EXPECT_EQ(Get(m, "strata_request_prompt_tokens_bucket{model_name=\"tiny\",le=\"5000\"}"), 2);
  EXPECT_EQ(m.count("strata_request_prompt_tokens_bucket{model_name=\"tiny\",le=\"10000\"}"), 0u);
  EXPECT_EQ(Get(m, "strata_request_generation_tokens_sum" + l), 4);

  EXPECT_EQ(Get(m, "strata_prompt_tokens_total" + l), 15);
  EXPECT_EQ(Get(m, "strata_generation_tokens_total" + l), 4);
  EXPECT_EQ(Get(m, "strata_requests_total{model_name=\"tiny\",finish_reason=\"stop\"}"), 1);
  EXPECT_EQ(Get(m, "strata_requests_total{model_name=\"tiny\",finish_reason=\"abort\"}"), 1);
}

TEST(ServerMetricsTest, HttpErrorsAreCountedByStatusCode) {
  ServerMetrics metrics("tiny", 256);
  for (int status : {200, 400, 400, 429, 404, 200, 503}) metrics.OnHttpResponse(status);
  const auto m = Parse(metrics.Render(scheduler::EngineStats{}));
  EXPECT_EQ(Get(m, "strata_request_errors_total{model_name=\"tiny\",code=\"400\"}"), 2);
  EXPECT_EQ(Get(m, "strata_request_errors_total{model_name=\"tiny\",code=\"429\"}"), 1);
  EXPECT_EQ(Get(m, "strata_request_errors_total{model_name=\"tiny\",code=\"404\"}"), 1);
  EXPECT_EQ(Get(m, "strata_request_errors_total{model_name=\"tiny\",code=\"503\"}"), 1);
  EXPECT_EQ(m.count("strata_request_errors_total{model_name=\"tiny\",code=\"200\"}"), 0u);
}

TEST(ServerMetricsTest, EngineSnapshotSetsGaugesAndGrowsCountersByDelta) {
  ServerMetrics metrics("tiny", 256);
  auto m = Parse(metrics.Render(Snapshot(1)));
  const std::string l = "{model_name=\"tiny\"}";
  // Per-tier series carry the kind (`tier`) and the configured name
  // (`tier_name`; the default names equal the kinds).
  auto tier = [](const std::string& name, const std::string& t) {
    return name + "{model_name=\"tiny\",tier=\"" + t + "\",tier_name=\"" + t + "\"}";
  };
  EXPECT_EQ(Get(m, "strata_num_requests_running" + l), 3);
  EXPECT_EQ(Get(m, "strata_num_requests_waiting" + l), 2);
  EXPECT_EQ(Get(m, "strata_kv_device_blocks_in_use" + l), 7);
  EXPECT_EQ(Get(m, "strata_kv_device_blocks{model_name=\"tiny\",state=\"cached\"}"), 5);
  EXPECT_DOUBLE_EQ(Get(m, tier("strata_kv_cache_usage_ratio", "device")), 0.25);
  EXPECT_DOUBLE_EQ(Get(m, tier("strata_kv_cache_usage_ratio", "disk")), 0.75);
  EXPECT_EQ(Get(m, tier("strata_kv_cache_used_bytes", "host")), 1000);
  EXPECT_EQ(Get(m, tier("strata_kv_cache_capacity_bytes", "disk")), 8000);
  EXPECT_EQ(Get(m, "strata_prefix_cache_queries_total" + l), 100);
  EXPECT_EQ(Get(m, tier("strata_prefix_cache_hits_total", "device")), 32);
  EXPECT_EQ(Get(m, tier("strata_prefix_cache_hits_total", "host")), 16);
  EXPECT_EQ(Get(m, tier("strata_prefix_cache_hits_total", "disk")), 8);
  EXPECT_EQ(Get(m, "strata_num_preemptions_total" + l), 1);
  EXPECT_EQ(Get(m, "strata_requests_rejected_total" + l), 4);
  EXPECT_EQ(Get(m, "strata_kv_device_evictions_total" + l), 9);
  EXPECT_EQ(Get(m, tier("strata_kv_tier_bytes_written_total", "host")), 4096);
  EXPECT_EQ(Get(m, tier("strata_kv_tier_bytes_read_total", "disk")), 1024);
  EXPECT_EQ(Get(m, tier("strata_kv_tier_load_failures_total", "disk")), 2);
  EXPECT_EQ(Get(m, tier("strata_kv_tier_write_failures_total", "disk")), 1);
  EXPECT_EQ(Get(m, tier("strata_kv_tier_writes_refused_total", "disk")), 3);
  EXPECT_DOUBLE_EQ(Get(m, tier("strata_kv_tier_load_seconds_total", "host")), 0.5);
  EXPECT_EQ(Get(m, tier("strata_kv_tier_writebacks_total", "disk")), 6);
  EXPECT_EQ(Get(m, tier("strata_kv_tier_writebacks_dropped_total", "disk")), 1);
  EXPECT_EQ(Get(m, tier("strata_kv_tier_writebacks_total", "host")), 0);
  EXPECT_EQ(Get(m, "strata_kv_prefetches_total{model_name=\"tiny\",outcome=\"started\"}"), 5);
  EXPECT_EQ(Get(m, "strata_kv_prefetches_total{model_name=\"tiny\",outcome=\"used\"}"), 3);
  EXPECT_EQ(Get(m, "strata_kv_prefetches_total{model_name=\"tiny\",outcome=\"released\"}"), 1);
  EXPECT_EQ(Get(m, "strata_kv_prefetched_blocks_total" + l), 12);
  EXPECT_EQ(Get(m, tier("strata_kv_tier_corrupt_blocks_total", "disk")), 2);
  EXPECT_EQ(Get(m, tier("strata_kv_tier_load_latency_seconds_count", "host")), 3);
  EXPECT_DOUBLE_EQ(Get(m, tier("strata_kv_tier_load_latency_seconds_sum", "host")), 0.5);
  const std::string hb =
      "strata_kv_tier_load_latency_seconds_bucket{model_name=\"tiny\",tier=\"host\",tier_name=\"host\",le=";
  EXPECT_EQ(Get(m, hb + "\"0.0005\"}"), 0);
  EXPECT_EQ(Get(m, hb + "\"0.001\"}"), 2);
  EXPECT_EQ(Get(m, hb + "\"1\"}"), 2);
  EXPECT_EQ(Get(m, hb + "\"+Inf\"}"), 3);
  EXPECT_EQ(Get(m, tier("strata_kv_tier_store_latency_seconds_count", "disk")), 4);
  EXPECT_DOUBLE_EQ(Get(m, tier("strata_kv_tier_store_latency_seconds_sum", "disk")), 0.001);

  // Scraping again with the same figures changes nothing; tripled figures
  // add the difference (a counter never double counts).
  m = Parse(metrics.Render(Snapshot(1)));
  EXPECT_EQ(Get(m, "strata_prefix_cache_queries_total" + l), 100);
  m = Parse(metrics.Render(Snapshot(3)));
  EXPECT_EQ(Get(m, "strata_prefix_cache_queries_total" + l), 300);
  EXPECT_EQ(Get(m, tier("strata_prefix_cache_hits_total", "host")), 48);
  EXPECT_EQ(Get(m, tier("strata_kv_tier_bytes_written_total", "disk")), 3 * 8192);
  EXPECT_EQ(Get(m, tier("strata_kv_tier_load_latency_seconds_count", "host")), 9);  // histograms grow by delta too
  EXPECT_DOUBLE_EQ(Get(m, tier("strata_kv_tier_load_latency_seconds_sum", "host")), 1.5);
  // A figure that went down (the engine restarted) counts from zero again:
  // the counter still only grows.
  m = Parse(metrics.Render(Snapshot(1)));
  EXPECT_EQ(Get(m, "strata_prefix_cache_queries_total" + l), 400);
}

TEST(ServerMetricsTest, PromtoolAcceptsTheExposition) {
  ServerMetrics metrics("stories260K", 512);
  FeedRequests(metrics);
  metrics.OnHttpResponse(400);
  metrics.Render(Snapshot(1));
  const std::string text = metrics.Render(Snapshot(2));
  ASSERT_NE(text.find("# TYPE strata_time_to_first_token_seconds histogram"), std::string::npos);
  ASSERT_NE(text.find("# TYPE strata_prompt_tokens_total counter"), std::string::npos);
  ASSERT_NE(text.find("# TYPE strata_kv_cache_usage_ratio gauge"), std::string::npos);

  const testing::CommandResult which = testing::RunCommand("command -v promtool");
  if (which.exit_code != 0) {
    const char* require = std::getenv("STRATA_REQUIRE_REFS");
    if (require != nullptr && std::string(require) == "1")
      FAIL() << "promtool not found (Debian package `prometheus`) and STRATA_REQUIRE_REFS=1";
    GTEST_SKIP() << "promtool not found: install Debian's `prometheus` package";
  }
  const std::string dir = testing::MakeTempDir("strata-metrics");
  const std::string path = dir + "/metrics.txt";
  {
    std::ofstream f(path, std::ios::binary);
    f << text;
  }
  const testing::CommandResult r =
      testing::RunCommand("promtool check metrics < " + testing::ShellQuote(path));
  EXPECT_EQ(r.exit_code, 0) << "stdout:\n"
                            << r.out << "\nstderr:\n"
                            << r.err << "\nexposition:\n"
                            << text;
  // promtool prints lint findings (names, units, help) even when it exits 0
  // for some kinds; there must be none.
  EXPECT_EQ(r.out, "") << r.out;
  EXPECT_EQ(r.err, "") << r.err;
}

}  // namespace
}  // namespace strata::server
