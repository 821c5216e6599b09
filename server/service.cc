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

Service::Service(ServiceOptions options) : options_(std::move(options)), lanes_(options_.lanes) {}
Service::~Service() { Stop(); }

void Service::Stop() { lanes_.Stop(); }

void Service::SendError(const ApiError& e, const std::shared_ptr<ResponseWriter>& w) const {
  HeaderList h;
  if (e.http_status == 429 || e.http_status == 503)
    h.emplace_back("retry-after", std::to_string(options_.retry_after_seconds));
  if (e.http_status == 401) h.emplace_back("www-authenticate", "Bearer");
  w->Send(e.http_status, "application/json", e.ToBody(), std::move(h));
}

void Service::SetBackend(Frontend* frontend, OpenAiRoutes* openai, AdminRoutes* admin, ServerMetrics* metrics,
                         std::function<std::string()> extra_metrics) {
  owned_ = std::make_unique<Backend>(Backend{frontend, openai, admin, metrics, std::move(extra_metrics)});
  backend_.store(owned_.get(), std::memory_order_release);
}

void Service::SetDraining() { draining_.store(true); }

namespace {
// Whether `req` carries "Authorization: Bearer SECRET" (always, when the
// secret is empty: that route is open).
bool BearerMatches(const HttpRequest& req, const std::string& secret) {
  if (secret.empty()) return true;
  const std::string auth = req.header("authorization");
  const std::string prefix = "Bearer ";
  if (auth.size() <= prefix.size() || auth.compare(0, prefix.size(), prefix) != 0) return false;
  return SecretEquals(auth.substr(prefix.size()), secret);
}
}  // namespace

bool Service::Authorized(const HttpRequest& req) const { return BearerMatches(req, options_.api_key); }

bool Service::AdminAuthorized(const HttpRequest& req) const { return BearerMatches(req, options_.admin_token); }

void Service::Handle(HttpRequest&& req, std::shared_ptr<ResponseWriter> w) {
  const std::string retry = std::to_string(options_.retry_after_seconds);
  Backend* b = backend_.load(std::memory_order_acquire);
  const bool draining = draining_.load();
  if (req.path == "/health") {
    if (req.method != "GET" && req.method != "HEAD")
      return SendError(ApiError{405, "invalid_request_error", "use GET for /health", "", "method_not_allowed"}, w);
    if (b == nullptr)
      return w->Send(503, "application/json", R"({"status":"loading"})", {{"retry-after", retry}});
    if (draining) return w->Send(503, "application/json", R"({"status":"draining"})", {{"retry-after", retry}});
    return w->Send(200, "application/json", R"({"status":"ok"})");
  }
  if (req.path == "/metrics") {
    if (b == nullptr || b->metrics == nullptr)
      return SendError(ApiError::Unavailable("the model is still loading"), w);
    FrontDoorStats front;
    for (size_t i = 0; i < kNumLanes; ++i) front.lanes[i] = lanes_.stats(static_cast<Lane>(i));
    front.write_timeouts = write_timeouts_.load();
    std::string text = b->metrics->Render(b->frontend->engine().Stats(), &front);
    if (b->extra_metrics) text += b->extra_metrics();
    return w->Send(200, "text/plain; version=0.0.4; charset=utf-8", std::move(text));
  }
  if (req.path == "/" && req.method == "GET")
    return w->Send(200, "application/json", R"({"service":"strata","docs":"see docs/api.md"})");
  // Everything else parses JSON or tokenizes: off the I/O thread.
  const Lane lane = lanes_.Classify(req.body.size());
  auto work = [this, r = std::make_shared<HttpRequest>(std::move(req)), w] { Route(std::move(*r), w); };
  if (!lanes_.Post(lane, std::move(work))) {
    const LaneOptions& lo = lane == Lane::kSmall ? lanes_.options().small : lanes_.options().large;
    SendError(ApiError::Unavailable("the server is busy: the " + std::string(LaneName(lane)) +
                                    "-request lane has " + std::to_string(lo.max_queue) +
                                    " requests waiting; retry later"),
              w);
  }
}

void Service::Route(HttpRequest&& req, const std::shared_ptr<ResponseWriter>& w) {
  if (w->closed()) return;  // the client left while the request waited in its lane
  Backend* b = backend_.load(std::memory_order_acquire);
  const bool draining = draining_.load();
  if (req.path.rfind("/admin/", 0) == 0) {
    if (b == nullptr) return SendError(ApiError::Unavailable("the model is still loading"), w);
    if (b->admin != nullptr && b->admin->Handle(req, w)) return;
    return SendError(ApiError::NotFound("no admin endpoint " + req.method + " " + req.path), w);
  }
  if (req.path.rfind("/internal/", 0) == 0) {
    if (!BearerMatches(req, options_.internal_token.empty() ? options_.admin_token : options_.internal_token))
      return SendError(ApiError::Unauthorized(options_.internal_token.empty()
                                                  ? "the cluster routes need 'Authorization: Bearer ADMIN_TOKEN'"
                                                  : "the cluster routes need the cluster secret's bearer token"),
                       w);
    if (b == nullptr) return SendError(ApiError::Unavailable("the model is still loading"), w);
    if (internal_ && internal_(req, w)) return;
    return SendError(ApiError::NotFound("no cluster endpoint " + req.method + " " + req.path), w);
  }
  if (IsApiPath(req.path)) {
    if (!Authorized(req))
      return SendError(ApiError::Unauthorized(req.header("authorization").empty()
                                                  ? "missing API key: send the header 'Authorization: Bearer KEY'"
                                                  : "invalid API key"),
                       w);
    if (b == nullptr) return SendError(ApiError::Unavailable("the model is still loading; retry shortly"), w);
    if (draining) return SendError(ApiError::Unavailable("the server is shutting down"), w);
    if (b->openai->Handle(req, w)) return;
  }
  SendError(ApiError::NotFound("no route " + req.method + " " + req.path), w);
}

void Service::OnAccess(const AccessRecord& r) {
  if (r.write_timeout) write_timeouts_.fetch_add(1);
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
                  r.path, r.status,
                  r.write_timeout ? " write_timeout" : (r.client_closed ? " client_closed" : ""), r.seconds * 1e3,
                  r.bytes_out, fields);
}

}  // namespace strata::server
