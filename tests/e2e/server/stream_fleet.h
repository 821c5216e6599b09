#pragma once
// Many HTTP/1.1 requests at once from one thread: nonblocking sockets and
// poll(), so a test can hold a thousand streams open against `strata serve`
// without a thousand threads. Reads each response whole (chunked or
// Content-Length), counts its SSE `data:` events, and can hang up after a
// number of them (a client that goes away mid-stream).
//
// Header-only because tests/CMakeLists.txt builds one executable per
// *_test.cc; the load and cancel tests include it.
//
// Thread-safety: RunFleet is reentrant; each call owns its sockets.

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

namespace strata::testing {

struct FleetRequest {
  std::string raw;               // the whole request: request line, headers, body
  int hangup_after_events = -1;  // close after this many SSE data events; -1 = read to the end
  // Close once the status line is in and this many seconds have passed since
  // the requests were sent (released); < 0 = never.
  double hangup_after_seconds = -1;
};

struct FleetResult {
  int status = 0;          // 0: no status line received
  std::string headers;     // raw header block (names as sent)
  std::string body;        // de-chunked
  bool complete = false;   // the response was read to its end
  bool hung_up = false;    // we closed after hangup_after_events
  std::string error;       // connect/read failure, early close or timeout
  int data_events = 0;     // SSE events that start with "data:"
  bool saw_done = false;   // "data: [DONE]" among them
  // First value of header `name` (case-insensitive), or "".
  std::string header(const std::string& name) const {
    auto lower = [](std::string s) {
      for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
      return s;
    };
    const std::string want = lower(name);
    size_t pos = 0;
    while (pos < headers.size()) {
      size_t eol = headers.find("\r\n", pos);
      if (eol == std::string::npos) eol = headers.size();
      size_t colon = headers.find(':', pos);
      if (colon != std::string::npos && colon < eol && lower(headers.substr(pos, colon - pos)) == want) {
        std::string v = headers.substr(colon + 1, eol - colon - 1);
        size_t b = v.find_first_not_of(" \t");
        return b == std::string::npos ? std::string() : v.substr(b, v.find_last_not_of(" \t") - b + 1);
      }
      pos = eol + 2;
    }
    return "";
  }
};

struct FleetOptions {
  double timeout_seconds = 120;  // for the whole fleet; unfinished requests get error "timeout"
  // Send every request except its last byte first, then all last bytes in
  // one tight loop, so the server sees the requests complete as nearly at
  // once as a single client can make it (the overload test).
  bool hold_last_byte = false;
};

// Raises the soft RLIMIT_NOFILE to min(want, hard limit); returns the new
// soft limit. Children started afterwards inherit it.
inline long RaiseFdLimit(long want) {
  rlimit rl{};
  if (getrlimit(RLIMIT_NOFILE, &rl) != 0) return -1;
  rlim_t target = static_cast<rlim_t>(want);
  if (rl.rlim_max != RLIM_INFINITY && target > rl.rlim_max) target = rl.rlim_max;
  if (rl.rlim_cur == RLIM_INFINITY || rl.rlim_cur >= target) {
    return rl.rlim_cur == RLIM_INFINITY ? want : static_cast<long>(rl.rlim_cur);
  }
  rl.rlim_cur = target;
  if (setrlimit(RLIMIT_NOFILE, &rl) != 0) return -1;
  return static_cast<long>(target);
}

namespace fleet_detail {

enum class Phase { kConnecting, kSending, kHolding, kReading, kDone };

struct Conn {
  int fd = -1;
  Phase phase = Phase::kConnecting;
  size_t sent = 0;
  size_t send_limit = 0;  // bytes to send before holding
  std::string in;         // bytes received, not yet consumed
  bool headers_done = false;
  bool chunked = false;
  long long content_length = -1;
  bool in_chunk_trailer = false;
  long long chunk_left = -1;  // -1: expecting a size line
  size_t sse_scanned = 0;     // body bytes already split into events
};

inline void CountEvents(Conn& c, FleetResult& r) {
  while (true) {
    size_t end = r.body.find("\n\n", c.sse_scanned);
    if (end == std::string::npos) return;
    std::string event = r.body.substr(c.sse_scanned, end - c.sse_scanned);
    c.sse_scanned = end + 2;
    size_t b = event.find_first_not_of("\r\n");
    if (b != std::string::npos && event.compare(b, 5, "data:") == 0) {
      ++r.data_events;
      std::string payload = event.substr(b + 5);
      size_t p = payload.find_first_not_of(' ');
      if (p != std::string::npos && payload.compare(p, 6, "[DONE]") == 0) r.saw_done = true;
    }
  }
}

// Consumes c.in; returns true when the response is complete.
inline bool Consume(Conn& c, FleetResult& r) {
  if (!c.headers_done) {
    size_t end = c.in.find("\r\n\r\n");
    if (end == std::string::npos) return false;
    std::string head = c.in.substr(0, end);
    c.in.erase(0, end + 4);
    c.headers_done = true;
    size_t eol = head.find("\r\n");
    std::string status_line = head.substr(0, eol);
    if (status_line.size() >= 12 && status_line.rfind("HTTP/1.", 0) == 0) r.status = std::atoi(status_line.c_str() + 9);
    r.headers = eol == std::string::npos ? "" : head.substr(eol + 2);
    std::string te = r.header("transfer-encoding");
    for (char& ch : te) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
    c.chunked = te.find("chunked") != std::string::npos;
    std::string cl = r.header("content-length");
    if (!c.chunked && !cl.empty()) c.content_length = std::atoll(cl.c_str());
  }
  if (!c.chunked) {
    r.body += c.in;
    c.in.clear();
    CountEvents(c, r);
    return c.content_length >= 0 && static_cast<long long>(r.body.size()) >= c.content_length;
  }
  while (true) {
    if (c.chunk_left < 0) {
      size_t eol = c.in.find("\r\n");
      if (eol == std::string::npos) return false;
      long long size = std::strtoll(c.in.substr(0, eol).c_str(), nullptr, 16);
      c.in.erase(0, eol + 2);
      if (size == 0) return true;  // trailers, if any, are not needed
      c.chunk_left = size;
    }
    if (c.chunk_left > 0) {
      size_t take = std::min(static_cast<size_t>(c.chunk_left), c.in.size());
      r.body.append(c.in, 0, take);
      c.in.erase(0, take);
      c.chunk_left -= static_cast<long long>(take);
      if (c.chunk_left > 0) {
        CountEvents(c, r);
        return false;
      }
    }
    if (c.in.size() < 2) {
      CountEvents(c, r);
      return false;
    }
    c.in.erase(0, 2);  // CRLF after the chunk
    c.chunk_left = -1;
    CountEvents(c, r);
  }
}

}  // namespace fleet_detail

// Runs every request on its own connection to 127.0.0.1:port, all at once.
inline std::vector<FleetResult> RunFleet(int port, const std::vector<FleetRequest>& requests,
                                         const FleetOptions& options = {}) {
  using fleet_detail::Conn;
  using fleet_detail::Phase;
  const auto t0 = std::chrono::steady_clock::now();
  auto elapsed = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };

  std::vector<Conn> conns(requests.size());
  std::vector<FleetResult> results(requests.size());
  auto finish = [&](size_t i, const std::string& error) {
    if (conns[i].fd >= 0) ::close(conns[i].fd);
    conns[i].fd = -1;
    conns[i].phase = Phase::kDone;
    if (!error.empty() && results[i].error.empty()) results[i].error = error;
  };

  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  for (size_t i = 0; i < requests.size(); ++i) {
    Conn& c = conns[i];
    c.send_limit = requests[i].raw.size() - (options.hold_last_byte && !requests[i].raw.empty() ? 1 : 0);
    c.fd = ::socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (c.fd < 0) {
      finish(i, std::string("socket: ") + std::strerror(errno));
      continue;
    }
    int one = 1;
    ::setsockopt(c.fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (::connect(c.fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr) == 0) {
      c.phase = Phase::kSending;
    } else if (errno != EINPROGRESS) {
      finish(i, std::string("connect: ") + std::strerror(errno));
    }
  }

  bool released = !options.hold_last_byte;
  double released_at = 0;  // elapsed() when the last bytes went out
  std::vector<pollfd> fds;
  std::vector<size_t> index;
  char buf[65536];
  while (true) {
    // Release the held last bytes once every connection is holding (or done).
    if (!released) {
      bool all_holding = true;
      for (const Conn& c : conns) all_holding = all_holding && (c.phase == Phase::kHolding || c.phase == Phase::kDone);
      if (all_holding) {
        released = true;
        released_at = elapsed();
        for (size_t i = 0; i < conns.size(); ++i) {
          Conn& c = conns[i];
          if (c.phase != Phase::kHolding) continue;
          c.send_limit = requests[i].raw.size();
          c.phase = Phase::kSending;
          ssize_t n = ::send(c.fd, requests[i].raw.data() + c.sent, c.send_limit - c.sent, MSG_NOSIGNAL);
          if (n > 0) c.sent += static_cast<size_t>(n);
          if (c.sent == c.send_limit) c.phase = Phase::kReading;
        }
      }
    }
    if (released) {
      for (size_t i = 0; i < conns.size(); ++i) {
        const double after = requests[i].hangup_after_seconds;
        if (after >= 0 && conns[i].phase == Phase::kReading && conns[i].headers_done &&
            elapsed() - released_at >= after) {
          results[i].hung_up = true;
          finish(i, "");
        }
      }
    }
    fds.clear();
    index.clear();
    for (size_t i = 0; i < conns.size(); ++i) {
      const Conn& c = conns[i];
      if (c.phase == Phase::kDone || c.phase == Phase::kHolding) continue;
      short ev = 0;
      if (c.phase == Phase::kConnecting || c.phase == Phase::kSending) ev = POLLOUT;
      if (c.phase == Phase::kReading || c.phase == Phase::kSending) ev |= POLLIN;
      fds.push_back(pollfd{c.fd, ev, 0});
      index.push_back(i);
    }
    if (fds.empty() && released) break;
    if (elapsed() > options.timeout_seconds) {
      for (size_t i = 0; i < conns.size(); ++i) {
        if (conns[i].phase != Phase::kDone) finish(i, "timeout");
      }
      break;
    }
    if (fds.empty()) continue;  // all holding: released on the next pass
    int pr = ::poll(fds.data(), fds.size(), 20);
    if (pr < 0 && errno != EINTR) {
      for (size_t i = 0; i < conns.size(); ++i) {
        if (conns[i].phase != Phase::kDone) finish(i, std::string("poll: ") + std::strerror(errno));
      }
      break;
    }
    if (pr <= 0) continue;
    for (size_t k = 0; k < fds.size(); ++k) {
      if (fds[k].revents == 0) continue;
      const size_t i = index[k];
      Conn& c = conns[i];
      FleetResult& r = results[i];
      if (c.phase == Phase::kConnecting) {
        int err = 0;
        socklen_t len = sizeof err;
        ::getsockopt(c.fd, SOL_SOCKET, SO_ERROR, &err, &len);
        if (err != 0) {
          finish(i, std::string("connect: ") + std::strerror(err));
          continue;
        }
        c.phase = Phase::kSending;
      }
      if (c.phase == Phase::kSending && (fds[k].revents & POLLOUT)) {
        while (c.sent < c.send_limit) {
          ssize_t n = ::send(c.fd, requests[i].raw.data() + c.sent, c.send_limit - c.sent, MSG_NOSIGNAL);
          if (n <= 0) break;
          c.sent += static_cast<size_t>(n);
        }
        if (c.sent == c.send_limit) {
          c.phase = c.send_limit < requests[i].raw.size() ? Phase::kHolding : Phase::kReading;
        }
      }
      if ((c.phase == Phase::kReading || c.phase == Phase::kSending) &&
          (fds[k].revents & (POLLIN | POLLHUP | POLLERR))) {
        while (true) {
          ssize_t n = ::recv(c.fd, buf, sizeof buf, 0);
          if (n > 0) {
            c.in.append(buf, static_cast<size_t>(n));
            continue;
          }
          if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK)) break;
          if (n < 0 && errno == EINTR) continue;
          // Closed by the server (or reset).
          bool done = fleet_detail::Consume(c, r);
          if (!done && c.headers_done && !c.chunked && c.content_length < 0) done = true;  // read-to-close body
          if (done) {
            r.complete = true;
            finish(i, "");
          } else {
            finish(i, n == 0 ? "closed before the response was complete" : std::string("recv: ") + std::strerror(errno));
          }
          break;
        }
        if (c.phase == Phase::kDone) continue;
        if (fleet_detail::Consume(c, r)) {
          r.complete = true;
          finish(i, "");
        } else if (requests[i].hangup_after_events >= 0 && c.headers_done &&
                   r.data_events >= requests[i].hangup_after_events) {
          r.hung_up = true;
          finish(i, "");
        }
      }
    }
  }
  return results;
}

// An HTTP/1.1 POST of a JSON body, as raw bytes for RunFleet.
inline std::string RawPost(int port, const std::string& target, const std::string& body,
                           const std::vector<std::string>& extra_headers = {}) {
  std::string r = "POST " + target + " HTTP/1.1\r\nHost: 127.0.0.1:" + std::to_string(port) +
                  "\r\nContent-Type: application/json\r\nContent-Length: " + std::to_string(body.size()) + "\r\n";
  for (const auto& h : extra_headers) r += h + "\r\n";
  return r + "\r\n" + body;
}

}  // namespace strata::testing
