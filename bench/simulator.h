#pragma once
// `strata bench simulate`: a whole cluster replaying a trace in virtual time.
//
// Each instance is the real serving code: a scheduler::Engine (continuous
// batching, chunked prefill, preemption) over a metadata-only
// kvcache::KvManager (the real prefix index, LRU eviction, write-through and
// load policy) with SimStore lower tiers, all on one kvcache::ManualClock. A
// StepRunner stands in for the model: it returns zero logits (greedy picks
// token 0; requests use ignore_eos, so each runs exactly its output length)
// and reports the step's cost from the CostModel.
//
// Event loop: requests are released at their trace timestamps (x time_scale)
// to the router component live routers use (scheduler::Router: round-robin,
// least-loaded, longest cached prefix by KvManager::Match, or ttft), and the
// instance that becomes free earliest takes the
// next step: the clock is set to its free time, Step() runs, and the instance
// is busy until that time + the step's cost, when the step's tokens count as
// produced. An instance waiting only on tier loads wakes at the load's
// completion.
//
// Disaggregated clusters (ClusterConfig::prefill_instances), as `strata
// router` runs them live: at release the router picks the decode instance
// (Router::PickDecode), which reserves the prompt's blocks
// (KvManager::Reserve; with no room at any decode instance the request waits
// until a decode finishes), then the prefill instance (Router::Pick over the
// prefill instances), which runs the prompt with max_tokens 1: its first
// token is the request's first token. The blocks the decode instance lacks
// arrive there after the cluster's transfer latency plus their bytes at its
// transfer rate; the continuation (prompt + first token, the other output
// tokens) then runs on the decode instance over the reserved blocks, which
// are released at its first event, as live. --serial releases a request only when the previous finished
// (at max(its timestamp, that finish)). --concurrency N releases the next
// request whenever one of N slots is free (at the finish that freed it).
//
// hit_ratio_blocks: hash ids served from cache / all hash ids. An id is served
// when every token of it lies in cached blocks at admission (and every id
// before it is served); the trailing id of a prompt counts when all of its
// full blocks are cached (its partial last block can never be). The engine
// always recomputes the last prompt block, so for a prompt seen whole before
// the simulator asks the KV manager (at release) whether that block was
// cached too. With --unlimited-cache --serial and a block size dividing
// tokens_per_hash_id, this equals IdealHitRatio exactly (tests assert it for
// tokens_per_hash_id 16, block 16: one block per hash id).
//
// Thread-safety: Simulate is self-contained (its own clock and instances);
// concurrent calls are independent.

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "bench/cost_model.h"
#include "bench/trace.h"
#include "common/status.h"

namespace strata::bench {

struct SimOptions {
  ClusterConfig cluster = DefaultCluster();
  // Device pools big enough never to evict (sized from the trace), no lower
  // tiers. Metadata only, so it costs little memory.
  bool unlimited_cache = false;
  bool serial = false;
  // Closed loop, as `strata bench run --concurrency N`: N users, each sends
  // the next request in trace order as soon as its previous one finished
  // (timestamps ignored). 0 = open loop at the trace's timestamps. Excludes
  // `serial` (which keeps the timestamps).
  int concurrency = 0;
  int tokens_per_hash_id = 0;  // 0 = real lengths (see ScaleRequest)
  double time_scale = 1.0;     // trace timestamps are multiplied by it
  int64_t max_requests = 0;    // the first N requests; 0 = all
  int max_model_len = 0;       // prompt + output above it are skipped and counted; 0 = no limit
  int max_waiting = 1024;      // per instance, as `strata serve --max-waiting`
  double slo_ttft_s = 0, slo_tpot_s = 0;  // goodput SLOs; 0 = not set
  // Token ids: HashIdTokens(id, n, vocab_size, first_id). 512 ids over 16-token
  // blocks make accidental equal blocks (16 draws from 509) impossible in practice.
  int vocab_size = 512;
  int first_id = 3;
};

struct SimRequestRecord {
  int instance = -1;         // where it was prefilled (colocated: where it ran)
  int decode_instance = -1;  // disaggregated: where it was decoded
  double arrival_s = 0, first_token_s = -1, finish_s = -1;
  int32_t prompt_tokens = 0, output_tokens = 0, cached_tokens = 0;
  std::vector<int32_t> cached_tokens_by_tier;  // device, then lower tiers
  uint32_t hash_ids = 0, served_ids = 0, ideal_ids = 0;
  std::string finish_reason;  // "length", "rejected", "error", "skipped" (context or capacity)
};

struct SimTier {
  std::string name;
  uint64_t hit_tokens = 0;  // prompt tokens served from this tier (responses)
  uint64_t hit_blocks = 0;  // KvManagerStats (device shares, completed loads)
  uint64_t capacity_bytes = 0, used_bytes = 0, evictions = 0;
  uint64_t bytes_written = 0;  // device → this tier (completed writes; 0 for device)
};

struct SimResult {
  int64_t requests = 0;  // finished successfully
  int64_t rejected = 0, errors = 0, skipped_over_context = 0;
  // Requests whose prompt + output needs more blocks than a device pool has.
  int64_t skipped_over_capacity = 0;
  uint64_t total_ids = 0, served_ids = 0;
  double hit_ratio_blocks = 0;
  double ideal_hit_ratio_blocks = 0;  // IdealHitRatio over the requests run
  // The ideal less what block granularity forbids: a trailing id without a
  // full block (real lengths, or a block size not dividing
  // tokens_per_hash_id) can never be served. Equal to the ideal when every
  // id is whole blocks.
  double achievable_hit_ratio_blocks = 0;
  // achievable − achieved when not serial (0 when serial). With bounded
  // tiers it includes what capacity lost; with --unlimited-cache it is
  // overlap alone.
  double lost_to_overlap = 0;
  // Offline references (bench/cache_reference.h): one flat cache of the
  // cluster's total size (every instance's device + host + disk blocks, in
  // hash-id units of tokens_per_hash_id / block_size blocks), serial order,
  // the same semantics as hit_ratio_blocks, with LRU and with Belady MIN.
  double lru_hit_ratio_blocks = 0;
  double belady_hit_ratio_blocks = 0;
  uint64_t reference_capacity_ids = 0;
  uint64_t prompt_tokens = 0, cached_tokens = 0, completion_tokens = 0;
  double hit_ratio_tokens = 0;
  double ttft_mean_s = 0, ttft_p50_s = 0, ttft_p90_s = 0, ttft_p99_s = 0;
  double tpot_p50_s = 0, tpot_p99_s = 0, e2e_p50_s = 0, e2e_p99_s = 0;
  double duration_s = 0;  // first release to last finish (virtual)
  double throughput_requests_per_s = 0;
  double throughput_tokens_per_s = 0;  // generated tokens / duration
  double total_tokens_per_s = 0;       // (prompt + generated) / duration
  int64_t goodput_requests = 0;
  double goodput_rps = 0;  // requests meeting the SLOs / duration (all finished when none set)
  uint64_t steps = 0, preemptions = 0;
  // Disaggregated: KV blocks sent from prefill to decode instances (the
  // blocks a decode instance already held are not sent).
  uint64_t handoff_blocks = 0;
  // Disaggregated: requests that waited for room at a decode instance.
  uint64_t decode_waits = 0;
  // Disaggregated: reservations released before their continuation ran
  // because every queued continuation of a decode instance waited for
  // blocks the others' reservations held (as live reservations expire).
  uint64_t reservations_expired = 0;
  double busy_s = 0;  // sum of every step's cost over all instances (live: strata_engine_forward_seconds_total)
  std::vector<SimTier> tiers;  // device, host, disk (those configured), summed over instances
  double wall_seconds = 0;     // real time the simulation took
  std::vector<SimRequestRecord> records;
};

// Runs the trace (already parsed) through the cluster. Errors: a cluster that
// cannot be built (e.g. no device block), a failed engine step, a stalled
// simulation (a bug).
Result<SimResult> Simulate(const std::vector<TraceRequest>& trace, const SimOptions& options);

// The report: one JSON object (the SimResult's figures, the options and the
// cluster; "curve" with one entry per sweep point when `sweep` is non-empty,
// each with `sweep_key` = its capacity). Records are left out unless
// `with_records`.
std::string SimReportJson(const SimOptions& options, const SimResult& result, const std::string& sweep_key,
                          const std::vector<std::pair<uint64_t, SimResult>>& sweep, bool with_records);
// A few readable lines (and the curve as a table).
std::string SimReportText(const SimOptions& options, const SimResult& result, const std::string& sweep_key,
                          const std::vector<std::pair<uint64_t, SimResult>>& sweep);

}  // namespace strata::bench
