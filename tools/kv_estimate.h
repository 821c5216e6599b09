#pragma once
// Start-up estimates behind `--kv-load-policy auto` (issue 4: "the engine
// takes a hit from a lower tier only when loading is cheaper than
// recomputing"): how fast this engine recomputes prompt tokens, and how fast
// each lower tier delivers a block, measured once when the KV stack opens
// and logged. KvManager::WorthLoading compares
//   blocks x block_bytes / tier read rate   with   blocks x block_size / recompute rate.
//
// - recompute: one prefill of up to 64 tokens through the engine, on device
//   blocks no request owns yet (the stack is opened before serving). The
//   rate at short context is an upper bound on the real recompute speed of a
//   long prefix, so the policy errs toward loading.
// - host: a memcpy of up to 16 blocks between two page-aligned buffers (a
//   host-tier load is one memcpy into the device block).
// - disk: O_DIRECT write then timed O_DIRECT read of up to 16 blocks in a
//   temporary file in the disk tier's directory (removed again); the page
//   cache plays no part.

#include <cstdint>
#include <string>

#include "common/status.h"
#include "model/forward.h"

namespace strata::cli {

struct KvLoadEstimates {
  double recompute_tokens_per_s = 0;  // 0 = not measured
  double host_bytes_per_s = 0;
  double disk_bytes_per_s = 0;
};

// Prefill rate of `engine` over `tokens` tokens (1..64; fewer when the pool
// is smaller). Writes into device blocks 0.. : call before any request uses
// the pool. Returns 0 when the engine refuses (logged).
double MeasureRecomputeRate(ForwardPass& engine, int tokens = 64);

// memcpy rate over `bytes` bytes (page-aligned buffers).
double MeasureMemcpyRate(uint64_t bytes);

// O_DIRECT read rate of `blocks` blocks of `block_bytes` bytes (a multiple of
// 4096) in `directory`. Errors (no O_DIRECT, no space) say why; the caller
// then leaves the disk estimate unknown.
Result<double> MeasureDirectReadRate(const std::string& directory, uint64_t block_bytes, int blocks);

}  // namespace strata::cli
