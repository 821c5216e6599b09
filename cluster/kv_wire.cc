#include "cluster/kv_wire.h"

#include <nlohmann/json.hpp>

namespace strata::cluster {

using nlohmann::json;
using kvcache::KvEvent;
using kvcache::KvEventBatch;
using kvcache::KvSnapshot;
using kvcache::TierKind;

namespace {

int HexDigit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

Result<TierKind> TierFrom(const json& j) {
  if (!j.is_string()) return Status::InvalidArgument("tier is not a string");
  auto k = kvcache::ParseTierKind(j.get<std::string>());
  if (!k) return Status::InvalidArgument("unknown tier '" + j.get<std::string>() + "'");
  return *k;
}

Result<json> Parse(const std::string& text, const char* what) {
  json j = json::parse(text, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Status::InvalidArgument(std::string(what) + ": not a JSON object");
  return j;
}

uint64_t U64(const json& j, const char* key) {
  if (!j.contains(key)) return 0;
  const json& v = j[key];
  return v.is_number_unsigned() || v.is_number_integer() ? v.get<uint64_t>() : 0;
}

std::string Str(const json& j, const char* key) {
  return j.contains(key) && j[key].is_string() ? j[key].get<std::string>() : std::string();
}

json BatchToJson(const KvEventBatch& b) {
  json events = json::array();
  for (const KvEvent& e : b.events)
    events.push_back({e.kind == KvEvent::Kind::kStored ? 1 : 0, HashHex(e.hash), kvcache::TierKindName(e.tier)});
  return {{"seq_first", b.seq_first}, {"events", std::move(events)}};
}

}  // namespace

std::string HashHex(const BlockHash& h) { return ToHex(h.digest); }

std::string ErrorJson(const std::string& message) { return json{{"error", message}}.dump(); }

Result<BlockHash> HashFromHex(std::string_view hex) {
  BlockHash h;
  if (hex.size() != h.digest.size() * 2) return Status::InvalidArgument("a block hash is 64 hex digits");
  for (size_t i = 0; i < h.digest.size(); ++i) {
    const int hi = HexDigit(hex[2 * i]), lo = HexDigit(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return Status::InvalidArgument("a block hash is 64 hex digits");
    h.digest[i] = static_cast<uint8_t>(hi * 16 + lo);
  }
  return h;
}

std::string EventsReplyToJson(const EventsReply& r) {
  json batches = json::array();
  for (const auto& b : r.batches) batches.push_back(BatchToJson(b));
  return json{{"instance", r.instance},
              {"incarnation", r.incarnation},
              {"epoch", r.epoch},
              {"last_seq", r.last_seq},
              {"batches", std::move(batches)}}
      .dump();
}

Result<EventsReply> EventsReplyFromJson(const std::string& text) {
  STRATA_ASSIGN_OR_RETURN(json j, Parse(text, "events reply"));
  EventsReply r;
  r.instance = Str(j, "instance");
  r.incarnation = Str(j, "incarnation");
  r.epoch = U64(j, "epoch");
  r.last_seq = U64(j, "last_seq");
  if (r.instance.empty() || r.incarnation.empty()) return Status::InvalidArgument("events reply: no instance");
  if (!j.contains("batches") || !j["batches"].is_array()) return Status::InvalidArgument("events reply: no batches");
  for (const json& jb : j["batches"]) {
    if (!jb.is_object() || !jb.contains("events") || !jb["events"].is_array())
      return Status::InvalidArgument("events reply: a batch without events");
    KvEventBatch b{r.instance, r.incarnation, r.epoch, U64(jb, "seq_first"), {}};
    if (b.seq_first == 0) return Status::InvalidArgument("events reply: seq_first 0");
    for (const json& je : jb["events"]) {
      if (!je.is_array() || je.size() != 3 || !je[0].is_number_integer() || !je[1].is_string())
        return Status::InvalidArgument("events reply: a malformed event");
      STRATA_ASSIGN_OR_RETURN(BlockHash h, HashFromHex(je[1].get<std::string>()));
      STRATA_ASSIGN_OR_RETURN(TierKind t, TierFrom(je[2]));
      b.events.push_back({je[0].get<int>() == 1 ? KvEvent::Kind::kStored : KvEvent::Kind::kRemoved, h, t});
    }
    r.batches.push_back(std::move(b));
  }
  return r;
}

std::string SnapshotToJson(const KvSnapshot& s) {
  json blocks = json::array();
  for (const auto& [h, t] : s.blocks) blocks.push_back({HashHex(h), kvcache::TierKindName(t)});
  return json{{"instance", s.instance},
              {"incarnation", s.incarnation},
              {"epoch", s.epoch},
              {"seq", s.seq},
              {"blocks", std::move(blocks)}}
      .dump();
}

Result<KvSnapshot> SnapshotFromJson(const std::string& text) {
  STRATA_ASSIGN_OR_RETURN(json j, Parse(text, "snapshot"));
  KvSnapshot s;
  s.instance = Str(j, "instance");
  s.incarnation = Str(j, "incarnation");
  s.epoch = U64(j, "epoch");
  s.seq = U64(j, "seq");
  if (s.instance.empty() || s.incarnation.empty()) return Status::InvalidArgument("snapshot: no instance");
  if (!j.contains("blocks") || !j["blocks"].is_array()) return Status::InvalidArgument("snapshot: no blocks");
  for (const json& jb : j["blocks"]) {
    if (!jb.is_array() || jb.size() != 2 || !jb[0].is_string())
      return Status::InvalidArgument("snapshot: a malformed block");
    STRATA_ASSIGN_OR_RETURN(BlockHash h, HashFromHex(jb[0].get<std::string>()));
    STRATA_ASSIGN_OR_RETURN(TierKind t, TierFrom(jb[1]));
    s.blocks.emplace_back(h, t);
  }
  return s;
}

std::string ResolveRequestToJson(const ResolveRequest& r) {
  json hashes = json::array();
  for (const auto& h : r.hashes) hashes.push_back(HashHex(h));
  return json{{"reader", r.reader}, {"lease_ms", r.lease_ms}, {"hashes", std::move(hashes)}}.dump();
}

Result<ResolveRequest> ResolveRequestFromJson(const std::string& text) {
  STRATA_ASSIGN_OR_RETURN(json j, Parse(text, "resolve request"));
  ResolveRequest r;
  r.reader = Str(j, "reader");
  if (!j.contains("lease_ms") || !j["lease_ms"].is_number_integer() || j["lease_ms"].get<int64_t>() <= 0)
    return Status::InvalidArgument("resolve request: 'lease_ms' must be a positive integer");
  r.lease_ms = j["lease_ms"].get<int64_t>();
  if (!j.contains("hashes") || !j["hashes"].is_array())
    return Status::InvalidArgument("resolve request: 'hashes' must be an array of block hashes");
  for (const json& h : j["hashes"]) {
    if (!h.is_string()) return Status::InvalidArgument("resolve request: 'hashes' holds a non-string");
    auto parsed = HashFromHex(h.get<std::string>());
    if (!parsed) return parsed.error().WithContext("resolve request: 'hashes'");
    r.hashes.push_back(*parsed);
  }
  return r;
}

std::string ResolveReplyToJson(const ResolveReply& r) {
  json blocks = json::array();
  for (const auto& b : r.blocks)
    blocks.push_back({{"segment", b.segment},
                      {"offset", b.offset},
                      {"length", b.length},
                      {"checksum", ToHex(reinterpret_cast<const uint8_t*>(&b.checksum), sizeof(b.checksum))}});
  return json{{"lease", r.lease}, {"blocks", std::move(blocks)}}.dump();
}

Result<ResolveReply> ResolveReplyFromJson(const std::string& text) {
  STRATA_ASSIGN_OR_RETURN(json j, Parse(text, "resolve reply"));
  ResolveReply r;
  r.lease = U64(j, "lease");
  if (!j.contains("blocks") || !j["blocks"].is_array()) return Status::InvalidArgument("resolve reply: no blocks");
  for (const json& jb : j["blocks"]) {
    if (!jb.is_object()) return Status::InvalidArgument("resolve reply: a malformed block");
    ResolvedBlock b{Str(jb, "segment"), U64(jb, "offset"), U64(jb, "length"), 0};
    const std::string sum = Str(jb, "checksum");
    if (b.segment.empty() || b.length == 0 || sum.size() != 16)
      return Status::InvalidArgument("resolve reply: a block without segment, length or checksum");
    auto* out = reinterpret_cast<uint8_t*>(&b.checksum);
    for (size_t i = 0; i < 8; ++i) {
      const int hi = HexDigit(sum[2 * i]), lo = HexDigit(sum[2 * i + 1]);
      if (hi < 0 || lo < 0) return Status::InvalidArgument("resolve reply: a malformed checksum");
      out[i] = static_cast<uint8_t>(hi * 16 + lo);
    }
    r.blocks.push_back(std::move(b));
  }
  return r;
}

}  // namespace strata::cluster
