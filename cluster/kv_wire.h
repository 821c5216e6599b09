#pragma once
// The cluster pool's messages between instances, as JSON over the HTTP
// routes of `strata serve` (docs/cluster.md: /internal/kv/*):
//
//   GET  /internal/kv/events?since=S   the event batches after sequence S
//        → {"instance","incarnation","epoch","last_seq","batches":[batch...]}
//          batch = {"seq_first":N,"events":[[stored 1|0, "hash hex", "tier"]...]}
//        410 when batches after S are no longer kept (ask for a snapshot).
//   GET  /internal/kv/snapshot
//        → {"instance","incarnation","epoch","seq","blocks":[["hash hex","tier"]...]}
//   POST /internal/kv/resolve {"reader","lease_ms","hashes":[hex...]}
//        → {"lease":N,"blocks":[{"segment","offset","length","checksum"}...]}
//          for the leading hashes held in an exported tier (stops at the
//          first one that is not), each pinned until the lease ends.
//   POST /internal/kv/release {"lease":N}
//
// Thread-safety: pure functions.

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"
#include "kvcache/cluster_index.h"

namespace strata::cluster {

std::string HashHex(const BlockHash& h);
// The body of an error reply on the cluster routes: {"error": message}.
std::string ErrorJson(const std::string& message);
Result<BlockHash> HashFromHex(std::string_view hex);

// The events reply: batches after a sequence number.
struct EventsReply {
  std::string instance, incarnation;
  uint64_t epoch = 0;
  uint64_t last_seq = 0;
  std::vector<kvcache::KvEventBatch> batches;
};
std::string EventsReplyToJson(const EventsReply& r);
Result<EventsReply> EventsReplyFromJson(const std::string& text);

std::string SnapshotToJson(const kvcache::KvSnapshot& s);
Result<kvcache::KvSnapshot> SnapshotFromJson(const std::string& text);

struct ResolveRequest {
  std::string reader;
  int64_t lease_ms = 0;
  std::vector<BlockHash> hashes;
};
std::string ResolveRequestToJson(const ResolveRequest& r);
// Errors name the field at fault (kInvalidArgument).
Result<ResolveRequest> ResolveRequestFromJson(const std::string& text);

struct ResolvedBlock {
  std::string segment;  // the holder's export name
  uint64_t offset = 0;
  uint64_t length = 0;
  uint64_t checksum = 0;  // XXH3-64 of the bytes
};
struct ResolveReply {
  uint64_t lease = 0;  // 0: nothing pinned
  std::vector<ResolvedBlock> blocks;
};
std::string ResolveReplyToJson(const ResolveReply& r);
Result<ResolveReply> ResolveReplyFromJson(const std::string& text);

}  // namespace strata::cluster
