#include "server/api_types.h"

#include <nlohmann/json.hpp>

namespace strata::server {

nlohmann::json ApiError::ToJson() const {
  nlohmann::json e;
  e["message"] = message;
  e["type"] = type;
  e["param"] = param.empty() ? nlohmann::json(nullptr) : nlohmann::json(param);
  e["code"] = code.empty() ? nlohmann::json(nullptr) : nlohmann::json(code);
  return nlohmann::json{{"error", e}};
}

std::string ApiError::ToBody() const {
  return ToJson().dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

int ApiError::grpc_code() const {
  // grpc::StatusCode values, without including gRPC here.
  switch (http_status) {
    case 400: return 3;   // INVALID_ARGUMENT
    case 401: return 16;  // UNAUTHENTICATED
    case 403: return 7;   // PERMISSION_DENIED
    case 404: return 5;   // NOT_FOUND
    case 413: return 3;   // INVALID_ARGUMENT (message too large for this API)
    case 429: return 8;   // RESOURCE_EXHAUSTED
    case 499: return 1;   // CANCELLED
    case 503: return 14;  // UNAVAILABLE
    case 504: return 4;   // DEADLINE_EXCEEDED
    default: return http_status >= 500 ? 13 : 2;  // INTERNAL : UNKNOWN
  }
}

namespace {
ApiError Make(int status, std::string type, std::string message, std::string param, std::string code) {
  ApiError e;
  e.http_status = status;
  e.type = std::move(type);
  e.message = std::move(message);
  e.param = std::move(param);
  e.code = std::move(code);
  return e;
}
}  // namespace

ApiError ApiError::BadRequest(std::string message, std::string param) {
  return Make(400, "invalid_request_error", std::move(message), std::move(param), {});
}
ApiError ApiError::NotFound(std::string message, std::string param) {
  return Make(404, "not_found_error", std::move(message), std::move(param), "not_found");
}
ApiError ApiError::Unauthorized(std::string message) {
  return Make(401, "authentication_error", std::move(message), {}, "invalid_api_key");
}
ApiError ApiError::TooLarge(std::string message) {
  return Make(413, "invalid_request_error", std::move(message), {}, "request_too_large");
}
ApiError ApiError::Overloaded(std::string message) {
  return Make(429, "rate_limit_error", std::move(message), {}, "server_overloaded");
}
ApiError ApiError::Unavailable(std::string message) {
  return Make(503, "service_unavailable_error", std::move(message), {}, "service_unavailable");
}
ApiError ApiError::SloUnattainable(std::string message) {
  return Make(429, "rate_limit_error", std::move(message), {}, "slo_unattainable");
}
ApiError ApiError::Internal(std::string message) {
  return Make(500, "server_error", std::move(message), {}, "internal_error");
}

}  // namespace strata::server
