#pragma once
// The gRPC transport of `strata bench run` (`--url grpc://HOST:PORT`): talks
// to a server's `strata.v1.Strata` service (proto/strata.proto) through the
// generated stub and fills the same RequestRecord fields as the HTTP path:
//   - start/end times, TTFT from the first streamed Delta with text, and the
//     arrival time of every such Delta (inter-token times);
//   - prompt, completion and cached tokens, cached_tokens_by_tier, from the
//     final Usage message;
//   - errors: error = "grpc_<STATUS NAME>" (e.g. grpc_RESOURCE_EXHAUSTED,
//     grpc_UNAVAILABLE; "context" for a refusal because the prompt does not fit
//     the context, as over HTTP), error_message = the status message; a stream
//     that ends OK without a Usage message is a "stream" error.
//     http_status carries the HTTP equivalent of the gRPC status (200 for OK,
//     429 for RESOURCE_EXHAUSTED, 503 for UNAVAILABLE, 400 for
//     INVALID_ARGUMENT, ...; 0 when the server was never reached), so that
//     the report counts rejections (429/503) the same way for both transports;
//     grpc_status keeps the name.
// The per-run questions the HTTP path asks of /v1/models and /metrics come
// from Health + Tokenize (model name, max_model_len) and CacheStats (prefix
// query and hit tokens by tier, running, waiting).
//
// Thread-safety: a GrpcClient is shared by every session thread of a run
// (gRPC channels and stubs are thread-safe); each call is independent.

#include <chrono>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "bench/load_driver.h"
#include "common/status.h"

namespace strata::bench {

// True when `url` starts with "grpc://".
bool IsGrpcUrl(std::string_view url);

// "grpc://HOST:PORT" (an optional trailing '/'); HOST may be a name, an IPv4
// address or a bracketed IPv6 address. InvalidArgument otherwise, naming what
// is wrong.
Result<std::pair<std::string, int>> ParseGrpcUrl(std::string_view url);

// One request to stream.
struct GrpcSend {
  std::string model;
  int max_tokens = 0;
  std::vector<int32_t> prompt;  // a completion over token ids, unless `chat`
  bool chat = false;
  std::vector<std::pair<std::string, std::string>> messages;  // chat: (role, content)
  std::string cache_salt;
};

class GrpcClient {
 public:
  // Opens a channel to host:port and waits up to `connect_timeout_s` for it
  // to connect. Unavailable, naming the address, when it does not.
  static Result<std::unique_ptr<GrpcClient>> Connect(const std::string& host, int port,
                                                     double connect_timeout_s = 10);
  ~GrpcClient();
  GrpcClient(const GrpcClient&) = delete;
  GrpcClient& operator=(const GrpcClient&) = delete;

  // The served model (Health) and its context length (Tokenize).
  Result<ServedModel> QueryModel();
  // The vocabulary size, from the server's refusal of an out-of-range token
  // id; 0 when the answer does not say.
  int ProbeVocabSize(const std::string& model);
  // Streams one Generate (token ids) or Chat call and fills *r (see the top;
  // times are seconds since t0). `timeout_s` bounds the whole call. Returns
  // the generated text.
  std::string Send(const GrpcSend& req, std::chrono::steady_clock::time_point t0, double timeout_s,
                   RequestRecord* r);
  // CacheStats as a metrics sample (t_s left 0); false when it failed.
  bool Scrape(MetricsSample* out);

  const std::string& target() const { return target_; }

 private:
  struct Impl;
  explicit GrpcClient(std::unique_ptr<Impl> impl, std::string target);
  std::unique_ptr<Impl> impl_;
  std::string target_;
};

}  // namespace strata::bench
