#pragma once
// The gRPC front end of `strata serve`: service strata.v1.Strata
// (proto/strata.proto; docs/grpc.md) plus server reflection.
//
// Requests become server::GenerationParams and go through the same Frontend
// as HTTP (Prepare / Start / Tokenize), so validation, defaults and error
// messages are the HTTP API's; an ApiError becomes a grpc::Status with
// ApiError::grpc_code() and its message, and trailing metadata
// "strata-error-type", "strata-error-param" (when set), "strata-error-code"
// (when set) and "retry-after" (RESOURCE_EXHAUSTED, UNAVAILABLE).
//
// Every call gets a request id (the client's "x-request-id" metadata, else
// generated), returned as initial metadata "x-request-id", and one access
// log line (Health and CacheStats at debug level when they succeed).
//
// Every RPC runs on gRPC's callback API: an open stream costs no thread.
// Tokenization (Generate, Chat, Tokenize) runs on the same request lanes as
// HTTP's (server/request_lanes.h; a full lane is UNAVAILABLE with
// retry-after). A stream's engine events are queued and written one message
// at a time; when a client falls behind by more than 256 messages its
// choices are held in the engine until it catches up. A client that cancels,
// whose deadline passes or whose stream breaks has its engine requests
// cancelled at once.
//
// Thread-safety: port() and active_streams() may be called from any thread; Shutdown once, from
// one thread (the destructor calls it when it was not called).

#include <functional>
#include <memory>
#include <string>

#include "common/status.h"
#include "server/frontend.h"
#include "server/request_lanes.h"

namespace grpc {
class Server;
}

namespace strata::server {

struct GrpcServerOptions {
  std::string host = "127.0.0.1";
  int port = 50051;                  // 0 = any free port (see port())
  int max_message_bytes = 16 << 20;  // larger requests: RESOURCE_EXHAUSTED (gRPC's own check)
  // As for HTTP: when set, Generate, Chat and Tokenize need the metadata
  // "authorization: Bearer <api_key>" and CacheStats needs "authorization:
  // Bearer <admin_token>"; else UNAUTHENTICATED. Health is always open.
  std::string api_key;
  std::string admin_token;
  int retry_after_seconds = 1;  // trailing "retry-after" on RESOURCE_EXHAUSTED / UNAVAILABLE
  // A stream whose message write makes no progress this long (the client
  // stopped reading) is cancelled, its engine requests too; 0 = never.
  double write_timeout_seconds = 30;
  // Called (on the sweeper's thread) for each stream so cancelled.
  std::function<void()> on_write_timeout;
};

class GrpcService;  // the generated service's implementation (grpc_service.cc)

class GrpcServer {
 public:
  // Binds and starts serving. `frontend` (and its engine) and `lanes` must
  // outlive the server. Errors: Unavailable when the address cannot be bound.
  static Result<std::unique_ptr<GrpcServer>> Create(const GrpcServerOptions& options,
                                                    Frontend& frontend, RequestLanes& lanes);
  ~GrpcServer();
  GrpcServer(const GrpcServer&) = delete;
  GrpcServer& operator=(const GrpcServer&) = delete;

  int port() const { return port_; }
  // Generate/Chat calls whose handler is running (for metrics and logs).
  int active_streams() const;

  // Stops accepting calls; calls still running after `deadline_seconds` are
  // cancelled (their engine requests too). Returns when every handler has
  // returned. Idempotent.
  void Shutdown(double deadline_seconds);

 private:
  GrpcServer() = default;

  std::unique_ptr<GrpcService> service_;
  std::unique_ptr<grpc::Server> server_;
  int port_ = 0;
  bool shut_down_ = false;
};

}  // namespace strata::server
