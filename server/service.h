#pragma once
// The HTTP service of `strata serve`: authentication, /health, /metrics,
// /admin/ and the OpenAI routes behind one HttpHandler, plus the access log.
//
// The I/O thread that calls Handle only moves bytes: /health, /metrics and
// / are answered there (no parsing, no tokenizer); every other request goes
// to a request lane by its body size (server/request_lanes.h), where its
// JSON is parsed, its chat template applied, its prompt tokenized and it is
// submitted to the engine. A full lane answers 503 with Retry-After.
//
// The HTTP server starts before the model is loaded (so /health can say 503
// while it loads); SetBackend() attaches the routes once the engine runs.
// Until then, and again while draining, /health answers 503 and API routes
// 503 with Retry-After.
//
// Thread-safety: Handle and OnAccess run on the HTTP server's I/O threads;
// SetBackend / SetDraining / Stop may be called from any thread (Stop not
// from a lane worker).

#include <atomic>
#include <functional>
#include <memory>
#include <string>

#include "server/http_server.h"
#include "server/request_lanes.h"

namespace strata::server {

class Frontend;
struct ApiError;
class OpenAiRoutes;
class AdminRoutes;
class ServerMetrics;

struct ServiceOptions {
  std::string api_key;      // required as "Authorization: Bearer KEY" on /v1/*, /tokenize, /detokenize; empty = open
  std::string admin_token;  // required on /admin/* (checked by AdminRoutes); empty = open
  // Required on /internal/* (the cluster's calls between instances and
  // from a router): transfer::ClusterBearer of the cluster secret; empty =
  // the admin token (empty = open).
  std::string internal_token;
  int retry_after_seconds = 1;  // Retry-After on 429 and 503
  RequestLanesOptions lanes;     // workers and queue limits of the small and large lanes
};

class Service {
 public:
  explicit Service(ServiceOptions options);
  ~Service();

  // Attaches the loaded model's routes (not owned; they must outlive every
  // request, i.e. the HTTP server's Stop()).
  // `extra_metrics` (optional) returns more text exposition appended to
  // /metrics (the transfer engine's families); called on the I/O thread.
  void SetBackend(Frontend* frontend, OpenAiRoutes* openai, AdminRoutes* admin, ServerMetrics* metrics,
                  std::function<std::string()> extra_metrics = {});
  void SetDraining();
  // Routes under /internal/ (the cluster pool's peer routes,
  // cluster/kv_wire.h), run on a lane worker after the admin token check
  // (peers send the cluster's admin token). The handler returns false for a
  // path it does not serve (404). Set before the server takes traffic, or
  // never.
  using InternalHandler = std::function<bool(const HttpRequest&, const std::shared_ptr<ResponseWriter>&)>;
  void SetInternalRoutes(InternalHandler handler) { internal_ = std::move(handler); }

  void Handle(HttpRequest&& req, std::shared_ptr<ResponseWriter> w);
  void OnAccess(const AccessRecord& record);
  // Runs what the lanes hold and stops their workers; later requests get
  // 503. Call after the HTTP server stopped reading, before the backend's
  // parts are destroyed.
  void Stop();
  LaneStats lane_stats(Lane lane) const { return lanes_.stats(lane); }
  // A stream of another front end (gRPC) was cancelled by its write timeout.
  void CountWriteTimeout() { write_timeouts_.fetch_add(1); }
  // The request lanes, shared with the gRPC front end.
  RequestLanes& lanes() { return lanes_; }

 private:
  struct Backend {
    Frontend* frontend;
    OpenAiRoutes* openai;
    AdminRoutes* admin;
    ServerMetrics* metrics;
    std::function<std::string()> extra_metrics;
  };
  bool Authorized(const HttpRequest& req) const;
  bool AdminAuthorized(const HttpRequest& req) const;
  InternalHandler internal_;
  // On a lane worker: admin and API routes.
  void Route(HttpRequest&& req, const std::shared_ptr<ResponseWriter>& w);
  void SendError(const ApiError& e, const std::shared_ptr<ResponseWriter>& w) const;

  const ServiceOptions options_;
  std::atomic<Backend*> backend_{nullptr};
  std::unique_ptr<Backend> owned_;
  std::atomic<bool> draining_{false};
  std::atomic<uint64_t> write_timeouts_{0};
  RequestLanes lanes_;
};

}  // namespace strata::server
