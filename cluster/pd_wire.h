#pragma once
// Prefill/decode disaggregation (issue 19): the messages between a router
// and its instances, as JSON over `strata serve`'s /internal/pd/ routes
// (docs/disaggregation.md):
//
//   POST /internal/pd/reserve   (decode)  ReserveRequest → ReserveReply;
//        503 when the pool cannot hold the prompt now (try another).
//   POST /internal/pd/prefill   (prefill) PrefillRequest → PrefillReply:
//        runs the request to its first token (pause_after 1), writes the
//        reserved blocks into the decode instance's grants, answers with
//        the paused final event (its tokens and continuation).
//   POST /internal/pd/decode    (decode)  DecodeRequest → a stream of
//        RequestOutput events, one "data: JSON" SSE line each, the last
//        with finished = true.
//   POST /internal/pd/cancel    (decode)  {"id":N}: frees a reservation.
//   POST /internal/pd/lookup    (any)     LookupRequest → LookupReply: how
//        much of a prompt the instance holds, and its queue and prefill
//        rate (what a router's choice reads).
//
// An EngineRequest crosses whole (sampling, stop conditions, salt,
// continuation with its sampler state; not deadline_nanos, which is a
// process's own clock). Bytes that may not be UTF-8 (a continuation's held
// bytes) travel as hex; a logprob of -inf as null.
//
// Thread-safety: pure functions.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "scheduler/engine_client.h"

namespace strata::cluster {

std::string EngineRequestToJson(const scheduler::EngineRequest& r);
// Errors name the field at fault (kInvalidArgument). Ranges are the
// engine's to check (Submit).
Result<scheduler::EngineRequest> EngineRequestFromJson(const std::string& text);

std::string RequestOutputToJson(const scheduler::RequestOutput& o);
Result<scheduler::RequestOutput> RequestOutputFromJson(const std::string& text);

struct ReserveRequest {
  uint64_t id = 0;               // chosen by the router, unique per decode instance
  std::vector<int32_t> prompt;
  std::string cache_salt;
  int64_t lease_ms = 0;          // the reservation (and its grants) lapse after this
  std::string grantee;           // the prefill instance's transfer name
};
std::string ReserveRequestToJson(const ReserveRequest& r);
Result<ReserveRequest> ReserveRequestFromJson(const std::string& text);

struct ReserveReply {
  uint64_t id = 0;
  int32_t held_blocks = 0;        // leading blocks the decode instance holds: not sent
  int32_t blocks = 0;             // blocks [held_blocks, blocks) are to be written
  uint64_t block_bytes = 0;
  std::vector<uint64_t> grants;   // one per block to write, in order
  std::string transfer;           // the decode instance's transfer address (host:port)
};
std::string ReserveReplyToJson(const ReserveReply& r);
Result<ReserveReply> ReserveReplyFromJson(const std::string& text);

struct PrefillRequest {
  scheduler::EngineRequest request;  // pause_after is set to 1 by the prefill instance
  ReserveReply decode;               // where its blocks go (empty when they follow)
  // Non-zero: `decode` is empty and comes later, in a GrantsMessage with
  // this key (the router reserves at the decode instance while the prefill
  // runs, so the reservation's round trip is not in the time to first
  // token). Unique among the prefill instance's flights.
  uint64_t grants_key = 0;
};
std::string PrefillRequestToJson(const PrefillRequest& r);
Result<PrefillRequest> PrefillRequestFromJson(const std::string& text);

// POST /internal/pd/grants: where the blocks of the prefill with
// `grants_key` go, or (`decode` absent) that they go nowhere: the
// reservation failed, the prefill answers without writing any.
struct GrantsMessage {
  uint64_t key = 0;
  std::optional<ReserveReply> decode;
};
std::string GrantsMessageToJson(const GrantsMessage& m);
Result<GrantsMessage> GrantsMessageFromJson(const std::string& text);

struct PrefillReply {
  scheduler::RequestOutput output;  // the whole stream merged: first token(s), final event, continuation
  int32_t blocks_written = 0;       // blocks [held, held + this) landed at the decode instance
  std::vector<uint64_t> checksums;  // XXH3-64 of each block written, as sent
  // The kinds ("device", "host", "disk", "remote") of the prefill
  // instance's tiers by index: output.cached_tokens_by_tier's meaning.
  std::vector<std::string> tier_kinds;
};
std::string PrefillReplyToJson(const PrefillReply& r);
Result<PrefillReply> PrefillReplyFromJson(const std::string& text);

struct LookupRequest {
  std::vector<int32_t> prompt;
  std::string cache_salt;
};
std::string LookupRequestToJson(const LookupRequest& r);
Result<LookupRequest> LookupRequestFromJson(const std::string& text);

struct LookupReply {
  int32_t cached_tokens = 0;           // leading prompt tokens with KV there (any tier)
  int32_t device_cached_tokens = 0;    // of them, in its device pool (a decode instance need not be sent these)
  int64_t pending_prefill_tokens = 0;  // EngineStats::pending_prefill_tokens
  double prefill_tokens_per_s = 0;     // EngineStats::prefill_tokens_per_s (0: not known yet)
  double decode_step_seconds = 0;      // EngineStats::decode_step_seconds (0: not known yet)
  int running = 0;
  int waiting = 0;
  double load_seconds = 0;             // CacheMatch::load_seconds: fetching the lower-tier part
  double step_elapsed_seconds = 0;     // EngineStats::step_elapsed_seconds
  int64_t device_free_tokens = 0;      // device pool tokens no request references (free or cached)
  int64_t device_tokens = 0;           // device pool capacity in tokens
};
std::string LookupReplyToJson(const LookupReply& r);
// GET /internal/pd/status: an instance's state for `strata cluster status`
// (a JSON object: requests, queue, rates measured and calibrated, KV use
// per tier). Read by tools as plain JSON.
std::string EngineStatusToJson(const scheduler::EngineStats& s);
Result<LookupReply> LookupReplyFromJson(const std::string& text);

struct DecodeRequest {
  uint64_t id = 0;                   // the reservation
  int32_t filled = 0;                // blocks the prefill instance wrote (PrefillReply::blocks_written)
  std::vector<uint64_t> checksums;   // PrefillReply::checksums: a block that does not match ends the run
  scheduler::EngineRequest request;  // with the continuation
};
std::string DecodeRequestToJson(const DecodeRequest& r);
Result<DecodeRequest> DecodeRequestFromJson(const std::string& text);

}  // namespace strata::cluster
