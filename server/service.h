#pragma once
// The HTTP service of `strata serve`: authentication, /health, /metrics,
// /admin/ and the OpenAI routes behind one HttpHandler, plus the access log.
//
// The HTTP server starts before the model is loaded (so /health can say 503
// while it loads); SetBackend() attaches the routes once the engine runs.
// Until then, and again while draining, /health answers 503 and API routes
// 503 with Retry-After.
//
// Thread-safety: Handle and OnAccess run on the HTTP server's I/O threads;
// SetBackend / SetDraining may be called from any thread.

#include <atomic>
#include <memory>
#include <string>

#include "server/http_server.h"

namespace strata::server {

class Frontend;
class OpenAiRoutes;
class AdminRoutes;
class ServerMetrics;

struct ServiceOptions {
  std::string api_key;      // required as "Authorization: Bearer KEY" on /v1/*, /tokenize, /detokenize; empty = open
  std::string admin_token;  // required on /admin/* (checked by AdminRoutes); empty = open
  int retry_after_seconds = 1;  // Retry-After on 429 and 503
};

class Service {
 public:
  explicit Service(ServiceOptions options);
  ~Service();

  // Attaches the loaded model's routes (not owned; they must outlive every
  // request, i.e. the HTTP server's Stop()).
  void SetBackend(Frontend* frontend, OpenAiRoutes* openai, AdminRoutes* admin, ServerMetrics* metrics);
  void SetDraining();

  void Handle(HttpRequest&& req, std::shared_ptr<ResponseWriter> w);
  void OnAccess(const AccessRecord& record);

 private:
  struct Backend {
    Frontend* frontend;
    OpenAiRoutes* openai;
    AdminRoutes* admin;
    ServerMetrics* metrics;
  };
  bool Authorized(const HttpRequest& req) const;

  const ServiceOptions options_;
  std::atomic<Backend*> backend_{nullptr};
  std::unique_ptr<Backend> owned_;
  std::atomic<bool> draining_{false};
};

}  // namespace strata::server
