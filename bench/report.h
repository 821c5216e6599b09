#pragma once
// Reports of `strata bench run`: latency distributions, throughput, goodput
// under SLOs, errors, prefix-cache hit ratios (from responses and from the
// server's /metrics) split by tier; the JSON file (with the raw per-request
// records), the human summary and gnuplot plots. docs/bench.md describes
// every field.
//
// Definitions (as vLLM's `bench serve` and AIPerf use them):
// - TTFT: first content chunk − request start.
// - TPOT: (end − first token) ÷ (generated tokens − 1), per request with at
//   least 2 generated tokens.
// - ITL: every gap between consecutive content chunks, pooled over requests.
// - E2E: end − start.
// - Percentiles: linear interpolation between closest ranks (numpy's
//   default): rank = p/100 · (n − 1).
// - Goodput: successful requests meeting every given SLO, per second of run.
//
// Thread-safety: pure functions over values.

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "bench/load_driver.h"
#include "common/status.h"

namespace strata::bench {

// Linear interpolation between closest ranks. REQUIRES: `sorted` ascending.
// 0 for an empty input; p clamped to [0, 100].
double Percentile(const std::vector<double>& sorted, double p);

struct Distribution {
  int64_t count = 0;
  double mean = 0, p50 = 0, p90 = 0, p99 = 0, min = 0, max = 0;
};
Distribution Describe(std::vector<double> values);

// SLO limits in seconds; <= 0 = not set.
struct Slo {
  double ttft_s = 0;
  double tpot_s = 0;
  double e2e_s = 0;
  bool any() const { return ttft_s > 0 || tpot_s > 0 || e2e_s > 0; }
};
// "ttft=2s,tpot=100ms,e2e=10s": keys ttft, tpot, e2e; units s, ms, us (a bare
// number is seconds). Errors: kInvalidArgument naming the bad part.
Result<Slo> ParseSlo(const std::string& text);
// Whether a successful record meets `slo` (TPOT only when >= 2 tokens).
bool MeetsSlo(const RequestRecord& r, const Slo& slo);

// Everything a run wrote, as stored in the JSON file.
struct RunData {
  std::string url, model, workload;
  std::string mode;  // "trace-timestamps", "poisson", "closed-loop"
  double rate = 0;
  int concurrency = 0;
  double time_scale = 1;
  int tokens_per_hash_id = 0;
  uint64_t seed = 1;
  int max_model_len = 0;
  bool unique_cache_salt = false;
  Slo slo;
  std::string started_at;  // UTC, ISO 8601
  LoadResult load;
};

struct TierRatios {
  double total = 0;  // cached ÷ prompt (or hits ÷ queries)
  std::array<double, 4> by_tier{};
  std::array<double, 4> tokens{};  // numerators by tier
  double denominator = 0;
};

struct TurnStats {
  int turn = 0;
  int64_t requests = 0;
  double ttft_mean_s = 0, ttft_p50_s = 0;
  double hit_ratio = 0;
};

struct Summary {
  int64_t requests_total = 0, requests_ok = 0, requests_failed = 0;
  int64_t skipped_over_context = 0, not_sent = 0;
  std::map<std::string, int64_t> errors;      // error class → count (see RequestRecord::error)
  std::map<std::string, int64_t> rejections;  // HTTP 429 / 503 among them
  double duration_s = 0;
  Distribution ttft_s, tpot_s, itl_s, e2e_s;
  double request_throughput = 0;      // ok requests / s
  double output_token_throughput = 0; // generated tokens / s
  double total_token_throughput = 0;  // (prompt + generated) / s
  int64_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
  int64_t goodput_requests = 0;
  double goodput_rps = 0;   // requests meeting the SLO per second (all ok requests when none set)
  double goodput_ratio = 0; // goodput_requests ÷ requests_total
  TierRatios hit_responses;  // from usage.cached_tokens
  bool metrics_available = false;
  TierRatios hit_metrics;    // from /metrics deltas (last − first scrape)
  std::vector<TurnStats> by_turn;  // multi-turn workloads
};
Summary Summarize(const RunData& run);

// One point per time bucket of the run (for the over-time plots).
struct TimelinePoint {
  double t_s = 0;  // bucket start
  int64_t requests_done = 0, tokens = 0;
  double request_rate = 0, token_rate = 0;
  double hit_ratio_responses = -1;  // of requests ending in the bucket; -1 none
  double hit_ratio_metrics = -1;    // between scrapes in the bucket; -1 none
};
std::vector<TimelinePoint> Timeline(const RunData& run, double bucket_s);

// The JSON document: {"strata_bench_run": 1, "config", "summary",
// "records", "metrics_scrapes", "timeline"}.
std::string RunJson(const RunData& run, const Summary& summary);
// Reads RunJson's output back (config and records; summary recomputed by the
// caller). Errors: kInvalidArgument (not a bench run file).
Result<RunData> RunDataFromJson(const std::string& text);

// A few lines for the terminal.
std::string HumanSummary(const RunData& run, const Summary& summary);

// Writes <stem>.ttft_cdf.EXT, <stem>.throughput.EXT, <stem>.hit_ratio.EXT and
// <stem>.hit_by_tier.EXT (stem = out path without .json) with gnuplot; EXT is
// png when gnuplot has the pngcairo terminal, else svg. Returns the files
// written; kUnavailable when gnuplot is missing (the caller warns and goes on).
Result<std::vector<std::string>> WritePlots(const RunData& run, const Summary& summary, const std::string& json_path);

}  // namespace strata::bench
