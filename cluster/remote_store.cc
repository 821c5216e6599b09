#include "cluster/remote_store.h"

#include <xxhash.h>

#include <algorithm>
#include <chrono>

#include "cluster/kv_wire.h"
#include "common/http_client.h"
#include "common/logging.h"

namespace strata::cluster {

namespace {
// Blocks a holder can serve: in its host tier, or on its disk (staged first).
constexpr kvcache::TierMask kHostMask =
    kvcache::MaskOf(kvcache::TierKind::kHost) | kvcache::MaskOf(kvcache::TierKind::kDisk);
constexpr kvcache::TierMask kHostOnly = kvcache::MaskOf(kvcache::TierKind::kHost);

std::string HostOf(const std::string& address) {
  const size_t colon = address.rfind(':');
  std::string host = colon == std::string::npos ? address : address.substr(0, colon);
  if (host.size() > 2 && host.front() == '[' && host.back() == ']') host = host.substr(1, host.size() - 2);
  return host;
}

bool IsLoopback(const std::string& host) { return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1"; }
}  // namespace

Result<std::unique_ptr<RemoteStore>> RemoteStore::Create(const RemoteStoreOptions& options) {
  if (options.block_bytes == 0) return Status::InvalidArgument("remote store: block_bytes must be > 0");
  if (options.timeout_s <= 0 || options.lease_ms <= 0)
    return Status::InvalidArgument("remote store: timeout and lease must be > 0");
  std::unique_ptr<RemoteStore> s(new RemoteStore(options));
  s->worker_ = std::thread([p = s.get()] { p->WorkerLoop(); });
  return s;
}

RemoteStore::~RemoteStore() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

void RemoteStore::Bind(ClusterDirectory* directory, transfer::TransferEngine* engine) {
  engine_.store(engine);
  directory_.store(directory);
}

kvcache::StoreStats RemoteStore::stats() const {
  std::lock_guard lock(mu_);
  kvcache::StoreStats s;
  s.corrupt_blocks = corrupt_;
  return s;
}

RemoteStats RemoteStore::remote_stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

double RemoteStore::measured_read_bytes_per_s() const {
  std::lock_guard lock(mu_);
  if (std::chrono::steady_clock::now() - rate_at_ > kRateTtl) return 0;  // stale: unknown
  return rate_;
}

bool RemoteStore::Contains(const BlockHash& h) const {
  ClusterDirectory* dir = directory_.load();
  if (dir == nullptr) return false;
  for (const auto& p : dir->Peers())
    if (!p.transfer_address.empty() && (dir->index().Holds(p.name, h) & kHostMask) != 0 && dir->Peer(p.name))
      return true;
  return false;
}

size_t RemoteStore::CountPrefix(std::span<const BlockHash> chain) const {
  ClusterDirectory* dir = directory_.load();
  if (dir == nullptr || chain.empty()) return 0;
  size_t best = 0;
  for (const auto& holder : dir->index().LongestPrefix(chain)) {
    if (holder.instance == dir->options().self || holder.blocks <= best) continue;
    auto peer = dir->Peer(holder.instance);
    if (!peer || peer->transfer_address.empty()) continue;  // unknown, unreachable, or no transfer engine
    size_t n = 0;
    while (n < holder.blocks && (holder.tiers[n] & kHostMask) != 0) ++n;
    best = std::max(best, n);
  }
  return best;
}

Status RemoteStore::SubmitWrite(const BlockHash&, const Sha256Digest&, const Region&, uint64_t) {
  return Status::InvalidArgument("remote store: the remote tier is read-only (its write_policy is none)");
}

Status RemoteStore::SubmitRead(const BlockHash& h, const Region& dst, uint64_t tag) {
  STRATA_ASSIGN_OR_RETURN(std::span<uint8_t> bytes, HostBytes(dst, options_.block_bytes, false));
  submitted_.push_back({h, dst, bytes, tag});
  return Status::Ok();
}

size_t RemoteStore::Poll(std::vector<kvcache::StoreCompletion>* out) {
  std::lock_guard lock(mu_);
  if (!submitted_.empty()) {
    queue_.push_back(std::move(submitted_));
    submitted_.clear();
    ++busy_;
    cv_.notify_all();
  }
  const size_t n = done_.size();
  for (auto& c : done_) out->push_back(std::move(c));
  done_.clear();
  return n;
}

void RemoteStore::Drain(std::vector<kvcache::StoreCompletion>* out) {
  (void)Poll(out);
  std::unique_lock lock(mu_);
  cv_.wait(lock, [this] { return busy_ == 0; });
  for (auto& c : done_) out->push_back(std::move(c));
  done_.clear();
}

Status RemoteStore::Remove(const BlockHash&) { return Status::NotFound("remote store: holds no blocks of its own"); }
Status RemoteStore::Flush(const Sha256Digest*) { return Status::Ok(); }

void RemoteStore::Finish(const Read& r, Status s) {
  std::lock_guard lock(mu_);
  if (s.ok()) {
    ++stats_.blocks_read;
    stats_.bytes_read += options_.block_bytes;
  }
  done_.push_back({r.tag, std::move(s)});
}

void RemoteStore::WorkerLoop() {
  std::unique_lock lock(mu_);
  while (true) {
    cv_.wait(lock, [this] { return stop_ || !queue_.empty(); });
    if (queue_.empty() && stop_) return;
    std::vector<Read> batch = std::move(queue_.front());
    queue_.pop_front();
    const bool stopping = stop_;
    lock.unlock();
    if (stopping) {
      for (const Read& r : batch) Finish(r, Status::Unavailable("remote store: shutting down"));
    } else {
      RunBatch(std::move(batch));
    }
    lock.lock();
    --busy_;
    cv_.notify_all();
  }
}

bool RemoteStore::SameHost(const transfer::InstanceInfo& peer) const {
  const std::string theirs = HostOf(peer.transfer_address);
  if (IsLoopback(theirs)) return true;
  transfer::TransferEngine* engine = engine_.load();
  return engine != nullptr && theirs == HostOf(engine->address());
}

void RemoteStore::RunBatch(std::vector<Read> batch) {
  {
    std::lock_guard lock(mu_);
    ++stats_.batches;
  }
  ClusterDirectory* dir = directory_.load();
  if (dir == nullptr || engine_.load() == nullptr) {
    for (const Read& r : batch) Finish(r, Status::Unavailable("remote store: not connected to a cluster"));
    return;
  }
  // Candidate holders: reachable peers with a transfer address, ranked by
  // same host first, then by how many of the batch's blocks they hold.
  struct Candidate {
    transfer::InstanceInfo info;
    bool same_host = false;
    size_t held = 0;       // blocks of the batch it can serve
    size_t in_host = 0;    // of those, in its host tier (no staging)
  };
  std::vector<Candidate> cands;
  for (const auto& p : dir->Peers()) {
    if (p.transfer_address.empty() || !dir->Peer(p.name)) continue;
    Candidate c{p, SameHost(p), 0, 0};
    for (const Read& r : batch) {
      const kvcache::TierMask m = dir->index().Holds(p.name, r.hash);
      c.held += (m & kHostMask) != 0;
      c.in_host += (m & kHostOnly) != 0;
    }
    if (c.held > 0) cands.push_back(std::move(c));
  }
  std::sort(cands.begin(), cands.end(), [](const Candidate& a, const Candidate& b) {
    if (a.same_host != b.same_host) return a.same_host;
    if (a.held != b.held) return a.held > b.held;
    if (a.in_host != b.in_host) return a.in_host > b.in_host;  // host tier before disk
    return a.info.name < b.info.name;
  });
  std::vector<std::vector<Read>> groups(cands.size());
  for (Read& r : batch) {
    size_t i = 0;
    while (i < cands.size() && (dir->index().Holds(cands[i].info.name, r.hash) & kHostMask) == 0) ++i;
    if (i == cands.size()) {
      {
        std::lock_guard lock(mu_);
        ++stats_.misses;
      }
      Finish(r, Status::NotFound("remote store: no reachable peer holds the block"));
      continue;
    }
    groups[i].push_back(std::move(r));
  }
  for (size_t i = 0; i < cands.size(); ++i)
    if (!groups[i].empty()) ReadFrom(cands[i].info, std::move(groups[i]));
}

Result<uint64_t> RemoteStore::PeerId(const std::string& address) {
  if (auto it = peers_.find(address); it != peers_.end()) return it->second;
  STRATA_ASSIGN_OR_RETURN(uint64_t id, engine_.load()->Connect(address));
  peers_[address] = id;
  return id;
}

void RemoteStore::ReadFrom(const transfer::InstanceInfo& holder, std::vector<Read> reads) {
  transfer::TransferEngine* const engine = engine_.load();
  const auto t0 = std::chrono::steady_clock::now();
  const auto deadline = t0 + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                 std::chrono::duration<double>(options_.timeout_s));
  auto fail_all = [&](size_t from, const Status& s, uint64_t RemoteStats::*counter) {
    {
      std::lock_guard lock(mu_);
      stats_.*counter += reads.size() - from;
    }
    for (size_t i = from; i < reads.size(); ++i) Finish(reads[i], s);
  };
  const std::string who = "remote store: holder '" + holder.name + "': ";
  // 1. Resolve and pin.
  ResolveRequest req{engine->instance_name(), options_.lease_ms, {}};
  for (const Read& r : reads) req.hashes.push_back(r.hash);
  const std::string host = HostOf(holder.http_address);
  int port = 0;
  try {
    port = std::stoi(holder.http_address.substr(holder.http_address.rfind(':') + 1));
  } catch (...) {
  }
  HeaderList headers = {{"content-type", "application/json"}};
  if (!options_.admin_token.empty()) headers.emplace_back("authorization", "Bearer " + options_.admin_token);
  auto resp = HttpCall(host, port, "POST", "/internal/kv/resolve", ResolveRequestToJson(req), headers, options_.timeout_s);
  if (!resp || resp->status != 200) {
    const std::string why = !resp ? resp.error().message() : "HTTP " + std::to_string(resp->status) + " " + resp->body;
    return fail_all(0, Status::Unavailable(who + "resolve failed: " + why), &RemoteStats::holder_failures);
  }
  auto resolved = ResolveReplyFromJson(resp->body);
  if (!resolved) return fail_all(0, Status::Corrupt(who + resolved.error().message()), &RemoteStats::holder_failures);
  const size_t n = std::min(resolved->blocks.size(), reads.size());
  auto release = [&] {
    if (resolved->lease == 0) return;
    (void)HttpCall(host, port, "POST", "/internal/kv/release", "{\"lease\":" + std::to_string(resolved->lease) + "}",
                   headers, options_.timeout_s);
  };
  // 2. Read the resolved blocks with the transfer engine.
  std::vector<transfer::TransferOp> ops;
  Status open = Status::Ok();
  std::map<std::string, transfer::RemoteHandle> handles;
  auto peer = PeerId(holder.transfer_address);
  if (!peer) open = peer.error();
  for (size_t i = 0; i < n && open.ok(); ++i) {
    const ResolvedBlock& b = resolved->blocks[i];
    if (b.length != options_.block_bytes) {
      open = Status::Corrupt(who + "resolved a block of " + std::to_string(b.length) + " bytes");
      break;
    }
    auto h = handles.find(b.segment);
    if (h == handles.end()) {
      auto opened = engine->OpenSegment(*peer, b.segment);
      if (!opened) {
        open = opened.error();
        break;
      }
      h = handles.emplace(b.segment, *opened).first;
    }
    ops.push_back({transfer::OpKind::kRead, reads[i].dst, h->second, b.offset});
  }
  if (!open.ok()) {
    peers_.erase(holder.transfer_address);  // reconnect next time (the holder may have restarted)
    release();
    fail_all(0, Status::Unavailable(who + open.message()), &RemoteStats::transfer_failures);
    return;
  }
  std::vector<Status> results(n, Status::Ok());
  if (!ops.empty()) {
    auto batch = engine->Submit(std::move(ops), deadline);
    if (!batch) {
      results.assign(n, batch.error());
    } else {
      transfer::BatchResult br = engine->Wait(*batch);
      for (size_t i = 0; i < n; ++i)
        results[i] = i < br.ops.size() ? br.ops[i]
                     : br.status.ok() ? Status::Internal("the transfer engine reported no status for the read")
                                      : br.status;
    }
  }
  // 3. Check each block and complete (then release the lease: the load
  // need not wait for that round trip).
  bool any_failed = false;
  uint64_t good_bytes = 0;
  for (size_t i = 0; i < reads.size(); ++i) {
    if (i >= n) {
      {
        std::lock_guard lock(mu_);
        ++stats_.misses;
      }
      Finish(reads[i], Status::NotFound(who + "no longer holds the block"));
      continue;
    }
    if (!results[i].ok()) {
      any_failed = true;
      {
        std::lock_guard lock(mu_);
        ++stats_.transfer_failures;
      }
      Finish(reads[i], Status(results[i].code(), who + results[i].message()));
      continue;
    }
    if (XXH3_64bits(reads[i].bytes.data(), reads[i].bytes.size()) != resolved->blocks[i].checksum) {
      {
        std::lock_guard lock(mu_);
        ++stats_.checksum_mismatches;
        ++corrupt_;
      }
      Finish(reads[i], Status::Corrupt(who + "block checksum mismatch"));
      continue;
    }
    good_bytes += options_.block_bytes;
    Finish(reads[i], Status::Ok());
  }
  release();
  if (any_failed) peers_.erase(holder.transfer_address);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  if (good_bytes > 0 && secs > 0) {
    std::lock_guard lock(mu_);
    const double r = static_cast<double>(good_bytes) / secs;
    const auto now = std::chrono::steady_clock::now();
    rate_ = rate_ == 0 || now - rate_at_ > kRateTtl ? r : 0.8 * rate_ + 0.2 * r;
    rate_at_ = now;
  }
}

}  // namespace strata::cluster
