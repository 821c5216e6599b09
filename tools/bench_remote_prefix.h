#pragma once
// `strata bench transfer`'s remote_prefix part (issue 18): the time to first
// token of a long prompt whose KV a peer holds in its host tier, loaded
// through the remote tier, against the same prompt computed from nothing.
//
// Real processes on 127.0.0.1: `strata meta`, a holder `strata serve` with a
// host tier, and a reader `strata serve --kv-remote` (one per transport,
// forced with --transfer-transports). Each round the holder computes a fresh
// prompt, then the reader is asked it (its remote tier loads the whole
// blocks) and another fresh prompt no instance has (cold); both as 1-token
// completions, so the time is prefill (or load) plus one sampling. Best of
// the rounds, alternating which is measured first.

#include <nlohmann/json.hpp>
#include <string>

#include "common/status.h"

namespace strata::cli {

struct RemotePrefixOptions {
  std::string model;        // GGUF; empty: bench-110m (q8_0) written to a temp dir
  int prompt_tokens = 1792;
  int rounds = 3;
  int threads = 1;          // compute threads per instance (the holder and the reader share the machine)
};

// {"ttft_seconds", "cold_ttft_seconds", "ratio", "by_transport": {tcp: {...}, shm: {...}}}: the top-level
// figures are the slower transport's.
Result<nlohmann::json> RunRemotePrefixBench(const RemotePrefixOptions& options);

}  // namespace strata::cli
