#pragma once
// An asynchronous HTTP/1.1 server (Boost.Beast over Asio) for the OpenAI API,
// metrics and admin endpoints: keep-alive, bodies up to a limit (413 beyond),
// chunked streaming for SSE, and detection of clients that hang up
// mid-stream. A few I/O threads hold thousands of open connections; handlers
// must not block (they hand work to the engine and return).
//
// Every response carries `x-request-id` (the client's when it sent one,
// else a generated one). When a response completes (or the client goes away)
// the access callback gets one record per request.
//
// Thread-safety: ResponseWriter methods may be called from any thread (the
// engine thread streams through them). HttpServer's Start/Stop from one
// thread.

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/http_client.h"  // HeaderList
#include "common/status.h"

namespace strata::server {

using ::strata::HeaderList;

struct HttpRequest {
  std::string method;   // "GET", "POST", ...
  std::string target;   // as sent: path and query
  std::string path;     // without the query
  std::string query;    // after '?', may be empty
  std::map<std::string, std::string> headers;  // names lower-case
  std::string body;
  std::string request_id;  // x-request-id given or generated
  std::string remote;      // peer address:port
  // std::chrono::steady_clock time (ns since its epoch, the same clock as
  // kvcache::RealClock) when the request's first byte was read.
  int64_t received_nanos = 0;
  // Header value or "" (name lower-case).
  std::string header(const std::string& name) const {
    auto it = headers.find(name);
    return it == headers.end() ? std::string() : it->second;
  }
};

// One request's response. Either Send() once, or StartStream(), Write()...,
// End(). Calls after the response is complete are ignored.
class ResponseWriter {
 public:
  virtual ~ResponseWriter() = default;
  virtual void Send(int status, std::string content_type, std::string body, HeaderList headers = {}) = 0;
  // Chunked transfer encoding; for SSE pass "text/event-stream".
  virtual void StartStream(int status, std::string content_type, HeaderList headers = {}) = 0;
  // Queues data; false once the client is gone (then stop producing).
  virtual bool Write(std::string data) = 0;
  virtual void End() = 0;
  // `f` runs once, on an I/O thread, if the client hangs up (or the write
  // fails) before the response completed; runs at once if already closed.
  virtual void OnClose(std::function<void()> f) = 0;
  virtual bool closed() const = 0;
  // Adds "key=value" to this request's access log line.
  virtual void AddLogField(std::string key, std::string value) = 0;
  // Bytes queued for this connection and not yet written to its socket.
  // Write never drops data; a producer that sees more than
  // HttpServerOptions::max_buffered_bytes should stop producing until
  // OnDrained fires.
  virtual uint64_t buffered_bytes() const = 0;
  virtual bool over_buffer_limit() const = 0;
  // `f` runs once, on an I/O thread, when the queued bytes fall to half the
  // limit or less (at once, on the caller's thread, if they already are).
  // Not run if the connection closes first (OnClose runs instead). A later
  // call replaces an earlier one not yet run.
  virtual void OnDrained(std::function<void()> f) = 0;
};

using HttpHandler = std::function<void(HttpRequest&&, std::shared_ptr<ResponseWriter>)>;

struct AccessRecord {
  std::string request_id, method, path, remote;
  int status = 0;          // 0 when the client left before a response started
  bool client_closed = false;
  bool write_timeout = false;  // closed because the client read nothing for write_timeout_seconds
  double seconds = 0;      // request read → response complete
  uint64_t bytes_out = 0;
  std::vector<std::pair<std::string, std::string>> fields;  // AddLogField
};

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;  // 0 = any free port (see port())
  int io_threads = 2;
  uint64_t max_body_bytes = 16ull << 20;  // larger bodies get 413 (OpenAI error body)
  int backlog = 4096;
  int max_connections = 20000;            // beyond: accepted and closed at once
  double header_timeout_seconds = 30;     // to read a request's header and body
  double keepalive_timeout_seconds = 120; // idle between requests
  // A response write that makes no progress for this long (the client stopped
  // reading and the socket buffers are full) closes the connection like a
  // hang-up: OnClose runs, the access record says write_timeout.
  double write_timeout_seconds = 30;
  uint64_t max_buffered_bytes = 1u << 20;  // per connection; see ResponseWriter::buffered_bytes
  // SO_SNDBUF of accepted connections (Linux doubles it); 0 = the kernel's
  // autotuning, which lets a client that never reads absorb up to
  // net.ipv4.tcp_wmem's maximum (4 MiB) before anything stalls.
  uint64_t socket_send_buffer_bytes = 64u << 10;
};

class HttpServer {
 public:
  // Binds and listens (errors: address in use, bad host). Does not serve yet.
  static Result<std::unique_ptr<HttpServer>> Create(const HttpServerOptions& options, HttpHandler handler,
                                                   std::function<void(const AccessRecord&)> on_access = nullptr);
  virtual ~HttpServer() = default;
  virtual void Start() = 0;           // starts the I/O threads
  virtual int port() const = 0;       // the bound port
  virtual void StopAccepting() = 0;   // closes the listener; open connections go on
  // Waits until every request read so far has its response completely
  // written (or its client gone), at most `seconds`. False on timeout.
  // Graceful shutdown calls it between the engine's stop and Stop(), so
  // the last bytes of cancelled streams reach their clients.
  virtual bool WaitForResponses(double seconds) = 0;
  virtual void Stop() = 0;            // closes everything and joins the threads
  virtual int open_connections() const = 0;
};

}  // namespace strata::server
