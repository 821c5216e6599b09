#pragma once
// The live load driver of `strata bench run`: sends a Workload to an
// OpenAI-compatible server over streaming HTTP, or to strata's gRPC service
// (strata.v1.Strata, streaming Generate/Chat; bench/grpc_client.h) when the
// URL is grpc://HOST:PORT, and records, per request, when
// it started, when each token arrived, when it ended, the usage the server
// reported (prompt, cached by tier, generated) and any error.
//
// Loops:
// - open loop: each session starts at its trace timestamp × time_scale, or at
//   Poisson arrivals of `rate` sessions per second; nothing waits for earlier
//   requests (a session's later turns still follow its earlier ones).
// - closed loop: `concurrency` users, each running one session after the
//   other to completion.
// Chat turns wait think_time_s after the previous turn's end.
//
// Threads: one thread per in-flight session (blocking sockets; over gRPC one
// blocking streaming call on a shared channel), plus one monitor thread that
// scrapes /metrics (gRPC: the CacheStats call) and draws the progress bar. That holds
// 64 concurrent streams on two cores easily; beyond a few hundred streams the
// thread stacks and context switches dominate, and an event-loop client would
// be needed.
//
// Thread-safety: RunLoad is called from one thread and blocks until the run
// ends; the functions below it are pure.

#include <array>
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "bench/workload.h"
#include "common/status.h"
#include "kvcache/tier_kind.h"

namespace strata::bench {

// The tier kinds' names (kvcache/tier_kind.h), by TierKindIndex: the keys of
// cached_tokens_by_tier and the values of the metrics' `tier` label.
inline constexpr std::array<const char*, kvcache::kNumTierKinds> kTierNames = [] {
  std::array<const char*, kvcache::kNumTierKinds> names{};
  for (kvcache::TierKind k : kvcache::kAllTierKinds) names[kvcache::TierKindIndex(k)] = kvcache::TierKindName(k).data();
  return names;
}();

struct RequestRecord {
  int64_t index = 0;  // order of completion bookkeeping: workload order
  int session = 0;
  int turn = 0;
  double scheduled_s = 0;  // when it was due (open loop), else = start_s
  double start_s = 0;      // seconds since the run started
  double first_token_s = -1;  // < 0: no token arrived
  double end_s = 0;
  std::vector<double> token_s;  // arrival of every content chunk
  int64_t sent_prompt_tokens = 0;  // token workloads: ids sent; chat: 0
  int max_tokens = 0;
  int64_t prompt_tokens = 0;  // from usage
  int64_t completion_tokens = 0;
  int64_t cached_tokens = 0;
  std::array<int64_t, 4> cached_by_tier{};  // kTierNames order
  // 0: no answer (transport error). gRPC: the HTTP equivalent of the status
  // (429 RESOURCE_EXHAUSTED, 503 UNAVAILABLE, ...), so rejections count alike.
  int http_status = 0;
  std::string grpc_status;  // gRPC only: the status name ("OK", "UNAVAILABLE", ...)
  // "" on success; else an error class: "http_<status>" / "grpc_<STATUS>",
  // "transport", "stream" (an error event inside a 200 stream, or a gRPC
  // stream without usage), "context" (refused because the prompt does not fit
  // the model's context).
  std::string error;
  std::string error_message;

  bool ok() const { return error.empty(); }
};

// One scrape of the server's /metrics (counters summed over label sets).
struct MetricsSample {
  double t_s = 0;
  double queries = 0;  // strata_prefix_cache_queries_total
  std::array<double, 4> hits{};  // strata_prefix_cache_hits_total by tier
  double running = 0, waiting = 0;  // gauges
  double rejected = 0;  // strata_requests_rejected_total
};

struct LoadOptions {
  std::string host;
  int port = 0;
  bool grpc = false;  // host:port is strata's gRPC port (grpc:// URL)
  std::string model;  // "model" field of requests
  // Exactly one mode: rate > 0 (Poisson open loop), concurrency > 0 (closed
  // loop), or neither with trace timestamps (open loop at time_scale).
  double rate = 0;
  int concurrency = 0;
  double time_scale = 1.0;  // trace timestamps are multiplied by it
  uint64_t seed = 1;        // Poisson arrivals
  double request_timeout_s = 600;  // per wait for bytes of one stream
  double scrape_interval_s = 1.0;  // 0 = only before and after
  bool progress = false;           // draw a progress bar on stderr
  int max_model_len = 0;           // for classifying context refusals
  // Sends a different "cache_salt" with every request, so that no request
  // can reuse another's KV blocks: a cache-off baseline against any server
  // that honours cache_salt (strata serve, vLLM).
  bool unique_cache_salt = false;
};

struct LoadResult {
  std::vector<RequestRecord> records;  // workload order (session, turn)
  std::vector<MetricsSample> scrapes;  // first before, last after the run
  bool metrics_available = false;
  double duration_s = 0;  // run start to last request end
  int64_t skipped_over_context = 0;  // the workload's + context refusals
  int64_t not_sent = 0;   // chat turns left out after an earlier turn failed
};

// Runs the whole workload. Errors only for setup (bad options); request
// failures are records.
Result<LoadResult> RunLoad(const Workload& workload, const LoadOptions& options);

// A `bench run --url`: http://HOST:PORT or grpc://HOST:PORT.
struct ServerUrl {
  std::string host;
  int port = 0;
  bool grpc = false;
};
Result<ServerUrl> ParseServerUrl(std::string_view url);

// Parses Prometheus text into a sample (t_s left 0). Missing metrics stay 0.
MetricsSample ParseMetricsSample(const std::string& prometheus_text);

// GET /v1/models: the first model's id and max_model_len (0 if absent).
struct ServedModel {
  std::string id;
  int max_model_len = 0;
};
Result<ServedModel> QueryModel(const std::string& host, int port);
// Either transport (gRPC: Health + Tokenize); errors name the URL's server.
Result<ServedModel> QueryModel(const ServerUrl& url);

// The vocabulary size, learnt from the server's refusal of an out-of-range
// token id ("... outside the vocabulary [0, N)"); nullopt-like 0 when the
// answer does not say.
int ProbeVocabSize(const std::string& host, int port, const std::string& model);
int ProbeVocabSize(const ServerUrl& url, const std::string& model);

}  // namespace strata::bench
