// Transfer engine, target side: the listener and the connections peers
// opened to this process. Every access is checked on arrival against the
// export table, then the bytes go straight into or out of registered memory.
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "common/logging.h"
#include "transfer/engine_impl.h"

namespace strata::transfer::detail {

namespace {
using nlohmann::json;

std::string MacInput(std::string_view tag, std::initializer_list<std::string_view> parts) {
  std::string s(tag);
  for (auto p : parts) {
    s += '|';
    s += p;
  }
  return s;
}
}  // namespace

std::string PeerMac(const std::string& secret, const Hello& target, const Hello& peer) {
  auto d = HmacSha256(secret, MacInput("strata-transfer-1 peer", {target.nonce, peer.nonce, peer.name, target.name}));
  return ToHex(d);
}
std::string TargetMac(const std::string& secret, const Hello& target, const Hello& peer) {
  auto d = HmacSha256(secret, MacInput("strata-transfer-1 target", {peer.nonce, target.nonce, target.name}));
  return ToHex(d);
}
bool HexEqual(const std::string& a, const std::string& b) {
  if (a.size() != b.size() || a.size() != 64) return false;
  Sha256Digest x{}, y{};
  std::memcpy(x.data(), a.data(), 32);
  std::memcpy(y.data(), b.data(), 32);
  Sha256Digest x2{}, y2{};
  std::memcpy(x2.data(), a.data() + 32, 32);
  std::memcpy(y2.data(), b.data() + 32, 32);
  return DigestEqual(x, y) && DigestEqual(x2, y2);
}

json HelloJson(const Hello& h) {
  return json{{"name", h.name}, {"nonce", h.nonce},     {"host", h.host}, {"boot_id", h.boot_id},
              {"pid", h.pid},   {"role", h.role},       {"probe", h.probe_address}, {"mac", h.mac}};
}
std::string HelloText(const Hello& h) { return HelloJson(h).dump(); }

Result<Hello> ParseHello(const std::string& payload) {
  json j = json::parse(payload, nullptr, false);
  if (j.is_discarded() || !j.is_object()) return Status::Corrupt("transfer hello is not a JSON object");
  Hello h;
  try {
    h.name = j.value("name", "");
    h.nonce = j.value("nonce", "");
    h.host = j.value("host", "");
    h.boot_id = j.value("boot_id", "");
    h.pid = j.value("pid", 0);
    h.role = j.value("role", "");
    h.probe_address = j.value("probe", uint64_t{0});
    h.mac = j.value("mac", "");
  } catch (const std::exception& e) {
    return Status::Corrupt(std::string("transfer hello: ") + e.what());
  }
  if (h.name.empty() || h.nonce.size() != 32) return Status::Corrupt("transfer hello lacks a name or nonce");
  return h;
}

void EngineImpl::ListenLoop() {
  while (!stopping_) {
    pollfd p[2] = {{listen_fd_, POLLIN, 0}, {stop_fd_, POLLIN, 0}};
    int n = ::poll(p, 2, 1000);
    if (stopping_) break;
    if (n <= 0 || !(p[0].revents & POLLIN)) continue;
    int fd = ::accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
    if (fd < 0) continue;
    TuneSocket(fd);
    auto sc = std::make_shared<Served>();
    sc->id = next_conn_id_++;
    sc->fd = fd;
    std::lock_guard lock(served_mu_);
    // Reap finished connection threads.
    for (auto it = served_.begin(); it != served_.end();) {
      if (it->second->done) {
        if (it->second->th.joinable()) it->second->th.join();
        it = served_.erase(it);
      } else {
        ++it;
      }
    }
    served_[sc->id] = sc;
    sc->th = std::thread([this, sc] { ServeConnection(sc); });
  }
}

Hello EngineImpl::MakeHello(const std::string& role) const {
  Hello me;
  me.name = opt_.instance_name;
  me.nonce = RandomHex(16);
  me.host = host_;
  me.boot_id = boot_id_;
  me.pid = static_cast<int>(getpid());
  me.role = role;
  return me;
}

Result<Hello> EngineImpl::ServerHandshake(Served& sc) {
  SetSocketTimeouts(sc.fd, opt_.connect_timeout_s);
  Hello me = MakeHello("target");
  me.probe_address = reinterpret_cast<uint64_t>(&probe_word_);
  FrameHeader h;
  h.type = FrameType::kHelloTarget;
  if (Status s = SendFrame(sc.fd, h, HelloJson(me).dump()); !s.ok()) return s;
  auto got = RecvHeader(sc.fd);
  if (!got) return got.error();
  if (got->type != FrameType::kHelloPeer) return Status::Corrupt("expected a peer hello");
  std::string payload(got->payload_bytes, '\0');
  if (Status s = RecvAll(sc.fd, payload.data(), payload.size(), "peer hello"); !s.ok()) return s;
  auto peer = ParseHello(payload);
  if (!peer) return peer.error();
  if (!HexEqual(peer->mac, PeerMac(opt_.cluster_secret, me, *peer))) {
    FrameHeader f;
    f.type = FrameType::kAuthFail;
    f.status = StatusCode::kInvalidArgument;
    (void)SendFrame(sc.fd, f, "cluster secret mismatch");
    return Status::InvalidArgument("peer '" + peer->name + "' failed authentication (cluster secret mismatch)");
  }
  FrameHeader ok;
  ok.type = FrameType::kAuthOk;
  if (Status s = SendFrame(sc.fd, ok, json{{"mac", TargetMac(opt_.cluster_secret, me, *peer)}}.dump()); !s.ok()) {
    return s;
  }
  SetSocketTimeouts(sc.fd, 0);
  return peer;
}

void EngineImpl::ServeConnection(std::shared_ptr<Served> sc) {
  auto hello = ServerHandshake(*sc);
  if (!hello) {
    failed_handshakes_++;
    STRATA_LOG_WARN("transfer: connection refused: {}", hello.error().message());
    CloseServed(*sc);
    std::lock_guard lock(served_mu_);
    sc->done = true;
    return;
  }
  {
    std::lock_guard lock(served_mu_);
    sc->peer = hello->name;
    sc->role = hello->role;
  }
  // A peer that stops reading cannot hold a reply (or a revoke notice) forever.
  SetSocketTimeouts(sc->fd, 30);
  connections_++;
  Status why;
  while (!stopping_) {
    auto h = RecvHeader(sc->fd);
    if (!h) {
      why = h.error();
      break;
    }
    Status s;
    switch (h->type) {
      case FrameType::kOpenSegment:
      case FrameType::kOpenGrant: {
        std::string payload(h->payload_bytes, '\0');
        s = RecvAll(sc->fd, payload.data(), payload.size(), "open request");
        if (s.ok()) HandleOpen(*sc, *h, payload);
        break;
      }
      case FrameType::kRead: s = HandleRead(*sc, *h); break;
      case FrameType::kWrite: s = HandleWrite(*sc, *h); break;
      case FrameType::kRevokeAck:
        s = Discard(sc->fd, h->payload_bytes);
        exports_.AckRevoke(h->handle, sc->id);
        break;
      default:
        s = Status::Corrupt("unexpected " + std::string(FrameTypeName(h->type)) + " frame from a peer");
    }
    if (!s.ok()) {
      why = s;
      break;
    }
  }
  (void)why;
  CloseServed(*sc);
  connections_--;
  // This connection can no longer acknowledge revocations; the peer drops
  // its mappings when it loses its control connection.
  exports_.ConnectionGone(sc->id);
  std::lock_guard lock(served_mu_);
  sc->done = true;
}

void EngineImpl::CloseServed(Served& sc) {
  sc.Shutdown();  // a send blocked on this socket fails now, releasing write_mu
  std::lock_guard wl(sc.write_mu);
  std::lock_guard fl(sc.fd_mu);
  if (sc.fd >= 0) ::close(sc.fd);
  sc.fd = -1;
}

Status EngineImpl::SendToServed(Served& sc, FrameHeader h, std::string_view payload) {
  std::lock_guard lock(sc.write_mu);
  int fd;
  {
    std::lock_guard fl(sc.fd_mu);
    fd = sc.fd;  // stays open while write_mu is held (closing takes it)
  }
  if (fd < 0) return Status::Unavailable("connection closed");
  return SendFrame(fd, h, payload);
}

void EngineImpl::HandleOpen(Served& sc, const FrameHeader& h, const std::string& payload) {
  json req = json::parse(payload, nullptr, false);
  bool direct = req.is_object() && req.value("direct", false);
  uint64_t direct_conn = direct ? sc.id : 0;
  // The open and its reply happen under write_mu, so a revoke notice for
  // this handle (sent under write_mu too) always follows the reply.
  std::lock_guard lock(sc.write_mu);
  int fd;
  {
    std::lock_guard fl(sc.fd_mu);
    fd = sc.fd;
  }
  Result<ExportView> view = Status::Internal("unset");
  if (h.type == FrameType::kOpenSegment) {
    std::string name = req.is_object() ? req.value("name", "") : "";
    view = exports_.OpenSegment(name, sc.peer, direct_conn);
  } else {
    view = exports_.OpenGrant(h.handle, sc.peer, direct_conn, Clock::now());
  }
  FrameHeader r;
  r.type = FrameType::kOpenReply;
  r.request_id = h.request_id;
  if (!view) {
    r.status = view.error().code();
    (void)SendFrame(fd, r, view.error().message());
    return;
  }
  r.handle = view->handle;
  r.length = view->length;
  json j{{"handle", view->handle},  {"length", view->length},         {"writable", view->writable},
         {"base", view->base_address}, {"expires_ns", view->expires_ns}, {"name", view->name},
         {"memfd", view->memfd},       {"memfd_offset", view->memfd_offset}};
  (void)SendFrame(fd, r, j.dump());
}

namespace {
// The reply header to request `h` (length 0: no payload yet).
FrameHeader ReplyTo(const FrameHeader& h, FrameType type) {
  FrameHeader r;
  r.type = type;
  r.request_id = h.request_id;
  r.handle = h.handle;
  r.offset = h.offset;
  return r;
}
}  // namespace

Status EngineImpl::HandleRead(Served& sc, const FrameHeader& h) {
  if (Status s = Discard(sc.fd, h.payload_bytes); !s.ok()) return s;
  FrameHeader r = ReplyTo(h, FrameType::kReadReply);
  auto mem = exports_.Begin(h.handle, sc.peer, h.offset, h.length, false, sc.id, Clock::now());
  if (!mem) {
    r.status = mem.error().code();
    return SendToServed(sc, r, mem.error().message());
  }
  r.length = h.length;
  Status s = SendToServed(sc, r, std::string_view(reinterpret_cast<const char*>(*mem), h.length));
  exports_.End(h.handle, sc.id);
  if (s.ok()) served_read_bytes_ += h.length;
  return s;
}

Status EngineImpl::HandleWrite(Served& sc, const FrameHeader& h) {
  FrameHeader r = ReplyTo(h, FrameType::kWriteReply);
  auto mem = exports_.Begin(h.handle, sc.peer, h.offset, h.length, true, sc.id, Clock::now());
  if (!mem) {
    if (Status s = Discard(sc.fd, h.payload_bytes); !s.ok()) return s;
    r.status = mem.error().code();
    return SendToServed(sc, r, mem.error().message());
  }
  Status s = RecvAll(sc.fd, *mem, h.length, "write payload");
  exports_.End(h.handle, sc.id);
  if (!s.ok()) return s;
  served_write_bytes_ += h.length;
  return SendToServed(sc, r, "");
}

void EngineImpl::ShutdownServed(const std::vector<uint64_t>& ids) {
  std::vector<std::shared_ptr<Served>> found;
  {
    std::lock_guard lock(served_mu_);
    for (uint64_t id : ids) {
      auto it = served_.find(id);
      if (it != served_.end()) found.push_back(it->second);
    }
  }
  for (auto& sc : found) sc->Shutdown();  // never waits for a reply in progress
}

void EngineImpl::NotifyRevoke(uint64_t handle) {
  for (uint64_t conn : exports_.DirectMappers(handle)) {
    std::shared_ptr<Served> control;
    {
      std::lock_guard lock(served_mu_);
      auto it = served_.find(conn);
      if (it != served_.end() && !it->second->done) control = it->second;
    }
    FrameHeader f;
    f.type = FrameType::kRevoke;
    f.handle = handle;
    if (!control || !SendToServed(*control, f, "").ok()) {
      // Unreachable: once its control connection is gone the peer has
      // dropped every mapping (and its copies hold the same lock).
      if (control) control->Shutdown();
      if (!control) exports_.AckRevoke(handle, conn);
    }
  }
}

}  // namespace strata::transfer::detail
