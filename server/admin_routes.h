#pragma once
// Operator endpoints under /admin/ (used by `strata cache`; docs/admin.md):
//
//   GET  /admin/cache/stats    the engine's snapshot as JSON: requests,
//                              tiers with capacity, usage and hits, bytes
//                              moved, failures, device blocks.
//   POST /admin/cache/lookup   {"prompt": "..."} | {"messages": [...]} |
//                              {"tokens": [ids]}, optional "cache_salt",
//                              "add_special_tokens" → how many leading tokens
//                              would come from cache now, split by tier:
//                              {"prompt_tokens", "cached_tokens", "blocks",
//                               "block_size", "by_tier": {"device", "host",
//                               "disk", ...}}. A pure query: nothing moves.
//   POST /admin/cache/flush    {"tiers": ["device","host","disk"]} (absent =
//                              all), optional "all_namespaces" (lower tiers:
//                              also other models' blocks) → blocks removed
//                              per tier. Running requests are unaffected.
//
// When `admin_token` is non-empty, every /admin/ request needs
// `Authorization: Bearer <admin_token>` (else 401). Errors use the OpenAI
// body shape: 400 bad JSON or field, 404 unknown /admin/ path, 405 wrong
// method, 503 when the engine is gone.
//
// Lookups and flushes go through EngineClient::LookupCache / FlushCache and
// answer from their callbacks (on the engine's delivery thread) through the
// (thread-safe) ResponseWriter.
//
// Thread-safety: Handle may be called from any thread, concurrently.

#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <vector>
#include <nlohmann/json_fwd.hpp>
#include <string>

#include "scheduler/engine_client.h"
#include "server/frontend.h"
#include "server/http_server.h"

namespace strata::server {

// The JSON of GET /admin/cache/stats (also for gRPC CacheStats).
nlohmann::json CacheStatsJson(const scheduler::EngineStats& stats);

class AdminRoutes {
 public:
  // `frontend` (and its engine) must outlive the routes.
  AdminRoutes(Frontend& frontend, std::string admin_token);

  // True when `req.path` is under /admin/: then a response has been sent, or
  // will be from the engine thread. False: not an admin path, nothing sent.
  bool Handle(HttpRequest& req, const std::shared_ptr<ResponseWriter>& w);

  // In a cluster: which other instances hold a prompt's prefix, and in
  // which tiers (the cluster index), added to /admin/cache/lookup as
  // "cluster". Called on a lane worker. Set before traffic, or never.
  using ClusterLookupFn = std::function<nlohmann::json(const std::vector<int32_t>& tokens, const std::string& salt)>;
  void SetClusterLookup(ClusterLookupFn fn) { cluster_lookup_ = std::move(fn); }

 private:
  bool Authorized(const HttpRequest& req) const;
  void Stats(const std::shared_ptr<ResponseWriter>& w);
  void Lookup(const HttpRequest& req, const std::shared_ptr<ResponseWriter>& w);
  void Flush(const HttpRequest& req, const std::shared_ptr<ResponseWriter>& w);

  Frontend& frontend_;
  const std::string admin_token_;
  ClusterLookupFn cluster_lookup_;
};

}  // namespace strata::server
