#pragma once
// The OpenAI-compatible routes of `strata serve` (docs/api.md):
//   POST /v1/chat/completions, POST /v1/completions (streaming SSE or not),
//   GET /v1/models, GET /v1/models/{id}, POST /tokenize, POST /detokenize.
// Requests are parsed by openai_protocol, checked and run by the Frontend;
// engine events (on the engine thread) become one response or SSE chunks.
// A known path with the wrong method is a 405; other paths are left to the
// caller (Handle returns false), which also owns /health, /metrics, /admin
// and authentication.
//
// Streaming starts when the first engine event arrives, so a request that
// fails before producing anything still gets a plain error status. A client
// that hangs up (ResponseWriter::OnClose, or a failed Write) has every choice
// of its request cancelled. Each request adds access-log fields:
// prompt_tokens, cached_tokens, completion_tokens, ttft_ms, finish_reason.
//
// Thread-safety: Handle may be called from many I/O threads at once; the
// Frontend (and its engine) must outlive the routes and every request they
// started.

#include <cstdint>
#include <memory>

#include "server/frontend.h"
#include "server/http_server.h"

namespace strata::server {

class OpenAiRoutes {
 public:
  explicit OpenAiRoutes(Frontend& frontend);

  // Serves `req` and returns true when its path is one of the routes above
  // (the response may complete later, from the engine thread); false when
  // the path is not ours (nothing was sent).
  bool Handle(HttpRequest& req, const std::shared_ptr<ResponseWriter>& w);

 private:
  void Generate(HttpRequest& req, const std::shared_ptr<ResponseWriter>& w, ApiKind kind);
  void Models(const HttpRequest& req, const std::shared_ptr<ResponseWriter>& w);
  void Tokenize(const HttpRequest& req, const std::shared_ptr<ResponseWriter>& w);
  void Detokenize(const HttpRequest& req, const std::shared_ptr<ResponseWriter>& w);

  Frontend& frontend_;
  int64_t created_;  // /v1/models "created": when the routes were made (Unix seconds)
};

// Sends `error` as an OpenAI error body with its status (plus Retry-After
// for 429 and 503) and logs its type.
void SendApiError(ResponseWriter& w, const ApiError& error);

}  // namespace strata::server
