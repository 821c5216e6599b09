#include "server/service.h"

#include <nlohmann/json.hpp>

#include "common/logging.h"
#include "server/admin_routes.h"
#include "server/api_types.h"
#include "server/frontend.h"
#include "server/metrics.h"
#include "server/openai_routes.h"

namespace strata::server {

namespace {

bool IsApiPath(const std::string& path) {
  return path.rfind("/v1/", 0) == 0 || path == "/tokenize" || path == "/detokenize";
}

// Compares in time independent of where the strings differ.
bool SecretEquals(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

}  // namespace

Service::Service(ServiceOptions options) : options_(std::move(options)) {}
Service::~Service() = default;

void Service::SetBackend(Frontend* frontend, OpenAiRoutes* openai, AdminRoutes* admin, ServerMetrics* metrics) {
  owned_ = std::make_unique<Backend>(Backend{frontend, openai, admin, metrics});
  backend_.store(owned_.get(), std::memory_order_release);
}

void Service::SetDraining() { draining_.store(true); }

bool Service::Authorized(const HttpRequest& req) const {
  if (options_.api_key.empty()) return true;
  const std::string auth = req.header("authorization");
  const std::string prefix = "Bearer ";
  if (auth.size() <= prefix.size() || auth.compare(0, prefix.size(), prefix) != 0) return false;
  return SecretEquals(auth.substr(prefix.size()), options_.api_key);
}

void Service::Handle(HttpRequest&& req, std::shared_ptr<ResponseWriter> w) {
  const std::string retry = std::to_string(options_.retry_after_seconds);
  auto send_error = [&](const ApiError& e) {
    HeaderList h;
    if (e.http_status == 429 || e.http_status == 503) h.emplace_back("retry-after", retry);
    if (e.http_status == 401) h.emplace_back("www-authenticate", "Bearer");
    w->Send(e.http_status, "application/json", e.ToBody(), std::move(h));
  };
  Backend* b = backend_.load(std::memory_order_acquire);
  const bool draining = draining_.load();
  if (req.path == "/health") {
    if (req.method != "GET" && req.method != "HEAD")
      return send_error(ApiError{405, "invalid_request_error", "use GET for /health", "", "method_not_allowed"});
    if (b == nullptr)
      return w->Send(503, "application/json", R"({"status":"loading"})", {{"retry-after", retry}});
    if (draining) return w->Send(503, "application/json", R"({"status":"draining"})", {{"retry-after", retry}});
    return w->Send(200, "application/json", R"({"status":"ok"})");
  }
  if (req.path == "/metrics") {
    if (b == nullptr || b->metrics == nullptr)
      return send_error(ApiError::Unavailable("the model is still loading"));
    return w->Send(200, "text/plain; version=0.0.4; charset=utf-8", b->metrics->Render(b->frontend->engine().Stats()));
  }
  if (req.path == "/" && req.method == "GET")
    return w->Send(200, "application/json", R"({"service":"strata","docs":"see docs/api.md"})");
  if (req.path.rfind("/admin/", 0) == 0) {
    if (b == nullptr) return send_error(ApiError::Unavailable("the model is still loading"));
    if (b->admin != nullptr && b->admin->Handle(req, w)) return;
    return send_error(ApiError::NotFound("no admin endpoint " + req.method + " " + req.path));
  }
  if (IsApiPath(req.path)) {
    if (!Authorized(req))
      return send_error(ApiError::Unauthorized(req.header("authorization").empty()
                                                   ? "missing API key: send the header 'Authorization: Bearer KEY'"
                                                   : "invalid API key"));
    if (b == nullptr) return send_error(ApiError::Unavailable("the model is still loading; retry shortly"));
    if (draining) return send_error(ApiError::Unavailable("the server is shutting down"));
    if (b->openai->Handle(req, w)) return;
  }
  send_error(ApiError::NotFound("no route " + req.method + " " + req.path));
}

void Service::OnAccess(const AccessRecord& r) {
  Backend* b = backend_.load(std::memory_order_acquire);
  if (b != nullptr && b->metrics != nullptr && r.status >= 400) b->metrics->OnHttpResponse(r.status);
  std::string fields;
  for (const auto& [k, v] : r.fields) fields += " " + k + "=" + v;
  if (r.path == "/health" || r.path == "/metrics") {
    STRATA_LOG_DEBUG("access id={} {} {} status={} ms={:.1f}{}", r.request_id, r.method, r.path, r.status,
                     r.seconds * 1e3, fields);
    return;
  }
  STRATA_LOG_INFO("access id={} remote={} {} {} status={}{} ms={:.1f} bytes={}{}", r.request_id, r.remote, r.method,
                  r.path, r.status, r.client_closed ? " client_closed" : "", r.seconds * 1e3, r.bytes_out, fields);
}

}  // namespace strata::server
