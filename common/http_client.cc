#include "common/http_client.h"

#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstring>

namespace strata {
namespace {

using Clock = std::chrono::steady_clock;
constexpr size_t kMaxHead = 1 << 20;

Clock::time_point After(double seconds) {
  return Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
}

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

std::string_view Trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

// Waits for `events` on fd until `deadline`. Error kResourceExhausted on timeout.
Status Wait(int fd, short events, Clock::time_point deadline, short* revents) {
  for (;;) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    if (left <= 0) return Status::ResourceExhausted("http client: timed out");
    pollfd p{fd, events, 0};
    int r = ::poll(&p, 1, static_cast<int>(std::min<long long>(left, 1 << 30)));
    if (r < 0) {
      if (errno == EINTR) continue;
      return Status::IoError("http client: poll", "", errno);
    }
    if (r == 0) continue;  // re-check the deadline
    *revents = p.revents;
    return Status::Ok();
  }
}

Result<int> Connect(const std::string& host, int port, Clock::time_point deadline) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  std::string port_str = std::to_string(port);
  int rc = ::getaddrinfo(host.c_str(), port_str.c_str(), &hints, &res);
  if (rc != 0) return Status::Unavailable("http client: cannot resolve '" + host + "': " + gai_strerror(rc));
  Status last = Status::Unavailable("http client: no address for '" + host + "'");
  for (addrinfo* ai = res; ai != nullptr; ai = ai->ai_next) {
    int fd = ::socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, ai->ai_protocol);
    if (fd < 0) {
      last = Status::IoError("http client: socket", host, errno);
      continue;
    }
    int err = 0;
    if (::connect(fd, ai->ai_addr, ai->ai_addrlen) != 0) {
      err = errno;
      if (err == EINPROGRESS) {
        short rev = 0;
        Status s = Wait(fd, POLLOUT, deadline, &rev);
        if (!s.ok()) {
          ::close(fd);
          last = s;
          continue;
        }
        socklen_t len = sizeof(err);
        ::getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
      }
    }
    if (err != 0) {
      ::close(fd);
      last = Status::Unavailable("http client: cannot connect to " + host + ":" + port_str + ": " + std::strerror(err));
      continue;
    }
    int one = 1;
    ::setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    ::freeaddrinfo(res);
    return fd;
  }
  ::freeaddrinfo(res);
  return last;
}

// Sends all of `data`. Stops early (ok, *answered = true) when the server
// already has something to say (a 413 before the body was read, say), and
// treats a reset while sending the same way: the answer may be readable.
Status SendAll(int fd, std::string_view data, Clock::time_point deadline, bool* answered) {
  *answered = false;
  while (!data.empty()) {
    short rev = 0;
    STRATA_RETURN_IF_ERROR(Wait(fd, POLLOUT | POLLIN, deadline, &rev));
    if (rev & POLLIN) {
      *answered = true;
      return Status::Ok();
    }
    ssize_t n = ::send(fd, data.data(), data.size(), MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EAGAIN || errno == EINTR) continue;
      if (errno == EPIPE || errno == ECONNRESET) {
        *answered = true;
        return Status::Ok();
      }
      return Status::IoError("http client: send", "", errno);
    }
    data.remove_prefix(static_cast<size_t>(n));
  }
  return Status::Ok();
}

// Buffered reads with a deadline: fixed (whole call) or renewed per read (streams).
class Reader {
 public:
  Reader(int fd, std::string* buf, Clock::time_point deadline) : fd_(fd), buf_(*buf), deadline_(deadline) {}
  void SetIdleTimeout(double seconds) { idle_ = seconds; }
  // Appends at least one byte; *eof on orderly close.
  Status Fill(bool* eof) {
    *eof = false;
    if (idle_ > 0) deadline_ = After(idle_);
    for (;;) {
      short rev = 0;
      STRATA_RETURN_IF_ERROR(Wait(fd_, POLLIN, deadline_, &rev));
      char tmp[16384];
      ssize_t n = ::recv(fd_, tmp, sizeof(tmp), 0);
      if (n < 0) {
        if (errno == EAGAIN || errno == EINTR) continue;
        if (errno == ECONNRESET) return Status::Unavailable("http client: connection reset by server");
        return Status::IoError("http client: recv", "", errno);
      }
      if (n == 0) {
        *eof = true;
        return Status::Ok();
      }
      buf_.append(tmp, static_cast<size_t>(n));
      return Status::Ok();
    }
  }
  // A line ending in CRLF (or LF), without it.
  Status Line(std::string* line) {
    for (;;) {
      size_t nl = buf_.find('\n');
      if (nl != std::string::npos) {
        *line = std::string(Trim(std::string_view(buf_).substr(0, nl)));
        buf_.erase(0, nl + 1);
        return Status::Ok();
      }
      if (buf_.size() > kMaxHead) return Status::Corrupt("http client: line too long");
      bool eof = false;
      STRATA_RETURN_IF_ERROR(Fill(&eof));
      if (eof) return Status::Unavailable("http client: connection closed mid-response");
    }
  }
  std::string& buf() { return buf_; }

 private:
  int fd_;
  std::string& buf_;
  Clock::time_point deadline_;
  double idle_ = 0;
};

// Reads a status line and headers (skipping 1xx). *got_any: some byte came.
Status ReadHead(Reader& r, HttpResponse* resp, bool* http10, bool* got_any) {
  for (;;) {
    size_t end;
    while ((end = r.buf().find("\r\n\r\n")) == std::string::npos) {
      if (r.buf().size() > kMaxHead) return Status::Corrupt("http client: response header too large");
      bool eof = false;
      STRATA_RETURN_IF_ERROR(r.Fill(&eof));
      if (eof) {
        return Status::Unavailable(r.buf().empty() ? "http client: connection closed before a response"
                                                   : "http client: connection closed mid-header");
      }
      *got_any = true;
    }
    *got_any = true;
    std::string_view head(r.buf().data(), end);
    size_t eol = head.find("\r\n");
    std::string_view status_line = head.substr(0, eol);
    if (status_line.size() < 12 || status_line.substr(0, 5) != "HTTP/") {
      return Status::Corrupt("http client: not an HTTP response: '" + std::string(status_line.substr(0, 80)) + "'");
    }
    *http10 = status_line.substr(5, 3) == "1.0";
    int status = 0;
    auto code = status_line.substr(9, 3);
    if (std::from_chars(code.data(), code.data() + 3, status).ec != std::errc() || status < 100) {
      return Status::Corrupt("http client: bad status line '" + std::string(status_line) + "'");
    }
    resp->status = status;
    resp->headers.clear();
    std::string_view rest = eol == std::string_view::npos ? std::string_view() : head.substr(eol + 2);
    while (!rest.empty()) {
      size_t e = rest.find("\r\n");
      std::string_view line = rest.substr(0, e);
      rest = e == std::string_view::npos ? std::string_view() : rest.substr(e + 2);
      size_t colon = line.find(':');
      if (colon == std::string_view::npos) continue;
      std::string name = Lower(Trim(line.substr(0, colon)));
      std::string value(Trim(line.substr(colon + 1)));
      auto [it, inserted] = resp->headers.emplace(name, value);
      if (!inserted) it->second += ", " + value;
    }
    r.buf().erase(0, end + 4);
    if (status >= 100 && status < 200) continue;  // 100 Continue and friends
    return Status::Ok();
  }
}

// Hands body bytes to on_data (or the body). False: the caller asked to stop.
bool Emit(HttpResponse* resp, const HttpDataFn* on_data, std::string_view data) {
  if (data.empty()) return true;
  if (on_data != nullptr) return (*on_data)(data);
  resp->body.append(data);
  return true;
}

// Reads the body. *reusable: the connection may carry another request.
// *stopped: on_data returned false.
Status ReadBody(Reader& r, const std::string& method, HttpResponse* resp, bool http10, const HttpDataFn* on_data,
                bool* reusable, bool* stopped) {
  *stopped = false;
  std::string conn = Lower(resp->header("connection"));
  *reusable = http10 ? conn.find("keep-alive") != std::string::npos : conn.find("close") == std::string::npos;
  if (method == "HEAD" || resp->status == 204 || resp->status == 304) return Status::Ok();
  std::string te = Lower(resp->header("transfer-encoding"));
  bool eof = false;
  if (te.find("chunked") != std::string::npos) {
    for (;;) {
      std::string line;
      STRATA_RETURN_IF_ERROR(r.Line(&line));
      size_t size = 0;
      auto semi = line.find(';');
      std::string_view hex = Trim(std::string_view(line).substr(0, semi));
      if (hex.empty() || std::from_chars(hex.data(), hex.data() + hex.size(), size, 16).ec != std::errc()) {
        return Status::Corrupt("http client: bad chunk size '" + line + "'");
      }
      if (size == 0) {
        // Trailers up to an empty line.
        do {
          STRATA_RETURN_IF_ERROR(r.Line(&line));
        } while (!line.empty());
        return Status::Ok();
      }
      while (size > 0) {
        if (r.buf().empty()) {
          STRATA_RETURN_IF_ERROR(r.Fill(&eof));
          if (eof) return Status::Unavailable("http client: connection closed mid-chunk");
        }
        size_t take = std::min(size, r.buf().size());
        bool go_on = Emit(resp, on_data, std::string_view(r.buf()).substr(0, take));
        r.buf().erase(0, take);
        size -= take;
        if (!go_on) {
          *stopped = true;
          return Status::Ok();
        }
      }
      STRATA_RETURN_IF_ERROR(r.Line(&line));
      if (!line.empty()) return Status::Corrupt("http client: chunk not followed by CRLF");
    }
  }
  std::string cl = resp->header("content-length");
  if (!cl.empty()) {
    size_t left = 0;
    if (std::from_chars(cl.data(), cl.data() + cl.size(), left).ec != std::errc()) {
      return Status::Corrupt("http client: bad content-length '" + cl + "'");
    }
    while (left > 0) {
      if (r.buf().empty()) {
        STRATA_RETURN_IF_ERROR(r.Fill(&eof));
        if (eof) return Status::Unavailable("http client: connection closed mid-body");
      }
      size_t take = std::min(left, r.buf().size());
      bool go_on = Emit(resp, on_data, std::string_view(r.buf()).substr(0, take));
      r.buf().erase(0, take);
      left -= take;
      if (!go_on) {
        *stopped = true;
        return Status::Ok();
      }
    }
    return Status::Ok();
  }
  // No length: the body ends with the connection.
  *reusable = false;
  for (;;) {
    bool go_on = Emit(resp, on_data, r.buf());
    r.buf().clear();
    if (!go_on) {
      *stopped = true;
      return Status::Ok();
    }
    STRATA_RETURN_IF_ERROR(r.Fill(&eof));
    if (eof) return Status::Ok();
  }
}

}  // namespace

HttpConnection::~HttpConnection() { Close(); }

void HttpConnection::Close() {
  std::lock_guard lock(abort_mu_);
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  leftover_.clear();
}

bool HttpConnection::IsAborted() {
  std::lock_guard lock(abort_mu_);
  return aborted_;
}

Status HttpConnection::AbortedOr(Status s) {
  if (IsAborted()) return Status::Cancelled("the call was aborted");
  return s;
}

void HttpConnection::Abort() {
  std::lock_guard lock(abort_mu_);
  aborted_ = true;
  if (fd_ >= 0) ::shutdown(fd_, SHUT_RDWR);
}

Result<HttpResponse> HttpConnection::Call(const std::string& method, const std::string& path,
                                          const std::string& body, const HeaderList& headers,
                                          double timeout_seconds) {
  return Do(method, path, body, headers, nullptr, timeout_seconds, false);
}

Result<HttpResponse> HttpConnection::Stream(const std::string& method, const std::string& path,
                                            const std::string& body, const HeaderList& headers, HttpDataFn on_data,
                                            double timeout_seconds) {
  return Do(method, path, body, headers, &on_data, timeout_seconds, false);
}

Result<HttpResponse> HttpConnection::Do(const std::string& method, const std::string& path, const std::string& body,
                                        const HeaderList& headers, const HttpDataFn* on_data,
                                        double timeout_seconds, bool close_after) {
  Clock::time_point deadline = After(timeout_seconds);
  std::string req;
  req.reserve(256 + body.size());
  req += method + " " + path + " HTTP/1.1\r\nHost: " + host_ + ":" + std::to_string(port_) + "\r\n";
  bool has_type = false;
  for (const auto& [k, v] : headers) {
    if (Lower(k) == "content-type") has_type = true;
    req += k + ": " + v + "\r\n";
  }
  if (!body.empty() && !has_type) req += "Content-Type: application/json\r\n";
  if (!body.empty() || method == "POST" || method == "PUT" || method == "PATCH") {
    req += "Content-Length: " + std::to_string(body.size()) + "\r\n";
  }
  if (close_after) req += "Connection: close\r\n";
  req += "\r\n";
  req += body;

  // A kept-alive socket may have been closed by the server meanwhile: one
  // retry on a fresh connection when nothing at all came back.
  for (int attempt = 0;; ++attempt) {
    if (IsAborted()) return Status::Cancelled("the call was aborted");
    bool reused = fd_ >= 0;
    if (fd_ < 0) {
      STRATA_ASSIGN_OR_RETURN(int fd, Connect(host_, port_, deadline));
      std::lock_guard lock(abort_mu_);
      fd_ = fd;
      ++connects_;
      leftover_.clear();
    }
    {
      std::lock_guard lock(abort_mu_);
      if (aborted_) {
        ::shutdown(fd_, SHUT_RDWR);
      }
    }
    bool answered_early = false;
    Status sent = SendAll(fd_, req, deadline, &answered_early);
    if (!sent.ok()) {
      Close();
      return AbortedOr(sent);
    }
    HttpResponse resp;
    bool http10 = false, got_any = false;
    Reader reader(fd_, &leftover_, deadline);
    if (on_data != nullptr) reader.SetIdleTimeout(timeout_seconds);
    Status head = ReadHead(reader, &resp, &http10, &got_any);
    if (!head.ok()) {
      Close();
      if (reused && !got_any && attempt == 0 && head.code() == StatusCode::kUnavailable && !IsAborted()) continue;
      return AbortedOr(head);
    }
    bool reusable = false, stopped = false;
    Status b = ReadBody(reader, method, &resp, http10, on_data, &reusable, &stopped);
    if (!b.ok()) {
      Close();
      return AbortedOr(b);
    }
    if (stopped || !reusable || close_after || answered_early) Close();
    return resp;
  }
}

Result<HttpResponse> HttpCall(const std::string& host, int port, const std::string& method, const std::string& path,
                              const std::string& body, const HeaderList& headers, double timeout_seconds) {
  HttpConnection c(host, port);
  return c.Do(method, path, body, headers, nullptr, timeout_seconds, true);
}

Result<HttpResponse> HttpStream(const std::string& host, int port, const std::string& method,
                                const std::string& path, const std::string& body, const HeaderList& headers,
                                HttpDataFn on_data, double timeout_seconds) {
  HttpConnection c(host, port);
  return c.Do(method, path, body, headers, &on_data, timeout_seconds, true);
}

bool SseParser::Next(std::string* data) {
  size_t p = pos_;
  bool have = false, found = false;
  std::string out;
  for (;;) {
    size_t nl = buf_.find('\n', p);
    if (nl == std::string::npos) break;  // an incomplete event is parsed again next time
    std::string_view line(buf_.data() + p, nl - p);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    p = nl + 1;
    if (line.empty()) {
      pos_ = p;  // the event ends here, with or without data
      if (have) {
        found = true;
        break;
      }
      continue;
    }
    if (line.substr(0, 5) == "data:") {
      std::string_view v = line.substr(5);
      if (!v.empty() && v.front() == ' ') v.remove_prefix(1);
      if (have) out += '\n';
      out.append(v);
      have = true;
    }
  }
  if (pos_ > 4096 && pos_ * 2 > buf_.size()) {
    buf_.erase(0, pos_);
    pos_ = 0;
  }
  if (found) *data = std::move(out);
  return found;
}

Result<HttpUrl> ParseHttpUrl(std::string_view url) {
  std::string_view rest = url;
  auto bad = [&](const std::string& why) { return Status::InvalidArgument("bad URL '" + std::string(url) + "': " + why); };
  if (size_t s = rest.find("://"); s != std::string_view::npos) {
    std::string scheme = Lower(rest.substr(0, s));
    if (scheme != "http") return bad("only http:// is supported");
    rest.remove_prefix(s + 3);
  }
  HttpUrl out;
  size_t slash = rest.find('/');
  std::string_view authority = rest.substr(0, slash);
  if (slash != std::string_view::npos) out.path = std::string(rest.substr(slash));
  std::string_view port_str;
  bool has_port = false;
  if (!authority.empty() && authority.front() == '[') {
    size_t close = authority.find(']');
    if (close == std::string_view::npos) return bad("unclosed '['");
    out.host = std::string(authority.substr(1, close - 1));
    std::string_view after = authority.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') return bad("junk after ']'");
      port_str = after.substr(1);
      has_port = true;
    }
  } else {
    size_t colon = authority.rfind(':');
    out.host = std::string(authority.substr(0, colon));
    if (colon != std::string_view::npos) {
      port_str = authority.substr(colon + 1);
      has_port = true;
    }
  }
  if (out.host.empty()) return bad("no host");
  if (has_port) {
    int port = 0;
    auto r = std::from_chars(port_str.data(), port_str.data() + port_str.size(), port);
    if (port_str.empty() || r.ec != std::errc() || r.ptr != port_str.data() + port_str.size() || port < 1 ||
        port > 65535) {
      return bad("bad port '" + std::string(port_str) + "'");
    }
    out.port = port;
  }
  return out;
}

}  // namespace strata
