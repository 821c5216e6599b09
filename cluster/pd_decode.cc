#include "cluster/pd_decode.h"

#include <nlohmann/json.hpp>

#include "cluster/pd_wire.h"
#include "cluster/kv_wire.h"
#include "common/logging.h"

#include <algorithm>
#include <xxhash.h>

namespace strata::cluster {

namespace {
constexpr int kRevokeTries = 100;  // x 10 ms
}  // namespace

PdDecode::PdDecode(PostFn post, scheduler::EngineClient* engine, transfer::TransferEngine* xfer,
                   SegmentId device_segment, uint64_t block_bytes, std::chrono::milliseconds max_lease)
    : post_(std::move(post)),
      engine_(engine),
      xfer_(xfer),
      segment_(device_segment),
      block_bytes_(block_bytes),
      max_lease_(max_lease) {
  timer_ = std::thread([this] { TimerLoop(); });
}

PdDecode::~PdDecode() { Stop(); }

void PdDecode::Stop() {
  std::vector<Revoking> left;
  std::vector<uint64_t> grants;
  {
    std::lock_guard lock(mu_);
    if (stop_) return;
    stop_ = true;
    left.swap(revoking_);
    for (auto& [id, h] : held_) grants.insert(grants.end(), h.grants.begin(), h.grants.end());
  }
  cv_.notify_all();
  if (timer_.joinable()) timer_.join();
  // No peer writes into this instance's blocks after shutdown; decodes that
  // waited for a revocation get their answer.
  for (uint64_t g : grants) (void)xfer_->Revoke(g);
  for (auto& r : left)
    if (r.then && r.abandoned) r.abandoned();
}

PdDecodeStats PdDecode::stats() const {
  std::lock_guard lock(mu_);
  PdDecodeStats s = stats_;
  s.active = held_.size();
  return s;
}

bool PdDecode::Handle(const std::string& method, const std::string& path, const std::string& body,
                      StreamReply reply) {
  if (method != "POST") return false;
  {
    std::lock_guard lock(mu_);
    if (stop_) {
      reply.reply(503, ErrorJson("the instance is shutting down"));
      return true;
    }
  }
  if (path == "/internal/pd/reserve" && draining_.load()) {
    reply.reply(503, ErrorJson("the instance is draining: reserve elsewhere"));
    return true;
  }
  if (path == "/internal/pd/reserve") return Reserve(body, reply.reply), true;
  if (path == "/internal/pd/decode") return Decode(body, std::move(reply)), true;
  if (path == "/internal/pd/cancel") return Cancel(body, reply.reply), true;
  return false;
}

void PdDecode::Reserve(const std::string& body, const ReplyFn& reply) {
  auto req = ReserveRequestFromJson(body);
  if (!req.ok()) return reply(400, ErrorJson(req.error().message()));
  const auto lease = std::min(std::chrono::milliseconds(req->lease_ms), max_lease_);
  const bool posted = post_([this, q = std::move(*req), lease, reply](kvcache::KvManager& kv) {
    {
      std::lock_guard lock(mu_);
      if (held_.contains(q.id)) return reply(409, ErrorJson("reservation " + std::to_string(q.id) + " exists"));
    }
    kvcache::KvManager::Reservation r;
    auto got = kv.Reserve(q.id, q.prompt, q.cache_salt, INT64_MAX, &r);  // the lease is ours (the timer)
    if (!got.ok()) return reply(400, ErrorJson(got.error().message()));
    if (*got == kvcache::AllocOutcome::kNotNow) {
      std::lock_guard lock(mu_);
      ++stats_.not_now;
      return reply(503, ErrorJson("not now: the KV pool cannot hold " + std::to_string(q.prompt.size()) +
                                  " prompt tokens at the moment"));
    }
    ReserveReply a;
    a.id = q.id;
    a.held_blocks = r.held_blocks;
    a.blocks = static_cast<int32_t>(r.blocks.size());
    a.block_bytes = block_bytes_;
    a.transfer = xfer_->address();
    for (size_t i = static_cast<size_t>(r.held_blocks); i < r.blocks.size(); ++i) {
      const Region region{segment_, static_cast<uint64_t>(r.blocks[i].value()) * block_bytes_, block_bytes_};
      auto g = xfer_->Grant(region, q.grantee, lease);
      if (!g.ok()) {
        for (uint64_t done : a.grants) (void)xfer_->Revoke(done);  // nothing was written yet: no wait
        kv.ReleaseReservation(q.id);
        return reply(500, ErrorJson("granting block " + std::to_string(i) + ": " + g.error().message()));
      }
      a.grants.push_back(*g);
    }
    {
      std::lock_guard lock(mu_);
      held_[q.id] = Held{a.grants, std::chrono::steady_clock::now() + lease, false};
      ++stats_.reserved;
      stats_.blocks_granted += a.grants.size();
      stats_.blocks_held += static_cast<uint64_t>(r.held_blocks);
    }
    reply(200, ReserveReplyToJson(a));
  });
  if (!posted) reply(503, ErrorJson("the engine is stopping"));
}

std::optional<std::vector<uint64_t>> PdDecode::Claim(uint64_t id, bool for_decode) {
  std::lock_guard lock(mu_);
  auto it = held_.find(id);
  if (it == held_.end() || it->second.decoding) return std::nullopt;
  std::vector<uint64_t> g = std::move(it->second.grants);
  if (for_decode) {
    it->second.decoding = true;
    it->second.grants.clear();
  } else {
    held_.erase(it);
  }
  return g;
}

void PdDecode::Decode(const std::string& body, StreamReply reply) {
  auto req = DecodeRequestFromJson(body);
  if (!req.ok()) return reply.reply(400, ErrorJson(req.error().message()));
  const uint64_t id = req->id;
  // Unknown, expired or claimed by another call: not used (recomputed).
  std::optional<std::vector<uint64_t>> grants = Claim(id, /*for_decode=*/true);
  const bool known = grants.has_value();
  auto abandoned = [reply] { reply.reply(503, ErrorJson("the engine is stopping")); };
  RevokeThen(id, grants.value_or(std::vector<uint64_t>{}), [this, d = std::move(*req), known, reply](kvcache::KvManager& kv, bool quiesced) {
    const uint64_t id = d.id;
    // Writes that may still land are not trusted: the reservation stays
    // out of use (released once its grants quiesce) and the prompt is
    // recomputed.
    const bool use = known && quiesced;
    if (use) {
      const int32_t filled = Verified(kv, id, d);
      Status s = kv.CompleteReservation(id, filled);
      if (!s.ok()) {
        STRATA_LOG_WARN("pd decode: reservation {}: {}; recomputing", id, s.message());
        (void)kv.CompleteReservation(id, 0);
      }
      std::lock_guard lock(mu_);
      stats_.blocks_received += static_cast<uint64_t>(s.ok() ? filled : 0);
    } else if (known) {
      std::lock_guard lock(mu_);
      ++stats_.untrusted;
      held_.erase(id);
    }
    auto first = std::make_shared<std::atomic<bool>>(true);
    auto sink = [this, id, use, first, reply](scheduler::RequestOutput&& ev) {
      if (observer_) observer_(ev);
      if (use && first->exchange(false)) {
        // The continuation holds its own references now (its first event
        // comes after its admission): the reservation's can go.
        post_([this, id](kvcache::KvManager& k) {
          k.ReleaseReservation(id);
          std::lock_guard lock(mu_);
          held_.erase(id);
        });
      }
      const bool finished = ev.finished;
      reply.write("data: " + RequestOutputToJson(ev) + "\n\n");
      if (finished) reply.end();
    };
    auto rid = engine_->Submit(d.request, sink);
    if (!rid.ok()) {
      if (use) kv.ReleaseReservation(id);
      {
        std::lock_guard lock(mu_);
        held_.erase(id);
      }
      return reply.reply(rid.error().code() == StatusCode::kInvalidArgument ? 400 : 503,
                         ErrorJson(rid.error().message()));
    }
    {
      std::lock_guard lock(mu_);
      ++stats_.decoded;
    }
    reply.start(200, "text/event-stream");
    reply.on_close([this, r = *rid] { engine_->Cancel(r); });
  }, abandoned);
}

int32_t PdDecode::Verified(kvcache::KvManager& kv, uint64_t id, const DecodeRequest& d) {
  const kvcache::KvManager::Reservation* r = kv.reservation(id);
  if (r == nullptr) return 0;
  const auto room = static_cast<int32_t>(r->blocks.size()) - r->held_blocks;
  const int32_t claimed = std::clamp(d.filled, 0, std::min(room, static_cast<int32_t>(d.checksums.size())));
  for (int32_t i = 0; i < claimed; ++i) {
    const uint64_t b = r->blocks[static_cast<size_t>(r->held_blocks + i)].value();
    auto bytes = kv.segments().Resolve(Region{segment_, b * block_bytes_, block_bytes_});
    if (bytes.ok() && XXH3_64bits(bytes->data(), bytes->size()) == d.checksums[static_cast<size_t>(i)]) continue;
    STRATA_LOG_WARN("pd decode: reservation {}: block {} does not match the sender's checksum: recomputing from there",
                    id, r->held_blocks + i);
    std::lock_guard lock(mu_);
    ++stats_.corrupt;
    return i;
  }
  return claimed;
}

void PdDecode::Cancel(const std::string& body, const ReplyFn& reply) {
  const auto j = nlohmann::json::parse(body, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("id") || !j["id"].is_number_unsigned())
    return reply(400, ErrorJson("cancel: 'id' is required"));
  const uint64_t id = j["id"].get<uint64_t>();
  std::optional<std::vector<uint64_t>> grants = Claim(id, /*for_decode=*/false);
  if (!grants) return reply(404, ErrorJson("no reservation " + std::to_string(id) + " awaiting its decode"));
  RevokeThen(id, std::move(*grants), [this, id](kvcache::KvManager& kv, bool quiesced) {
    if (quiesced) kv.ReleaseReservation(id);
    std::lock_guard lock(mu_);
    ++stats_.cancelled;
  });
  reply(200, "{}");
}

void PdDecode::RevokeThen(uint64_t id, std::vector<uint64_t> grants, AfterRevoke then,
                          std::function<void()> abandoned) {
  for (uint64_t g : grants) (void)xfer_->Revoke(g);  // stops new accesses at once
  CheckRevoked(id, std::move(grants), std::move(then), 0, std::move(abandoned));
}

void PdDecode::CheckRevoked(uint64_t id, std::vector<uint64_t> grants, AfterRevoke then, int tries,
                            std::function<void()> abandoned) {
  const bool posted = post_([this, id, grants, then, tries, abandoned](kvcache::KvManager& kv) mutable {
    bool all = true;
    for (uint64_t g : grants) all = all && xfer_->Quiesced(g);
    if (all && then) return then(kv, true);
    if (all) return kv.ReleaseReservation(id);  // quiesced after `then` gave up on it
    if (then && tries >= kRevokeTries) {
      STRATA_LOG_WARN("pd decode: reservation {}'s grants are not quiesced after {} ms: its blocks stay unused "
                      "until they are",
                      id, kRevokeTries * 10);
      then(kv, false);
      then = nullptr;
    }
    std::lock_guard lock(mu_);
    revoking_.push_back(Revoking{id, std::move(grants), std::move(then), tries + 1, std::move(abandoned)});
  });
  if (!posted && then && abandoned) abandoned();  // the engine stopped: no reply would come
}

void PdDecode::TimerLoop() {
  std::unique_lock lock(mu_);
  while (!stop_) {
    cv_.wait_for(lock, std::chrono::milliseconds(10));  // a revocation check per tick; leases are coarser
    if (stop_) break;
    std::vector<Revoking> again;
    again.swap(revoking_);
    std::vector<std::pair<uint64_t, std::vector<uint64_t>>> expired;
    const auto now = std::chrono::steady_clock::now();
    for (auto it = held_.begin(); it != held_.end();) {
      if (it->second.decoding || it->second.deadline > now) {
        ++it;
        continue;
      }
      expired.emplace_back(it->first, std::move(it->second.grants));
      ++stats_.expired;
      it = held_.erase(it);
    }
    lock.unlock();
    for (auto& r : again) CheckRevoked(r.id, std::move(r.grants), std::move(r.then), r.tries, std::move(r.abandoned));
    for (auto& [id, grants] : expired) {
      STRATA_LOG_INFO("pd decode: reservation {} not decoded within its lease: freed", id);
      RevokeThen(id, std::move(grants), [id](kvcache::KvManager& kv, bool quiesced) {
        if (quiesced) kv.ReleaseReservation(id);
      });
    }
    lock.lock();
  }
}

}  // namespace strata::cluster
