#pragma once
// Mooncake-format request traces (issue "strata bench"): one JSON object per
// line with `timestamp` (ms since the trace's start), `input_length`,
// `output_length` and `hash_ids`. Each hash id stands for one 512-token block
// *and everything before it*, so equal ids at a position mean an equal prefix.
//
// This header is shared by the live driver (`strata bench run`) and the
// simulator (`strata bench simulate`); both turn a trace request into tokens
// with ScaleRequest so that equal ids give equal tokens in both.
//
// Thread-safety: every function here is pure (no shared state); call from any
// thread.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace strata::bench {

// The token count one hash id stands for in the published traces.
inline constexpr int kTraceTokensPerHashId = 512;

struct TraceRequest {
  int64_t timestamp_ms = 0;
  int32_t input_length = 0;   // prompt tokens at real lengths (>= 1)
  int32_t output_length = 0;  // generated tokens (>= 1)
  std::vector<int64_t> hash_ids;  // non-empty, each >= 0
};

// Parses JSON-lines text. Blank lines are skipped; unknown fields are ignored.
// Rejected, with an InvalidArgument "NAME:LINE: what is wrong" (LINE 1-based):
// a line that is not a JSON object, a missing or non-integer field, a negative
// timestamp, input_length or output_length < 1, an empty hash_ids or a
// negative id, and a timestamp earlier than the previous request's (equal
// timestamps are allowed: requests released together).
Result<std::vector<TraceRequest>> ParseTrace(std::string_view jsonl_text, std::string_view source_name);

// Reads `path` and parses it with the path as NAME. NotFound / IoError when
// the file cannot be read.
Result<std::vector<TraceRequest>> LoadTrace(const std::string& path);

// Deterministic token ids for one hash id's block: n ids in
// [first_id, vocab_size) from a SplitMix64 stream seeded by the hash id. Equal
// ids give equal tokens; a shorter block is a prefix of a longer one of the
// same id. REQUIRES: n >= 0, 0 <= first_id < vocab_size.
std::vector<int32_t> HashIdTokens(int64_t hash_id, int n, int vocab_size, int first_id);

// The prompt and output length of one trace request.
struct ScaledRequest {
  std::vector<int32_t> prompt;
  int32_t output_length = 0;
};

// tokens_per_hash_id N > 0: the prompt is exactly (number of ids x N) tokens,
// HashIdTokens(id, N) concatenated; output_length is scaled by N/512, rounded
// up, at least 1.
// N == 0 (real lengths): every id gives 512 tokens except the last, which
// gives input_length - 512*(k-1) tokens (at least 1); output_length unchanged.
// REQUIRES: N >= 0, 0 <= first_id < vocab_size.
ScaledRequest ScaleRequest(const TraceRequest& r, int tokens_per_hash_id, int vocab_size, int first_id);

// The token count of hash id number `index` (0-based) of `r` in the prompt
// ScaleRequest builds; the prompt's length is the sum over all ids.
int32_t HashIdTokenCount(const TraceRequest& r, size_t index, int tokens_per_hash_id);

// The trace's ideal prefix-cache hit ratio with an unlimited cache and one
// request at a time: a hash id is a hit only if it and every id before it in
// its prompt appeared, as that same prefix chain, in some earlier prompt.
struct IdealHit {
  uint64_t hit_ids = 0, total_ids = 0;
  double ratio() const { return total_ids == 0 ? 0.0 : static_cast<double>(hit_ids) / static_cast<double>(total_ids); }
};
IdealHit IdealHitRatio(const std::vector<TraceRequest>& trace);

// The number of leading ids of each request that the ideal cache serves, in
// trace order (IdealHitRatio's per-request detail; sums to hit_ids).
std::vector<uint32_t> IdealHitIdsPerRequest(const std::vector<TraceRequest>& trace);

}  // namespace strata::bench
