// Transfer engine, requester side: peers this process connected to, their
// tcp data connections (requests pipelined, replies matched in order) and
// same-host direct copies (shm).
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "common/logging.h"
#include "transfer/engine_impl.h"

namespace strata::transfer::detail {

using nlohmann::json;
json HelloJson(const Hello& h);

void DirectHandle::Unmap() {
  if (map_base) munmap(map_base, map_length);
  map_base = nullptr;
  mapped = nullptr;
  map_length = 0;
}

namespace {
// Maps the owner's memfd range of an export (same host); null on failure
// (the caller then copies with cross-memory attach).
void MapExport(int pid, int memfd, uint64_t offset, uint64_t length, bool writable, DirectHandle* d) {
  if (memfd < 0) return;
  std::string path = "/proc/" + std::to_string(pid) + "/fd/" + std::to_string(memfd);
  int fd = ::open(path.c_str(), (writable ? O_RDWR : O_RDONLY) | O_CLOEXEC);
  if (fd < 0) return;
  uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
  uint64_t aligned = offset & ~(page - 1);
  size_t len = static_cast<size_t>(length + (offset - aligned));
  void* p = mmap(nullptr, len, writable ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED | MAP_POPULATE, fd,
                 static_cast<off_t>(aligned));
  ::close(fd);
  if (p == MAP_FAILED) return;
  d->map_base = p;
  d->map_length = len;
  d->mapped = static_cast<uint8_t*>(p) + (offset - aligned);
}

int64_t MonotonicNs() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now().time_since_epoch()).count();
}
}  // namespace

Result<int> EngineImpl::Dial(const std::string& host, int port, const std::string& role, Hello* target) {
  auto fd = ConnectTcp(host, port, opt_.connect_timeout_s);
  if (!fd) return fd.error();
  int s = *fd;
  TuneSocket(s);
  SetSocketTimeouts(s, opt_.connect_timeout_s);
  auto fail = [&](Status st) -> Result<int> {
    ::close(s);
    failed_handshakes_++;
    return st.WithContext("transfer handshake with " + host + ":" + std::to_string(port));
  };
  auto h = RecvHeader(s);
  if (!h) return fail(h.error());
  if (h->type != FrameType::kHelloTarget) return fail(Status::Corrupt("expected the target's hello"));
  std::string payload(h->payload_bytes, '\0');
  if (Status st = RecvAll(s, payload.data(), payload.size(), "target hello"); !st.ok()) return fail(st);
  auto th = ParseHello(payload);
  if (!th) return fail(th.error());
  Hello me = MakeHello(role);
  me.mac = PeerMac(opt_.cluster_secret, *th, me);
  FrameHeader f;
  f.type = FrameType::kHelloPeer;
  if (Status st = SendFrame(s, f, HelloJson(me).dump()); !st.ok()) return fail(st);
  auto r = RecvHeader(s);
  if (!r) return fail(r.error().code() == StatusCode::kUnavailable
                          ? Status::InvalidArgument("the peer closed the connection during authentication")
                          : r.error());
  std::string rp(r->payload_bytes, '\0');
  if (Status st = RecvAll(s, rp.data(), rp.size(), "auth reply"); !st.ok()) return fail(st);
  if (r->type == FrameType::kAuthFail) return fail(Status::InvalidArgument("refused by the peer: " + rp));
  if (r->type != FrameType::kAuthOk) return fail(Status::Corrupt("expected an auth reply"));
  json j = json::parse(rp, nullptr, false);
  std::string mac = j.is_object() ? j.value("mac", "") : "";
  if (!HexEqual(mac, TargetMac(opt_.cluster_secret, *th, me))) {
    return fail(Status::InvalidArgument("the peer did not prove it knows the cluster secret"));
  }
  SetSocketTimeouts(s, 0);
  *target = *th;
  return s;
}

std::shared_ptr<Peer> EngineImpl::FindPeer(uint64_t id) {
  std::lock_guard lock(peers_mu_);
  auto it = peers_.find(id);
  return it == peers_.end() ? nullptr : it->second;
}

Result<uint64_t> EngineImpl::Connect(const std::string& address) {
  auto hp = SplitHostPort(address);
  if (!hp) return hp.error();
  {
    std::lock_guard lock(peers_mu_);
    auto it = peer_by_address_.find(address);
    if (it != peer_by_address_.end()) {
      auto p = peers_.at(it->second);
      if (!p->control_broken && !p->closing) return p->id;
    }
  }
  Hello target;
  auto fd = Dial(hp->first, hp->second, "control", &target);
  if (!fd) return fd.error();
  auto peer = std::make_shared<Peer>();
  peer->address = address;
  peer->host = hp->first;
  peer->port = hp->second;
  peer->name = target.name;
  peer->pid = target.pid;
  peer->control_fd = *fd;
  connections_++;
  // Transport: the first allowed one that works with this peer.
  std::string tried;
  bool chosen = false;
  for (Transport t : opt_.transports) {
    if (t == Transport::kShm) {
      if (target.boot_id.empty() || target.boot_id != boot_id_ || target.probe_address == 0) {
        tried += "shm: not the same host; ";
        continue;
      }
      uint64_t word = 0;
      iovec local{&word, sizeof(word)}, remote{reinterpret_cast<void*>(target.probe_address), sizeof(word)};
      ssize_t n = process_vm_readv(target.pid, &local, 1, &remote, 1, 0);
      if (n != sizeof(word) || word != 0x5354524154415348ull) {
        tried += std::string("shm: cross-memory attach refused (") + std::strerror(errno) + "); ";
        continue;
      }
      peer->transport = Transport::kShm;
      chosen = true;
      break;
    }
    peer->transport = Transport::kTcp;
    chosen = true;
    break;
  }
  if (!chosen) {
    ::close(*fd);
    connections_--;
    return Status::Unavailable("no allowed transfer transport reaches " + address + ": " + tried);
  }
  {
    std::lock_guard lock(peers_mu_);
    peer->id = next_peer_++;
    peers_[peer->id] = peer;
    peer_by_address_[address] = peer->id;
  }
  peer->control_reader = std::thread([this, peer] { ControlReader(peer); });
  if (peer->transport == Transport::kTcp) {
    for (int i = 0; i < opt_.connections_per_peer; ++i) {
      if (Status s = AddDataConn(peer); !s.ok()) {
        STRATA_LOG_WARN("transfer: data connection to {} failed: {}", address, s.message());
        break;
      }
    }
  }
  STRATA_LOG_INFO("transfer: connected to '{}' at {} over {}", peer->name, address, TransportName(peer->transport));
  return peer->id;
}

Result<std::string> EngineImpl::PeerName(uint64_t id) {
  auto p = FindPeer(id);
  if (!p) return Status::NotFound("no transfer peer " + std::to_string(id));
  return p->name;
}

void EngineImpl::ControlReader(std::shared_ptr<Peer> peer) {
  while (true) {
    auto h = RecvHeader(peer->control_fd);
    if (!h) break;
    std::string payload(h->payload_bytes, '\0');
    if (!RecvAll(peer->control_fd, payload.data(), payload.size(), "control payload").ok()) break;
    if (h->type == FrameType::kRevoke) {
      {
        std::unique_lock lock(peer->direct_mu);  // waits for copies in flight
        auto it = peer->direct.find(h->handle);
        if (it != peer->direct.end()) {
          it->second.Unmap();  // an old handle now reaches nothing
          peer->direct.erase(it);
        }
        // Also when the open's reply has not been turned into a mapping
        // yet: FinishOpen checks this set under the same lock.
        peer->revoked.insert(h->handle);
      }
      FrameHeader ack;
      ack.type = FrameType::kRevokeAck;
      ack.handle = h->handle;
      std::lock_guard wl(peer->control_write_mu);
      if (peer->control_fd >= 0) (void)SendFrame(peer->control_fd, ack, "");
      continue;
    }
    std::lock_guard lock(peer->reply_mu);
    if (peer->waiting.count(h->request_id)) {  // nobody waits for a late reply
      peer->replies[h->request_id] = {*h, std::move(payload)};
      peer->reply_cv.notify_all();
    }
  }
  // Without the control connection no revocation can reach us: stop
  // direct access to everything this peer exported (and to what a pending
  // open would map).
  {
    std::unique_lock lock(peer->direct_mu);
    for (auto& [h, d] : peer->direct) d.Unmap();
    peer->direct.clear();
    peer->control_broken = true;
  }
  std::lock_guard lock(peer->reply_mu);
  peer->reply_cv.notify_all();
}

Result<std::pair<FrameHeader, std::string>> EngineImpl::ControlCall(Peer& peer, FrameHeader h,
                                                                    const std::string& payload) {
  h.request_id = next_op_id_++;
  {
    std::lock_guard lock(peer.reply_mu);
    peer.waiting.insert(h.request_id);
  }
  {
    std::lock_guard wl(peer.control_write_mu);
    Status s = peer.control_fd >= 0 && !peer.control_broken
                   ? SendFrame(peer.control_fd, h, payload)
                   : Status::Unavailable("transfer peer " + peer.name + " (" + peer.address + ") is closed");
    if (!s.ok()) {
      std::lock_guard lock(peer.reply_mu);
      peer.waiting.erase(h.request_id);
      return s;
    }
  }
  std::unique_lock lock(peer.reply_mu);
  bool got = peer.reply_cv.wait_for(lock, std::chrono::duration<double>(opt_.connect_timeout_s), [&] {
    return peer.replies.count(h.request_id) || peer.control_broken.load();
  });
  peer.waiting.erase(h.request_id);
  auto it = peer.replies.find(h.request_id);
  if (it == peer.replies.end()) {
    if (!got) return Status::DeadlineExceeded("no reply from transfer peer " + peer.name);
    return Status::Unavailable("transfer peer " + peer.name + " (" + peer.address + ") closed its connection");
  }
  auto r = std::move(it->second);
  peer.replies.erase(it);
  return r;
}

Result<RemoteHandle> EngineImpl::FinishOpen(Peer& peer, const std::pair<FrameHeader, std::string>& reply) {
  if (reply.first.status != StatusCode::kOk) return Status(reply.first.status, reply.second);
  json j = json::parse(reply.second, nullptr, false);
  if (!j.is_object()) return Status::Corrupt("transfer open reply is not JSON");
  RemoteHandle rh;
  rh.peer = peer.id;
  rh.handle = j.value("handle", uint64_t{0});
  rh.length = j.value("length", uint64_t{0});
  rh.writable = j.value("writable", false);
  rh.name = j.value("name", "");
  rh.transport = peer.transport;
  if (peer.transport == Transport::kShm) {
    DirectHandle d;
    d.base = j.value("base", uint64_t{0});
    d.length = rh.length;
    d.writable = rh.writable;
    d.expires_ns = j.value("expires_ns", int64_t{0});
    MapExport(peer.pid, j.value("memfd", -1), j.value("memfd_offset", uint64_t{0}), d.length, d.writable, &d);
    std::unique_lock lock(peer.direct_mu);
    if (peer.control_broken || peer.revoked.count(rh.handle)) {
      d.Unmap();  // revoked (or the peer gone) between the reply and now
      return Status::InvalidArgument("handle " + std::to_string(rh.handle) + " of " + peer.name +
                                     " was revoked while it was being opened");
    }
    auto [it, inserted] = peer.direct.try_emplace(rh.handle, d);
    if (!inserted) {
      d.Unmap();  // opened twice: keep the first mapping
    }
  }
  return rh;
}

Result<RemoteHandle> EngineImpl::OpenSegment(uint64_t id, const std::string& name) {
  auto peer = FindPeer(id);
  if (!peer) return Status::NotFound("no transfer peer " + std::to_string(id));
  FrameHeader h;
  h.type = FrameType::kOpenSegment;
  auto r = ControlCall(*peer, h, json{{"name", name}, {"direct", peer->transport == Transport::kShm}}.dump());
  if (!r) return r.error();
  return FinishOpen(*peer, *r);
}

Result<RemoteHandle> EngineImpl::OpenGrant(uint64_t id, uint64_t grant) {
  auto peer = FindPeer(id);
  if (!peer) return Status::NotFound("no transfer peer " + std::to_string(id));
  FrameHeader h;
  h.type = FrameType::kOpenGrant;
  h.handle = grant;
  auto r = ControlCall(*peer, h, json{{"direct", peer->transport == Transport::kShm}}.dump());
  if (!r) return r.error();
  return FinishOpen(*peer, *r);
}

// --- tcp data connections ---

Status EngineImpl::AddDataConn(const std::shared_ptr<Peer>& peer) {
  Hello target;
  auto fd = Dial(peer->host, peer->port, "data", &target);
  if (!fd) return fd.error();
  if (target.name != peer->name) {
    ::close(*fd);
    return Status::Unavailable("transfer peer at " + peer->address + " is now '" + target.name + "', not '" +
                               peer->name + "'");
  }
  auto c = std::make_shared<DataConn>();
  c->id = next_conn_id_++;
  c->fd = *fd;
  std::lock_guard lock(peer->q_mu);
  if (peer->closing || stopping_) {  // ClosePeer took its snapshot of conns already
    ::close(*fd);
    return Status::Unavailable("transfer peer " + peer->name + " is closing");
  }
  connections_++;
  peer->conns.push_back(c);
  c->sender = std::thread([this, peer, c] { SenderLoop(peer, c); });
  c->receiver = std::thread([this, peer, c] { ReceiverLoop(peer, c); });
  return Status::Ok();
}

void EngineImpl::BreakConn(DataConn& c, Status why) {
  std::lock_guard lock(c.mu);
  if (!c.broken) {
    c.broken = true;
    c.why = std::move(why);
  }
  if (c.fd >= 0) ::shutdown(c.fd, SHUT_RDWR);
  c.cv.notify_all();
}

void EngineImpl::SenderLoop(std::shared_ptr<Peer> peer, std::shared_ptr<DataConn> c) {
  std::vector<uint8_t> scratch;
  while (true) {
    OpPtr op;
    {
      std::unique_lock lock(peer->q_mu);
      peer->q_cv.wait(lock, [&] {
        if (peer->closing) return true;
        std::lock_guard cl(c->mu);
        return c->broken || (!peer->queue.empty() &&
                             c->sent.size() < static_cast<size_t>(opt_.max_inflight_per_connection));
      });
      std::lock_guard cl(c->mu);
      if (peer->closing || c->broken) break;
      op = peer->queue.front();
      peer->queue.pop_front();
      if (op->teardown) {
        op->teardown = false;
        peer->queue.push_front(op);  // another connection takes it
        c->broken = true;
        c->why = Status::Unavailable("connection torn down (test fault)");
        if (c->fd >= 0) ::shutdown(c->fd, SHUT_RDWR);
        break;
      }
      c->sent.push_back(op);
    }
    FrameHeader h;
    h.request_id = op->id;
    h.handle = op->handle;
    h.offset = op->offset;
    h.length = op->length;
    Status s;
    if (op->kind == OpKind::kRead) {
      h.type = FrameType::kRead;
      s = SendFrame(c->fd, h, "");
    } else {
      h.type = FrameType::kWrite;
      std::string_view payload(reinterpret_cast<const char*>(op->local), op->length);
      if (op->corrupt) {
        scratch.assign(op->local, op->local + op->length);
        scratch[op->length / 2] ^= 0x5a;
        payload = std::string_view(reinterpret_cast<const char*>(scratch.data()), scratch.size());
      }
      s = SendFrame(c->fd, h, payload);
    }
    if (!s.ok()) {
      BreakConn(*c, s);
      break;
    }
  }
  std::lock_guard lock(c->mu);
  c->sender_done = true;
  c->cv.notify_all();
}

void EngineImpl::ReceiverLoop(std::shared_ptr<Peer> peer, std::shared_ptr<DataConn> c) {
  while (true) {
    auto h = RecvHeader(c->fd);
    if (!h) {
      BreakConn(*c, h.error());
      break;
    }
    OpPtr op;
    {
      std::lock_guard lock(c->mu);
      if (!c->sent.empty()) op = c->sent.front();
    }
    FrameType want = op && op->kind == OpKind::kRead ? FrameType::kReadReply : FrameType::kWriteReply;
    if (!op || op->id != h->request_id || h->type != want) {
      BreakConn(*c, Status::Corrupt("transfer peer " + peer->name + " answered a request it was not sent"));
      break;
    }
    Status result;
    if (h->status == StatusCode::kOk && h->type == FrameType::kReadReply) {
      if (h->length != op->length) {
        BreakConn(*c, Status::Corrupt("read reply of the wrong length"));
        break;
      }
      if (Status s = RecvAll(c->fd, op->local, op->length, "read payload"); !s.ok()) {
        BreakConn(*c, s);
        break;
      }
      if (op->corrupt) op->local[op->length / 2] ^= 0x5a;
    } else if (h->status != StatusCode::kOk) {
      std::string msg(h->payload_bytes, '\0');
      if (Status s = RecvAll(c->fd, msg.data(), msg.size(), "error text"); !s.ok()) {
        BreakConn(*c, s);
        break;
      }
      result = Status(h->status, "transfer peer " + peer->name + " refused: " + msg);
    } else if (Status s = Discard(c->fd, h->payload_bytes); !s.ok()) {
      BreakConn(*c, s);
      break;
    }
    {
      std::lock_guard lock(c->mu);
      c->sent.pop_front();
    }
    {
      std::lock_guard lock(peer->q_mu);  // a sender may wait for room
      peer->q_cv.notify_all();
    }
    CompleteOp(op, std::move(result));
  }
  ReapConn(*peer, *c);
}

void EngineImpl::ReapConn(Peer& peer, DataConn& c) {
  {
    std::lock_guard lock(peer.q_mu);
    peer.q_cv.notify_all();
  }
  std::deque<OpPtr> left;
  Status why;
  {
    std::unique_lock lock(c.mu);
    c.cv.wait(lock, [&] { return c.sender_done; });
    left.swap(c.sent);
    why = c.why;
  }
  auto now = Clock::now();
  std::vector<OpPtr> retry;
  for (auto& op : left) {
    if (now >= op->deadline) {
      CompleteOp(op, Status::DeadlineExceeded("transfer op to " + peer.name + " missed its deadline"));
    } else if (op->retries < 1 && !peer.closing && !peer.control_broken) {
      op->retries++;
      retry.push_back(op);
    } else {
      CompleteOp(op, Status::Unavailable("transfer to " + peer.name + " failed: " + why.message()));
    }
  }
  if (!retry.empty()) {
    bool closing;
    {
      std::lock_guard lock(peer.q_mu);
      closing = peer.closing;
      if (!closing) {
        for (auto it = retry.rbegin(); it != retry.rend(); ++it) peer.queue.push_front(*it);
        peer.q_cv.notify_all();
      }
    }
    if (closing) {
      for (auto& op : retry) CompleteOp(op, Status::Unavailable("transfer peer " + peer.name + " closed"));
    }
  }
  {
    std::lock_guard lock(c.mu);
    ::close(c.fd);
    c.fd = -1;
  }
  connections_--;
  c.finished = true;
}

void EngineImpl::MaintainPeers() {
  std::vector<std::shared_ptr<Peer>> peers;
  {
    std::lock_guard lock(peers_mu_);
    for (auto& [id, p] : peers_) peers.push_back(p);
  }
  for (auto& p : peers) {
    std::vector<std::shared_ptr<DataConn>> dead;
    size_t live = 0;
    std::vector<OpPtr> orphans;
    {
      std::lock_guard lock(p->q_mu);
      for (auto it = p->conns.begin(); it != p->conns.end();) {
        if ((*it)->finished) {
          dead.push_back(*it);
          it = p->conns.erase(it);
        } else {
          ++live;
          ++it;
        }
      }
      // A peer whose control connection is gone: nothing queued can succeed.
      if (p->control_broken && live == 0) {
        orphans.assign(p->queue.begin(), p->queue.end());
        p->queue.clear();
      }
    }
    for (auto& c : dead) {
      if (c->sender.joinable()) c->sender.join();
      if (c->receiver.joinable()) c->receiver.join();
    }
    for (auto& op : orphans) {
      CompleteOp(op, Status::Unavailable("transfer peer " + p->name + " (" + p->address + ") is gone"));
    }
    // Redial lost data connections in the background while the peer lives.
    if (p->transport == Transport::kTcp && !p->control_broken && !p->closing &&
        live < static_cast<size_t>(opt_.connections_per_peer) && p->dialing == 0 && !stopping_) {
      p->dialing++;
      RunInBackground([this, p] {
        (void)AddDataConn(p);
        p->dialing--;
      });
    }
    if (p->control_broken && live == 0 && !p->closing) {
      // Forget the peer: later ops on it fail at once.
      std::lock_guard lock(peers_mu_);
      if (peers_.erase(p->id)) {
        auto it = peer_by_address_.find(p->address);
        if (it != peer_by_address_.end() && it->second == p->id) peer_by_address_.erase(it);
        RunInBackground([this, p] { ClosePeer(*p); });
      }
    }
  }
}

void EngineImpl::ClosePeer(Peer& peer) {
  {
    std::lock_guard wl(peer.control_write_mu);
    if (peer.control_fd >= 0) ::shutdown(peer.control_fd, SHUT_RDWR);
  }
  std::vector<std::shared_ptr<DataConn>> conns;
  std::vector<OpPtr> queued;
  {
    std::lock_guard lock(peer.q_mu);
    peer.closing = true;  // no connection is added and no op queued after this
    conns = peer.conns;
    queued.assign(peer.queue.begin(), peer.queue.end());
    peer.queue.clear();
    peer.q_cv.notify_all();
  }
  for (auto& c : conns) BreakConn(*c, Status::Unavailable("transfer peer closed"));
  for (auto& c : conns) {
    if (c->sender.joinable()) c->sender.join();
    if (c->receiver.joinable()) c->receiver.join();
  }
  for (auto& op : queued) CompleteOp(op, Status::Unavailable("transfer peer " + peer.name + " closed"));
  if (peer.control_reader.joinable()) peer.control_reader.join();
  std::lock_guard wl(peer.control_write_mu);
  if (peer.control_fd >= 0) {
    ::close(peer.control_fd);
    peer.control_fd = -1;
    connections_--;
  }
}

void EngineImpl::TearDownPeer(uint64_t id) {
  auto p = FindPeer(id);
  if (!p) return;
  std::lock_guard lock(p->q_mu);
  for (auto& c : p->conns) BreakConn(*c, Status::Unavailable("connection torn down (test)"));
}

// --- shm: direct copies between address spaces on one host ---

void EngineImpl::ShmLoop() {
  while (true) {
    OpPtr op;
    {
      std::unique_lock lock(shm_mu_);
      shm_cv_.wait(lock, [&] { return stopping_ || !shm_queue_.empty(); });
      if (stopping_) return;
      op = shm_queue_.front();
      shm_queue_.pop_front();
    }
    Status s = ShmCopy(*op);
    CompleteOp(op, std::move(s));
  }
}

Status EngineImpl::ShmCopy(Op& op) {
  auto peer = FindPeer(op.peer);
  if (!peer) return Status::Unavailable("transfer peer " + std::to_string(op.peer) + " is gone");
  std::shared_lock lock(peer->direct_mu);  // a revocation waits for this copy
  auto it = peer->direct.find(op.handle);
  std::string what = "handle " + std::to_string(op.handle) + " of " + peer->name;
  auto refuse = [&](Status s) {
    refused_locally_++;
    return s;
  };
  if (it == peer->direct.end()) {
    return refuse(Status::InvalidArgument(what + (peer->revoked.count(op.handle) ? " was revoked" : ": not opened")));
  }
  const DirectHandle& d = it->second;
  if (d.expires_ns != 0 && MonotonicNs() >= d.expires_ns) return refuse(Status::DeadlineExceeded(what + ": lease over"));
  if (op.kind == OpKind::kWrite && !d.writable) return refuse(Status::InvalidArgument(what + " is read-only"));
  if (op.length == 0 || op.offset > d.length || op.length > d.length - op.offset) {
    return refuse(Status::OutOfRange(what + ": bytes [" + std::to_string(op.offset) + ", +" +
                                     std::to_string(op.length) + ") outside its " + std::to_string(d.length)));
  }
  if (Clock::now() >= op.deadline) return Status::DeadlineExceeded("transfer op missed its deadline (not started)");
  std::vector<uint8_t> scratch;
  uint8_t* local = op.local;
  if (op.corrupt && op.kind == OpKind::kWrite) {
    scratch.assign(op.local, op.local + op.length);
    scratch[op.length / 2] ^= 0x5a;
    local = scratch.data();
  }
  if (d.mapped) {
    if (op.kind == OpKind::kRead) {
      std::memcpy(op.local, d.mapped + op.offset, op.length);
    } else {
      std::memcpy(d.mapped + op.offset, local, op.length);
    }
    if (op.corrupt && op.kind == OpKind::kRead) op.local[op.length / 2] ^= 0x5a;
    return Status::Ok();
  }
  uint64_t done = 0;
  while (done < op.length) {
    iovec l{local + done, op.length - done};
    iovec r{reinterpret_cast<void*>(d.base + op.offset + done), op.length - done};
    ssize_t n = op.kind == OpKind::kRead ? process_vm_readv(peer->pid, &l, 1, &r, 1, 0)
                                         : process_vm_writev(peer->pid, &l, 1, &r, 1, 0);
    if (n <= 0) {
      if (n < 0 && errno == EINTR) continue;
      int err = errno;
      return Status::Unavailable("shared-memory copy with " + peer->name + " failed: " +
                                 (err == ESRCH ? std::string("the process is gone") : std::strerror(err)));
    }
    done += static_cast<uint64_t>(n);
  }
  if (op.corrupt && op.kind == OpKind::kRead) op.local[op.length / 2] ^= 0x5a;
  return Status::Ok();
}

}  // namespace strata::transfer::detail
