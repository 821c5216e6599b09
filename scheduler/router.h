#pragma once
// Routing logic with no I/O, where a router can use it: the cost of one
// engine step (a batched forward pass) and the policies that pick the
// instance a request goes to. The simulator (bench/simulator.h) calls it
// today; the KV-aware router (a later issue) builds on it. Reading cost
// files and cluster files stays with the simulator's command (bench/).
//
// Thread-safety: CostModel and the name functions are pure; a Router is
// used by one thread (it keeps the round-robin turn).

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "model/backend/backend.h"

namespace strata::scheduler {

// Step cost, in seconds, for a batch of prefill chunks and decode tokens:
//   prefill part = a + b * T + c * sum over chunks of (t * ctx)
//       T = prompt tokens in the step; a chunk of t tokens starting at
//       position p has ctx = p + t / 2 (the mean context each of its tokens
//       attends to)
//   decode part  = d + e * B + f * sum over decode sequences of context
//       B = decode sequences (one token each); context = positions attended
//   step = max(a, d) + (prefill part - a) + (decode part - d), each part only
//   when present (one forward pass pays one fixed overhead).
// A one-token "chunk" (the last prompt token) counts as decode.
struct CostModel {
  double a = 0, b = 0, c = 0;  // prefill: fixed s, s per token, s per token x context
  double d = 0, e = 0, f = 0;  // decode: fixed s, s per sequence, s per context position

  // Seconds for one forward pass over `batch` (ForwardSeq as the engine
  // builds it: tokens, start_pos). 0 for an empty batch.
  double StepSeconds(std::span<const ForwardSeq> batch) const;
  // Prompt tokens per second of a long prefill at short context (1 / b), for
  // the KV manager's "load or recompute" estimate; 0 when b is 0.
  double recompute_tokens_per_s() const { return b > 0 ? 1.0 / b : 0.0; }
  // Prompt tokens per second of prefill steps of `chunk` tokens from
  // position 0 (what an engine's measured prefill rate averages over);
  // 0 when the model has no prefill terms.
  double PrefillTokensPerS(int chunk) const;
  // Seconds of a decode-only step of `batch` sequences at `context`
  // positions each; 0 when the model has no decode terms.
  double DecodeStepSeconds(int batch, int context) const;
};

// The figures a router and an engine take from a calibration
// (`strata bench calibrate`) before live steps measure them: prefill steps
// of 512-token chunks, decode steps of one sequence at 512 positions.
struct CalibratedRates {
  double prefill_tokens_per_s = 0;
  double decode_step_seconds = 0;
};
CalibratedRates RatesFromCostModel(const CostModel& m);

enum class RoutingPolicy {
  kRoundRobin,     // "round-robin": instances in turn
  kLongestPrefix,  // "longest-prefix": where most of the prompt is cached
  kLeastLoaded,    // "least-loaded": the fewest unfinished requests
  kTtft,           // "ttft": the lowest predicted time to first token (PredictTtftSeconds)
};

// The one table of policy names (config files, flags, reports).
std::string_view RoutingPolicyName(RoutingPolicy p);
std::optional<RoutingPolicy> RoutingPolicyFromName(std::string_view name);
// "round-robin, longest-prefix, least-loaded, ttft", for error messages.
std::string RoutingPolicyNames();

// What the router knows about one instance when a request arrives.
struct RouteCandidate {
  int32_t cached_tokens = 0;  // prompt tokens the instance holds (any tier); longest-prefix and ttft
  int unfinished = 0;         // requests it has not finished
  // ttft only: prompt tokens of this request it would compute (the prompt
  // less cached_tokens), prompt tokens queued ahead of it there, its
  // prefill rate (tokens/s; 0 = not known yet), and the seconds to fetch
  // the cached part from where it lies (lower tiers, peers).
  int64_t uncached_tokens = 0;
  int64_t queue_tokens = 0;
  double prefill_tokens_per_s = 0;
  double load_seconds = 0;
  // Seconds of the queue's work already done: the instance's running step
  // has run this long (its tokens stay queued until it ends). Negative:
  // work owed beyond queue_tokens (the simulator's step already taken
  // from the queue but not yet over).
  double queue_done_seconds = 0;
  // A correction learned from this instance's recent requests (observed ÷
  // predicted time to first token; 1 = none): what the queue-and-rate model
  // misses (contention, batching, transfer waits).
  double ttft_scale = 1;
  // Decode choice (PickDecode) under ttft: the seconds per output token it
  // runs at now (0 = not known), and the device KV tokens it has free
  // (-1 = not known).
  double tpot_seconds = 0;
  int64_t free_kv_tokens = -1;
};

// Predicted time to first token at `c`:
//   (max(0, queue_tokens / rate - queue_done_seconds) + uncached_tokens / rate)
//     * ttft_scale + load_seconds,
// with `c`'s prefill rate, or `fallback_rate` when it has none; a negative
// value when neither is known.
double PredictTtftSeconds(const RouteCandidate& c, double fallback_rate);
// The mean prefill rate of the candidates that know theirs (0 when none
// does): the fallback rate for the others.
double MeanKnownPrefillRate(std::span<const RouteCandidate> candidates);

class Router {
 public:
  explicit Router(RoutingPolicy policy) : policy_(policy) {}
  RoutingPolicy policy() const { return policy_; }
  // Whether Pick reads cached_tokens (else the caller need not ask the
  // instances' caches) and, for ttft, the other candidate fields.
  bool needs_cached_tokens() const {
    return policy_ == RoutingPolicy::kLongestPrefix || policy_ == RoutingPolicy::kTtft;
  }

  // The index of the instance for the next request. round-robin: in turn.
  // longest-prefix: the most cached tokens; a tie goes to the fewer
  // unfinished requests, then to the first in turn order. least-loaded:
  // the fewest unfinished, ties in turn. ttft: the lowest
  // PredictTtftSeconds (an unknown rate takes the mean of the known ones;
  // none known: least-loaded); ties as longest-prefix. Every call advances
  // the turn. REQUIRES: candidates not empty.
  size_t Pick(std::span<const RouteCandidate> candidates);
  // The decode instance for a request needing `need_kv_tokens` of KV. ttft:
  // candidates whose free KV holds it (or is unknown) before the rest; among
  // them the lowest tpot_seconds (unknown takes the mean of the known; none
  // known: the fewest unfinished); ties to the most cached_tokens (device
  // blocks it need not be sent), then the fewest unfinished, then turn.
  // Other policies: Pick. REQUIRES: candidates not empty.
  size_t PickDecode(std::span<const RouteCandidate> candidates, int64_t need_kv_tokens);

 private:
  RoutingPolicy policy_;
  size_t turn_ = 0;
};

}  // namespace strata::scheduler
