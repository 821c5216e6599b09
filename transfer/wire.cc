#include "transfer/wire.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/crypto.h>
#include <openssl/hmac.h>
#include <openssl/rand.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <vector>

namespace strata::transfer {
namespace {

void PutU16(uint8_t* p, uint16_t v) { std::memcpy(p, &v, 2); }
void PutU32(uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); }
void PutU64(uint8_t* p, uint64_t v) { std::memcpy(p, &v, 8); }
uint32_t GetU32(const uint8_t* p) { uint32_t v; std::memcpy(&v, p, 4); return v; }
uint64_t GetU64(const uint8_t* p) { uint64_t v; std::memcpy(&v, p, 8); return v; }

bool IsDataFrame(FrameType t) { return t == FrameType::kWrite; }

Status Errno(std::string_view what, int err) {
  return Status::Unavailable(std::string(what) + ": " + std::strerror(err));
}

}  // namespace

std::string_view FrameTypeName(FrameType t) {
  switch (t) {
    case FrameType::kHelloTarget: return "hello-target";
    case FrameType::kHelloPeer: return "hello-peer";
    case FrameType::kAuthOk: return "auth-ok";
    case FrameType::kAuthFail: return "auth-fail";
    case FrameType::kOpenSegment: return "open-segment";
    case FrameType::kOpenGrant: return "open-grant";
    case FrameType::kOpenReply: return "open-reply";
    case FrameType::kRead: return "read";
    case FrameType::kReadReply: return "read-reply";
    case FrameType::kWrite: return "write";
    case FrameType::kWriteReply: return "write-reply";
    case FrameType::kRevoke: return "revoke";
    case FrameType::kRevokeAck: return "revoke-ack";
  }
  return "unknown";
}

void EncodeHeader(const FrameHeader& h, uint8_t out[kHeaderBytes]) {
  std::memset(out, 0, kHeaderBytes);
  PutU32(out, kFrameMagic);
  out[4] = static_cast<uint8_t>(h.type);
  out[5] = static_cast<uint8_t>(h.status);
  PutU16(out + 6, 0);
  PutU32(out + 8, h.payload_bytes);
  PutU64(out + 16, h.request_id);
  PutU64(out + 24, h.handle);
  PutU64(out + 32, h.offset);
  PutU64(out + 40, h.length);
}

Result<FrameHeader> DecodeHeader(std::span<const uint8_t> b) {
  if (b.size() < kHeaderBytes) return Status::Corrupt("transfer frame: short header");
  if (GetU32(b.data()) != kFrameMagic) return Status::Corrupt("transfer frame: bad magic (not a Strata transfer peer?)");
  FrameHeader h;
  uint8_t type = b[4];
  if (type < 1 || type > static_cast<uint8_t>(FrameType::kRevokeAck)) {
    return Status::Corrupt("transfer frame: unknown type " + std::to_string(type));
  }
  h.type = static_cast<FrameType>(type);
  if (b[5] > static_cast<uint8_t>(StatusCode::kDeadlineExceeded)) {
    return Status::Corrupt("transfer frame: unknown status " + std::to_string(b[5]));
  }
  h.status = static_cast<StatusCode>(b[5]);
  h.payload_bytes = GetU32(b.data() + 8);
  h.request_id = GetU64(b.data() + 16);
  h.handle = GetU64(b.data() + 24);
  h.offset = GetU64(b.data() + 32);
  h.length = GetU64(b.data() + 40);
  if (IsDataFrame(h.type)) {
    if (h.length > kMaxDataPayload || h.payload_bytes != h.length) {
      return Status::Corrupt("transfer frame: write of " + std::to_string(h.length) + " bytes carries " +
                             std::to_string(h.payload_bytes) + " (limit " + std::to_string(kMaxDataPayload) + ")");
    }
  } else if (h.type == FrameType::kReadReply && h.status == StatusCode::kOk) {
    if (h.payload_bytes != h.length || h.length > kMaxDataPayload) {
      return Status::Corrupt("transfer frame: read reply length mismatch");
    }
  } else if (h.payload_bytes > kMaxControlPayload) {
    return Status::Corrupt("transfer frame: " + std::string(FrameTypeName(h.type)) + " payload of " +
                           std::to_string(h.payload_bytes) + " bytes exceeds " + std::to_string(kMaxControlPayload));
  }
  if (h.type == FrameType::kRead && h.length > kMaxDataPayload) {
    return Status::Corrupt("transfer frame: read of " + std::to_string(h.length) + " bytes exceeds the frame limit");
  }
  return h;
}

Sha256Digest HmacSha256(std::string_view key, std::string_view data) {
  Sha256Digest out{};
  unsigned int len = 0;
  static const unsigned char kEmpty = 0;
  HMAC(EVP_sha256(), key.empty() ? static_cast<const void*>(&kEmpty) : static_cast<const void*>(key.data()), static_cast<int>(key.size()),
       reinterpret_cast<const unsigned char*>(data.data()), data.size(), out.data(), &len);
  return out;
}

bool DigestEqual(const Sha256Digest& a, const Sha256Digest& b) {
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

std::string RandomHex(size_t n) {
  std::vector<uint8_t> bytes(n);
  if (RAND_bytes(bytes.data(), static_cast<int>(n)) != 1) {
    // Fall back to the clock; the nonce only needs to be unique per connection.
    uint64_t t = std::chrono::steady_clock::now().time_since_epoch().count();
    for (size_t i = 0; i < n; ++i) bytes[i] = static_cast<uint8_t>(t >> ((i % 8) * 8)) ^ static_cast<uint8_t>(i);
  }
  return ToHex(bytes.data(), bytes.size());
}

Status SendAll(int fd, const void* data, size_t len, std::string_view what) {
  const uint8_t* p = static_cast<const uint8_t*>(data);
  while (len > 0) {
    ssize_t n = ::send(fd, p, len, MSG_NOSIGNAL);
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return Status::DeadlineExceeded(std::string(what) + ": send timed out");
      return Errno(what, errno);
    }
    p += n;
    len -= static_cast<size_t>(n);
  }
  return Status::Ok();
}

Status RecvAll(int fd, void* data, size_t len, std::string_view what) {
  uint8_t* p = static_cast<uint8_t*>(data);
  while (len > 0) {
    ssize_t n = ::recv(fd, p, len, 0);
    if (n == 0) return Status::Unavailable(std::string(what) + ": connection closed by peer");
    if (n < 0) {
      if (errno == EINTR) continue;
      if (errno == EAGAIN || errno == EWOULDBLOCK) return Status::DeadlineExceeded(std::string(what) + ": receive timed out");
      return Errno(what, errno);
    }
    p += n;
    len -= static_cast<size_t>(n);
  }
  return Status::Ok();
}

Status SendFrame(int fd, FrameHeader h, std::string_view payload) {
  h.payload_bytes = static_cast<uint32_t>(payload.size());
  uint8_t hdr[kHeaderBytes];
  EncodeHeader(h, hdr);
  if (payload.empty()) return SendAll(fd, hdr, kHeaderBytes, FrameTypeName(h.type));
  iovec iov[2] = {{hdr, kHeaderBytes}, {const_cast<char*>(payload.data()), payload.size()}};
  msghdr msg{};
  msg.msg_iov = iov;
  msg.msg_iovlen = 2;
  size_t total = kHeaderBytes + payload.size();
  ssize_t n;
  do { n = ::sendmsg(fd, &msg, MSG_NOSIGNAL); } while (n < 0 && errno == EINTR);
  if (n < 0) return Errno(FrameTypeName(h.type), errno);
  if (static_cast<size_t>(n) == total) return Status::Ok();
  // Partial: finish the rest plainly.
  size_t done = static_cast<size_t>(n);
  if (done < kHeaderBytes) {
    if (Status s = SendAll(fd, hdr + done, kHeaderBytes - done, FrameTypeName(h.type)); !s.ok()) return s;
    done = kHeaderBytes;
  }
  size_t pdone = done - kHeaderBytes;
  return SendAll(fd, payload.data() + pdone, payload.size() - pdone, FrameTypeName(h.type));
}

Result<FrameHeader> RecvHeader(int fd) {
  uint8_t hdr[kHeaderBytes];
  if (Status s = RecvAll(fd, hdr, kHeaderBytes, "transfer frame header"); !s.ok()) return s;
  return DecodeHeader(std::span<const uint8_t>(hdr, kHeaderBytes));
}

Status Discard(int fd, uint64_t len) {
  char buf[16384];
  while (len > 0) {
    size_t n = std::min<uint64_t>(len, sizeof(buf));
    if (Status s = RecvAll(fd, buf, n, "discarding payload"); !s.ok()) return s;
    len -= n;
  }
  return Status::Ok();
}

bool IsLoopbackAddress(const std::string& host) {
  if (host == "localhost") return true;
  in_addr a{};
  if (inet_pton(AF_INET, host.c_str(), &a) != 1) return false;
  return (ntohl(a.s_addr) >> 24) == 127;
}

namespace {
Result<sockaddr_in> ParseAddr(const std::string& host, int port) {
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_port = htons(static_cast<uint16_t>(port));
  std::string h = host == "localhost" ? "127.0.0.1" : host;
  if (inet_pton(AF_INET, h.c_str(), &addr.sin_addr) != 1) {
    return Status::InvalidArgument("'" + host + "' is not an IPv4 address");
  }
  return addr;
}
}  // namespace

Result<int> ListenTcp(const std::string& host, int port, int* bound_port) {
  auto addr = ParseAddr(host, port);
  if (!addr) return addr.error();
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return Errno("socket", errno);
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
  if (::bind(fd, reinterpret_cast<sockaddr*>(&*addr), sizeof(*addr)) != 0) {
    int err = errno;
    ::close(fd);
    return Status::Unavailable("transfer listener: cannot bind " + host + ":" + std::to_string(port) + ": " +
                               std::strerror(err));
  }
  if (::listen(fd, 128) != 0) {
    int err = errno;
    ::close(fd);
    return Errno("listen", err);
  }
  sockaddr_in got{};
  socklen_t len = sizeof(got);
  getsockname(fd, reinterpret_cast<sockaddr*>(&got), &len);
  if (bound_port) *bound_port = ntohs(got.sin_port);
  return fd;
}

Result<int> ConnectTcp(const std::string& host, int port, double timeout_s) {
  auto addr = ParseAddr(host, port);
  if (!addr) return addr.error();
  int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return Errno("socket", errno);
  std::string where = host + ":" + std::to_string(port);
  int rc = ::connect(fd, reinterpret_cast<sockaddr*>(&*addr), sizeof(*addr));
  if (rc != 0 && errno != EINPROGRESS) {
    int err = errno;
    ::close(fd);
    return Status::Unavailable("connect to transfer peer " + where + ": " + std::strerror(err));
  }
  if (rc != 0) {
    pollfd p{fd, POLLOUT, 0};
    int n;
    do { n = ::poll(&p, 1, static_cast<int>(timeout_s * 1000)); } while (n < 0 && errno == EINTR);
    if (n == 0) {
      ::close(fd);
      return Status::DeadlineExceeded("connect to transfer peer " + where + ": timed out");
    }
    int err = 0;
    socklen_t len = sizeof(err);
    getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
    if (err != 0) {
      ::close(fd);
      return Status::Unavailable("connect to transfer peer " + where + ": " + std::strerror(err));
    }
  }
  int flags = fcntl(fd, F_GETFL, 0);
  fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  return fd;
}

Result<std::pair<std::string, int>> SplitHostPort(std::string_view s) {
  size_t colon = s.rfind(':');
  if (colon == std::string_view::npos || colon == 0 || colon + 1 == s.size()) {
    return Status::InvalidArgument("'" + std::string(s) + "' is not HOST:PORT");
  }
  int port = 0;
  for (char c : s.substr(colon + 1)) {
    if (c < '0' || c > '9') return Status::InvalidArgument("'" + std::string(s) + "': port is not a number");
    port = port * 10 + (c - '0');
    if (port > 65535) return Status::InvalidArgument("'" + std::string(s) + "': port out of range");
  }
  return std::pair<std::string, int>(std::string(s.substr(0, colon)), port);
}

void TuneSocket(int fd) {
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  int buf = 4 << 20;
  setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &buf, sizeof(buf));
  setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &buf, sizeof(buf));
}

void SetSocketTimeouts(int fd, double seconds) {
  timeval tv{};
  tv.tv_sec = static_cast<time_t>(seconds);
  tv.tv_usec = static_cast<suseconds_t>((seconds - static_cast<double>(tv.tv_sec)) * 1e6);
  setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
}

}  // namespace strata::transfer

#include <xxhash.h>

namespace strata::transfer {
uint64_t PayloadChecksum(const void* data, size_t len) { return XXH3_64bits(data, len); }
}  // namespace strata::transfer
