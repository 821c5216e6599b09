#pragma once
// The engine behind `strata router` (issue 19): an EngineClient whose
// requests run on prefill and decode instances, so the router's front end
// (server/: OpenAI HTTP, gRPC) serves them exactly as `strata serve` does.
//
// Each request is one handoff through the /internal/pd/ routes
// (cluster/pd_wire.h, docs/disaggregation.md):
//   1. pick a prefill and a decode instance by the routing policy
//      (PdRouterOptions::routing; least-loaded by default: this router's
//      own count of requests in each phase, ties in turn);
//   2. reserve the prompt's blocks at the decode instance, granted to the
//      prefill instance ("not now" → the next decode instance);
//   3. prefill: the prefill instance runs the prompt to its first token and
//      writes the blocks; its answer is the first event;
//   4. decode: the decode instance's stream of events, passed on.
// Failover: a prefill instance that fails (connection refused or reset, 5xx,
// draining) is replaced and the reservation cancelled; a decode stream that
// breaks before its final event (the instance died or aborted it) is
// resumed on another decode instance by running the handoff again: the
// prefill instance finds the prompt in its prefix cache, and the replay
// reproduces the tokens already delivered, which StreamSplicer drops (and
// checks: a replay that differs ends the request with an error rather than
// a wrong text). An instance that failed is avoided for a while.
//
// Every event carries prefill_instance and decode_instances; prompt and
// cached-token counts are the prefill instance's (cached_tokens_by_tier by
// TierKind, tier_names() below); timings are this router's clock.
//
// Threads: each request runs on its own thread of a BlockingPool (blocking
// HTTP calls; the pool keeps finished threads for the next requests), which
// is also its delivery thread: its events are in order and never two at
// once. Lookups of several candidates and a reservation beside its prefill
// run on threads of the same pool. A membership thread re-reads the
// instance list. SetHeld stops reading the decode stream (TCP backpressure
// reaches the decode instance, which holds the request). Cancel aborts the
// call in progress and cancels the reservation; the decode instance cancels
// a request whose stream closes.
//
// Thread-safety: every public method may be called from any thread.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <set>
#include <iterator>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "cluster/pd_wire.h"
#include "common/blocking_pool.h"
#include "common/http_client.h"
#include "common/status.h"
#include "scheduler/engine_client.h"
#include "scheduler/router.h"
#include "transfer/metadata.h"

namespace strata::cluster {

// Joins the attempts of one request into one stream for the client: a
// failover replays the request from its first token, and what was already
// delivered must be neither repeated nor lost.
//
// Thread-safety: a value, used by one thread.
class StreamSplicer {
 public:
  // A new attempt: its events start again from the first generated token.
  void BeginAttempt() {
    attempt_tokens_ = 0;
    attempt_text_.clear();
  }
  // Cuts from `ev` (an event of the current attempt: token ids, their
  // logprobs when present, text) what was already delivered, so that `ev`
  // holds only what is new; completion_tokens becomes the delivered count.
  // False when the attempt's tokens or text differ from what was delivered
  // at the same place (then `ev` must not be delivered).
  bool Take(scheduler::RequestOutput* ev);
  int32_t delivered_tokens() const { return static_cast<int32_t>(delivered_ids_.size()); }
  const std::string& delivered_text() const { return delivered_text_; }

 private:
  std::vector<int32_t> delivered_ids_;
  std::string delivered_text_;
  size_t attempt_tokens_ = 0;
  std::string attempt_text_;
};

struct PdRouterOptions {
  std::string model;    // the served model name: only instances registered with it are used
  HeaderList auth;      // sent on every /internal/ call (the cluster's admin token)
  int64_t lease_ms = 30000;      // a decode reservation's lease: the prefill and its writes must fit
  double call_timeout_s = 600;   // a prefill call; the longest silence of a decode stream
  int max_attempts = 4;          // handoffs per request (a failover starts another)
  int max_in_flight = 4096;      // requests at once; Submit beyond answers ResourceExhausted
  // When every decode instance answers "not now" (its pool is short), the
  // request waits (retrying with backoff) up to this long after arrival,
  // without using up an attempt; then it fails.
  std::chrono::milliseconds queue_timeout{60000};
  std::chrono::milliseconds refresh{500};   // how often the instance list is re-read
  std::chrono::milliseconds avoid{5000};    // an instance that failed is not picked for this long
  // How instances are chosen (scheduler/router.h): the prefill instance by
  // this policy (longest-prefix and ttft ask each candidate's
  // /internal/pd/lookup); the decode instance by Router::PickDecode (ttft:
  // room for the prompt in its KV pool, then the lowest time per output
  // token, then the most of the prompt on its device; others: as prefill).
  scheduler::RoutingPolicy routing = scheduler::RoutingPolicy::kLeastLoaded;
  // Service levels (0 = none). A request whose best predicted time to
  // first token (over the prefill candidates: PredictTtftSeconds from
  // their lookups) or time per output token (the decode candidates'
  // recent decode step time) exceeds its level is refused at once: a final
  // kError event, ResourceExhausted, message starting with
  // scheduler::kSloUnattainable and giving the figures. Unknown figures
  // (no rate measured yet) admit.
  double slo_ttft_seconds = 0;
  double slo_tpot_seconds = 0;
  // Reserve at the decode instance while the prefill runs (the grants
  // follow the prefill request: GrantsMessage), so that the reservation's
  // round trip is not part of the time to first token. Not towards a
  // decode instance that answered "not now" within `avoid` (the prefill
  // would likely be wasted), nor after one did in this request.
  bool overlap_reserve = true;
  // Calibrated rates (`strata router --calibration F`) of instances that do
  // not report measured ones yet (a lookup answering 0), by instance name,
  // else `default_calibration` (zeros: none).
  std::map<std::string, scheduler::CalibratedRates> calibration;
  scheduler::CalibratedRates default_calibration;
};

// Upper bounds of the buckets of observed ÷ predicted time to first token
// (PdRouterStats::ttft_ratio_buckets; one more bucket for the rest).
inline constexpr double kTtftRatioBounds[] = {0.25, 0.5, 0.75, 0.9, 1.1, 1.33, 2, 4};

struct PdRouterStats {
  uint64_t requests = 0;            // submitted
  uint64_t handoffs = 0;            // prefills answered and handed to a decode instance
  uint64_t decode_failovers = 0;    // decode streams that broke and were resumed elsewhere
  uint64_t prefill_failovers = 0;   // prefill calls that failed and were retried elsewhere
  uint64_t not_now = 0;             // reservations a decode instance refused for now (503)
  uint64_t replay_mismatches = 0;   // resumed streams that differed from what was delivered (error)
  uint64_t no_instance = 0;         // requests that failed: no instance could serve them
  uint64_t refused_slo_ttft = 0;    // refused: predicted TTFT over the SLO
  uint64_t refused_slo_tpot = 0;    // refused: predicted TPOT over the SLO
  // Observed ÷ predicted TTFT of requests whose prediction was known:
  // counts per kTtftRatioBounds bucket (+1 for larger), their sum and count.
  std::vector<uint64_t> ttft_ratio_buckets = std::vector<uint64_t>(std::size(kTtftRatioBounds) + 1, 0);
  double ttft_ratio_sum = 0;
  uint64_t ttft_ratio_count = 0;
  std::map<std::string, uint64_t> finished_by_reason;
  int in_flight = 0;
  std::map<std::string, uint64_t> prefills_by_instance;  // prefill calls answered 200
  std::map<std::string, uint64_t> decodes_by_instance;   // decode streams started
};

// One instance as the router sees it.
struct PdInstance {
  std::string name;
  std::string role;  // prefill | decode | both
  std::string host;
  int port = 0;
  int prefilling = 0;  // this router's requests in its prefill phase there
  int decoding = 0;    // ... in their decode phase there
  int64_t prefill_tokens = 0;  // prompt tokens this router sent it to compute, not yet answered
  // Learned correction of its TTFT predictions (RouteCandidate::ttft_scale):
  // moved towards observed ÷ predicted after each first token it gives.
  double ttft_scale = 1;
  // The rates its last lookup answer reported (0 = none yet): what the
  // router assumes when a lookup does not answer in time, before its
  // calibration (PdRouterOptions::calibration).
  double reported_prefill_tokens_per_s = 0;
  double reported_decode_step_seconds = 0;
  std::chrono::steady_clock::time_point avoid_until{};
  std::chrono::steady_clock::time_point not_now_until{};  // a reservation was refused for now: reserve first
};

using ListInstancesFn = std::function<Result<std::vector<transfer::InstanceInfo>>()>;

class PdRouter final : public scheduler::EngineClient {
 public:
  // `list` is called from the membership thread (MetadataClient::List).
  PdRouter(ListInstancesFn list, PdRouterOptions options);
  ~PdRouter() override;  // Stop()
  PdRouter(const PdRouter&) = delete;
  PdRouter& operator=(const PdRouter&) = delete;

  // EngineClient. Submit: InvalidArgument for an empty prompt,
  // ResourceExhausted beyond max_in_flight, Unavailable while draining or
  // stopped. A request no instance can serve ends with a final kError
  // event (status Unavailable) naming why.
  Result<RequestId> Submit(scheduler::EngineRequest request, scheduler::OutputSink sink) override;
  void Cancel(RequestId id) override;
  void SetHeld(RequestId id, bool held) override;
  scheduler::EngineStats Stats() const override;
  const std::vector<std::string>& tier_names() const override { return tier_names_; }
  const std::vector<kvcache::TierKind>& tier_kinds() const override { return tier_kinds_; }
  // The router holds no cache: both answer false (ask the instances).
  bool LookupCache(std::vector<int32_t>, std::string, std::function<void(const scheduler::CacheMatch&)>) override {
    return false;
  }
  bool FlushCache(scheduler::CacheFlush, std::function<void(Result<kvcache::FlushResult>)>) override {
    return false;
  }

  // New requests are refused (Unavailable); those running go on.
  void SetDraining() { draining_.store(true); }
  // Waits up to `grace_seconds` for the requests running, then cancels the
  // rest (their final "abort" events run) and joins every thread.
  void Stop(double grace_seconds = 0);
  // Re-reads the instance list now (the membership thread does it every
  // `refresh`); the first read happens in the constructor.
  void Refresh();

  PdRouterStats stats() const;
  std::vector<PdInstance> instances() const;

 private:
  struct Flight;
  enum class Phase { kPrefill, kDecode };
  void Run(const std::shared_ptr<Flight>& f);
  // One handoff; true when the request ended (delivered its final event).
  // `not_now`: decode instances that refused for now in this round; when
  // they are all that is left, Attempt waits and starts a new round
  // (`*free_retry`: the attempt does not count).
  struct Tried {
    std::set<std::string> prefill, decode, not_now;
    int backoff_ms = 10;
    bool reserve_first = false;  // a reservation was refused for now: no more prefills beside reservations
  };
  bool Attempt(Flight& f, Tried* tried, bool* free_retry, Status* why);
  // The reservation at `d` (reservation `rid`) failed with `r` / `reserve`:
  // undoes the picks and says what Attempt returns.
  bool ReserveFailed(Flight& f, Tried* tried, const PdInstance& p, const PdInstance& d, uint64_t rid,
                     const Result<HttpResponse>& r, const Result<ReserveReply>& reserve, bool* free_retry,
                     Status* why);
  // Reserves at `d` and sends the grants (or their absence) to `p`'s
  // prefill with key `rid`; runs beside the prefill call.
  void ReserveBeside(Flight& f, const PdInstance& p, const PdInstance& d, const ReserveRequest& q,
                     Result<HttpResponse>* r, Result<ReserveReply>* reserve);
  bool Decode(Flight& f, const PdInstance& d, const std::string& body, Status* why);
  // Picks an instance for `phase` by the routing policy among those not in
  // `exclude`, preferring ones not avoided and not `other` (the other
  // phase's instance); asks the candidates' /internal/pd/lookup when the
  // policy reads caches (decode: the device blocks held). Counts it as
  // loaded. False: no candidate.
  // `predicted` (optional): {best over the candidates, the chosen one's}
  // prediction (prefill: TTFT seconds; decode: seconds per output token),
  // -1 where not known.
  bool Pick(Flight& f, Phase phase, const std::set<std::string>& exclude, const std::string& other,
            PdInstance* out, std::pair<double, double>* predicted = nullptr);
  // Asks every candidate's /internal/pd/lookup at once (a pool thread each
  // beyond the first, on pooled connections; 1 s timeout; one that does not
  // answer keeps what `rc` had) and fills `rc` in. Called without mu_ held.
  void LookUp(const Flight& f, Phase phase, const std::vector<PdInstance>& cands,
              std::vector<scheduler::RouteCandidate>* rc);
  scheduler::CalibratedRates Calibrated(const std::string& name) const;
  // Undoes Pick's count; prefill: `tokens` is the flight's routed_tokens.
  void Unload(Phase phase, const std::string& name, int64_t tokens = 0);
  // A first token at `observed` seconds whose prediction on `name` was
  // `predicted` (made with `scale`): the instance's ttft_scale moves
  // towards scale x observed / predicted (an exponential average, kept
  // within [1/4, 8]).
  void Learn(const std::string& name, double predicted, double scale, double observed);
  void Avoid(const std::string& name);
  // A blocking call on the flight's connection (aborted by Cancel): a kept-
  // alive connection to `to` from the pool when one is idle (it goes back
  // after a whole response, unless the call was aborted).
  Result<HttpResponse> Call(Flight& f, const PdInstance& to, const std::string& path, const std::string& body,
                            HttpDataFn on_data = nullptr);
  void CancelReservation(const PdInstance& d, uint64_t id);
  // The connection pool: an idle kept-alive connection to host:port, or a
  // new one; Return keeps at most kIdlePerInstance per address.
  std::shared_ptr<HttpConnection> TakeConnection(const std::string& host, int port);
  void ReturnConnection(const std::string& host, int port, std::shared_ptr<HttpConnection> conn);
  static constexpr size_t kIdlePerInstance = 16;
  // Delivers `ev` through the splicer with the router's fields set. False
  // when the replay differed (the flight then ends with an error).
  bool Deliver(Flight& f, scheduler::RequestOutput ev);
  void Final(Flight& f, FinishReason reason, const Status& status);
  // True (and `why` says so) when the best predictions miss an SLO.
  bool Refused(Flight& f, double best_ttft, double best_tpot, Status* why);
  void MembershipLoop();

  const ListInstancesFn list_;
  const PdRouterOptions options_;
  const std::vector<std::string> tier_names_;
  const std::vector<kvcache::TierKind> tier_kinds_;
  std::atomic<bool> draining_{false};
  std::atomic<uint64_t> next_reservation_;

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stopping_ = false;
  uint64_t next_id_ = 1;
  scheduler::Router prefill_router_, decode_router_;  // mu_ (their turns)
  std::vector<PdInstance> instances_;
  std::map<uint64_t, std::shared_ptr<Flight>> flights_;
  PdRouterStats stats_;
  std::thread membership_;
  std::mutex pool_mu_;  // idle_
  std::map<std::string, std::vector<std::shared_ptr<HttpConnection>>> idle_;  // by "host:port"
  // Runs the flights, lookups and reservations. Last: destroyed first, so
  // that whatever still runs there finds every other member alive.
  BlockingPool workers_{64};
};

}  // namespace strata::cluster
