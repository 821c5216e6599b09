#pragma once
// What a server needs from an engine, and nothing of the KV manager's
// insides: submit a request and receive its stream of outputs, cancel it,
// read statistics and tier usage, look up and flush the cache. The
// in-process Engine (scheduler/engine.h) implements it; a remote engine (a
// router in front of prefill and decode instances) implements it over the
// network. The server (server/) depends on this header only.
//
// The contract every implementation keeps:
// - Nothing blocks the caller: Submit, Cancel, LookupCache and FlushCache
//   queue work and return; Stats returns a snapshot.
// - A request's outputs arrive on the engine's delivery thread (the
//   in-process engine's stepping thread), in order, never inside Submit and
//   never two at once for one request. Sinks and callbacks run there and
//   must not block.
// - Every accepted request's stream ends with exactly one final event
//   (finished = true): stop, length, paused, error, or abort. Cancel before
//   its first token, while it runs, or twice gives one final "abort" event;
//   Cancel after the final event (or of an unknown id) does nothing.
//
// Thread-safety: every method may be called from any thread.

#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "common/strong_id.h"
#include "kvcache/kv_stats.h"
#include "kvcache/tier_kind.h"
#include "model/finish_reason.h"
#include "model/output_processor.h"
#include "model/sampler.h"

namespace strata::scheduler {

struct EngineRequest {
  std::vector<int32_t> prompt;  // >= 1 token, ids in the vocabulary
  // >= 1; prompt + max_tokens <= context length (callers resolve defaults
  // with ResolveMaxTokens first).
  int max_tokens = 16;
  SamplingParams sampling;                 // validated by Submit
  std::vector<std::string> stop;           // stop strings (not in the text)
  std::vector<int32_t> stop_token_ids;     // in addition to the tokenizer's end-of-generation ids
  bool ignore_eos = false;
  std::string cache_salt;                  // tenant: blocks are shared only within one salt
  // > 0: keep this request's prompt blocks cached at least this long after
  // each use, in every tier (eviction takes other blocks first); 0 = no ask.
  double cache_ttl_seconds = 0;
  int priority = 0;                        // lower runs first; ties: arrival order
  int64_t deadline_nanos = 0;              // Clock time after which it is cancelled; 0 = none
  // Continue a request another engine began (model/output_processor.h):
  // the tokens it generated and its output state. Empty = a new request.
  // The prompt, sampling, stop conditions and max_tokens must be the ones
  // that engine was given; max_tokens counts the continuation's tokens too.
  Continuation continuation;
  // > 0: stop after this many generated tokens (a continuation's included)
  // unless finished before, with FinishReason::kPaused and the final event's
  // `continuation` set, to be continued elsewhere. 0 = run to the end.
  int pause_after = 0;
  // Optional: called on the delivery thread after each step that computed
  // positions of this request (and committed their full blocks), with the
  // request's id (known here even before Submit has returned to its
  // caller) and how many positions hold KV now. The prefill side of a
  // handoff sends each block as soon as it is full. Must not block. Not
  // sent over the wire.
  std::function<void(RequestId id, int32_t computed)> on_computed;
};

// Clock times (nanoseconds, kvcache::Clock) of a request's life; 0 = not yet.
struct RequestTimings {
  int64_t arrival = 0;      // Submit
  int64_t scheduled = 0;    // first admitted to running
  int64_t first_token = 0;  // first generated token sampled
  int64_t last_token = 0;   // latest generated token sampled
  int64_t finished = 0;
  double prefill_seconds = 0;  // scheduled → first token
  double decode_seconds = 0;   // first token → finished
  double queue_seconds = 0;    // arrival → scheduled
};

// One event for a request's sink. Tokens and text are deltas since the
// previous event; the last event has finished = true.
struct RequestOutput {
  RequestId id{0};
  std::vector<int32_t> token_ids;       // generated since the last event
  std::string text;                     // final text since the last event (stop strings cut, EOS not shown)
  std::vector<SampleResult> logprobs;   // one per token in token_ids when sampling.logprobs / top_logprobs
  bool finished = false;
  // kStop (EOS, stop id or stop string), kLength (max_tokens), kAbort
  // (cancelled, deadline, engine stopping), kError (see status); kNone
  // until finished.
  FinishReason finish_reason = FinishReason::kNone;
  Status status;                        // the error for kError / kAbort, else OK
  int32_t prompt_tokens = 0;
  int32_t completion_tokens = 0;        // generated so far (all events)
  // Prompt tokens whose KV came from cache, and the split by tier:
  // index kvcache::kDeviceTier (0) = device, i + 1 = lower tier i
  // (names in Engine::tier_names(), kinds in tier_kinds()). Known from the
  // first event on.
  int32_t cached_tokens = 0;
  std::vector<int32_t> cached_tokens_by_tier;
  int32_t preemptions = 0;
  RequestTimings timings;               // complete in the final event
  // Set in the final event of a kPaused request only: give it to
  // EngineRequest::continuation to continue.
  std::optional<Continuation> continuation;
  // Which instances served the request, set by a router in front of
  // prefill and decode instances (cluster/pd_router.h) on every event; empty
  // in-process. Not sent over the wire.
  std::string prefill_instance;
  std::vector<std::string> decode_instances;  // in order: a failover adds one
};

using OutputSink = std::function<void(RequestOutput&&)>;

// A request refused because no instance is predicted to meet its service
// level (a router's --slo) ends with kError and a ResourceExhausted status
// whose message starts with this; front ends answer 429 with this code.
inline constexpr std::string_view kSloUnattainable = "slo_unattainable";

struct TierUsage {
  std::string name;             // "device", then the configured lower tiers' names
  kvcache::TierKind kind = kvcache::TierKind::kDevice;
  uint64_t capacity_bytes = 0;
  uint64_t used_bytes = 0;      // device: blocks referenced by requests (cached free blocks count as free, as in vLLM)
  double usage_ratio = 0;       // used / capacity (0 when capacity 0)
};

// A consistent snapshot, refreshed after every step.
struct EngineStats {
  int num_running = 0;   // admitted (prefill, decode or loading)
  int num_waiting = 0;   // submitted, not yet admitted
  bool draining = false;
  uint64_t steps = 0;  // forward passes
  // Wall time of the steps that ran a forward pass (scheduling, the pass,
  // sampling and events), and of the passes alone (StepRunner::Forward).
  uint64_t step_nanos = 0;
  uint64_t forward_nanos = 0;
  // Tokens those passes computed: prompt chunks of 2+ tokens, and one-token
  // entries (decode, or a prompt's last token), as the cost model counts them.
  uint64_t step_prefill_tokens = 0;
  uint64_t step_decode_tokens = 0;
  // What a router predicts this instance's time to first token from:
  // prompt tokens of waiting and running requests still to compute (cached
  // prefixes not subtracted; requests submitted since the last step
  // included), and the recent prefill rate (prompt tokens
  // per second of the steps that computed prompt chunks, an exponential
  // average; 0 until one ran).
  int64_t pending_prefill_tokens = 0;
  double prefill_tokens_per_s = 0;
  // Seconds of a recent step that computed decode tokens only (an
  // exponential average; 0 until one ran): the time per output token at
  // the current batch.
  double decode_step_seconds = 0;
  // The same two figures from the instance's calibration
  // (EngineOptions::calibrated_*; 0 = none): they stand in for the
  // measured ones until a step measures them.
  double calibrated_prefill_tokens_per_s = 0;
  double calibrated_decode_step_seconds = 0;
  // How long the step running now has run (0 when none runs): the part of
  // pending_prefill_tokens' time already spent (they are counted until the
  // step that computes them ends).
  double step_elapsed_seconds = 0;
  uint64_t preemptions = 0;
  uint64_t prompt_tokens = 0;      // of finished and running requests, counted at admission
  uint64_t generation_tokens = 0;
  uint64_t rejected_queue_full = 0;
  std::map<std::string, uint64_t> finished_by_reason;  // stop, length, abort, error
  int32_t device_blocks_in_use = 0;  // referenced by a request
  std::vector<TierUsage> tiers;      // device first, then the lower tiers in chain order
  // Prefetch ahead of admission (see Engine).
  uint64_t prefetches_started = 0;   // waiting requests that began loading their prefix
  uint64_t prefetched_blocks = 0;    // lower-tier blocks those prefetches queued for loading
  uint64_t prefetches_used = 0;      // admitted with their prefetched blocks
  uint64_t prefetches_released = 0;  // prefetches given back before admission (pool pressure)
  int num_prefetching = 0;           // waiting requests holding prefetched blocks now
  kvcache::KvManagerStats kv;
};

// How much of a prompt is cached, by tier (EngineClient::LookupCache).
struct CacheMatch {
  int32_t prompt_tokens = 0;
  int32_t cached_tokens = 0;            // leading prompt tokens with KV somewhere (whole blocks)
  int32_t block_size = 0;
  std::vector<int32_t> tokens_by_tier;  // by tier index (tier_names()); sums to cached_tokens
  // Estimated seconds to load the lower-tier part into the device pool
  // (KvManager::EstimateLoadSeconds; 0 when all on device or rates unknown).
  double load_seconds = 0;
};

// What FlushCache empties: the device tier and/or lower tiers by chain
// index (lower[i] is tier i + 1); blocks of every cache salt, or only of
// unsalted requests.
struct CacheFlush {
  bool device = true;
  std::vector<bool> lower;
  bool all_namespaces = false;
};

class EngineClient {
 public:
  virtual ~EngineClient() = default;

  // Queues a request; its events go to `sink` (see the top). Errors:
  // InvalidArgument (bad prompt, max_tokens, sampling params, continuation;
  // nothing queued), ResourceExhausted (waiting queue full), Unavailable
  // (draining or stopped).
  virtual Result<RequestId> Submit(EngineRequest request, OutputSink sink) = 0;
  // See the top: one final "abort" event, at most, within one engine step.
  virtual void Cancel(RequestId id) = 0;
  // Backpressure: a held request keeps its place and its KV blocks but is
  // not scheduled, so it generates nothing until released (its consumer
  // cannot take more output now). Takes effect within one engine step;
  // unknown or finished ids are ignored. Cancel still works while held.
  virtual void SetHeld(RequestId id, bool held) = 0;
  // A consistent snapshot; `tiers` is the usage of every tier.
  virtual EngineStats Stats() const = 0;
  // Tier names and kinds by index: "device" first, then the lower tiers in
  // chain order. Fixed for the engine's life.
  virtual const std::vector<std::string>& tier_names() const = 0;
  virtual const std::vector<kvcache::TierKind>& tier_kinds() const = 0;
  // `done` gets how much of `tokens` is cached for `cache_salt`: on the
  // caller's thread, inside this call, when the engine can answer at once
  // (the in-process Engine between its forward passes' bookkeeping: a
  // lookup never waits for a step to end), else later on the delivery
  // thread. False (and `done` is never called) once the engine is
  // stopping.
  virtual bool LookupCache(std::vector<int32_t> tokens, std::string cache_salt,
                           std::function<void(const CacheMatch&)> done) = 0;
  // Empties cached blocks no request uses; `done` gets the blocks removed
  // per tier, on the delivery thread. False (and `done` is never called)
  // once the engine is stopping.
  virtual bool FlushCache(CacheFlush what, std::function<void(Result<kvcache::FlushResult>)> done) = 0;
};

}  // namespace strata::scheduler
