#pragma once
// One run of `strata bench simulate`, for Simulate (bench/simulator.cc) only.
// Simulate checks the options and settles what the run needs (SimPlan);
// RunSimulation builds the simulated cluster from it, replays the requests
// through it in virtual time (bench/simulator.h describes the model) and
// sums up the figures.
//
// Ownership: RunSimulation takes the plan; it builds and owns everything it
// simulates (its clock and the instances with their engines, KV managers and
// stores) and destroys all of it, and the plan, before it returns. It keeps
// no reference to `o` after returning.
//
// Thread-safety: runs on the calling thread only; concurrent calls (with
// their own plans) are independent.

#include <chrono>
#include <cstdint>
#include <memory>
#include <vector>

#include "bench/simulator.h"
#include "bench/trace.h"
#include "common/status.h"
#include "kvcache/tier_registry.h"
#include "model/tokenizer/tokenizer.h"

namespace strata::bench::internal {

struct SimPlan {
  std::vector<TraceRequest> head;  // the requests run: the trace's first o.max_requests
  std::vector<uint32_t> ideal;     // IdealHitIdsPerRequest(head)
  std::unique_ptr<Tokenizer> tokenizer;       // the synthetic vocabulary; every engine's
  int64_t device_blocks = 0;                  // each instance's device pool; 1 .. INT32_MAX - 1
  std::vector<kvcache::TierSpec> tier_specs;  // each instance's lower tiers (host, disk, remote)
  std::chrono::steady_clock::time_point wall_start;  // res.wall_seconds counts from it
};

// Runs plan.head through a cluster of o.cluster's instances. Errors: an
// instance that cannot be built, a failed engine step, a stalled simulation
// (a bug).
// REQUIRES: `o` passed Simulate's checks (block size, token ids,
// tokens_per_hash_id, time_scale, concurrency); `plan` as SimPlan says.
Result<SimResult> RunSimulation(SimPlan plan, const SimOptions& o);

}  // namespace strata::bench::internal
