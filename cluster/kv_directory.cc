#include "cluster/kv_directory.h"

#include <chrono>

#include "cluster/kv_wire.h"
#include "common/http_client.h"
#include "common/logging.h"

namespace strata::cluster {

namespace {
bool SplitHostPort(const std::string& address, std::string* host, int* port) {
  const size_t colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0) return false;
  try {
    *port = std::stoi(address.substr(colon + 1));
  } catch (...) {
    return false;
  }
  *host = address.substr(0, colon);
  if (host->size() > 2 && host->front() == '[' && host->back() == ']') *host = host->substr(1, host->size() - 2);
  return *port > 0;
}
}  // namespace

ClusterDirectory::ClusterDirectory(DirectoryOptions options, transfer::MetadataClient* meta)
    : options_(std::move(options)), meta_(meta) {
  thread_ = std::thread([this] { Loop(); });
}

ClusterDirectory::~ClusterDirectory() {
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

std::optional<transfer::InstanceInfo> ClusterDirectory::Peer(const std::string& name) const {
  std::lock_guard lock(mu_);
  auto it = peers_.find(name);
  if (it == peers_.end() || !it->second.reachable) return std::nullopt;
  return it->second.info;
}

std::vector<transfer::InstanceInfo> ClusterDirectory::Peers() const {
  std::lock_guard lock(mu_);
  std::vector<transfer::InstanceInfo> out;
  for (const auto& [n, p] : peers_) out.push_back(p.info);
  return out;
}

DirectoryStats ClusterDirectory::stats() const {
  std::lock_guard lock(mu_);
  DirectoryStats s = stats_;
  s.members = peers_.size();
  return s;
}

void ClusterDirectory::Loop() {
  using Clock = std::chrono::steady_clock;
  auto next_members = Clock::now();
  std::unique_lock lock(mu_);
  while (!stop_) {
    lock.unlock();
    {
      std::lock_guard poll(poll_mu_);
      if (Clock::now() >= next_members) {
        RefreshMembers();
        next_members = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                          std::chrono::duration<double>(options_.members_interval_s));
      }
      std::vector<std::string> names;
      {
        std::lock_guard l(mu_);
        for (const auto& [n, p] : peers_) names.push_back(n);
      }
      for (const auto& n : names) PollPeer(n);
    }
    lock.lock();
    cv_.wait_for(lock, std::chrono::duration<double>(options_.poll_interval_s), [this] { return stop_; });
  }
}

void ClusterDirectory::PollNow() {
  std::lock_guard poll(poll_mu_);
  RefreshMembers();
  std::vector<std::string> names;
  {
    std::lock_guard l(mu_);
    for (const auto& [n, p] : peers_) names.push_back(n);
  }
  for (const auto& n : names) PollPeer(n);
}

void ClusterDirectory::RefreshMembers() {
  auto listed = meta_->List();
  if (!listed) {
    std::lock_guard lock(mu_);
    if (stats_.member_failures++ == 0 || stats_.member_failures % 30 == 0)
      STRATA_LOG_WARN("cluster: membership unreadable ({}); keeping the {} known peers", listed.error().message(),
                      peers_.size());
    return;
  }
  std::map<std::string, transfer::InstanceInfo> now;
  for (auto& i : *listed) {
    if (i.name == options_.self || i.model_namespace != options_.model_namespace || i.http_address.empty()) continue;
    now.emplace(i.name, std::move(i));
  }
  std::vector<std::string> gone;
  {
    std::lock_guard lock(mu_);
    ++stats_.member_listings;
    const auto t = std::chrono::steady_clock::now();
    const auto grace = std::chrono::duration<double>(options_.absent_grace_s);
    for (auto it = peers_.begin(); it != peers_.end();) {
      PeerState& p = it->second;
      if (now.contains(it->first)) {
        p.absent_since = {};
        ++it;
        continue;
      }
      if (p.absent_since == std::chrono::steady_clock::time_point{}) p.absent_since = t;
      if (p.reachable && t - p.absent_since < grace) {
        ++it;  // alive and answering: the store may have lost it (restarted empty)
        continue;
      }
      gone.push_back(it->first);
      it = peers_.erase(it);
    }
    for (auto& [name, info] : now) {
      auto [it, fresh] = peers_.try_emplace(name);
      it->second.info = std::move(info);
      if (fresh) {
        STRATA_LOG_INFO("cluster: peer '{}' at {}", name, it->second.info.http_address);
        // Removed earlier while only unreachable or unlisted: its snapshot counts again.
        index_.Readmit(name, it->second.info.incarnation);
      }
    }
  }
  for (const auto& name : gone) {
    STRATA_LOG_INFO("cluster: peer '{}' left; its blocks leave the index", name);
    index_.RemoveInstance(name);
  }
}

bool ClusterDirectory::FetchSnapshot(const std::string& name, const std::string& http_address) {
  std::string host;
  int port = 0;
  if (!SplitHostPort(http_address, &host, &port)) return false;
  HeaderList headers;
  if (!options_.admin_token.empty()) headers.emplace_back("authorization", "Bearer " + options_.admin_token);
  auto r = HttpCall(host, port, "GET", "/internal/kv/snapshot", "", headers, options_.call_timeout_s);
  if (!r || r->status != 200) return false;
  auto snap = SnapshotFromJson(r->body);
  if (!snap || snap->instance != name) return false;
  if (!index_.ApplySnapshot(*snap)) return false;  // stale (an older process, or one the index retired)
  std::lock_guard lock(mu_);
  ++stats_.snapshots;
  auto it = peers_.find(name);
  if (it != peers_.end()) {
    it->second.incarnation = snap->incarnation;
    it->second.applied = snap->seq;
  }
  return true;
}

void ClusterDirectory::PollPeer(const std::string& name) {
  std::string address, incarnation;
  uint64_t applied = 0;
  {
    std::lock_guard lock(mu_);
    auto it = peers_.find(name);
    if (it == peers_.end()) return;
    if (std::chrono::steady_clock::now() < it->second.retry_at) return;  // backing off
    address = it->second.info.http_address;
    incarnation = it->second.incarnation;
    applied = it->second.applied;
  }
  auto mark = [&](bool ok) {
    std::lock_guard lock(mu_);
    auto it = peers_.find(name);
    if (ok) ++stats_.polls;
    else ++stats_.poll_failures;
    if (it != peers_.end()) {
      PeerState& p = it->second;
      p.reachable = ok;
      p.failures = ok ? 0 : p.failures + 1;
      const auto delay = std::min<std::chrono::milliseconds>(
          std::chrono::milliseconds(5000), std::chrono::milliseconds(100) * (1 << std::min(p.failures, 6)));
      p.retry_at = ok ? std::chrono::steady_clock::time_point{} : std::chrono::steady_clock::now() + delay;
    }
    return ok;
  };
  std::string host;
  int port = 0;
  if (!SplitHostPort(address, &host, &port)) return (void)mark(false);
  if (incarnation.empty()) return (void)mark(FetchSnapshot(name, address));
  HeaderList headers;
  if (!options_.admin_token.empty()) headers.emplace_back("authorization", "Bearer " + options_.admin_token);
  auto r = HttpCall(host, port, "GET", "/internal/kv/events?since=" + std::to_string(applied), "", headers,
                    options_.call_timeout_s);
  if (!r) return (void)mark(false);
  if (r->status == 410) return (void)mark(FetchSnapshot(name, address));
  if (r->status != 200) return (void)mark(false);
  auto reply = EventsReplyFromJson(r->body);
  if (!reply || reply->instance != name) return (void)mark(false);
  if (reply->incarnation != incarnation) return (void)mark(FetchSnapshot(name, address));  // restarted
  bool need_snapshot = false;
  uint64_t last = applied;
  for (const auto& b : reply->batches) {
    const auto res = index_.Apply(b);
    if (res == kvcache::ClusterKvIndex::ApplyResult::kNeedSnapshot ||
        res == kvcache::ClusterKvIndex::ApplyResult::kWaiting || res == kvcache::ClusterKvIndex::ApplyResult::kStale) {
      need_snapshot = true;
      break;
    }
    last = std::max<uint64_t>(last, b.seq_first + b.events.size() - 1);
  }
  if (need_snapshot) return (void)mark(FetchSnapshot(name, address));
  {
    std::lock_guard lock(mu_);
    auto it = peers_.find(name);
    if (it != peers_.end() && it->second.incarnation == incarnation) it->second.applied = last;
  }
  mark(true);
}

}  // namespace strata::cluster
