#pragma once
// A small blocking HTTP/1.1 client over POSIX sockets, for tests, `strata
// cache` and `strata bench run`. Plain http only (no TLS, no redirects, no
// proxies). Bodies are read by Content-Length, chunked transfer encoding, or
// to EOF; `100 Continue` interim responses are skipped.
//
// Timeouts: HttpCall and HttpConnection::Call bound the whole call (connect,
// send, full response); HttpStream bounds connect + header, then each wait for
// more body bytes (a stream may run as long as data keeps coming).
//
// Thread-safety: the free functions may be called from any thread at once.
// An HttpConnection is used by one thread at a time. SseParser is a value.

#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "common/status.h"
#include <utility>
#include <vector>

namespace strata {

// HTTP header fields as (name, value) pairs, in order.
using HeaderList = std::vector<std::pair<std::string, std::string>>;

struct HttpResponse {
  int status = 0;
  std::map<std::string, std::string> headers;  // names lower-case; repeats joined with ", "
  std::string body;
  std::string header(const std::string& name) const {
    auto it = headers.find(name);
    return it == headers.end() ? std::string() : it->second;
  }
};

// Called with body bytes (chunk framing removed) as they arrive; return false
// to close the connection at once.
using HttpDataFn = std::function<bool(std::string_view data)>;

// One request on a fresh connection (sent with `Connection: close`).
// Errors: kUnavailable (cannot connect, reset), kIoError, kCorrupt (a reply
// that is not HTTP), kResourceExhausted (timeout). An HTTP error status is a
// value, not an error.
Result<HttpResponse> HttpCall(const std::string& host, int port, const std::string& method, const std::string& path,
                              const std::string& body = "", const HeaderList& headers = {},
                              double timeout_seconds = 60);

// Like HttpCall, but the body goes to `on_data` as it arrives (the returned
// body stays empty). When on_data returns false the socket is closed at once
// and the response so far (status, headers) is returned.
Result<HttpResponse> HttpStream(const std::string& host, int port, const std::string& method,
                                const std::string& path, const std::string& body, const HeaderList& headers,
                                HttpDataFn on_data, double timeout_seconds = 60);

// A keep-alive connection: requests go over the same socket while the server
// keeps it open; it reconnects when the server closed it between calls.
class HttpConnection {
 public:
  HttpConnection(std::string host, int port) : host_(std::move(host)), port_(port) {}
  ~HttpConnection();
  HttpConnection(const HttpConnection&) = delete;
  HttpConnection& operator=(const HttpConnection&) = delete;

  Result<HttpResponse> Call(const std::string& method, const std::string& path, const std::string& body = "",
                            const HeaderList& headers = {}, double timeout_seconds = 60);
  // Streaming form; see HttpStream. Returning false from on_data closes the socket.
  Result<HttpResponse> Stream(const std::string& method, const std::string& path, const std::string& body,
                              const HeaderList& headers, HttpDataFn on_data, double timeout_seconds = 60);
  bool connected() const { return fd_ >= 0; }
  // From any thread: ends the call in progress at once (its socket is shut
  // down; it returns kCancelled) and makes every later call fail with
  // kCancelled. For a caller that must give up a blocking call (a client
  // that left).
  void Abort();
  // How many TCP connections this object has opened (1 while keep-alive holds).
  int connects() const { return connects_; }
  void Close();

 private:
  Result<HttpResponse> Do(const std::string& method, const std::string& path, const std::string& body,
                          const HeaderList& headers, const HttpDataFn* on_data, double timeout_seconds,
                          bool close_after);
  bool IsAborted();
  // kCancelled when Abort() was called (whatever the socket said), else `s`.
  Status AbortedOr(Status s);

  std::string host_;
  int port_;
  int fd_ = -1;
  int connects_ = 0;
  std::string leftover_;  // bytes read past the previous response
  std::mutex abort_mu_;   // fd_'s close and Abort's shutdown
  bool aborted_ = false;  // abort_mu_

  friend Result<HttpResponse> HttpCall(const std::string&, int, const std::string&, const std::string&,
                                       const std::string&, const HeaderList&, double);
  friend Result<HttpResponse> HttpStream(const std::string&, int, const std::string&, const std::string&,
                                         const std::string&, const HeaderList&, HttpDataFn, double);
};

// Splits a Server-Sent Events stream into events and returns the `data:`
// payload of each (several data lines of one event joined with "\n"; events
// without data, such as `: comment`, are skipped). Accepts \n and \r\n.
class SseParser {
 public:
  void Feed(std::string_view bytes) { buf_.append(bytes); }
  // True with the next event's data, false when no complete event is buffered.
  bool Next(std::string* data);

 private:
  std::string buf_;
  size_t pos_ = 0;
};

struct HttpUrl {
  std::string host;
  int port = 80;
  std::string path = "/";  // "/" when the URL has none
};
// "http://host:port[/path]", "host:port" or "http://[::1]:8000". Errors:
// kInvalidArgument naming the URL (https, bad port, empty host).
Result<HttpUrl> ParseHttpUrl(std::string_view url);

}  // namespace strata
