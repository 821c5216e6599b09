#include "server/admin_routes.h"

#include <algorithm>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <utility>
#include <vector>

#include "common/logging.h"
#include "server/openai_protocol.h"

namespace strata::server {
namespace {

using nlohmann::json;

constexpr const char* kJson = "application/json";

void SendError(const std::shared_ptr<ResponseWriter>& w, const ApiError& e) {
  w->Send(e.http_status, kJson, e.ToBody());
}

void SendJson(const std::shared_ptr<ResponseWriter>& w, const json& j) {
  w->Send(200, kJson, Dump(j));
}

ApiError MethodNotAllowed(const std::string& method, const std::string& path, const char* allowed) {
  ApiError e =
      ApiError::BadRequest(method + " is not allowed on " + path + " (use " + allowed + ")");
  e.http_status = 405;
  e.code = "method_not_allowed";
  return e;
}

// Parses the body as a JSON object; an empty body is {}.
std::optional<ApiError> ParseObject(const std::string& body, json* out) {
  if (body.find_first_not_of(" \t\r\n") == std::string::npos) {
    *out = json::object();
    return std::nullopt;
  }
  *out = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (out->is_discarded()) return ApiError::BadRequest("the request body is not valid JSON");
  if (!out->is_object()) return ApiError::BadRequest("the request body must be a JSON object");
  return std::nullopt;
}

bool ConstantTimeEquals(const std::string& a, const std::string& b) {
  // Length leaks; content does not.
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

json HitsJson(const kvcache::TierHits& h) {
  return json{{"blocks", h.blocks}, {"tokens", h.tokens}};
}

}  // namespace

namespace {
json PolicyJson(const std::string& name, const kvcache::PolicyStats& p) {
  return {{"name", name},
          {"inserted", p.inserted},
          {"rejected", p.rejected},
          {"hits", p.hits},
          {"evicted", p.evicted},
          {"evicted_unused", p.evicted_unused},
          {"evicted_expired", p.evicted_expired},
          {"evicted_kept", p.evicted_kept},
          {"removed", p.removed}};
}
}  // namespace

json CacheStatsJson(const scheduler::EngineStats& s) {
  json j;
  j["requests"] = {{"running", s.num_running},     {"waiting", s.num_waiting},
                   {"draining", s.draining},       {"rejected_queue_full", s.rejected_queue_full},
                   {"preemptions", s.preemptions}, {"finished_by_reason", s.finished_by_reason}};
  j["steps"] = s.steps;
  j["prompt_tokens"] = s.prompt_tokens;
  j["generation_tokens"] = s.generation_tokens;

  const auto& kv = s.kv;
  const auto& pool = kv.device_pool;
  j["device_blocks"] = {{"total", pool.num_blocks}, {"in_use", s.device_blocks_in_use},
                        {"cached", pool.cached},    {"free", pool.free},
                        {"indexed", pool.indexed},  {"evictions", pool.evictions}};
  uint64_t hit_tokens = kv.device.tokens;
  for (const auto& t : kv.tiers) hit_tokens += t.hits.tokens;
  j["prefix_cache"] = {
      {"queries", kv.queries},
      {"query_tokens", kv.query_tokens},
      {"hit_tokens", hit_tokens},
      {"hit_ratio", kv.query_tokens == 0
                        ? 0.0
                        : static_cast<double>(hit_tokens) / static_cast<double>(kv.query_tokens)}};
  j["bytes_moved"] = {{"device_to_lower", kv.bytes_down}, {"lower_to_device", kv.bytes_up}};
  j["failures"] = {{"writes", kv.writes_failed}, {"loads", kv.loads_failed}};

  // One entry per tier, in chain order: usage from `tiers`, traffic from kv.
  std::map<std::string, const kvcache::LowerTierStats*> lower;
  for (const auto& t : kv.tiers) lower[t.name] = &t;
  json tiers = json::array();
  for (const auto& u : s.tiers) {
    json t = {{"name", u.name},
              {"kind", std::string(kvcache::TierKindName(u.kind))},
              {"capacity_bytes", u.capacity_bytes},
              {"used_bytes", u.used_bytes},
              {"usage_ratio", u.usage_ratio}};
    if (u.kind == kvcache::TierKind::kDevice) {
      t["hits"] = HitsJson(kv.device);
      t["eviction_policy"] = PolicyJson(pool.eviction_policy, pool.policy);
    } else if (auto it = lower.find(u.name); it != lower.end()) {
      const auto& l = *it->second;
      t["hits"] = HitsJson(l.hits);
      t["bytes_written"] = l.bytes_down;
      t["bytes_read"] = l.bytes_up;
      t["writes"] = l.writes;
      t["writes_failed"] = l.writes_failed;
      t["writes_refused"] = l.writes_refused;
      t["loads_failed"] = l.loads_failed;
      t["admissions_deferred"] = l.admissions_deferred;
      t["promoted"] = l.promoted;
      t["load_seconds"] = static_cast<double>(l.load_nanos) / 1e9;
      if (!l.eviction_policy.empty()) t["eviction_policy"] = PolicyJson(l.eviction_policy, l.policy);
    }
    tiers.push_back(std::move(t));
  }
  j["tiers"] = std::move(tiers);
  return j;
}

AdminRoutes::AdminRoutes(Frontend& frontend, std::string admin_token)
    : frontend_(frontend), admin_token_(std::move(admin_token)) {}

bool AdminRoutes::Authorized(const HttpRequest& req) const {
  if (admin_token_.empty()) return true;
  const std::string auth = req.header("authorization");
  constexpr std::string_view kBearer = "Bearer ";
  if (auth.size() < kBearer.size() || auth.compare(0, kBearer.size(), kBearer) != 0) return false;
  return ConstantTimeEquals(auth.substr(kBearer.size()), admin_token_);
}

bool AdminRoutes::Handle(HttpRequest& req, const std::shared_ptr<ResponseWriter>& w) {
  if (req.path != "/admin" && req.path.rfind("/admin/", 0) != 0) return false;
  if (!Authorized(req)) {
    SendError(
        w, ApiError::Unauthorized(req.header("authorization").empty()
                                      ? "admin endpoints need 'Authorization: Bearer <admin token>'"
                                      : "wrong admin token"));
    return true;
  }
  if (req.path == "/admin/cache/stats") {
    if (req.method != "GET") {
      SendError(w, MethodNotAllowed(req.method, req.path, "GET"));
    } else {
      Stats(w);
    }
  } else if (req.path == "/admin/cache/lookup") {
    if (req.method != "POST") {
      SendError(w, MethodNotAllowed(req.method, req.path, "POST"));
    } else {
      Lookup(req, w);
    }
  } else if (req.path == "/admin/cache/flush") {
    if (req.method != "POST") {
      SendError(w, MethodNotAllowed(req.method, req.path, "POST"));
    } else {
      Flush(req, w);
    }
  } else {
    SendError(w, ApiError::NotFound(
                     "no admin route " + req.path +
                     " (there are /admin/cache/stats, /admin/cache/lookup, /admin/cache/flush)"));
  }
  return true;
}

void AdminRoutes::Stats(const std::shared_ptr<ResponseWriter>& w) {
  json j = CacheStatsJson(frontend_.engine().Stats());
  j["model"] = frontend_.model_name();
  SendJson(w, j);
}

void AdminRoutes::Lookup(const HttpRequest& req, const std::shared_ptr<ResponseWriter>& w) {
  json body;
  if (auto e = ParseObject(req.body, &body)) return SendError(w, *e);
  std::string salt;
  if (auto it = body.find("cache_salt"); it != body.end() && !it->is_null()) {
    if (!it->is_string())
      return SendError(w, ApiError::BadRequest("'cache_salt' must be a string", "cache_salt"));
    salt = it->get<std::string>();
  }
  std::vector<int32_t> tokens;
  if (auto it = body.find("tokens"); it != body.end()) {
    if (body.contains("prompt") || body.contains("messages"))
      return SendError(
          w, ApiError::BadRequest("give one of 'tokens', 'prompt' or 'messages'", "tokens"));
    if (!it->is_array())
      return SendError(w, ApiError::BadRequest("'tokens' must be an array of token ids", "tokens"));
    for (const auto& t : *it) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > INT32_MAX)
        return SendError(
            w, ApiError::BadRequest("'tokens' must hold non-negative integer token ids", "tokens"));
      tokens.push_back(static_cast<int32_t>(t.get<int64_t>()));
    }
  } else {
    // {"prompt"} or {"messages"} as POST /tokenize takes them (same template
    // and special tokens, so the ids are the ones a request would be fed).
    json sub = json::object();
    for (const char* k : {"prompt", "messages", "add_special_tokens"})
      if (body.contains(k)) sub[k] = body[k];
    GenerationParams params;
    if (auto e = ParseTokenizeRequest(Dump(sub), &params)) return SendError(w, *e);
    if (auto e = frontend_.Tokenize(params, &tokens)) return SendError(w, *e);
  }
  if (tokens.empty()) return SendError(w, ApiError::BadRequest("the prompt is empty", "tokens"));

  scheduler::EngineClient& engine = frontend_.engine();
  const std::vector<std::string> names = engine.tier_names();
  const std::vector<kvcache::TierKind> kinds = engine.tier_kinds();
  json cluster = cluster_lookup_ ? cluster_lookup_(tokens, salt) : json();
  const bool posted = engine.LookupCache(std::move(tokens), std::move(salt), [w, names, kinds, cluster = std::move(cluster)](const scheduler::CacheMatch& m) {
    // by_tier: by kind, every kind of the table present (as the API's
    // cached_tokens_by_tier); by_tier_name: by configured tier name.
    json by_tier = json::object();
    for (kvcache::TierKind k : kvcache::kAllTierKinds) by_tier[std::string(kvcache::TierKindName(k))] = 0;
    json by_name = json::object();
    for (size_t t = 0; t < m.tokens_by_tier.size() && t < names.size() && t < kinds.size(); ++t) {
      const std::string kind(kvcache::TierKindName(kinds[t]));
      by_tier[kind] = by_tier[kind].get<int64_t>() + m.tokens_by_tier[t];
      by_name[names[t]] = m.tokens_by_tier[t];
    }
    const int bs = m.block_size;
    json out{{"prompt_tokens", m.prompt_tokens},
             {"cached_tokens", m.cached_tokens},
             {"blocks", bs > 0 ? m.cached_tokens / bs : 0},
             {"block_size", bs},
             {"by_tier", by_tier},
             {"by_tier_name", by_name}};
    if (!cluster.is_null()) out["cluster"] = cluster;
    SendJson(w, out);
  });
  if (!posted) SendError(w, ApiError::Unavailable("the engine is shutting down"));
}

void AdminRoutes::Flush(const HttpRequest& req, const std::shared_ptr<ResponseWriter>& w) {
  json body;
  if (auto e = ParseObject(req.body, &body)) return SendError(w, *e);
  const std::vector<std::string> names =
      frontend_.engine().tier_names();  // "device", then lower tiers
  std::vector<bool> chosen(names.size(), true);
  if (auto it = body.find("tiers"); it != body.end() && !it->is_null()) {
    if (!it->is_array() || it->empty())
      return SendError(
          w, ApiError::BadRequest("'tiers' must be a non-empty array of tier names", "tiers"));
    std::fill(chosen.begin(), chosen.end(), false);
    for (const auto& t : *it) {
      auto pos =
          t.is_string() ? std::find(names.begin(), names.end(), t.get<std::string>()) : names.end();
      if (pos == names.end()) {
        std::string known;
        for (const auto& n : names) known += (known.empty() ? "" : ", ") + n;
        return SendError(
            w, ApiError::BadRequest(
                   "unknown tier " + (t.is_string() ? "'" + t.get<std::string>() + "'" : t.dump()) +
                       " (this server has: " + known + ")",
                   "tiers"));
      }
      chosen[static_cast<size_t>(pos - names.begin())] = true;
    }
  }
  bool all_namespaces = false;
  if (auto it = body.find("all_namespaces"); it != body.end() && !it->is_null()) {
    if (!it->is_boolean())
      return SendError(
          w, ApiError::BadRequest("'all_namespaces' must be a boolean", "all_namespaces"));
    all_namespaces = it->get<bool>();
  }
  const bool device = !chosen.empty() && chosen[0];
  std::vector<bool> lower(chosen.begin() + (chosen.empty() ? 0 : 1), chosen.end());
  scheduler::CacheFlush what{device, lower, all_namespaces};
  const bool posted = frontend_.engine().FlushCache(
      std::move(what), [w, names, device, lower, all_namespaces](Result<kvcache::FlushResult> r) {
        if (!r.ok()) {
          STRATA_LOG_WARN("admin: cache flush failed: {}", r.error().ToString());
          return SendError(w, ApiError::Internal("cache flush failed: " + r.error().ToString()));
        }
        json flushed = json::object();
        if (device) flushed["device"] = r->device_blocks;
        for (size_t i = 0; i < lower.size() && i < r->lower_blocks.size() && i + 1 < names.size(); ++i)
          if (lower[i]) flushed[names[i + 1]] = r->lower_blocks[i];
        STRATA_LOG_INFO("admin: cache flushed: {}", Dump(flushed));
        SendJson(w, json{{"flushed_blocks", flushed}, {"all_namespaces", all_namespaces}});
      });
  if (!posted) SendError(w, ApiError::Unavailable("the engine is shutting down"));
}

}  // namespace strata::server
