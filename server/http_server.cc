// HttpServer over Boost.Asio, with Beast's request parser. The only TU that
// includes Asio/Beast for HTTP (they compile slowly).
//
// Shape of a connection (all on the connection's strand unless noted):
//   - One read loop reads into `read_buf_` and appends to `in_` for the whole
//     life of the socket (never into in_.prepare(): a pipelined request
//     consumed from in_ while the read is pending moves in_'s write position,
//     and the read's bytes would land where commit() does not look). While
//     a request is being read, Beast's parser is fed from `in_` (put()); while
//     a response is under way the loop keeps reading (up to kMaxBufferedIn,
//     kept for a pipelined next request), so a client that hangs up is seen at
//     once (EOF) even in the middle of a long stream.
//   - Responses are written by hand (status line, headers, chunk framing) from
//     an output queue of owned strings that any thread may append to
//     (Enqueue, under out_mu_); the strand gathers the queue into one
//     async_write. Strings are moved, never copied, on their way to the socket.
//   - An Exchange is one request/response. The handler gets a thin
//     WriterHandle; when the handler drops it without responding, a 500 goes
//     out. The Exchange holds its Connection until the response completes or
//     the connection closes (then it detaches and later calls are no-ops).
//
// Lock order: Exchange::mu_ before Connection::out_mu_. Strand code never holds
// out_mu_ while taking an Exchange's mu_, and never runs user callbacks with
// either held.

#include <utility>  // Boost 1.74's Asio misses it under g++ 12 / C++20+.

#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/status.hpp>
#include <boost/beast/http/string_body.hpp>

#include <array>
#include <atomic>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <deque>
#include <future>
#include <mutex>
#include <random>
#include <thread>
#include <unordered_map>

#include "common/logging.h"
#include "server/api_types.h"
#include "server/http_server.h"

namespace strata::server {
namespace {

namespace asio = boost::asio;
namespace http = boost::beast::http;
using tcp = asio::ip::tcp;
using Clock = std::chrono::steady_clock;
using boost::system::error_code;

constexpr size_t kReadChunk = 16 * 1024;
constexpr size_t kMaxBufferedIn = 64 * 1024;  // pipelined bytes kept while a response runs
constexpr uint32_t kHeaderLimit = 64 * 1024;
constexpr double kLingerSeconds = 2;  // after a response with close: drain the client's leftovers
constexpr const char* kCrlf = "\r\n";

std::string GenerateRequestId() {
  thread_local std::mt19937_64 rng = [] {
    std::random_device rd;
    std::seed_seq seq{rd(), rd(), rd(), rd()};
    return std::mt19937_64(seq);
  }();
  char buf[17];
  std::snprintf(buf, sizeof(buf), "%016llx", static_cast<unsigned long long>(rng()));
  return std::string(buf, 16);
}

// A client's id is echoed only when it is short, visible ASCII.
bool UsableRequestId(const std::string& id) {
  if (id.empty() || id.size() > 200) return false;
  for (unsigned char c : id) {
    if (c <= 0x20 || c >= 0x7f) return false;
  }
  return true;
}

std::string_view SV(boost::beast::string_view s) { return {s.data(), s.size()}; }

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

bool IEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i) {
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) {
      return false;
    }
  }
  return true;
}

std::string ChunkHeader(size_t n) {
  char buf[24];
  auto r = std::to_chars(buf, buf + 16, n, 16);
  *r.ptr++ = '\r';
  *r.ptr++ = '\n';
  return std::string(buf, r.ptr);
}

class ServerImpl;
class Connection;

constexpr size_t kMaxWriteBatchBytes = 64 << 10;

enum class Phase { kNone, kStreaming, kDone };

// One request and its response; shared by the handler's WriterHandle (any
// thread) and the Connection (strand).
class Exchange {
 public:
  Exchange(std::shared_ptr<Connection> conn, unsigned version, bool keep_alive, std::string request_id)
      : conn_(std::move(conn)), version_(version), close_after_(!keep_alive), request_id_(std::move(request_id)) {}

  void Send(int status, std::string content_type, std::string body, HeaderList headers);
  void StartStream(int status, std::string content_type, HeaderList headers);
  bool Write(std::string data);
  void End();
  void OnClose(std::function<void()> f);
  bool closed() const {
    std::lock_guard lock(mu_);
    return closed_;
  }
  void AddLogField(std::string key, std::string value) {
    std::lock_guard lock(mu_);
    fields_.emplace_back(std::move(key), std::move(value));
  }
  // The handler dropped its writer: 500 if nothing was sent, abort an
  // unfinished stream.
  void Abandon();
  uint64_t buffered_bytes() const;
  bool over_buffer_limit() const;
  void OnDrained(std::function<void()> f);

  // Strand side. Marks the exchange closed (the client left or the connection
  // closed) and returns the OnClose callback to run, if the response had not
  // completed.
  std::function<void()> MarkClosed();
  // Detaches from the connection; returns status and log fields.
  void Detach(int* status, std::vector<std::pair<std::string, std::string>>* fields);

  const std::string& request_id() const { return request_id_; }
  // Connection-owned bookkeeping (strand only).
  std::string method, path, remote;
  Clock::time_point start = Clock::now();
  uint64_t bytes_out = 0;

 private:
  std::string HeadLocked(int status, const std::string& content_type, const HeaderList& headers,
                         const std::string* length) ;

  mutable std::mutex mu_;
  std::shared_ptr<Connection> conn_;  // null once detached
  Phase phase_ = Phase::kNone;
  bool closed_ = false;
  bool chunked_ = false;
  const unsigned version_;
  bool close_after_;
  const std::string request_id_;
  int status_ = 0;
  std::function<void()> on_close_;
  std::vector<std::pair<std::string, std::string>> fields_;
};

class WriterHandle final : public ResponseWriter {
 public:
  explicit WriterHandle(std::shared_ptr<Exchange> ex) : ex_(std::move(ex)) {}
  ~WriterHandle() override { ex_->Abandon(); }
  void Send(int status, std::string content_type, std::string body, HeaderList headers) override {
    ex_->Send(status, std::move(content_type), std::move(body), std::move(headers));
  }
  void StartStream(int status, std::string content_type, HeaderList headers) override {
    ex_->StartStream(status, std::move(content_type), std::move(headers));
  }
  bool Write(std::string data) override { return ex_->Write(std::move(data)); }
  void End() override { ex_->End(); }
  void OnClose(std::function<void()> f) override { ex_->OnClose(std::move(f)); }
  bool closed() const override { return ex_->closed(); }
  void AddLogField(std::string key, std::string value) override {
    ex_->AddLogField(std::move(key), std::move(value));
  }
  uint64_t buffered_bytes() const override { return ex_->buffered_bytes(); }
  bool over_buffer_limit() const override { return ex_->over_buffer_limit(); }
  void OnDrained(std::function<void()> f) override { ex_->OnDrained(std::move(f)); }

 private:
  std::shared_ptr<Exchange> ex_;
};

class Connection : public std::enable_shared_from_this<Connection> {
 public:
  Connection(ServerImpl* server, tcp::socket socket, uint64_t id);

  uint64_t id() const { return id_; }
  tcp::socket::executor_type executor() { return socket_.get_executor(); }
  void Start();  // strand
  // Closes the socket; an unfinished exchange is closed (its OnClose runs)
  // and logged with client_closed = `client_gone`. Strand, or any thread once
  // the I/O threads are joined.
  void Close(bool client_gone);

  // Any thread. Appends to the output queue; `last` ends the current response
  // (then the connection closes if `close_after`).
  void Enqueue(std::string* pieces, size_t n, bool last, bool close_after);
  // Any thread: close from the strand.
  void PostClose(bool client_gone);
  // Any thread: bytes enqueued and not yet written; the drained callback
  // (see ResponseWriter::OnDrained).
  uint64_t buffered_bytes() {
    std::lock_guard lock(out_mu_);
    return out_bytes_;
  }
  uint64_t max_buffered_bytes() const;
  void OnDrained(std::function<void()> f);

 private:
  enum class State { kReading, kResponding, kLingering, kClosed };

  void DoRead();
  void OnRead(error_code ec, size_t n);
  void ProcessInput();
  void CheckHeader();
  void Dispatch();
  void RespondError(const ApiError& error);
  void DoFlush();
  void OnWrite(error_code ec, size_t n);
  void OnResponseDone(bool close_after);
  void FinishExchange(bool client_closed);
  void SetDeadline(Clock::time_point d);
  void OnTimer(error_code ec, uint64_t gen);
  std::string RequestIdFromParser();

  ServerImpl* const server_;
  tcp::socket socket_;
  asio::steady_timer timer_;
  const uint64_t id_;
  std::string remote_;

  // Strand state.
  State state_ = State::kReading;
  boost::beast::flat_buffer in_;
  std::array<char, kReadChunk> read_buf_;  // the pending read's target
  bool read_pending_ = false;
  bool peer_gone_ = false;  // read EOF while a write was in flight
  std::optional<http::request_parser<http::string_body>> parser_;
  bool request_started_ = false;
  bool header_checked_ = false;
  Clock::time_point request_start_;
  std::shared_ptr<Exchange> current_;
  std::vector<std::string> inflight_;
  std::vector<asio::const_buffer> buffers_;
  Clock::time_point deadline_ = Clock::time_point::max();
  bool timer_armed_ = false;
  uint64_t timer_gen_ = 0;

  // Output queue, shared with any thread.
  std::mutex out_mu_;
  std::deque<std::string> out_pending_;
  bool write_active_ = false;  // a DoFlush is posted or a write is in flight
  bool out_last_ = false;
  bool out_close_after_ = false;
  uint64_t out_bytes_ = 0;                // pending + in flight
  std::function<void()> on_drained_;      // run when out_bytes_ <= half the limit
  bool out_closed_ = false;               // Close ran
  // Strand: the deadline armed is a write's (see write_timeout_seconds).
  bool write_deadline_ = false;
  bool write_timed_out_ = false;
};

class ServerImpl final : public HttpServer {
 public:
  ServerImpl(const HttpServerOptions& options, HttpHandler handler, std::function<void(const AccessRecord&)> on_access)
      : options_(options),
        handler_(std::move(handler)),
        on_access_(std::move(on_access)),
        ioc_(std::max(1, options.io_threads)),
        acceptor_strand_(asio::make_strand(ioc_)),
        acceptor_(acceptor_strand_),
        retry_timer_(acceptor_strand_) {}
  ~ServerImpl() override { Stop(); }

  Status Listen();
  void Start() override;
  int port() const override { return port_; }
  void StopAccepting() override;
  void Stop() override;
  int open_connections() const override { return open_.load(); }

  const HttpServerOptions& options() const { return options_; }
  bool stopping() const { return stopping_.load(); }
  // Requests read whose response has not completed (or been abandoned).
  void ExchangeBegan() { exchanges_.fetch_add(1); }
  void ExchangeEnded() { exchanges_.fetch_sub(1); }
  bool WaitForResponses(double seconds) override {
    const auto give_up = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
    while (exchanges_.load() > 0) {
      if (Clock::now() >= give_up) return false;
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    return true;
  }
  void CallHandler(HttpRequest&& request, std::shared_ptr<ResponseWriter> writer) {
    handler_(std::move(request), std::move(writer));
  }
  void Access(const AccessRecord& record) {
    if (on_access_) on_access_(record);
  }
  void Unregister(uint64_t id) {
    std::lock_guard lock(conns_mu_);
    if (conns_.erase(id) > 0) open_.fetch_sub(1);
  }

 private:
  void DoAccept();
  void OnAccept(error_code ec, tcp::socket socket);
  bool OnIoThread() const {
    for (const auto& t : threads_) {
      if (t.get_id() == std::this_thread::get_id()) return true;
    }
    return false;
  }

  const HttpServerOptions options_;
  HttpHandler handler_;
  std::function<void(const AccessRecord&)> on_access_;
  asio::io_context ioc_;
  asio::strand<asio::io_context::executor_type> acceptor_strand_;
  tcp::acceptor acceptor_;
  asio::steady_timer retry_timer_;  // backs off when accept fails (EMFILE)
  std::vector<std::thread> threads_;
  int port_ = 0;
  bool started_ = false;
  bool stopped_ = false;
  std::atomic<bool> stopping_{false};
  std::atomic<bool> accepting_{true};
  std::atomic<int> open_{0};
  std::atomic<int> exchanges_{0};
  uint64_t next_id_ = 1;  // acceptor strand
  std::mutex conns_mu_;
  std::unordered_map<uint64_t, std::weak_ptr<Connection>> conns_;
};

// ---------------------------------------------------------------- Exchange

std::string Exchange::HeadLocked(int status, const std::string& content_type, const HeaderList& headers,
                                 const std::string* length) {
  for (const auto& [k, v] : headers) {
    if (IEquals(k, "connection") && IEquals(v, "close")) close_after_ = true;
  }
  std::string reason(http::obsolete_reason(static_cast<http::status>(status)));
  std::string h;
  h.reserve(160 + content_type.size() + request_id_.size());
  h += version_ == 10 ? "HTTP/1.0 " : "HTTP/1.1 ";
  h += std::to_string(status);
  h += ' ';
  h += reason;
  h += "\r\nServer: strata\r\nx-request-id: ";
  h += request_id_;
  h += kCrlf;
  if (!content_type.empty()) {
    h += "Content-Type: ";
    h += content_type;
    h += kCrlf;
  }
  if (length != nullptr) {
    h += "Content-Length: ";
    h += *length;
    h += kCrlf;
  } else if (chunked_) {
    h += "Transfer-Encoding: chunked\r\n";
  }
  for (const auto& [k, v] : headers) {
    if (IEquals(k, "connection")) continue;
    h += k;
    h += ": ";
    h += v;
    h += kCrlf;
  }
  if (close_after_) {
    h += "Connection: close\r\n";
  } else if (version_ == 10) {
    h += "Connection: keep-alive\r\n";
  }
  h += kCrlf;
  return h;
}

void Exchange::Send(int status, std::string content_type, std::string body, HeaderList headers) {
  std::lock_guard lock(mu_);
  if (conn_ == nullptr || closed_ || phase_ != Phase::kNone) return;
  phase_ = Phase::kDone;
  status_ = status;
  std::string length = std::to_string(body.size());
  std::string pieces[2] = {HeadLocked(status, content_type, headers, &length), std::move(body)};
  conn_->Enqueue(pieces, 2, /*last=*/true, close_after_);
}

void Exchange::StartStream(int status, std::string content_type, HeaderList headers) {
  std::lock_guard lock(mu_);
  if (conn_ == nullptr || closed_ || phase_ != Phase::kNone) return;
  phase_ = Phase::kStreaming;
  status_ = status;
  if (version_ == 10) {
    close_after_ = true;  // HTTP/1.0: no chunking; the end of the body is the close
  } else {
    chunked_ = true;
  }
  std::string head = HeadLocked(status, content_type, headers, nullptr);
  conn_->Enqueue(&head, 1, /*last=*/false, close_after_);
}

bool Exchange::Write(std::string data) {
  std::lock_guard lock(mu_);
  if (conn_ == nullptr || closed_ || phase_ != Phase::kStreaming) return false;
  if (data.empty()) return true;  // an empty chunk would end the stream
  if (chunked_) {
    std::string pieces[3] = {ChunkHeader(data.size()), std::move(data), kCrlf};
    conn_->Enqueue(pieces, 3, false, close_after_);
  } else {
    conn_->Enqueue(&data, 1, false, close_after_);
  }
  return true;
}

void Exchange::End() {
  std::lock_guard lock(mu_);
  if (conn_ == nullptr || closed_ || phase_ != Phase::kStreaming) return;
  phase_ = Phase::kDone;
  std::string tail = chunked_ ? "0\r\n\r\n" : "";
  conn_->Enqueue(&tail, 1, /*last=*/true, close_after_);
}

void Exchange::OnClose(std::function<void()> f) {
  {
    std::lock_guard lock(mu_);
    if (!closed_) {
      // After a completed response the callback can never fire; drop it.
      if (conn_ != nullptr) on_close_ = std::move(f);
      return;
    }
  }
  if (f) f();
}

void Exchange::Abandon() {
  std::shared_ptr<Connection> conn;
  {
    std::lock_guard lock(mu_);
    if (conn_ == nullptr || closed_) return;
    if (phase_ == Phase::kNone) {
      ApiError e = ApiError::Internal("the server produced no response for this request");
      phase_ = Phase::kDone;
      status_ = e.http_status;
      std::string body = e.ToBody();
      std::string length = std::to_string(body.size());
      std::string pieces[2] = {HeadLocked(status_, "application/json", {}, &length), std::move(body)};
      conn_->Enqueue(pieces, 2, true, close_after_);
      return;
    }
    if (phase_ == Phase::kDone) return;
    // A stream left unfinished: closing tells the client it is incomplete.
    conn = conn_;
  }
  conn->PostClose(false);
}

std::function<void()> Exchange::MarkClosed() {
  std::lock_guard lock(mu_);
  if (closed_) return nullptr;
  closed_ = true;
  return std::move(on_close_);
}

void Exchange::Detach(int* status, std::vector<std::pair<std::string, std::string>>* fields) {
  std::lock_guard lock(mu_);
  conn_ = nullptr;
  on_close_ = nullptr;
  *status = status_;
  *fields = std::move(fields_);
}

// ---------------------------------------------------------------- Connection

Connection::Connection(ServerImpl* server, tcp::socket socket, uint64_t id)
    : server_(server), socket_(std::move(socket)), timer_(socket_.get_executor()), id_(id) {
  error_code ec;
  auto ep = socket_.remote_endpoint(ec);
  if (!ec) remote_ = ep.address().to_string() + ":" + std::to_string(ep.port());
  socket_.set_option(tcp::no_delay(true), ec);  // SSE chunks go out as written
}

void Connection::Start() {
  SetDeadline(Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                 std::chrono::duration<double>(server_->options().header_timeout_seconds)));
  DoRead();
}

void Connection::DoRead() {
  if (read_pending_ || state_ == State::kClosed) return;
  // While a response runs, keep a bounded amount of a pipelined next request.
  if (state_ == State::kResponding && in_.size() >= kMaxBufferedIn) return;
  read_pending_ = true;
  socket_.async_read_some(asio::buffer(read_buf_),
                          [self = shared_from_this()](error_code ec, size_t n) { self->OnRead(ec, n); });
}

void Connection::OnRead(error_code ec, size_t n) {
  read_pending_ = false;
  if (state_ == State::kClosed) return;
  if (ec) {
    // EOF or reset: mid-response this is a client hang-up, unless the last
    // bytes of the response are in a write whose completion is still queued
    // (a Connection: close client reads the answer and closes at once).
    if (state_ == State::kResponding && !inflight_.empty()) {
      peer_gone_ = true;  // OnWrite decides
      return;
    }
    Close(state_ == State::kResponding);
    return;
  }
  auto space = in_.prepare(n);
  std::memcpy(space.data(), read_buf_.data(), n);
  in_.commit(n);
  switch (state_) {
    case State::kReading:
      ProcessInput();
      break;
    case State::kLingering:
      in_.consume(in_.size());
      break;
    default:
      break;
  }
  DoRead();
}

std::string Connection::RequestIdFromParser() {
  if (parser_) {
    auto it = parser_->get().find("x-request-id");
    if (it != parser_->get().end()) {
      std::string id(it->value());
      if (UsableRequestId(id)) return id;
    }
  }
  return GenerateRequestId();
}

void Connection::ProcessInput() {
  const auto& opt = server_->options();
  while (state_ == State::kReading && in_.size() > 0) {
    if (!parser_) {
      parser_.emplace();
      parser_->header_limit(kHeaderLimit);
      parser_->body_limit(opt.max_body_bytes);
      parser_->eager(true);
      header_checked_ = false;
    }
    if (!request_started_) {
      request_started_ = true;
      request_start_ = Clock::now();
      SetDeadline(request_start_ + std::chrono::duration_cast<Clock::duration>(
                                       std::chrono::duration<double>(opt.header_timeout_seconds)));
    }
    error_code ec;
    size_t used = parser_->put(in_.data(), ec);
    in_.consume(used);
    if (ec == http::error::need_more) {
      CheckHeader();
      return;
    }
    if (ec == http::error::body_limit) {
      RespondError(ApiError::TooLarge("request body exceeds the limit of " + std::to_string(opt.max_body_bytes) +
                                      " bytes"));
      return;
    }
    if (ec) {
      RespondError(ApiError::BadRequest("malformed HTTP request: " + ec.message()));
      return;
    }
    CheckHeader();
    if (parser_->is_done()) {
      Dispatch();
      return;
    }
  }
}

// Once per request, when its header is complete: answer `Expect: 100-continue`.
void Connection::CheckHeader() {
  if (header_checked_ || !parser_ || !parser_->is_header_done()) return;
  header_checked_ = true;
  auto& msg = parser_->get();
  auto it = msg.find(http::field::expect);
  if (it != msg.end() && IEquals(SV(it->value()), "100-continue") && !parser_->is_done()) {
    std::string cont = msg.version() == 10 ? "" : "HTTP/1.1 100 Continue\r\n\r\n";
    if (!cont.empty()) Enqueue(&cont, 1, false, false);
  }
}

void Connection::Dispatch() {
  state_ = State::kResponding;
  SetDeadline(Clock::time_point::max());  // the handler and the stream take as long as they take
  auto& msg = parser_->get();
  HttpRequest req;
  req.method = std::string(msg.method_string());
  req.target = std::string(msg.target());
  auto q = req.target.find('?');
  req.path = req.target.substr(0, q);
  if (q != std::string::npos) req.query = req.target.substr(q + 1);
  for (const auto& f : msg) {
    std::string name = Lower(SV(f.name_string()));
    auto [it, inserted] = req.headers.emplace(name, std::string(f.value()));
    if (!inserted) {
      it->second += ", ";
      it->second += SV(f.value());
    }
  }
  req.request_id = RequestIdFromParser();
  req.remote = remote_;
  req.received_nanos =
      std::chrono::duration_cast<std::chrono::nanoseconds>(request_start_.time_since_epoch()).count();
  req.body = std::move(msg.body());
  bool keep_alive = msg.keep_alive() && !server_->stopping();
  unsigned version = msg.version();
  parser_.reset();
  request_started_ = false;

  auto ex = std::make_shared<Exchange>(shared_from_this(), version, keep_alive, req.request_id);
  ex->method = req.method;
  ex->path = req.path;
  ex->remote = remote_;
  ex->start = request_start_;
  current_ = ex;
  server_->ExchangeBegan();
  auto writer = std::make_shared<WriterHandle>(std::move(ex));
  try {
    server_->CallHandler(std::move(req), std::move(writer));
  } catch (const std::exception& e) {
    // The writer was dropped during unwinding: the client gets a 500.
    STRATA_LOG_ERROR("http: handler threw: {}", e.what());
  }
}

void Connection::RespondError(const ApiError& error) {
  std::string request_id = RequestIdFromParser();
  std::string method, path;
  if (parser_) {
    // Fields parsed before the error are there (a 413 is found right after the header).
    method = std::string(parser_->get().method_string());
    std::string target(parser_->get().target());
    path = target.substr(0, target.find('?'));
  }
  unsigned version = parser_ ? parser_->get().version() : 11;
  if (version != 10) version = 11;
  Clock::time_point start = request_started_ ? request_start_ : Clock::now();
  parser_.reset();
  request_started_ = false;
  state_ = State::kResponding;
  SetDeadline(Clock::time_point::max());
  // Whatever follows in the stream cannot be trusted (or was not read): close after.
  auto ex = std::make_shared<Exchange>(shared_from_this(), version, /*keep_alive=*/false, request_id);
  ex->method = method;
  ex->path = path;
  ex->remote = remote_;
  ex->start = start;
  current_ = ex;
  server_->ExchangeBegan();
  ex->Send(error.http_status, "application/json", error.ToBody(), {});
}

void Connection::Enqueue(std::string* pieces, size_t n, bool last, bool close_after) {
  bool post = false;
  {
    std::lock_guard lock(out_mu_);
    for (size_t i = 0; i < n; ++i) {
      out_bytes_ += pieces[i].size();
      out_pending_.push_back(std::move(pieces[i]));
    }
    if (last) {
      out_last_ = true;
      out_close_after_ = close_after;
    }
    if (!write_active_) {
      write_active_ = true;
      post = true;
    }
  }
  if (post) asio::post(socket_.get_executor(), [self = shared_from_this()] { self->DoFlush(); });
}

void Connection::DoFlush() {
  if (state_ == State::kClosed) return;
  bool done = false, close_after = false;
  {
    std::lock_guard lock(out_mu_);
    if (out_pending_.empty()) {
      write_active_ = false;
      done = out_last_;
      close_after = out_close_after_;
      out_last_ = false;
    } else {
      // At most ~64 KiB per write, so the write timeout measures progress
      // (a slow but steady reader completes a write well within it).
      size_t bytes = 0;
      while (!out_pending_.empty() && (inflight_.empty() || bytes < kMaxWriteBatchBytes)) {
        bytes += out_pending_.front().size();
        inflight_.push_back(std::move(out_pending_.front()));
        out_pending_.pop_front();
      }
    }
  }
  if (inflight_.empty()) {
    if (done) OnResponseDone(close_after);
    return;
  }
  buffers_.clear();
  for (const auto& s : inflight_) {
    if (!s.empty()) buffers_.emplace_back(s.data(), s.size());
  }
  if (state_ == State::kResponding) {
    write_deadline_ = true;
    SetDeadline(Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(
                                   server_->options().write_timeout_seconds)));
  }
  asio::async_write(socket_, buffers_,
                    [self = shared_from_this()](error_code ec, size_t n) { self->OnWrite(ec, n); });
}

void Connection::OnWrite(error_code ec, size_t n) {
  if (state_ == State::kClosed) return;
  if (ec) {
    Close(/*client_gone=*/true);
    return;
  }
  if (current_) current_->bytes_out += n;
  inflight_.clear();
  if (write_deadline_) {
    write_deadline_ = false;
    if (state_ == State::kResponding) SetDeadline(Clock::time_point::max());
  }
  std::function<void()> drained;
  {
    std::lock_guard lock(out_mu_);
    out_bytes_ = n < out_bytes_ ? out_bytes_ - n : 0;
    if (on_drained_ && out_bytes_ <= max_buffered_bytes() / 2) drained = std::move(on_drained_);
    if (drained) on_drained_ = nullptr;
  }
  if (drained) drained();
  if (peer_gone_) {
    bool complete = false;
    {
      std::lock_guard lock(out_mu_);
      complete = out_pending_.empty() && out_last_;
    }
    if (complete) FinishExchange(/*client_closed=*/false);
    Close(/*client_gone=*/!complete);
    return;
  }
  DoFlush();
}

void Connection::OnResponseDone(bool close_after) {
  FinishExchange(/*client_closed=*/false);
  if (close_after || server_->stopping()) {
    // Lingering close: stop sending, drain what the client still sends (say
    // the body of a refused upload) so that closing does not reset the
    // connection before the client has read the response.
    state_ = State::kLingering;
    error_code ignored;
    socket_.shutdown(tcp::socket::shutdown_send, ignored);
    in_.consume(in_.size());
    SetDeadline(Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                   std::chrono::duration<double>(kLingerSeconds)));
    DoRead();
    return;
  }
  state_ = State::kReading;
  SetDeadline(Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(
                                 server_->options().keepalive_timeout_seconds)));
  ProcessInput();  // a pipelined request may be waiting
  DoRead();
}

void Connection::FinishExchange(bool client_closed) {
  if (!current_) return;
  std::shared_ptr<Exchange> ex = std::move(current_);
  current_ = nullptr;
  server_->ExchangeEnded();
  AccessRecord rec;
  ex->Detach(&rec.status, &rec.fields);
  rec.request_id = ex->request_id();
  rec.method = ex->method;
  rec.path = ex->path;
  rec.remote = ex->remote;
  rec.client_closed = client_closed;
  rec.write_timeout = write_timed_out_;
  rec.seconds = std::chrono::duration<double>(Clock::now() - ex->start).count();
  rec.bytes_out = ex->bytes_out;
  server_->Access(rec);
}

uint64_t Connection::max_buffered_bytes() const { return std::max<uint64_t>(1, server_->options().max_buffered_bytes); }

void Connection::OnDrained(std::function<void()> f) {
  {
    std::lock_guard lock(out_mu_);
    if (out_closed_) return;  // OnClose runs (or ran) instead
    if (out_bytes_ > max_buffered_bytes() / 2) {
      on_drained_ = std::move(f);
      return;
    }
  }
  if (f) f();
}

uint64_t Exchange::buffered_bytes() const {
  std::shared_ptr<Connection> c;
  {
    std::lock_guard lock(mu_);
    c = conn_;
  }
  return c ? c->buffered_bytes() : 0;
}

bool Exchange::over_buffer_limit() const {
  std::shared_ptr<Connection> c;
  {
    std::lock_guard lock(mu_);
    c = conn_;
  }
  return c && c->buffered_bytes() > c->max_buffered_bytes();
}

void Exchange::OnDrained(std::function<void()> f) {
  std::shared_ptr<Connection> c;
  {
    std::lock_guard lock(mu_);
    if (closed_) return;
    c = conn_;
  }
  if (c) c->OnDrained(std::move(f));
}

void Connection::PostClose(bool client_gone) {
  asio::post(socket_.get_executor(), [self = shared_from_this(), client_gone] { self->Close(client_gone); });
}

void Connection::Close(bool client_gone) {
  if (state_ == State::kClosed) return;
  state_ = State::kClosed;
  error_code ignored;
  socket_.shutdown(tcp::socket::shutdown_both, ignored);
  socket_.close(ignored);
  timer_.cancel();
  deadline_ = Clock::time_point::max();
  if (current_) {
    std::function<void()> on_close = current_->MarkClosed();
    // Whether the response had completed is known to MarkClosed; a closed
    // exchange here never completed (completed ones were finished already).
    FinishExchange(/*client_closed=*/client_gone);
    if (on_close) on_close();
  }
  parser_.reset();
  {
    std::lock_guard lock(out_mu_);
    out_pending_.clear();
    out_bytes_ = 0;
    on_drained_ = nullptr;
    out_closed_ = true;
  }
  server_->Unregister(id_);
}

void Connection::SetDeadline(Clock::time_point d) {
  deadline_ = d;
  if (d == Clock::time_point::max() || state_ == State::kClosed) return;
  if (timer_armed_ && timer_.expiry() <= d) return;  // fires earlier and re-arms then
  timer_.expires_at(d);
  timer_armed_ = true;
  uint64_t gen = ++timer_gen_;
  timer_.async_wait([self = shared_from_this(), gen](error_code ec) { self->OnTimer(ec, gen); });
}

void Connection::OnTimer(error_code ec, uint64_t gen) {
  if (gen != timer_gen_) return;  // superseded by a re-arm
  timer_armed_ = false;
  if (state_ == State::kClosed || deadline_ == Clock::time_point::max()) return;
  if (Clock::now() < deadline_) {
    SetDeadline(deadline_);
    return;
  }
  if (write_deadline_) {
    // The client has not taken a byte for write_timeout_seconds: treat it as
    // gone (the handler's OnClose cancels its work).
    write_timed_out_ = true;
    Close(/*client_gone=*/true);
    return;
  }
  // Header/body too slow, keep-alive idle, or linger over: close quietly.
  Close(false);
}

// ---------------------------------------------------------------- ServerImpl

Status ServerImpl::Listen() {
  error_code ec;
  tcp::resolver resolver(ioc_);
  auto results = resolver.resolve(options_.host, std::to_string(options_.port),
                                  tcp::resolver::passive | tcp::resolver::numeric_service, ec);
  if (ec || results.empty()) {
    return Status::InvalidArgument("http: cannot resolve host '" + options_.host + "': " + ec.message());
  }
  tcp::endpoint ep = results.begin()->endpoint();
  acceptor_.open(ep.protocol(), ec);
  if (!ec) acceptor_.set_option(asio::socket_base::reuse_address(true), ec);
  if (!ec) acceptor_.bind(ep, ec);
  if (!ec) acceptor_.listen(options_.backlog, ec);
  if (ec) {
    return Status::Unavailable("http: cannot listen on " + options_.host + ":" + std::to_string(options_.port) +
                               ": " + ec.message());
  }
  port_ = acceptor_.local_endpoint(ec).port();
  return Status::Ok();
}

void ServerImpl::Start() {
  if (started_ || stopped_) return;
  started_ = true;
  asio::post(acceptor_strand_, [this] { DoAccept(); });
  int n = std::max(1, options_.io_threads);
  for (int i = 0; i < n; ++i) {
    threads_.emplace_back([this] {
      // Work guard: run() must not return while idle.
      auto guard = asio::make_work_guard(ioc_);
      (void)guard;
      ioc_.run();
    });
  }
}

void ServerImpl::DoAccept() {
  if (!accepting_.load() || !acceptor_.is_open()) return;
  acceptor_.async_accept(asio::make_strand(ioc_),
                         [this](error_code ec, tcp::socket socket) { OnAccept(ec, std::move(socket)); });
}

void ServerImpl::OnAccept(error_code ec, tcp::socket socket) {
  if (!accepting_.load() || !acceptor_.is_open()) return;
  if (ec) {
    if (ec == asio::error::operation_aborted) return;
    // EMFILE and friends: back off instead of spinning on the listener.
    STRATA_LOG_WARN("http: accept failed: {}", ec.message());
    retry_timer_.expires_after(std::chrono::milliseconds(50));
    retry_timer_.async_wait([this](error_code e) {
      if (!e) DoAccept();
    });
    return;
  }
  if (open_.load() >= options_.max_connections || stopping_.load()) {
    error_code ignored;
    socket.close(ignored);
  } else {
    if (options_.socket_send_buffer_bytes > 0) {
      // A bounded kernel buffer makes a client that stops reading visible
      // to the write timeout and the stream buffer (it would otherwise
      // absorb megabytes per connection).
      error_code ignored;
      socket.set_option(asio::socket_base::send_buffer_size(static_cast<int>(options_.socket_send_buffer_bytes)),
                        ignored);
    }
    uint64_t id = next_id_++;
    auto conn = std::make_shared<Connection>(this, std::move(socket), id);
    {
      std::lock_guard lock(conns_mu_);
      conns_.emplace(id, conn);
      open_.fetch_add(1);
    }
    asio::post(conn->executor(), [conn] { conn->Start(); });
  }
  DoAccept();
}

void ServerImpl::StopAccepting() {
  if (!accepting_.exchange(false)) return;
  auto close = [this] {
    error_code ignored;
    acceptor_.close(ignored);
    retry_timer_.cancel();
  };
  if (!started_ || threads_.empty()) {
    close();
    return;
  }
  if (OnIoThread()) {
    asio::post(acceptor_strand_, close);
    return;
  }
  std::promise<void> done;
  asio::post(acceptor_strand_, [&] {
    close();
    done.set_value();
  });
  done.get_future().wait();
}

void ServerImpl::Stop() {
  if (stopped_) return;
  stopped_ = true;
  stopping_.store(true);
  StopAccepting();
  std::vector<std::shared_ptr<Connection>> conns;
  {
    std::lock_guard lock(conns_mu_);
    for (auto& [id, weak] : conns_) {
      if (auto c = weak.lock()) conns.push_back(std::move(c));
    }
  }
  if (!threads_.empty()) {
    for (auto& c : conns) c->PostClose(false);
    auto give_up = Clock::now() + std::chrono::seconds(5);
    while (open_.load() > 0 && Clock::now() < give_up) {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
    }
    ioc_.stop();
    for (auto& t : threads_) t.join();
    threads_.clear();
  }
  // Anything not closed on its strand (or never started) is closed here: no
  // I/O thread runs any more, so strand state is ours.
  for (auto& c : conns) c->Close(false);
}

}  // namespace

Result<std::unique_ptr<HttpServer>> HttpServer::Create(const HttpServerOptions& options, HttpHandler handler,
                                                       std::function<void(const AccessRecord&)> on_access) {
  if (!handler) return Status::InvalidArgument("http: no handler");
  auto server = std::make_unique<ServerImpl>(options, std::move(handler), std::move(on_access));
  STRATA_RETURN_IF_ERROR(server->Listen());
  return std::unique_ptr<HttpServer>(std::move(server));
}

}  // namespace strata::server
