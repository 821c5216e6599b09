#include "server/metrics.h"

#include <prometheus/counter.h>
#include <prometheus/family.h>
#include <prometheus/gauge.h>
#include <prometheus/histogram.h>
#include <prometheus/registry.h>
#include <prometheus/text_serializer.h>

#include <algorithm>
#include <string>
#include <utility>

namespace strata::server {
namespace {

using prometheus::BuildCounter;
using prometheus::BuildGauge;
using prometheus::BuildHistogram;
using prometheus::Histogram;

// vLLM's buckets (vllm/v1/metrics/loggers.py), so dashboards' quantiles line up.
const Histogram::BucketBoundaries kTtftBuckets = {
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1,  0.25,  0.5,   0.75,
    1.0,   2.5,   5.0,  7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0};
const Histogram::BucketBoundaries kItlBuckets = {0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2,
                                                 0.3,  0.4,   0.5,  0.75,  1.0, 2.5,  5.0,
                                                 7.5,  10.0,  20.0, 40.0,  80.0};
const Histogram::BucketBoundaries kRequestLatencyBuckets = {
    0.3,  0.5,  0.8,  1.0,  1.5,   2.0,   2.5,   5.0,   10.0,   15.0,  20.0,
    30.0, 40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0};

// 1, 2, 5, 10, 20, 50, ... up to and including the first value >= max (vLLM's
// build_1_2_5_buckets stops at <= max; one more keeps max itself in a bucket).
Histogram::BucketBoundaries Buckets125(int max_value) {
  Histogram::BucketBoundaries b;
  const double max = std::max(1, max_value);
  for (double scale = 1;; scale *= 10) {
    for (double m : {1.0, 2.0, 5.0}) {
      b.push_back(m * scale);
      if (m * scale >= max) return b;
    }
  }
}

double Seconds(int64_t nanos) { return static_cast<double>(nanos) / 1e9; }

}  // namespace

ServerMetrics::ServerMetrics(std::string model_name, int max_model_len)
    : model_name_(std::move(model_name)), registry_(std::make_shared<prometheus::Registry>()) {
  auto& r = *registry_;
  const prometheus::Labels model{{"model_name", model_name_}};
  auto hist = [&](const char* name, const char* help, const Histogram::BucketBoundaries& buckets) {
    return &BuildHistogram().Name(name).Help(help).Labels(model).Register(r).Add({}, buckets);
  };
  auto counter_family = [&](const char* name, const char* help) {
    return &BuildCounter().Name(name).Help(help).Labels(model).Register(r);
  };
  auto gauge_family = [&](const char* name, const char* help) {
    return &BuildGauge().Name(name).Help(help).Labels(model).Register(r);
  };

  frontend_ = hist("strata_request_frontend_time_seconds",
                   "Time from the request's first byte read to its submission to the engine (read, parse, "
                   "validate, tokenize), in seconds.",
                   {0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5});
  ttft_ = hist("strata_time_to_first_token_seconds",
               "Time from arrival to the first generated token, in seconds.", kTtftBuckets);
  itl_ = hist("strata_inter_token_latency_seconds",
              "Time between successive generated tokens, in seconds.", kItlBuckets);
  tpot_ = hist("strata_time_per_output_token_seconds",
               "Per request: decode time divided by generated tokens after the first, in seconds.",
               kItlBuckets);
  e2e_ = hist("strata_e2e_request_latency_seconds",
              "Time from arrival to the final event, in seconds.", kRequestLatencyBuckets);
  queue_ = hist("strata_request_queue_time_seconds",
                "Time from arrival to first admission, in seconds.", kRequestLatencyBuckets);
  prefill_ =
      hist("strata_request_prefill_time_seconds",
           "Time from first admission to the first token, in seconds.", kRequestLatencyBuckets);
  decode_ =
      hist("strata_request_decode_time_seconds",
           "Time from the first token to the final event, in seconds.", kRequestLatencyBuckets);
  prompt_hist_ = hist("strata_request_prompt_tokens", "Prompt tokens per finished request.",
                      Buckets125(max_model_len));
  generation_hist_ = hist("strata_request_generation_tokens",
                          "Generated tokens per finished request.", Buckets125(max_model_len));

  prompt_tokens_ =
      &counter_family("strata_prompt_tokens_total", "Prompt tokens of requests seen.")->Add({});
  generation_tokens_ =
      &counter_family("strata_generation_tokens_total", "Tokens generated.")->Add({});
  requests_ = counter_family("strata_requests_total", "Finished engine requests by finish reason.");
  errors_ = counter_family("strata_request_errors_total",
                           "Responses with an error status, by HTTP status code.");

  running_ = &gauge_family("strata_num_requests_running",
                           "Requests admitted (prefill, decode or loading).")
                  ->Add({});
  waiting_ =
      &gauge_family("strata_num_requests_waiting", "Requests queued, not yet admitted.")->Add({});
  device_blocks_in_use_ =
      &gauge_family("strata_kv_device_blocks_in_use", "Device KV blocks referenced by requests.")
           ->Add({});
  device_blocks_ =
      gauge_family("strata_kv_device_blocks", "Device KV blocks by state: in_use, cached, free.");
  usage_ratio_ = gauge_family("strata_kv_cache_usage_ratio",
                              "Used fraction of each KV tier's capacity (0 to 1).");
  used_bytes_ = gauge_family("strata_kv_cache_used_bytes", "Bytes held in each KV tier.");
  capacity_bytes_ =
      gauge_family("strata_kv_cache_capacity_bytes", "Capacity of each KV tier in bytes.");

  cache_queries_ =
      counter_family("strata_prefix_cache_queries_total",
                     "Prompt tokens of requests whose prefix was looked up in the KV cache.");
  cache_hits_ =
      counter_family("strata_prefix_cache_hits_total",
                     "Prompt tokens served from the KV cache, by the tier they came from.");
  preemptions_ = counter_family("strata_num_preemptions_total",
                                "Running requests preempted for lack of blocks.");
  engine_steps_ = counter_family("strata_engine_steps_total", "Engine steps that ran a forward pass.");
  engine_step_seconds_ = counter_family(
      "strata_engine_step_seconds_total",
      "Wall time of engine steps that ran a forward pass (scheduling, the pass, sampling, events).");
  engine_forward_seconds_ = counter_family("strata_engine_forward_seconds_total",
                                           "Wall time of the forward passes alone.");
  engine_step_tokens_ = counter_family(
      "strata_engine_step_tokens_total",
      "Tokens computed by forward passes: kind=prefill (prompt chunks of 2+ tokens), kind=decode (one-token entries).");
  rejected_ = counter_family("strata_requests_rejected_total",
                             "Submissions refused because the waiting queue was full.");
  lane_queued_ = gauge_family("strata_frontend_lane_queued",
                              "Requests waiting for a front-end worker, by lane (small, large body).");
  lane_running_ = gauge_family("strata_frontend_lane_running", "Requests on a front-end worker now, by lane.");
  lane_requests_ = counter_family("strata_frontend_lane_requests_total",
                                  "Requests queued for a front-end worker (parse, template, tokenize), by lane.");
  lane_rejected_ = counter_family("strata_frontend_lane_rejected_total",
                                  "Requests refused with 503 because their lane's queue was full, by lane.");
  write_timeouts_ = counter_family("strata_stream_write_timeouts_total",
                                   "Streams cancelled because the client did not read for the write timeout.");
  device_evictions_ =
      counter_family("strata_kv_device_evictions_total",
                     "Cached device blocks whose contents were dropped for reuse or by a flush.");
  policy_decisions_ = counter_family(
      "strata_kv_policy_decisions_total",
      "Decisions of each tier's eviction policy (kv.eviction_policy): decision=inserted, rejected (not admitted), "
      "hit, evicted, evicted_unused (evicted without a hit since stored), evicted_expired (its keep time had "
      "passed), evicted_kept (still kept: nothing else was evictable), removed (flush).");
  tier_promoted_ = counter_family(
      "strata_kv_tier_promotions_total",
      "Blocks an exclusive lower tier dropped because a load moved them up to the device (write_policy exclusive).");
  tier_writebacks_deferred_ = counter_family(
      "strata_kv_tier_writebacks_deferred_total",
      "Write-backs to an exclusive lower tier that waited for the promotions out of it (so it need not evict).");
  tier_written_ = counter_family("strata_kv_tier_bytes_written_total",
                                 "Bytes written from device to each lower tier.");
  tier_read_ = counter_family("strata_kv_tier_bytes_read_total",
                              "Bytes loaded from each lower tier into device.");
  tier_load_failures_ =
      counter_family("strata_kv_tier_load_failures_total",
                     "Loads from each lower tier that failed (recomputed instead).");
  tier_write_failures_ = counter_family("strata_kv_tier_write_failures_total",
                                        "Writes to each lower tier that failed.");
  tier_writes_refused_ = counter_family(
      "strata_kv_tier_writes_refused_total",
      "Writes each lower tier declined without a fault: every slot busy, or not admitted.");
  tier_load_seconds_ = counter_family(
      "strata_kv_tier_load_seconds_total",
      "Sum over loads from each lower tier of submit-to-completion time, in seconds.");
  tier_deferred_ = counter_family(
      "strata_kv_tier_admissions_deferred_total",
      "Full blocks not written to each lower tier yet for lack of hits (admit_after).");
  tier_writebacks_ = counter_family(
      "strata_kv_tier_writebacks_total",
      "Evicted device blocks queued for writing to each write-back lower tier.");
  tier_writebacks_dropped_ = counter_family(
      "strata_kv_tier_writebacks_dropped_total",
      "Evicted device blocks not written back to each tier: every staging buffer was busy.");
  prefetches_ = counter_family(
      "strata_kv_prefetches_total",
      "Waiting requests whose lower-tier prefix started loading before admission, by outcome.");
  prefetched_blocks_ = counter_family("strata_kv_prefetched_blocks_total",
                                      "Blocks loaded ahead of admission by prefetches.");
  tier_load_latency_ = &BuildHistogram()
                            .Name("strata_kv_tier_load_latency_seconds")
                            .Help("Submit-to-completion time of each block load from a lower tier, in seconds.")
                            .Labels(model)
                            .Register(r);
  tier_write_latency_ = &BuildHistogram()
                             .Name("strata_kv_tier_store_latency_seconds")
                             .Help("Submit-to-completion time of each block write to a lower tier, in seconds.")
                             .Labels(model)
                             .Register(r);
  tier_corrupt_ = counter_family(
      "strata_kv_tier_corrupt_blocks_total",
      "Blocks a lower tier found corrupt (checksum, truncated slab, bad index entry) and turned into misses.");
}

ServerMetrics::~ServerMetrics() = default;

void ServerMetrics::OnEvent(const scheduler::RequestOutput& ev) {
  const auto& t = ev.timings;
  std::lock_guard<std::mutex> lock(mu_);
  RequestState& st = requests_state_[ev.id.value()];
  if (!st.prompt_counted) {
    st.prompt_counted = true;
    prompt_tokens_->Increment(static_cast<double>(std::max(0, ev.prompt_tokens)));
  }
  if (ev.completion_tokens > st.completion_tokens) {
    generation_tokens_->Increment(static_cast<double>(ev.completion_tokens - st.completion_tokens));
    st.completion_tokens = ev.completion_tokens;
  }
  const int64_t n = static_cast<int64_t>(ev.token_ids.size());
  if (ev.completion_tokens > 0 && !st.ttft_observed) {
    st.ttft_observed = true;
    if (t.first_token >= t.arrival) ttft_->Observe(Seconds(t.first_token - t.arrival));
    // The first token has no gap before it; the event's others are spread
    // over first_token → last_token.
    if (n > 1 && t.last_token > t.first_token) {
      const double gap = Seconds(t.last_token - t.first_token) / static_cast<double>(n - 1);
      for (int64_t i = 1; i < n; ++i) itl_->Observe(gap);
    }
    st.last_token_nanos = t.last_token;
  } else if (n > 0 && st.ttft_observed && t.last_token >= st.last_token_nanos) {
    // This event's tokens came over the time since the previous event's last token.
    const double gap = Seconds(t.last_token - st.last_token_nanos) / static_cast<double>(n);
    for (int64_t i = 0; i < n; ++i) itl_->Observe(gap);
    st.last_token_nanos = t.last_token;
  }
  if (!ev.finished) return;

  requests_state_.erase(ev.id.value());
  requests_->Add({{"finish_reason", ev.finish_reason == FinishReason::kNone ? std::string("unknown")
                                                                    : std::string(FinishReasonName(ev.finish_reason))}})
      .Increment();
  if (t.finished > 0 && t.finished >= t.arrival) e2e_->Observe(Seconds(t.finished - t.arrival));
  // Clock time 0 is a valid instant (virtual clocks), so "it ran" is judged
  // by what it produced where possible.
  const bool produced = ev.completion_tokens > 0;
  if (t.scheduled > 0 || produced) queue_->Observe(t.queue_seconds);
  if (produced) {
    prefill_->Observe(t.prefill_seconds);
    decode_->Observe(t.decode_seconds);
    if (ev.completion_tokens > 1)
      tpot_->Observe(t.decode_seconds / static_cast<double>(ev.completion_tokens - 1));
  }
  prompt_hist_->Observe(static_cast<double>(ev.prompt_tokens));
  generation_hist_->Observe(static_cast<double>(ev.completion_tokens));
}

void ServerMetrics::OnFrontendTime(double seconds) { frontend_->Observe(seconds); }

void ServerMetrics::OnHttpResponse(int status) {
  if (status < 400) return;
  errors_->Add({{"code", std::to_string(status)}}).Increment();
}

size_t ServerMetrics::tracked_requests() const {
  std::lock_guard<std::mutex> lock(mu_);
  return requests_state_.size();
}

void ServerMetrics::ObserveDelta(prometheus::Family<prometheus::Histogram>& family, const std::string& key,
                                 const std::map<std::string, std::string>& labels,
                                 const kvcache::TierLatencyCounts& counts, int64_t nanos) {
  std::string k = key;
  for (const auto& [name, v] : labels) k += "|" + name + "=" + v;
  DeltaHistogram& d = hist_deltas_[k];
  if (d.histogram == nullptr) {
    Histogram::BucketBoundaries bounds(kvcache::kTierLatencyBounds.begin(), kvcache::kTierLatencyBounds.end());
    d.histogram = &family.Add(labels, bounds);
  }
  // A count that went down means a new engine or tier: count from zero.
  bool restarted = nanos < d.last_nanos;
  for (size_t i = 0; i < counts.size(); ++i) restarted = restarted || counts[i] < d.last[i];
  std::vector<double> inc(counts.size());
  bool any = false;
  for (size_t i = 0; i < counts.size(); ++i) {
    inc[i] = static_cast<double>(restarted ? counts[i] : counts[i] - d.last[i]);
    any = any || inc[i] > 0;
  }
  if (any) d.histogram->ObserveMultiple(inc, Seconds(restarted ? nanos : nanos - d.last_nanos));
  d.last = counts;
  d.last_nanos = nanos;
}

void ServerMetrics::SetDelta(prometheus::Family<prometheus::Counter>& family,
                             const std::string& key,
                             const std::map<std::string, std::string>& labels, double value) {
  std::string k = key;
  for (const auto& [name, v] : labels) k += "|" + name + "=" + v;
  DeltaCounter& d = deltas_[k];
  if (d.counter == nullptr) d.counter = &family.Add(labels);
  // Cumulative figures only grow; one that went down restarted (a new engine
  // or tier): its new value counts from zero.
  const double delta = value >= d.last ? value - d.last : value;
  if (delta > 0) d.counter->Increment(delta);
  d.last = value;
}

void ServerMetrics::SetPolicyDecisions(std::map<std::string, std::string> tier, const std::string& policy,
                                       const kvcache::PolicyStats& p) {
  tier["policy"] = policy;
  for (const auto& [decision, value] :
       {std::pair{"inserted", p.inserted}, std::pair{"rejected", p.rejected}, std::pair{"hit", p.hits},
        std::pair{"evicted", p.evicted}, std::pair{"evicted_unused", p.evicted_unused},
        std::pair{"evicted_expired", p.evicted_expired}, std::pair{"evicted_kept", p.evicted_kept},
        std::pair{"removed", p.removed}}) {
    std::map<std::string, std::string> labels = tier;
    labels["decision"] = decision;
    SetDelta(*policy_decisions_, "policy", labels, static_cast<double>(value));
  }
}

std::map<std::string, std::string> ServerMetrics::TierLabels(kvcache::TierKind kind, const std::string& name) {
  return {{"tier", std::string(kvcache::TierKindName(kind))}, {"tier_name", name}};
}

std::string ServerMetrics::Render(const scheduler::EngineStats& s, const FrontDoorStats* front) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (front != nullptr) {
      for (size_t i = 0; i < kNumLanes; ++i) {
        const std::map<std::string, std::string> lane = {{"lane", std::string(LaneName(static_cast<Lane>(i)))}};
        const LaneStats& l = front->lanes[i];
        lane_queued_->Add(lane).Set(l.queued);
        lane_running_->Add(lane).Set(l.running);
        SetDelta(*lane_requests_, "lane_requests", lane, static_cast<double>(l.accepted));
        SetDelta(*lane_rejected_, "lane_rejected", lane, static_cast<double>(l.rejected));
      }
      SetDelta(*write_timeouts_, "write_timeouts", {}, static_cast<double>(front->write_timeouts));
    }
    running_->Set(s.num_running);
    waiting_->Set(s.num_waiting);
    device_blocks_in_use_->Set(s.device_blocks_in_use);
    device_blocks_->Add({{"state", "in_use"}}).Set(s.kv.device_pool.in_use);
    device_blocks_->Add({{"state", "cached"}}).Set(s.kv.device_pool.cached);
    device_blocks_->Add({{"state", "free"}}).Set(s.kv.device_pool.free);
    for (const auto& tier : s.tiers) {
      const auto labels = TierLabels(tier.kind, tier.name);
      usage_ratio_->Add(labels).Set(tier.usage_ratio);
      used_bytes_->Add(labels).Set(static_cast<double>(tier.used_bytes));
      capacity_bytes_->Add(labels).Set(static_cast<double>(tier.capacity_bytes));
    }

    SetDelta(*cache_queries_, "queries", {}, static_cast<double>(s.kv.query_tokens));
    SetDelta(*cache_hits_, "hits", TierLabels(kvcache::TierKind::kDevice, s.tiers.empty() ? "device" : s.tiers[0].name),
             static_cast<double>(s.kv.device.tokens));
    SetDelta(*preemptions_, "preemptions", {}, static_cast<double>(s.preemptions));
    SetDelta(*engine_steps_, "steps", {}, static_cast<double>(s.steps));
    SetDelta(*engine_step_seconds_, "step_seconds", {}, Seconds(s.step_nanos));
    SetDelta(*engine_forward_seconds_, "forward_seconds", {}, Seconds(s.forward_nanos));
    SetDelta(*engine_step_tokens_, "step_tokens", {{"kind", "prefill"}}, static_cast<double>(s.step_prefill_tokens));
    SetDelta(*engine_step_tokens_, "step_tokens", {{"kind", "decode"}}, static_cast<double>(s.step_decode_tokens));
    SetDelta(*rejected_, "rejected", {}, static_cast<double>(s.rejected_queue_full));
    SetDelta(*device_evictions_, "evictions", {}, static_cast<double>(s.kv.device_pool.evictions));
    SetPolicyDecisions(TierLabels(kvcache::TierKind::kDevice, s.tiers.empty() ? "device" : s.tiers[0].name),
                       s.kv.device_pool.eviction_policy, s.kv.device_pool.policy);
    for (const auto& t : s.kv.tiers)
      if (!t.eviction_policy.empty()) SetPolicyDecisions(TierLabels(t.kind, t.name), t.eviction_policy, t.policy);
    for (const auto& t : s.kv.tiers) {
      const std::map<std::string, std::string> tier = TierLabels(t.kind, t.name);
      SetDelta(*cache_hits_, "hits", tier, static_cast<double>(t.hits.tokens));
      SetDelta(*tier_written_, "written", tier, static_cast<double>(t.bytes_down));
      SetDelta(*tier_read_, "read", tier, static_cast<double>(t.bytes_up));
      SetDelta(*tier_load_failures_, "load_failures", tier, static_cast<double>(t.loads_failed));
      SetDelta(*tier_write_failures_, "write_failures", tier, static_cast<double>(t.writes_failed));
      SetDelta(*tier_writes_refused_, "writes_refused", tier, static_cast<double>(t.writes_refused));
      SetDelta(*tier_load_seconds_, "load_seconds", tier, Seconds(t.load_nanos));
      SetDelta(*tier_deferred_, "deferred", tier, static_cast<double>(t.admissions_deferred));
      SetDelta(*tier_writebacks_, "writebacks", tier, static_cast<double>(t.writebacks));
      SetDelta(*tier_writebacks_dropped_, "writebacks_dropped", tier, static_cast<double>(t.writebacks_dropped));
      SetDelta(*tier_promoted_, "promoted", tier, static_cast<double>(t.promoted));
      SetDelta(*tier_writebacks_deferred_, "writebacks_deferred", tier, static_cast<double>(t.writebacks_deferred));
      SetDelta(*tier_corrupt_, "corrupt", tier, static_cast<double>(t.corrupt_blocks));
      ObserveDelta(*tier_load_latency_, "load_latency", tier, t.load_latency, t.load_nanos);
      ObserveDelta(*tier_write_latency_, "write_latency", tier, t.write_latency, t.write_nanos);
    }
    SetDelta(*prefetches_, "prefetch_started", {{"outcome", "started"}}, static_cast<double>(s.prefetches_started));
    SetDelta(*prefetches_, "prefetch_used", {{"outcome", "used"}}, static_cast<double>(s.prefetches_used));
    SetDelta(*prefetches_, "prefetch_released", {{"outcome", "released"}},
             static_cast<double>(s.prefetches_released));
    SetDelta(*prefetched_blocks_, "prefetched_blocks", {}, static_cast<double>(s.prefetched_blocks));
  }
  prometheus::TextSerializer serializer;
  return serializer.Serialize(registry_->Collect());
}

}  // namespace strata::server
