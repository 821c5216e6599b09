#include "bench/sim_store.h"

#include <algorithm>
#include <climits>
#include <cmath>

namespace strata::bench {

Result<std::unique_ptr<SimStore>> SimStore::Create(const SimStoreOptions& options, kvcache::Clock* clock) {
  const uint64_t blocks = options.block_bytes == 0 ? 0 : options.capacity_bytes / options.block_bytes;
  if (blocks > kMaxBlocks)
    return Status::InvalidArgument("simulated tier '" + options.name + "' holds " + std::to_string(blocks) +
                                   " blocks, more than the simulator's " + std::to_string(kMaxBlocks));
  auto policy = kvcache::MakeEvictionPolicy(options.eviction_policy, static_cast<int32_t>(blocks));
  if (!policy.ok()) return policy.error().WithContext("simulated tier '" + options.name + "'");
  return std::unique_ptr<SimStore>(new SimStore(options, clock, std::move(policy).value()));
}

SimStore::SimStore(const SimStoreOptions& options, kvcache::Clock* clock,
                   std::unique_ptr<kvcache::EvictionPolicy> policy)
    : options_(options),
      clock_(clock),
      max_blocks_(options.block_bytes == 0 ? 0 : options.capacity_bytes / options.block_bytes),
      policy_(std::move(policy)) {}

kvcache::StoreStats SimStore::stats() const {
  kvcache::StoreStats s;
  s.capacity_bytes = max_blocks_ * options_.block_bytes;
  s.blocks = index_.size();
  s.used_bytes = s.blocks * options_.block_bytes;
  s.evictions = evictions_;
  s.write_errors = write_errors_;
  if (!remote()) {
    s.eviction_policy = std::string(policy_->name());
    s.policy = policy_->stats();
  }
  return s;
}

bool SimStore::Contains(const BlockHash& h) const {
  if (remote()) {
    for (const SimStore* p : peers_)
      if (p->Contains(h)) return true;
    return false;
  }
  return index_.count(h) != 0;
}

size_t SimStore::CountPrefix(std::span<const BlockHash> chain) const {
  if (remote()) {
    size_t best = 0;
    for (const SimStore* p : peers_) best = std::max(best, p->CountPrefix(chain));
    return best;
  }
  size_t n = 0;
  while (n < chain.size() && index_.count(chain[n]) != 0) ++n;
  return n;
}

int64_t SimStore::Schedule(int64_t* channel_free, double bytes_per_s) {
  const int64_t now = clock_->NowNanos();
  if (bytes_per_s <= 0) return now;
  const int64_t start = std::max(now, *channel_free);
  const double secs = static_cast<double>(options_.block_bytes) / bytes_per_s;
  const int64_t done = start + static_cast<int64_t>(std::ceil(secs * 1e9));
  *channel_free = done;
  return done;
}

Status SimStore::ReplaceEvictionPolicy(const PolicyFactory& make) {
  if (!index_.empty() || !pending_.empty())
    return Status::Unsupported("simulated tier '" + options_.name + "': its eviction policy can be replaced only while it is empty");
  auto p = make(static_cast<int32_t>(max_blocks_), policy_->name());
  if (!p.ok()) return p.error();
  policy_ = std::move(p).value();
  return Status::Ok();
}

Status SimStore::SubmitWrite(const BlockHash& h, const Sha256Digest& /*ns*/, const Region& /*src*/,
                             uint64_t tag) {
  if (remote()) return Status::InvalidArgument("tier '" + options_.name + "' is read-only (the cluster pool)");
  const int64_t now = clock_->NowNanos();
  if (max_blocks_ == 0) {
    ++write_errors_;
    pending_.push({now, next_seq_++, tag, true, h, Status::ResourceExhausted("tier '" + options_.name + "' is off")});
    return Status::Ok();
  }
  if (index_.count(h) != 0) {
    pending_.push({now, next_seq_++, tag, true, h, Status::Ok()});
    return Status::Ok();
  }
  pending_.push({Schedule(&write_free_nanos_, options_.write_bytes_per_s), next_seq_++, tag, true, h, Status::Ok()});
  return Status::Ok();
}

Status SimStore::SubmitRead(const BlockHash& h, const Region& /*dst*/, uint64_t tag) {
  if (remote()) {
    SimStore* holder = nullptr;
    for (SimStore* p : peers_)
      if (holder == nullptr && p->Contains(h)) holder = p;
    if (holder == nullptr) {
      pending_.push({clock_->NowNanos(), next_seq_++, tag, false, h, Status::NotFound("no peer holds the block")});
      return Status::Ok();
    }
    holder->Touch(h);
    ++remote_reads_;
    const int64_t done = Schedule(&read_free_nanos_, options_.read_bytes_per_s) +
                         static_cast<int64_t>(std::llround(options_.latency_s * 1e9));
    pending_.push({done, next_seq_++, tag, false, h, Status::Ok()});
    return Status::Ok();
  }
  if (index_.count(h) == 0) {
    pending_.push({clock_->NowNanos(), next_seq_++, tag, false, h, Status::NotFound("block not in tier '" + options_.name + "'")});
    return Status::Ok();
  }
  Touch(h);
  pending_.push({Schedule(&read_free_nanos_, options_.read_bytes_per_s), next_seq_++, tag, false, h, Status::Ok()});
  return Status::Ok();
}

void SimStore::Insert(const BlockHash& h) {
  int64_t keep = 0;
  if (auto k = keep_pending_.find(h); k != keep_pending_.end()) {
    keep = k->second;
    keep_pending_.erase(k);
  }
  if (auto it = index_.find(h); it != index_.end()) {
    policy_->Access(it->second);
    if (keep > 0) policy_->KeepUntil(it->second, keep);
    return;
  }
  kvcache::BlockTraits traits;
  traits.key = kvcache::BlockHashHasher{}(h);
  traits.keep_until_nanos = keep;
  policy_->SetNow(clock_->NowNanos());
  if (!policy_->Admit(traits)) return;
  int32_t slot;
  if (!free_slots_.empty()) {
    slot = free_slots_.back();
    free_slots_.pop_back();
  } else if (slot_hash_.size() < max_blocks_) {
    slot = static_cast<int32_t>(slot_hash_.size());
    slot_hash_.emplace_back();
  } else {
    slot = policy_->Victim();  // SetNow above
    if (slot < 0) return;  // nothing evictable (a simulated store pins nothing; unreachable)
    if (eviction_listener_) eviction_listener_(slot_hash_[static_cast<size_t>(slot)], Region{});
    policy_->Erase(slot, /*evicted=*/true);
    index_.erase(slot_hash_[static_cast<size_t>(slot)]);
    ++evictions_;
  }
  slot_hash_[static_cast<size_t>(slot)] = h;
  index_.emplace(h, slot);
  policy_->Insert(slot, traits, /*evictable=*/true);
}

void SimStore::KeepFor(const BlockHash& h, int64_t nanos) {
  const int64_t until_nanos = clock_->NowNanos() + nanos;
  if (remote()) return;
  if (auto it = index_.find(h); it != index_.end()) {
    policy_->KeepUntil(it->second, until_nanos);
    return;
  }
  if (keep_pending_.size() > max_blocks_ + 1024) keep_pending_.clear();  // asks for writes that never landed
  int64_t& k = keep_pending_[h];
  k = std::max(k, until_nanos);
}

void SimStore::Touch(const BlockHash& h) {
  auto it = index_.find(h);
  if (it == index_.end()) return;
  policy_->Access(it->second);
}

size_t SimStore::Poll(std::vector<kvcache::StoreCompletion>* out) {
  const int64_t now = clock_->NowNanos();
  size_t n = 0;
  while (!pending_.empty() && pending_.top().done_nanos <= now) {
    Pending p = pending_.top();
    pending_.pop();
    if (p.is_write && p.status.ok()) Insert(p.hash);
    out->push_back({p.tag, std::move(p.status)});
    ++n;
  }
  return n;
}

void SimStore::Drain(std::vector<kvcache::StoreCompletion>* out) {
  while (!pending_.empty()) {
    Pending p = pending_.top();
    pending_.pop();
    if (p.is_write && p.status.ok()) Insert(p.hash);
    out->push_back({p.tag, std::move(p.status)});
  }
}

Status SimStore::Remove(const BlockHash& h) {
  auto it = index_.find(h);
  if (it == index_.end()) return Status::NotFound("block not in tier '" + options_.name + "'");
  policy_->Erase(it->second, /*evicted=*/false);
  free_slots_.push_back(it->second);
  index_.erase(it);
  return Status::Ok();
}

Status SimStore::Flush(const Sha256Digest* /*ns*/) {
  // One model per simulated instance: every block is of its namespace.
  for (const auto& [h, slot] : index_) {
    policy_->Erase(slot, /*evicted=*/false);
    free_slots_.push_back(slot);
  }
  index_.clear();
  return Status::Ok();
}

int64_t SimStore::next_completion_nanos() const { return pending_.empty() ? INT64_MAX : pending_.top().done_nanos; }

int64_t SimStore::last_completion_nanos() const {
  if (pending_.empty()) return INT64_MAX;
  const int64_t latency = static_cast<int64_t>(std::llround(options_.latency_s * 1e9));
  return std::max({clock_->NowNanos(), write_free_nanos_, read_free_nanos_ + latency});
}

}  // namespace strata::bench
