// Report arithmetic of `strata bench run` on known inputs: percentiles by
// linear interpolation between closest ranks, TTFT/TPOT/ITL/E2E, goodput under
// SLOs, hit ratios from responses and /metrics, errors by code; the JSON file
// reads back to the same records and summary; compare prints ratios.

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include <nlohmann/json.hpp>

#include "bench/compare.h"
#include "bench/load_driver.h"
#include "bench/report.h"

namespace strata::bench {
namespace {

TEST(ReportTest, PercentileInterpolatesBetweenClosestRanks) {
  const std::vector<double> v = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  EXPECT_DOUBLE_EQ(Percentile(v, 0), 1);
  EXPECT_DOUBLE_EQ(Percentile(v, 100), 10);
  EXPECT_DOUBLE_EQ(Percentile(v, 50), 5.5);   // rank 4.5
  EXPECT_DOUBLE_EQ(Percentile(v, 90), 9.1);   // rank 8.1
  EXPECT_NEAR(Percentile(v, 99), 9.91, 1e-12);  // rank 8.91
  EXPECT_DOUBLE_EQ(Percentile({42}, 99), 42);
  EXPECT_DOUBLE_EQ(Percentile({}, 50), 0);
  EXPECT_DOUBLE_EQ(Percentile({0, 100}, 25), 25);

  Distribution d = Describe({4, 1, 3, 2});
  EXPECT_EQ(d.count, 4);
  EXPECT_DOUBLE_EQ(d.mean, 2.5);
  EXPECT_DOUBLE_EQ(d.p50, 2.5);
  EXPECT_DOUBLE_EQ(d.p90, 3.7);  // rank 2.7 of {1,2,3,4}
  EXPECT_DOUBLE_EQ(d.min, 1);
  EXPECT_DOUBLE_EQ(d.max, 4);
}

TEST(ReportTest, ParseSlo) {
  auto s = ParseSlo("ttft=2s,tpot=100ms");
  ASSERT_TRUE(s.has_value()) << s.error().ToString();
  EXPECT_DOUBLE_EQ(s->ttft_s, 2);
  EXPECT_DOUBLE_EQ(s->tpot_s, 0.1);
  EXPECT_EQ(s->e2e_s, 0);
  auto t = ParseSlo(" e2e = 1.5 , ttft=250us ");
  ASSERT_TRUE(t.has_value()) << t.error().ToString();
  EXPECT_DOUBLE_EQ(t->e2e_s, 1.5);
  EXPECT_DOUBLE_EQ(t->ttft_s, 250e-6);
  for (const char* bad : {"ttft", "ttft=", "ttft=-1s", "ttft=2x", "latency=2s", "ttft=abc"}) {
    auto r = ParseSlo(bad);
    EXPECT_FALSE(r.has_value()) << bad;
    if (!r.has_value()) {
      EXPECT_EQ(r.error().code(), StatusCode::kInvalidArgument);
    }
  }
}

// start 0; first token at `ttft`; `n` tokens `gap` apart; end at last token.
RequestRecord Rec(int64_t index, double start, double ttft, int n, double gap, int64_t prompt, int64_t device,
                  int64_t host, int turn = 0) {
  RequestRecord r;
  r.index = index;
  r.turn = turn;
  r.start_s = r.scheduled_s = start;
  r.first_token_s = start + ttft;
  for (int i = 0; i < n; ++i) r.token_s.push_back(r.first_token_s + gap * i);
  r.end_s = r.token_s.back();
  r.completion_tokens = n;
  r.prompt_tokens = prompt;
  r.cached_by_tier = {device, host, 0, 0};
  r.cached_tokens = device + host;
  r.http_status = 200;
  r.max_tokens = n;
  return r;
}

RunData KnownRun() {
  RunData run;
  run.url = "http://127.0.0.1:1";
  run.model = "m";
  run.workload = "random";
  run.mode = "closed-loop";
  run.concurrency = 2;
  run.slo.ttft_s = 1.0;
  run.slo.tpot_s = 0.1;
  // A: ttft 0.5, 5 tokens 0.05 apart: tpot 0.05, meets both.
  run.load.records.push_back(Rec(0, 0.0, 0.5, 5, 0.05, 100, 50, 0, 0));
  // B: ttft 2.0 (misses the TTFT SLO), 3 tokens 0.1 apart.
  run.load.records.push_back(Rec(1, 1.0, 2.0, 3, 0.1, 100, 0, 25, 1));
  // C: ttft 0.2, 2 tokens 0.3 apart: tpot 0.3 misses.
  run.load.records.push_back(Rec(2, 1.0, 0.2, 2, 0.3, 200, 100, 50, 1));
  // D: one token: TPOT does not apply; meets.
  run.load.records.push_back(Rec(3, 2.0, 0.1, 1, 0, 100, 0, 0, 0));
  // E, F: errors.
  RequestRecord e;
  e.index = 4;
  e.start_s = e.end_s = 2.5;
  e.http_status = 429;
  e.error = "http_429";
  run.load.records.push_back(e);
  RequestRecord f;
  f.index = 5;
  f.start_s = f.end_s = 2.5;
  f.error = "transport";
  f.error_message = "refused";
  run.load.records.push_back(f);
  run.load.duration_s = 4.0;
  run.load.metrics_available = true;
  MetricsSample a, b;
  a.queries = 1000;
  a.hits = {100, 0, 0, 0};
  b.t_s = 4;
  b.queries = 1500;
  b.hits = {250, 50, 20, 0};
  run.load.scrapes = {a, b};
  run.load.skipped_over_context = 3;
  return run;
}

TEST(ReportTest, SummaryOfKnownRecords) {
  const RunData run = KnownRun();
  const Summary s = Summarize(run);
  EXPECT_EQ(s.requests_total, 6);
  EXPECT_EQ(s.requests_ok, 4);
  EXPECT_EQ(s.requests_failed, 2);
  EXPECT_EQ(s.skipped_over_context, 3);
  EXPECT_EQ(s.errors.at("http_429"), 1);
  EXPECT_EQ(s.errors.at("transport"), 1);
  EXPECT_EQ(s.rejections.at("429"), 1);

  // TTFT {0.1, 0.2, 0.5, 2.0}.
  EXPECT_EQ(s.ttft_s.count, 4);
  EXPECT_DOUBLE_EQ(s.ttft_s.mean, 0.7);
  EXPECT_DOUBLE_EQ(s.ttft_s.p50, 0.35);
  EXPECT_NEAR(s.ttft_s.p90, 0.5 + 0.7 * 1.5, 1e-12);  // rank 2.7
  // TPOT over requests with >= 2 tokens: {0.05, 0.1, 0.3}.
  EXPECT_EQ(s.tpot_s.count, 3);
  EXPECT_NEAR(s.tpot_s.mean, 0.15, 1e-12);
  EXPECT_NEAR(s.tpot_s.p50, 0.1, 1e-12);
  // ITL: 4 gaps of 0.05, 2 of 0.1, 1 of 0.3.
  EXPECT_EQ(s.itl_s.count, 7);
  EXPECT_NEAR(s.itl_s.mean, (4 * 0.05 + 2 * 0.1 + 0.3) / 7, 1e-12);
  // E2E: A 0.7, B 2.2, C 0.5, D 0.1.
  EXPECT_NEAR(s.e2e_s.mean, 3.5 / 4, 1e-12);

  EXPECT_DOUBLE_EQ(s.request_throughput, 1.0);  // 4 ok / 4 s
  EXPECT_DOUBLE_EQ(s.output_token_throughput, 11.0 / 4);
  EXPECT_DOUBLE_EQ(s.total_token_throughput, (500.0 + 11) / 4);
  // Goodput: A and D meet ttft=1s,tpot=100ms; B misses TTFT, C misses TPOT.
  EXPECT_EQ(s.goodput_requests, 2);
  EXPECT_DOUBLE_EQ(s.goodput_rps, 0.5);
  EXPECT_DOUBLE_EQ(s.goodput_ratio, 2.0 / 6);

  // Responses: device 150, host 75 of 500 prompt tokens.
  EXPECT_DOUBLE_EQ(s.hit_responses.total, 225.0 / 500);
  EXPECT_DOUBLE_EQ(s.hit_responses.by_tier[0], 0.3);
  EXPECT_DOUBLE_EQ(s.hit_responses.by_tier[1], 0.15);
  // /metrics deltas: 150 + 50 + 20 of 500 queried.
  ASSERT_TRUE(s.metrics_available);
  EXPECT_DOUBLE_EQ(s.hit_metrics.total, 220.0 / 500);
  EXPECT_DOUBLE_EQ(s.hit_metrics.by_tier[2], 20.0 / 500);

  // Turns: 0 = {A, D}, 1 = {B, C}.
  ASSERT_EQ(s.by_turn.size(), 2u);
  EXPECT_NEAR(s.by_turn[0].ttft_mean_s, 0.3, 1e-12);
  EXPECT_NEAR(s.by_turn[1].ttft_mean_s, 1.1, 1e-12);
  EXPECT_DOUBLE_EQ(s.by_turn[1].hit_ratio, 175.0 / 300);
}

TEST(ReportTest, WithoutSloEverySuccessIsGoodput) {
  RunData run = KnownRun();
  run.slo = Slo{};
  EXPECT_EQ(Summarize(run).goodput_requests, 4);
}

TEST(ReportTest, TimelineBucketsRequestsTokensAndHits) {
  const RunData run = KnownRun();
  const auto tl = Timeline(run, 1.0);
  ASSERT_EQ(tl.size(), 4u);
  int64_t requests = 0, tokens = 0;
  for (const auto& p : tl) {
    requests += p.requests_done;
    tokens += p.tokens;
  }
  EXPECT_EQ(requests, 4);
  EXPECT_EQ(tokens, 11);
  // A ends at 0.7 (bucket 0), prompt 100 with 50 cached.
  EXPECT_DOUBLE_EQ(tl[0].hit_ratio_responses, 0.5);
  // The single /metrics delta lands in the last bucket.
  EXPECT_DOUBLE_EQ(tl[3].hit_ratio_metrics, 220.0 / 500);
  EXPECT_LT(tl[0].hit_ratio_metrics, 0);
}

TEST(ReportTest, JsonRoundTrip) {
  const RunData run = KnownRun();
  const Summary s = Summarize(run);
  const std::string text = RunJson(run, s);
  auto back = RunDataFromJson(text);
  ASSERT_TRUE(back.has_value()) << back.error().ToString();
  EXPECT_EQ(back->model, "m");
  EXPECT_EQ(back->concurrency, 2);
  EXPECT_DOUBLE_EQ(back->slo.tpot_s, 0.1);
  ASSERT_EQ(back->load.records.size(), run.load.records.size());
  for (size_t i = 0; i < run.load.records.size(); ++i) {
    const auto& a = run.load.records[i];
    const auto& b = back->load.records[i];
    EXPECT_EQ(a.token_s, b.token_s);
    EXPECT_EQ(a.cached_by_tier, b.cached_by_tier);
    EXPECT_EQ(a.error, b.error);
    EXPECT_EQ(a.error_message, b.error_message);
    EXPECT_EQ(a.http_status, b.http_status);
    EXPECT_DOUBLE_EQ(a.first_token_s, b.first_token_s);
  }
  EXPECT_EQ(back->load.scrapes.size(), 2u);
  EXPECT_EQ(back->load.skipped_over_context, 3);
  // The summary recomputed from the file is the one written.
  EXPECT_EQ(RunJson(*back, Summarize(*back)), text);
  EXPECT_FALSE(RunDataFromJson("{\"a\": 1}").has_value());
  EXPECT_FALSE(RunDataFromJson("not json").has_value());
}

TEST(ReportTest, MetricsTextParsing) {
  const MetricsSample m = ParseMetricsSample(
      "# HELP strata_prefix_cache_hits_total x\n"
      "# TYPE strata_prefix_cache_hits_total counter\n"
      "strata_prefix_cache_hits_total{model_name=\"a\",tier=\"device\"} 12\n"
      "strata_prefix_cache_hits_total{model_name=\"a\",tier=\"disk\"} 3.5\n"
      "strata_prefix_cache_queries_total{model_name=\"a\"} 40\n"
      "strata_num_requests_running{model_name=\"a\"} 2\n"
      "strata_prefix_cache_queries_total_other 99\n");
  EXPECT_DOUBLE_EQ(m.queries, 40);
  EXPECT_DOUBLE_EQ(m.hits[0], 12);
  EXPECT_DOUBLE_EQ(m.hits[1], 0);
  EXPECT_DOUBLE_EQ(m.hits[2], 3.5);
  EXPECT_DOUBLE_EQ(m.running, 2);
}

TEST(ReportTest, CompareShowsRatiosToTheFirstFile) {
  RunData a = KnownRun();
  RunData b = KnownRun();
  for (auto& r : b.load.records) {  // B: every latency doubled
    r.first_token_s = r.start_s + 2 * (r.first_token_s - r.start_s);
  }
  const std::string pa = ::testing::TempDir() + "/live_cmp_a.json", pb = ::testing::TempDir() + "/live_cmp_b.json";
  std::ofstream(pa) << RunJson(a, Summarize(a));
  std::ofstream(pb) << RunJson(b, Summarize(b));
  auto c = LoadComparison({pa, pb, pa});
  ASSERT_TRUE(c.has_value()) << c.error().ToString();
  bool found = false;
  for (const auto& row : c->rows) {
    if (row.metric == "ttft_s.mean") {
      found = true;
      ASSERT_EQ(row.values.size(), 3u);
      EXPECT_NEAR(row.values[0], 700, 1e-9);  // ms
      EXPECT_NEAR(row.values[1] / row.values[0], 2.0, 1e-12);
    }
  }
  EXPECT_TRUE(found);
  const std::string table = ComparisonTable(*c);
  EXPECT_NE(table.find("B/A"), std::string::npos) << table;
  EXPECT_NE(table.find("2.00"), std::string::npos) << table;
  auto j = nlohmann::json::parse(ComparisonJson(*c));
  EXPECT_DOUBLE_EQ(j["metrics"]["ttft_s.mean"]["ratios"][1].get<double>(), 2.0);
  EXPECT_DOUBLE_EQ(j["metrics"]["ttft_s.mean"]["ratios"][2].get<double>(), 1.0);
  EXPECT_FALSE(LoadComparison({pa, ::testing::TempDir() + "/missing.json"}).has_value());
}

}  // namespace
}  // namespace strata::bench
