#pragma once
// Generation of one sequence through the KV cache: the prompt's cached prefix
// (device, host or disk blocks) is reused, only the rest is computed, and
// every block that fills is committed so later requests (or, through the disk
// tier, later processes) hit it. Used by `strata generate` when a KV tier is
// configured; the serving engine loop will drive KvManager the same way for
// batches.
//
// Flow: AddRequest → Allocate(prompt + max_tokens) → Poll until IsReady →
// GenerateWithKv from CachedTokens (Commit after each step) → Free.
//
// Thread-safety: the caller's thread drives `engine` and `kv` (both
// single-threaded by contract) for the whole call.

#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"
#include "common/strong_id.h"
#include "kvcache/kv_manager.h"
#include "model/forward.h"
#include "model/generate.h"
#include "model/tokenizer/tokenizer.h"

namespace strata::scheduler {

struct CachedGenerateOutput {
  GenerateOutput gen;
  // Prompt tokens whose KV came from cache (the API's cached tokens).
  int32_t cached_tokens = 0;
  // Source of each cached block: kvcache::kDeviceTier or lower tier i + 1.
  std::vector<int> block_tiers;
  // Cached tokens by tier: [0] device, [i + 1] lower tier i; names alike.
  std::vector<int32_t> tier_hit_tokens;
  std::vector<std::string> tier_names;
  std::vector<kvcache::TierKind> tier_kinds;
  double load_wait_seconds = 0;  // time spent waiting for lower-tier loads
};

struct CachedGenerateOptions {
  RequestId request_id{1};
  std::string cache_salt;
  // Gives up waiting for lower-tier loads after this long (wall clock); the
  // loads are then abandoned (Free) and Unavailable is returned.
  double load_timeout_seconds = 60;
};

// REQUIRES: `kv` manages `engine`'s blocks (the same KV pool, same block
// size). kNotNow from the pool becomes
// ResourceExhausted (nothing else would free blocks here). The request is
// always freed before returning.
Result<CachedGenerateOutput> CachedGenerate(
    ForwardPass& engine, kvcache::KvManager& kv, const Tokenizer& tokenizer,
    std::span<const int32_t> prompt, const GenerateOptions& options,
    const CachedGenerateOptions& cache = {},
    const std::function<void(std::string_view)>& on_text = nullptr);

}  // namespace strata::scheduler
