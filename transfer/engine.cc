// Transfer engine: start/stop, exports, batches, deadlines, faults, stats.
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <fstream>
#include <limits>

#include "common/logging.h"
#include "transfer/engine_impl.h"

namespace strata::transfer {

std::string_view TransportName(Transport t) { return t == Transport::kShm ? "shm" : "tcp"; }

Result<std::vector<Transport>> ParseTransports(std::string_view list) {
  std::vector<Transport> out;
  size_t pos = 0;
  while (pos <= list.size()) {
    size_t comma = list.find(',', pos);
    std::string_view item = list.substr(pos, comma == std::string_view::npos ? std::string_view::npos : comma - pos);
    while (!item.empty() && item.front() == ' ') item.remove_prefix(1);
    while (!item.empty() && item.back() == ' ') item.remove_suffix(1);
    if (item == "tcp") {
      out.push_back(Transport::kTcp);
    } else if (item == "shm") {
      out.push_back(Transport::kShm);
    } else if (item == "rdma" || item == "verbs") {
      return Status::Unsupported("transfer transport '" + std::string(item) +
                                 "' is not built in this version (tcp and shm are; see docs/status.md)");
    } else {
      return Status::InvalidArgument("unknown transfer transport '" + std::string(item) + "' (expected tcp, shm)");
    }
    if (comma == std::string_view::npos) break;
    pos = comma + 1;
  }
  if (out.empty()) return Status::InvalidArgument("empty transfer transport list");
  return out;
}

Result<std::unique_ptr<TransferEngine>> TransferEngine::Start(TransferOptions options, SegmentTable* segments) {
  auto e = std::make_unique<detail::EngineImpl>(std::move(options), segments);
  if (Status s = e->Init(); !s.ok()) return s;
  return std::unique_ptr<TransferEngine>(std::move(e));
}

namespace detail {

const std::vector<double> kLatencyBuckets = {50e-6, 100e-6, 250e-6, 500e-6, 1e-3, 2.5e-3, 5e-3, 10e-3,
                                             25e-3, 50e-3,  100e-3, 250e-3, 500e-3, 1.0,  2.5};

namespace {
std::string ReadFirstLine(const char* path) {
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);
  return line;
}
}  // namespace

EngineImpl::EngineImpl(TransferOptions options, SegmentTable* segments)
    : opt_(std::move(options)), segments_(segments), hist_counts_(kLatencyBuckets.size() + 1, 0) {}

Status EngineImpl::Init() {
  if (opt_.instance_name.empty()) return Status::InvalidArgument("the transfer engine needs an instance name");
  if (opt_.connections_per_peer < 1 || opt_.connections_per_peer > 64) {
    return Status::InvalidArgument("transfer connections per peer must be 1..64");
  }
  if (opt_.max_inflight_per_connection < 1) opt_.max_inflight_per_connection = 1;
  if (opt_.transports.empty()) return Status::InvalidArgument("no transfer transport allowed");
  if (opt_.advertise_address.empty()) opt_.advertise_address = opt_.bind_address;
  char hn[256] = {};
  gethostname(hn, sizeof(hn) - 1);
  host_ = hn;
  boot_id_ = ReadFirstLine("/proc/sys/kernel/random/boot_id");
  if (opt_.listen) {
    if (opt_.cluster_secret.empty() && !IsLoopbackAddress(opt_.bind_address)) {
      return Status::InvalidArgument("the transfer listener binds " + opt_.bind_address +
                                     " only with a cluster secret (--cluster-secret-file); without one it binds "
                                     "loopback only");
    }
    auto fd = ListenTcp(opt_.bind_address, opt_.port, &port_);
    if (!fd) return fd.error();
    listen_fd_ = *fd;
    stop_fd_ = eventfd(0, EFD_CLOEXEC);
    if (opt_.cluster_secret.empty()) {
      STRATA_LOG_INFO("transfer: no cluster secret file: listener bound to loopback {}:{} only", opt_.bind_address,
                      port_);
    }
    listener_ = std::thread([this] { ListenLoop(); });
  }
  timer_ = std::thread([this] { TimerLoop(); });
  for (int i = 0; i < 2; ++i) shm_workers_.emplace_back([this] { ShmLoop(); });
  return Status::Ok();
}

EngineImpl::~EngineImpl() {
  stopping_ = true;
  if (stop_fd_ >= 0) {
    uint64_t one = 1;
    (void)!write(stop_fd_, &one, sizeof(one));
  }
  if (listener_.joinable()) listener_.join();
  {
    std::lock_guard lock(shm_mu_);
    shm_cv_.notify_all();
  }
  for (auto& t : shm_workers_) t.join();
  timer_cv_.notify_all();
  if (timer_.joinable()) timer_.join();
  {
    // Redials (bounded by the connect timeout) and peer closes.
    std::unique_lock lock(bg_mu_);
    bg_cv_.wait(lock, [&] { return background_ == 0; });
  }
  std::vector<std::shared_ptr<Peer>> peers;
  {
    std::lock_guard lock(peers_mu_);
    for (auto& [id, p] : peers_) peers.push_back(p);
    peers_.clear();
  }
  for (auto& p : peers) ClosePeer(*p);
  std::map<uint64_t, std::shared_ptr<Served>> served;
  {
    std::lock_guard lock(served_mu_);
    served.swap(served_);
  }
  for (auto& [id, sc] : served) sc->Shutdown();
  for (auto& [id, sc] : served) {
    if (sc->th.joinable()) sc->th.join();
  }
  // Ops still held by fault rules or queued for shm: fail them.
  std::vector<OpPtr> left;
  {
    std::lock_guard lock(held_mu_);
    left.swap(held_);
  }
  {
    std::lock_guard lock(shm_mu_);
    left.insert(left.end(), shm_queue_.begin(), shm_queue_.end());
    shm_queue_.clear();
  }
  for (auto& op : left) CompleteOp(op, Status::Cancelled("transfer engine stopped"));
  if (listen_fd_ >= 0) ::close(listen_fd_);
  if (stop_fd_ >= 0) ::close(stop_fd_);
}

std::string EngineImpl::address() const { return opt_.advertise_address + ":" + std::to_string(port_); }

// --- exports ---

Result<uint64_t> EngineImpl::ExportSegment(SegmentId segment, std::string name) {
  auto seg = segments_->Get(segment);
  if (!seg) return Status::NotFound("no segment " + std::to_string(segment.value()));
  return exports_.ExportSegment(*seg, std::move(name));
}

Status EngineImpl::Unexport(const std::string& name) {
  auto h = exports_.HandleOf(name);
  if (!h) return Status::NotFound("no exported segment '" + name + "'");
  return Revoke(*h);  // shuts in-flight accesses down and tells direct mappers
}

Result<uint64_t> EngineImpl::Grant(const Region& region, std::string grantee, std::chrono::nanoseconds lease) {
  auto bytes = segments_->Resolve(region);
  if (!bytes) return bytes.error();
  return exports_.Grant(bytes->data(), bytes->size(), std::move(grantee), lease);
}

Status EngineImpl::Revoke(uint64_t handle) {
  auto conns = exports_.Revoke(handle);
  if (!conns) return conns.error();
  ShutdownServed(*conns);
  NotifyRevoke(handle);
  return Status::Ok();
}

bool EngineImpl::Quiesced(uint64_t handle) {
  if (!exports_.Quiesced(handle)) return false;
  exports_.Forget(handle);  // its number is never reused; unknown handles read as quiesced
  return true;
}

// --- batches ---

Result<uint64_t> EngineImpl::Submit(std::vector<TransferOp> ops, Clock::time_point deadline) {
  if (ops.empty()) return Status::InvalidArgument("an empty transfer batch");
  auto now = Clock::now();
  std::vector<std::span<uint8_t>> local(ops.size());
  for (size_t i = 0; i < ops.size(); ++i) {
    auto r = segments_->Resolve(ops[i].local);
    if (!r) return r.error().WithContext("transfer op " + std::to_string(i) + ": local region");
    local[i] = *r;
  }
  auto batch = std::make_shared<Batch>();
  batch->start = now;
  batch->results.assign(ops.size(), Status::Internal("transfer op never completed"));
  batch->remaining = ops.size();
  {
    std::lock_guard lock(batch_mu_);
    batch->id = next_batch_++;
    batches_[batch->id] = batch;
  }
  std::vector<OpPtr> prepared;
  prepared.reserve(ops.size());
  for (size_t i = 0; i < ops.size(); ++i) {
    auto op = std::make_shared<Op>();
    op->batch = batch;
    op->index = i;
    op->id = next_op_id_++;
    op->kind = ops[i].kind;
    op->local = local[i].data();
    op->length = local[i].size();
    op->peer = ops[i].remote.peer;
    op->handle = ops[i].remote.handle;
    op->offset = ops[i].remote_offset;
    op->transport = ops[i].remote.transport;
    op->deadline = deadline;
    op->start = now;
    prepared.push_back(std::move(op));
  }
  for (auto& op : prepared) Dispatch(op);
  timer_cv_.notify_one();
  return batch->id;
}

void EngineImpl::Dispatch(const OpPtr& op) {
  // Requester-side checks: a known peer, bounds within what the open told us.
  auto peer = FindPeer(op->peer);
  if (!peer) {
    refused_locally_++;
    CompleteOp(op, Status::Unavailable("transfer peer " + std::to_string(op->peer) + " is not connected"));
    return;
  }
  if (op->length > kMaxDataPayload) {
    refused_locally_++;
    CompleteOp(op, Status::InvalidArgument("a transfer op moves at most " + std::to_string(kMaxDataPayload) +
                                           " bytes; split it"));
    return;
  }
  if (!op->faults_applied) {
    op->faults_applied = true;
    ApplyFaults(*op);
  }
  if (op->release_at != Clock::time_point()) {
    std::lock_guard lock(held_mu_);
    held_.push_back(op);
    return;
  }
  if (op->transport == Transport::kShm) {
    std::lock_guard lock(shm_mu_);
    shm_queue_.push_back(op);
    shm_cv_.notify_one();
    return;
  }
  {
    std::lock_guard lock(peer->q_mu);  // ClosePeer sets closing under it, then drains the queue
    if (!peer->closing) {
      peer->queue.push_back(op);
      peer->q_cv.notify_one();
      return;
    }
  }
  CompleteOp(op, Status::Unavailable("transfer peer " + peer->name + " (" + peer->address + ") is closed"));
}

void EngineImpl::CompleteOp(const OpPtr& op, Status s) {
  if (op->finished.exchange(true)) return;
  auto now = Clock::now();
  bool ok = s.ok();
  Counters& c = op->transport == Transport::kShm ? shm_ : tcp_;
  if (ok) {
    (op->kind == OpKind::kRead ? c.read_bytes : c.write_bytes) += op->length;
    (op->kind == OpKind::kRead ? c.reads : c.writes)++;
    double sec = std::chrono::duration<double>(now - op->start).count();
    std::lock_guard lock(hist_mu_);
    size_t b = std::lower_bound(kLatencyBuckets.begin(), kLatencyBuckets.end(), sec) - kLatencyBuckets.begin();
    hist_counts_[b]++;
    hist_sum_ += sec;
    hist_count_++;
  } else {
    c.failures++;
    if (s.code() == StatusCode::kDeadlineExceeded) timeouts_++;
  }
  Batch& b = *op->batch;
  std::lock_guard lock(b.mu);
  b.results[op->index] = std::move(s);
  if (ok) b.bytes += op->length;
  if (--b.remaining == 0) b.end = now;
}

std::optional<BatchResult> EngineImpl::Poll(uint64_t id) {
  std::shared_ptr<Batch> batch;
  {
    std::lock_guard lock(batch_mu_);
    auto it = batches_.find(id);
    if (it == batches_.end()) {
      BatchResult r;
      r.status = Status::NotFound("no transfer batch " + std::to_string(id) + " (unknown or already polled)");
      return r;
    }
    batch = it->second;
  }
  std::lock_guard lock(batch->mu);
  if (batch->remaining > 0) return std::nullopt;
  {
    std::lock_guard l2(batch_mu_);
    if (batches_.erase(id) == 0) {  // another Poll took it first
      BatchResult r;
      r.status = Status::NotFound("transfer batch " + std::to_string(id) + " was already polled");
      return r;
    }
  }
  BatchResult r;
  r.ops = std::move(batch->results);
  r.bytes = batch->bytes;
  r.seconds = std::chrono::duration<double>(batch->end - batch->start).count();
  for (const auto& s : r.ops) {
    if (!s.ok()) {
      r.status = s;
      break;
    }
  }
  return r;
}

BatchResult EngineImpl::Wait(uint64_t id) {
  for (int spins = 0;; ++spins) {
    if (auto r = Poll(id)) return std::move(*r);
    if (spins < 2000) {
      std::this_thread::yield();
    } else {
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  }
}

// --- faults ---

void EngineImpl::SetFaults(std::vector<FaultRule> rules) {
  std::lock_guard lock(fault_mu_);
  faults_ = std::move(rules);
  fault_seen_.assign(faults_.size(), 0);
}

void EngineImpl::ApplyFaults(Op& op) {
  std::lock_guard lock(fault_mu_);
  for (size_t i = 0; i < faults_.size(); ++i) {
    const FaultRule& r = faults_[i];
    if (r.kind && *r.kind != op.kind) continue;
    uint64_t n = fault_seen_[i]++;
    if (n < r.skip || n - r.skip >= r.count) continue;
    switch (r.action) {
      case FaultRule::Action::kDelay:
        op.release_at = Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(r.delay_s));
        break;
      case FaultRule::Action::kDrop:
        op.release_at = Clock::time_point::max();
        break;
      case FaultRule::Action::kCorrupt:
        op.corrupt = true;
        break;
      case FaultRule::Action::kFail:
        op.release_at = Clock::time_point::min() + std::chrono::nanoseconds(1);  // fails when released
        break;
      case FaultRule::Action::kTeardown:
        op.teardown = true;
        break;
    }
  }
}

// --- timer: deadlines and held ops ---

void EngineImpl::TimerLoop() {
  while (!stopping_) {
    bool busy;
    {
      std::lock_guard lock(batch_mu_);
      busy = !batches_.empty();
    }
    {
      // 1 ms ticks while batches are in flight (deadlines); otherwise wake
      // for Submit or every 50 ms (peer upkeep).
      std::unique_lock lock(timer_mu_);
      timer_cv_.wait_for(lock, std::chrono::milliseconds(busy ? 1 : 50));
    }
    if (stopping_) break;
    CheckDeadlines(Clock::now());
    MaintainPeers();
  }
}

void EngineImpl::CheckDeadlines(Clock::time_point now) {
  // Held ops (faults): release the due ones, time out the late ones.
  std::vector<OpPtr> release, expire, fail;
  {
    std::lock_guard lock(held_mu_);
    for (auto it = held_.begin(); it != held_.end();) {
      OpPtr& op = *it;
      if (op->release_at == Clock::time_point::min() + std::chrono::nanoseconds(1)) {
        fail.push_back(op);
      } else if (now >= op->deadline) {
        expire.push_back(op);
      } else if (now >= op->release_at) {
        release.push_back(op);
      } else {
        ++it;
        continue;
      }
      it = held_.erase(it);
    }
  }
  for (auto& op : fail) CompleteOp(op, Status::Internal("injected transfer failure (test fault)"));
  for (auto& op : expire) CompleteOp(op, Status::DeadlineExceeded("transfer op missed its deadline (not started)"));
  for (auto& op : release) {
    op->release_at = Clock::time_point();
    Dispatch(op);
  }
  // Queued tcp ops past their deadline never start; a connection whose
  // oldest sent op is late is shut down (its receiver retires the ops).
  std::vector<std::shared_ptr<Peer>> peers;
  {
    std::lock_guard lock(peers_mu_);
    for (auto& [id, p] : peers_) peers.push_back(p);
  }
  for (auto& p : peers) {
    std::vector<OpPtr> late;
    std::vector<std::shared_ptr<DataConn>> conns;
    {
      std::lock_guard lock(p->q_mu);
      for (auto it = p->queue.begin(); it != p->queue.end();) {
        if (now >= (*it)->deadline) {
          late.push_back(*it);
          it = p->queue.erase(it);
        } else {
          ++it;
        }
      }
      conns = p->conns;
    }
    for (auto& op : late) CompleteOp(op, Status::DeadlineExceeded("transfer op missed its deadline (still queued)"));
    for (auto& c : conns) {
      std::lock_guard lock(c->mu);
      if (c->broken) continue;
      for (const auto& op : c->sent) {
        if (now >= op->deadline) {
          c->broken = true;
          c->why = Status::DeadlineExceeded("transfer op missed its deadline on a connection to " + p->name);
          if (c->fd >= 0) ::shutdown(c->fd, SHUT_RDWR);
          break;
        }
      }
    }
  }
  // shm queue
  std::vector<OpPtr> shm_late;
  {
    std::lock_guard lock(shm_mu_);
    for (auto it = shm_queue_.begin(); it != shm_queue_.end();) {
      if (now >= (*it)->deadline) {
        shm_late.push_back(*it);
        it = shm_queue_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (auto& op : shm_late) CompleteOp(op, Status::DeadlineExceeded("transfer op missed its deadline (still queued)"));
}

// --- stats ---

TransferStats EngineImpl::stats() const {
  TransferStats s;
  auto fill = [](const Counters& c, TransferStats::ByTransport& t) {
    t.read_bytes = c.read_bytes;
    t.write_bytes = c.write_bytes;
    t.reads = c.reads;
    t.writes = c.writes;
    t.failures = c.failures;
  };
  fill(tcp_, s.tcp);
  fill(shm_, s.shm);
  s.served_read_bytes = served_read_bytes_;
  s.served_write_bytes = served_write_bytes_;
  s.timeouts = timeouts_;
  s.refused = exports_.refused();
  s.refused_locally = refused_locally_;
  s.failed_handshakes = failed_handshakes_;
  s.connections = connections_;
  {
    std::lock_guard lock(batch_mu_);
    s.batches_in_flight = batches_.size();
  }
  std::lock_guard lock(hist_mu_);
  s.latency_buckets = kLatencyBuckets;
  s.latency_counts = hist_counts_;
  s.latency_sum = hist_sum_;
  s.latency_count = hist_count_;
  return s;
}

}  // namespace detail

std::string RenderTransferMetrics(const TransferStats& s) {
  std::string out;
  auto line = [&](const std::string& l) { out += l + "\n"; };
  line("# HELP strata_transfer_bytes_total Bytes this process moved as requester, by transport and direction.");
  line("# TYPE strata_transfer_bytes_total counter");
  line("# HELP strata_transfer_ops_total Transfer ops completed as requester, by transport and direction.");
  line("# TYPE strata_transfer_ops_total counter");
  auto by = [&](const char* t, const TransferStats::ByTransport& b) {
    line(std::string("strata_transfer_bytes_total{transport=\"") + t + "\",direction=\"read\"} " + std::to_string(b.read_bytes));
    line(std::string("strata_transfer_bytes_total{transport=\"") + t + "\",direction=\"write\"} " + std::to_string(b.write_bytes));
    line(std::string("strata_transfer_ops_total{transport=\"") + t + "\",direction=\"read\"} " + std::to_string(b.reads));
    line(std::string("strata_transfer_ops_total{transport=\"") + t + "\",direction=\"write\"} " + std::to_string(b.writes));
  };
  by("tcp", s.tcp);
  by("shm", s.shm);
  line("# HELP strata_transfer_failures_total Transfer ops that completed with an error, by transport.");
  line("# TYPE strata_transfer_failures_total counter");
  line("strata_transfer_failures_total{transport=\"tcp\"} " + std::to_string(s.tcp.failures));
  line("strata_transfer_failures_total{transport=\"shm\"} " + std::to_string(s.shm.failures));
  line("# HELP strata_transfer_served_bytes_total Bytes peers read from or wrote into this process over tcp.");
  line("# TYPE strata_transfer_served_bytes_total counter");
  line("strata_transfer_served_bytes_total{direction=\"read\"} " + std::to_string(s.served_read_bytes));
  line("strata_transfer_served_bytes_total{direction=\"write\"} " + std::to_string(s.served_write_bytes));
  line("# HELP strata_transfer_timeouts_total Transfer ops that missed their batch deadline.");
  line("# TYPE strata_transfer_timeouts_total counter");
  line("strata_transfer_timeouts_total " + std::to_string(s.timeouts));
  line("# HELP strata_transfer_refused_total Accesses refused: by this process as target, or by its own checks before sending.");
  line("# TYPE strata_transfer_refused_total counter");
  line("strata_transfer_refused_total{side=\"target\"} " + std::to_string(s.refused));
  line("strata_transfer_refused_total{side=\"requester\"} " + std::to_string(s.refused_locally));
  line("# HELP strata_transfer_failed_handshakes_total Transfer connections closed by a failed handshake (wrong secret, bad hello).");
  line("# TYPE strata_transfer_failed_handshakes_total counter");
  line("strata_transfer_failed_handshakes_total " + std::to_string(s.failed_handshakes));
  line("# HELP strata_transfer_connections Open transfer connections, both directions.");
  line("# TYPE strata_transfer_connections gauge");
  line("strata_transfer_connections " + std::to_string(s.connections));
  line("# HELP strata_transfer_batches_in_flight Transfer batches submitted and not yet completed and polled.");
  line("# TYPE strata_transfer_batches_in_flight gauge");
  line("strata_transfer_batches_in_flight " + std::to_string(s.batches_in_flight));
  line("# HELP strata_transfer_op_seconds Time from submit to completion of each successful transfer op.");
  line("# TYPE strata_transfer_op_seconds histogram");
  uint64_t cum = 0;
  for (size_t i = 0; i < s.latency_buckets.size(); ++i) {
    cum += s.latency_counts[i];
    line("strata_transfer_op_seconds_bucket{le=\"" + fmt::format("{}", s.latency_buckets[i]) + "\"} " + std::to_string(cum));
  }
  if (!s.latency_counts.empty()) cum += s.latency_counts.back();
  line("strata_transfer_op_seconds_bucket{le=\"+Inf\"} " + std::to_string(cum));
  line("strata_transfer_op_seconds_sum " + fmt::format("{}", s.latency_sum));
  line("strata_transfer_op_seconds_count " + std::to_string(s.latency_count));
  return out;
}

}  // namespace strata::transfer
