#include "cluster/kv_holder.h"

#include <nlohmann/json.hpp>

#include "cluster/kv_wire.h"
#include "common/logging.h"

#include <xxhash.h>

namespace strata::cluster {

namespace {

// The value of `key` in a query string "a=1&b=2" ("" when absent).
std::string QueryValue(const std::string& query, const std::string& key) {
  size_t pos = 0;
  while (pos <= query.size()) {
    size_t end = query.find('&', pos);
    if (end == std::string::npos) end = query.size();
    const std::string part = query.substr(pos, end - pos);
    if (part.rfind(key + "=", 0) == 0) return part.substr(key.size() + 1);
    pos = end + 1;
  }
  return "";
}
}  // namespace

KvHolder::KvHolder(kvcache::KvEventLog* log, PostFn post, std::vector<ExportedTier> tiers,
                   std::chrono::milliseconds max_lease, std::vector<size_t> disk_tiers, StagingArea staging)
    : log_(log),
      post_(std::move(post)),
      tiers_(std::move(tiers)),
      max_lease_(max_lease),
      disk_tiers_(staging.slots > 0 ? std::move(disk_tiers) : std::vector<size_t>{}),
      staging_(std::move(staging)) {
  for (int i = staging_.slots - 1; i >= 0; --i) free_slots_.push_back(i);
  timer_ = std::thread([this] { TimerLoop(); });
}

struct KvHolder::PendingResolve {
  std::vector<ResolvedBlock> blocks;
  std::vector<bool> ok;  // per block: answered (host) or staged successfully
  Lease lease;
  int pending = 0;       // stagings in flight
  std::chrono::milliseconds lease_len{0};
  ReplyFn reply;
};

int KvHolder::TakeSlot() {
  std::lock_guard lock(mu_);
  if (free_slots_.empty()) return -1;
  const int s = free_slots_.back();
  free_slots_.pop_back();
  return s;
}

void KvHolder::Drop(Lease lease) {
  {
    std::lock_guard lock(mu_);
    for (int s : lease.slots) free_slots_.push_back(s);
  }
  Unpin(std::move(lease.pins));
}

KvHolder::~KvHolder() { Stop(); }

void KvHolder::Stop() {
  stopped_.store(true);
  {
    std::lock_guard lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (timer_.joinable()) timer_.join();
}

HolderStats KvHolder::stats() const {
  std::lock_guard lock(mu_);
  HolderStats s = stats_;
  s.leases_active = leases_.size();
  return s;
}

bool KvHolder::Handle(const std::string& method, const std::string& path, const std::string& query,
                      const std::string& body, ReplyFn reply) {
  if (path.rfind("/internal/kv/", 0) != 0) return false;
  if (stopped_.load()) return reply(503, ErrorJson("the instance is shutting down")), true;
  const bool get = method == "GET", post = method == "POST";
  if (path == "/internal/kv/events") {
    if (!get) return reply(405, ErrorJson("use GET")), true;
    Events(query, reply);
  } else if (path == "/internal/kv/snapshot") {
    if (!get) return reply(405, ErrorJson("use GET")), true;
    reply(200, SnapshotToJson(log_->Snapshot()));
  } else if (path == "/internal/kv/resolve") {
    if (!post) return reply(405, ErrorJson("use POST")), true;
    Resolve(body, std::move(reply));
  } else if (path == "/internal/kv/release") {
    if (!post) return reply(405, ErrorJson("use POST")), true;
    Release(body, reply);
  } else {
    return false;
  }
  return true;
}

void KvHolder::Events(const std::string& query, const ReplyFn& reply) const {
  const std::string since_text = QueryValue(query, "since");
  uint64_t since = 0;
  try {
    size_t used = 0;
    since = since_text.empty() ? 0 : std::stoull(since_text, &used);
    if (used != since_text.size()) throw std::invalid_argument("trailing");
  } catch (...) {
    return reply(400, ErrorJson("'since' must be a sequence number"));
  }
  auto batches = log_->Since(since);
  if (!batches) return reply(410, ErrorJson("batches after " + since_text + " are no longer kept: ask for a snapshot"));
  EventsReply r{log_->instance(), log_->incarnation(), log_->epoch(), log_->last_seq(), std::move(*batches)};
  reply(200, EventsReplyToJson(r));
}

void KvHolder::Resolve(const std::string& body, ReplyFn reply) {
  auto req = ResolveRequestFromJson(body);
  if (!req) return reply(400, ErrorJson(req.error().message()));
  const auto lease_len = std::min(std::chrono::milliseconds(req->lease_ms), max_lease_);
  auto task = [this, req = std::move(*req), lease_len, reply](kvcache::KvManager& kv) {
    if (stopped_.load()) return reply(503, ErrorJson("the instance is shutting down"));
    auto p = std::make_shared<PendingResolve>();
    p->lease_len = lease_len;
    p->reply = reply;
    bool cut = false;  // a staging could not start: answer the blocks before it only
    for (const BlockHash& h : req.hashes) {
      if (cut) break;
      bool found = false;
      for (const ExportedTier& t : tiers_) {  // host tiers first
        kvcache::BlockStore* store = kv.mutable_lower_store(t.tier);
        auto loc = store->Locate(h);
        if (!loc || !store->Pin(h)) continue;
        p->blocks.push_back({t.segment, loc->region.offset, loc->region.length, loc->checksum});
        p->ok.push_back(true);
        p->lease.pins.emplace_back(t.tier, h);
        found = true;
        break;
      }
      for (size_t d = 0; !found && d < disk_tiers_.size(); ++d) {
        if (!kv.lower_store(disk_tiers_[d]).Contains(h)) continue;
        const int slot = TakeSlot();
        if (slot < 0) {
          std::lock_guard lock(mu_);
          ++stats_.stage_failures;
          break;
        }
        const uint64_t offset = static_cast<uint64_t>(slot) * staging_.stride;
        const size_t index = p->blocks.size();
        p->blocks.push_back({staging_.segment, offset, staging_.block_bytes, 0});
        p->ok.push_back(false);
        p->lease.slots.push_back(slot);
        ++p->pending;
        Status s = kv.SubmitStage(disk_tiers_[d], h, Region{staging_.segment_id, offset, staging_.block_bytes},
                                  [this, p, index, offset](const Status& st) {
                                    if (st.ok()) {
                                      p->blocks[index].checksum =
                                          XXH3_64bits(staging_.base + offset, staging_.block_bytes);
                                      p->ok[index] = true;
                                    }
                                    {
                                      std::lock_guard lock(mu_);
                                      ++(st.ok() ? stats_.blocks_staged : stats_.stage_failures);
                                    }
                                    if (--p->pending == 0) FinishResolve(p);
                                  });
        if (!s.ok()) {
          --p->pending;
          cut = true;  // block `index` stays not ok: the answer ends before it
          std::lock_guard lock(mu_);
          ++stats_.stage_failures;
        }
        found = true;  // answered when staged (or cut there if the read fails)
      }
      if (!found) break;  // a prefix: the rest would be unusable
    }
    if (p->pending == 0) FinishResolve(p);
  };
  if (!post_(std::move(task))) reply(503, ErrorJson("the instance is shutting down"));
}

void KvHolder::FinishResolve(const std::shared_ptr<PendingResolve>& p) {
  if (stopped_.load()) return;  // shutting down: the reply would go nowhere; the stores go with the manager
  // The answer is the prefix of blocks that are ready; the rest is dropped.
  size_t n = 0;
  while (n < p->ok.size() && p->ok[n]) ++n;
  ResolveReply out;
  out.blocks.assign(p->blocks.begin(), p->blocks.begin() + static_cast<std::ptrdiff_t>(n));
  {
    std::lock_guard lock(mu_);
    ++stats_.resolves;
    stats_.blocks_pinned += n;
    if (n > 0) {
      out.lease = next_lease_++;
      Lease lease = std::move(p->lease);
      lease.deadline = std::chrono::steady_clock::now() + p->lease_len;
      leases_.emplace(out.lease, std::move(lease));
    }
  }
  if (n == 0) Drop(std::move(p->lease));  // nothing usable: unpin and free at once
  p->reply(200, ResolveReplyToJson(out));
}

void KvHolder::Release(const std::string& body, const ReplyFn& reply) {
  const auto j = nlohmann::json::parse(body, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("lease") || !j["lease"].is_number_unsigned())
    return reply(400, ErrorJson("release: 'lease' must be a lease number"));
  Lease lease;
  {
    std::lock_guard lock(mu_);
    auto it = leases_.find(j["lease"].get<uint64_t>());
    if (it == leases_.end()) return reply(404, ErrorJson("no such lease (expired or released)"));
    lease = std::move(it->second);
    leases_.erase(it);
    ++stats_.releases;
  }
  Drop(std::move(lease));
  reply(200, "{}");
}

void KvHolder::Unpin(std::vector<std::pair<size_t, BlockHash>> pins) {
  if (pins.empty()) return;
  (void)post_([pins = std::move(pins)](kvcache::KvManager& kv) {
    for (const auto& [tier, h] : pins) kv.mutable_lower_store(tier)->Unpin(h);
  });
}

void KvHolder::TimerLoop() {
  std::unique_lock lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, std::chrono::milliseconds(100));
    const auto now = std::chrono::steady_clock::now();
    std::vector<Lease> expired;
    for (auto it = leases_.begin(); it != leases_.end();) {
      if (it->second.deadline > now) {
        ++it;
        continue;
      }
      expired.push_back(std::move(it->second));
      it = leases_.erase(it);
    }
    if (expired.empty()) continue;
    lock.unlock();
    for (auto& l : expired) Drop(std::move(l));
    lock.lock();
    // Counted once their unpins are posted: a reader of the stat who then
    // runs the engine's tasks finds the blocks unpinned.
    stats_.leases_expired += expired.size();
  }
}

}  // namespace strata::cluster
