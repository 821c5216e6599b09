#pragma once
// Protocol-neutral request parameters and errors shared by the HTTP (OpenAI)
// and gRPC front ends. HTTP parses JSON into GenerationParams, gRPC parses
// protobuf into the same struct; both hand it to the Frontend, so validation
// and semantics are the same for both.
//
// Thread-safety: plain values.

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

#include "model/chat.h"
#include "model/sampler.h"

namespace strata::server {

// An error for a client, in OpenAI's shape:
//   {"error": {"message": ..., "type": ..., "param": ..., "code": ...}}
// `param` and `code` are null in JSON when empty.
struct ApiError {
  int http_status = 400;
  std::string type = "invalid_request_error";
  std::string message;
  std::string param;
  std::string code;

  nlohmann::json ToJson() const;
  std::string ToBody() const;  // ToJson().dump()
  // The gRPC status code (grpc::StatusCode value) for http_status: 400 and
  // 413 → INVALID_ARGUMENT, 401 → UNAUTHENTICATED, 404 → NOT_FOUND, 429 →
  // RESOURCE_EXHAUSTED, 503 → UNAVAILABLE, other 5xx → INTERNAL.
  int grpc_code() const;

  static ApiError BadRequest(std::string message, std::string param = {});
  static ApiError NotFound(std::string message, std::string param = {});  // type "not_found_error"
  static ApiError Unauthorized(std::string message);    // 401 "authentication_error"
  static ApiError TooLarge(std::string message);        // 413 "invalid_request_error"
  static ApiError Overloaded(std::string message);      // 429 "rate_limit_error", code "server_overloaded"
  static ApiError Unavailable(std::string message);     // 503 "service_unavailable_error"
  static ApiError Internal(std::string message);        // 500 "server_error"
  // 429 "rate_limit_error", code "slo_unattainable": no instance is
  // predicted to meet the request's service level (a router's --slo).
  static ApiError SloUnattainable(std::string message);
};

enum class ApiKind { kChat, kCompletion };

struct GenerationParams {
  ApiKind kind = ApiKind::kCompletion;
  std::string model;                  // must equal the served model name
  std::vector<ChatMessage> messages;  // kChat
  // kCompletion: text, or token ids used as given.
  std::string prompt_text;
  std::vector<int32_t> prompt_ids;
  bool prompt_is_ids = false;
  std::optional<int> max_tokens;      // absent = the rest of the context
  SamplingParams sampling;            // includes seed, logprobs, top_logprobs, penalties, logit_bias
  std::vector<std::string> stop;      // at most 4
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  int n = 1;                          // choices
  bool stream = false;
  bool include_usage = false;         // stream_options.include_usage
  bool echo = false;                  // completions: prepend the prompt text
  std::optional<bool> add_special_tokens;  // absent: completions true (BOS), chat per template
  std::string user;
  std::string cache_salt;
  double cache_ttl_seconds = 0;       // keep the prompt's KV at least this long after use (0 = no ask)
  int priority = 0;                   // lower runs first
};

}  // namespace strata::server
