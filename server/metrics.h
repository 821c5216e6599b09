#pragma once
// Prometheus metrics for `GET /metrics` (DESIGN.md decision 9), named after
// vLLM's with the `strata_` prefix so that existing dashboards map over.
// Every series carries a constant `model_name` label (the served model name).
// docs/metrics.md lists each metric.
//
// Two sources feed it:
//   - per-request events (OnEvent, as the front end's RequestObserver):
//     latency histograms, token counters and histograms, requests by finish
//     reason;
//   - the engine's snapshot (Render(stats), once per scrape): running and
//     waiting requests, KV usage per tier, prefix-cache queries and hits,
//     bytes moved between tiers, preemptions. The engine's figures are
//     cumulative; their counters grow by the delta since the last scrape (a
//     value that went down, e.g. a new engine, is taken as the new base).
// Plus HTTP errors by status code (OnHttpResponse).
//
// Thread-safety: every method may be called from any thread, concurrently.
// OnEvent is cheap and never blocks on I/O (it runs on the engine thread).

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "scheduler/engine_client.h"
#include "server/frontend.h"
#include "server/request_lanes.h"

namespace prometheus {
class Registry;
class Counter;
class Gauge;
class Histogram;
template <typename T>
class Family;
}  // namespace prometheus

namespace strata::server {

// The front door's own figures (request lanes, slow readers), given to
// Render by whoever owns them.
struct FrontDoorStats {
  std::array<LaneStats, kNumLanes> lanes{};  // by Lane
  uint64_t write_timeouts = 0;               // streams cancelled because the client stopped reading
};

// The exposition's content type.
inline constexpr const char* kMetricsContentType = "text/plain; version=0.0.4; charset=utf-8";

class ServerMetrics final : public RequestObserver {
 public:
  // `max_model_len` sets the upper buckets of the token-count histograms
  // (1-2-5 series up to it, as vLLM).
  ServerMetrics(std::string model_name, int max_model_len);
  ~ServerMetrics() override;
  ServerMetrics(const ServerMetrics&) = delete;
  ServerMetrics& operator=(const ServerMetrics&) = delete;

  // Every engine event of every request (RequestObserver).
  void OnEvent(const scheduler::RequestOutput& event) override;
  void OnFrontendTime(double seconds) override;
  // Every HTTP (or gRPC, mapped) response status: >= 400 counts as an error
  // under its code.
  void OnHttpResponse(int status);

  // Updates the engine-derived series from `stats` and returns the text
  // exposition (content type kMetricsContentType).
  std::string Render(const scheduler::EngineStats& stats, const FrontDoorStats* front = nullptr);

  // Requests seen whose final event has not come yet (tests, diagnostics).
  size_t tracked_requests() const;

 private:
  struct RequestState {
    bool prompt_counted = false;
    bool ttft_observed = false;
    int64_t last_token_nanos = 0;   // timings.last_token of the previous event
    int32_t completion_tokens = 0;  // counted so far into generation tokens
  };
  // An engine-cumulative figure exported as a counter.
  struct DeltaCounter {
    prometheus::Counter* counter = nullptr;
    double last = 0;
  };

  struct DeltaHistogram {
    prometheus::Histogram* histogram = nullptr;
    kvcache::TierLatencyCounts last{};
    int64_t last_nanos = 0;
  };
  // Feeds a histogram from cumulative per-bucket counts (kvcache's tier
  // latency buckets) by the change since the last scrape.
  void ObserveDelta(prometheus::Family<prometheus::Histogram>& family, const std::string& key,
                    const std::map<std::string, std::string>& labels, const kvcache::TierLatencyCounts& counts,
                    int64_t nanos);
  void SetDelta(prometheus::Family<prometheus::Counter>& family, const std::string& key,
                const std::map<std::string, std::string>& labels, double value);
  // strata_kv_policy_decisions_total for one tier.
  void SetPolicyDecisions(std::map<std::string, std::string> tier, const std::string& policy,
                          const kvcache::PolicyStats& p);
  // The labels of a per-tier series: `tier`, its kind from the table of
  // kvcache/tier_kind.h, and `tier_name`, its configured name.
  static std::map<std::string, std::string> TierLabels(kvcache::TierKind kind, const std::string& name);

  const std::string model_name_;
  std::shared_ptr<prometheus::Registry> registry_;

  // Histograms.
  prometheus::Histogram* ttft_ = nullptr;
  prometheus::Histogram* frontend_ = nullptr;
  prometheus::Histogram* itl_ = nullptr;
  prometheus::Histogram* tpot_ = nullptr;
  prometheus::Histogram* e2e_ = nullptr;
  prometheus::Histogram* queue_ = nullptr;
  prometheus::Histogram* prefill_ = nullptr;
  prometheus::Histogram* decode_ = nullptr;
  prometheus::Histogram* prompt_hist_ = nullptr;
  prometheus::Histogram* generation_hist_ = nullptr;
  // Counters fed by events.
  prometheus::Counter* prompt_tokens_ = nullptr;
  prometheus::Counter* generation_tokens_ = nullptr;
  prometheus::Family<prometheus::Counter>* requests_ = nullptr;  // {finish_reason}
  prometheus::Family<prometheus::Counter>* errors_ = nullptr;    // {code}
  // Gauges and counters fed by Render.
  prometheus::Gauge* running_ = nullptr;
  prometheus::Gauge* waiting_ = nullptr;
  prometheus::Gauge* device_blocks_in_use_ = nullptr;
  prometheus::Family<prometheus::Gauge>* device_blocks_ = nullptr;  // {state}
  prometheus::Family<prometheus::Gauge>* usage_ratio_ = nullptr;
  prometheus::Family<prometheus::Gauge>* used_bytes_ = nullptr;
  prometheus::Family<prometheus::Gauge>* capacity_bytes_ = nullptr;
  prometheus::Family<prometheus::Counter>* cache_queries_ = nullptr;
  prometheus::Family<prometheus::Counter>* cache_hits_ = nullptr;  // {tier}
  prometheus::Family<prometheus::Counter>* preemptions_ = nullptr;
  prometheus::Family<prometheus::Counter>* engine_steps_ = nullptr;
  prometheus::Family<prometheus::Counter>* engine_step_seconds_ = nullptr;
  prometheus::Family<prometheus::Counter>* engine_forward_seconds_ = nullptr;
  prometheus::Family<prometheus::Counter>* engine_step_tokens_ = nullptr;
  prometheus::Family<prometheus::Counter>* rejected_ = nullptr;
  prometheus::Family<prometheus::Counter>* device_evictions_ = nullptr;
  prometheus::Family<prometheus::Counter>* policy_decisions_ = nullptr;
  prometheus::Family<prometheus::Counter>* tier_promoted_ = nullptr;
  prometheus::Family<prometheus::Counter>* tier_writebacks_deferred_ = nullptr;  // {tier}
  prometheus::Family<prometheus::Counter>* tier_written_ = nullptr;        // {tier}
  prometheus::Family<prometheus::Counter>* tier_read_ = nullptr;           // {tier}
  prometheus::Family<prometheus::Counter>* tier_load_failures_ = nullptr;  // {tier}
  prometheus::Family<prometheus::Counter>* tier_write_failures_ = nullptr;
  prometheus::Family<prometheus::Counter>* tier_writes_refused_ = nullptr;
  prometheus::Family<prometheus::Counter>* tier_load_seconds_ = nullptr;
  prometheus::Family<prometheus::Counter>* tier_deferred_ = nullptr;
  prometheus::Family<prometheus::Counter>* tier_writebacks_ = nullptr;          // {tier}
  prometheus::Family<prometheus::Counter>* tier_writebacks_dropped_ = nullptr;  // {tier}
  prometheus::Family<prometheus::Counter>* prefetches_ = nullptr;               // {outcome}
  prometheus::Family<prometheus::Counter>* prefetched_blocks_ = nullptr;
  prometheus::Family<prometheus::Histogram>* tier_load_latency_ = nullptr;   // {tier}
  prometheus::Family<prometheus::Histogram>* tier_write_latency_ = nullptr;  // {tier}
  prometheus::Family<prometheus::Counter>* tier_corrupt_ = nullptr;          // {tier}
  prometheus::Family<prometheus::Gauge>* lane_queued_ = nullptr;             // {lane}
  prometheus::Family<prometheus::Gauge>* lane_running_ = nullptr;            // {lane}
  prometheus::Family<prometheus::Counter>* lane_requests_ = nullptr;         // {lane}
  prometheus::Family<prometheus::Counter>* lane_rejected_ = nullptr;         // {lane}
  prometheus::Family<prometheus::Counter>* write_timeouts_ = nullptr;

  mutable std::mutex mu_;  // guards the maps below
  std::unordered_map<uint64_t, RequestState> requests_state_;
  std::map<std::string, DeltaCounter> deltas_;  // family key + labels → counter
  std::map<std::string, DeltaHistogram> hist_deltas_;
};

}  // namespace strata::server
