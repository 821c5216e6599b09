#include "kvcache/cluster_index.h"

#include <algorithm>

namespace strata::kvcache {

void ClusterKvIndex::Set(const std::string& name, Instance& in, const BlockHash& h, TierMask mask) {
  if (mask == 0) {
    in.blocks.erase(h);
    auto it = holders_.find(h);
    if (it != holders_.end()) {
      it->second.erase(name);
      if (it->second.empty()) holders_.erase(it);
    }
  } else {
    in.blocks[h] = mask;
    holders_[h][name] = mask;
  }
}

void ClusterKvIndex::Clear(const std::string& name, Instance& in) {
  for (const auto& [h, mask] : in.blocks) {
    auto it = holders_.find(h);
    if (it != holders_.end()) {
      it->second.erase(name);
      if (it->second.empty()) holders_.erase(it);
    }
  }
  in.blocks.clear();
}

void ClusterKvIndex::ApplyEvents(const std::string& name, Instance& in, const KvEventBatch& b, uint64_t from_seq) {
  for (size_t i = static_cast<size_t>(from_seq - b.seq_first); i < b.events.size(); ++i) {
    const KvEvent& e = b.events[i];
    auto it = in.blocks.find(e.hash);
    TierMask mask = it == in.blocks.end() ? 0 : it->second;
    mask = e.kind == KvEvent::Kind::kStored ? (mask | MaskOf(e.tier)) : (mask & ~MaskOf(e.tier));
    Set(name, in, e.hash, mask);
  }
  in.applied = b.seq_first + b.events.size() - 1;
}

void ClusterKvIndex::DrainPending(const std::string& name, Instance& in) {
  while (!in.pending.empty()) {
    auto it = in.pending.begin();
    const KvEventBatch& b = it->second;
    uint64_t last = b.seq_first + b.events.size() - 1;
    if (last <= in.applied) {  // wholly old
      in.pending.erase(it);
      continue;
    }
    if (b.seq_first > in.applied + 1) return;  // still a gap
    ApplyEvents(name, in, b, in.applied + 1);
    in.pending.erase(it);
  }
}

int ClusterKvIndex::Compare(const Instance& in, bool fresh, uint64_t epoch, const std::string& incarnation) {
  if (fresh) return 1;
  if (epoch != in.epoch) return epoch < in.epoch ? -1 : 1;
  if (incarnation != in.incarnation) return incarnation < in.incarnation ? -1 : 1;
  return in.removed ? -1 : 0;  // the removed incarnation itself is stale
}

void ClusterKvIndex::Reincarnate(const std::string& name, Instance& in, uint64_t epoch,
                                 const std::string& incarnation) {
  // A new process under this name: nothing the old one published holds.
  Clear(name, in);
  in.pending.clear();
  in.incarnation = incarnation;
  in.epoch = epoch;
  in.removed = false;
  in.applied = 0;
  in.needs_snapshot = false;
}

void ClusterKvIndex::AddPending(Instance& in, const KvEventBatch& b) {
  uint64_t last = b.seq_first + b.events.size() - 1;
  auto it = in.pending.find(b.seq_first);
  if (it != in.pending.end()) {
    // A re-sent batch: keep the longer one.
    if (it->second.seq_first + it->second.events.size() - 1 < last) it->second = b;
    return;
  }
  in.pending.emplace(b.seq_first, b);
  // Bounded: keep the newest (a snapshot will cover the oldest).
  while (in.pending.size() > kMaxPending) in.pending.erase(in.pending.begin());
}

ClusterKvIndex::ApplyResult ClusterKvIndex::Apply(const KvEventBatch& b) {
  if (b.events.empty() || b.seq_first == 0) return ApplyResult::kDuplicate;
  std::lock_guard lock(mu_);
  auto [it, fresh] = instances_.try_emplace(b.instance);
  Instance& in = it->second;
  int order = Compare(in, fresh, b.epoch, b.incarnation);
  if (order < 0) return ApplyResult::kStale;
  // Its earlier batches may still come (reordering) or may have gone by
  // (a subscriber that joined late): the gap rules below decide, and the
  // subscriber asks for a snapshot when a gap lasts.
  if (order > 0) Reincarnate(b.instance, in, b.epoch, b.incarnation);
  uint64_t last = b.seq_first + b.events.size() - 1;
  if (in.needs_snapshot) {
    if (last > in.applied) AddPending(in, b);
    return ApplyResult::kNeedSnapshot;
  }
  if (last <= in.applied) return ApplyResult::kDuplicate;
  if (b.seq_first > in.applied + 1) {
    if (in.pending.size() >= kMaxPending) {
      // Too far behind: the snapshot will cover what waits; keep only newer.
      in.pending.clear();
      in.needs_snapshot = true;
      AddPending(in, b);
      return ApplyResult::kNeedSnapshot;
    }
    AddPending(in, b);
    return ApplyResult::kWaiting;
  }
  ApplyEvents(b.instance, in, b, in.applied + 1);
  DrainPending(b.instance, in);
  return ApplyResult::kApplied;
}

bool ClusterKvIndex::ApplySnapshot(const KvSnapshot& s) {
  std::lock_guard lock(mu_);
  auto [it, fresh] = instances_.try_emplace(s.instance);
  Instance& in = it->second;
  int order = Compare(in, fresh, s.epoch, s.incarnation);
  if (order < 0) return false;
  if (order == 0 && s.seq < in.applied) return false;  // older than what is applied
  if (order > 0) Reincarnate(s.instance, in, s.epoch, s.incarnation);
  Clear(s.instance, in);
  for (const auto& [h, tier] : s.blocks) {
    auto b = in.blocks.find(h);
    Set(s.instance, in, h, static_cast<TierMask>((b == in.blocks.end() ? 0 : b->second) | MaskOf(tier)));
  }
  in.applied = s.seq;
  in.needs_snapshot = false;
  DrainPending(s.instance, in);
  return true;
}

void ClusterKvIndex::RemoveInstance(const std::string& instance) {
  std::lock_guard lock(mu_);
  auto it = instances_.find(instance);
  if (it == instances_.end()) return;
  Clear(instance, it->second);
  it->second.pending.clear();
  it->second.removed = true;  // a tombstone: its incarnation's late traffic is stale
  it->second.needs_snapshot = false;
}

void ClusterKvIndex::Readmit(const std::string& instance, const std::string& incarnation) {
  std::lock_guard lock(mu_);
  auto it = instances_.find(instance);
  if (it == instances_.end() || !it->second.removed || it->second.incarnation != incarnation) return;
  it->second.removed = false;
  it->second.applied = 0;
  it->second.needs_snapshot = true;
}

std::vector<PrefixHolder> ClusterKvIndex::LongestPrefix(std::span<const BlockHash> chain) const {
  std::lock_guard lock(mu_);
  std::vector<PrefixHolder> out;
  if (chain.empty()) return out;
  auto first = holders_.find(chain[0]);
  if (first == holders_.end()) return out;
  std::map<std::string, PrefixHolder> alive;
  for (const auto& [name, mask] : first->second) alive[name] = PrefixHolder{name, 1, {mask}};
  for (size_t i = 1; i < chain.size() && !alive.empty(); ++i) {
    auto h = holders_.find(chain[i]);
    for (auto it = alive.begin(); it != alive.end();) {
      TierMask mask = 0;
      if (h != holders_.end()) {
        auto f = h->second.find(it->first);
        if (f != h->second.end()) mask = f->second;
      }
      if (mask == 0) {
        out.push_back(std::move(it->second));
        it = alive.erase(it);
      } else {
        it->second.blocks++;
        it->second.tiers.push_back(mask);
        ++it;
      }
    }
  }
  for (auto& [name, holder] : alive) out.push_back(std::move(holder));
  std::sort(out.begin(), out.end(), [](const PrefixHolder& a, const PrefixHolder& b) {
    return a.blocks != b.blocks ? a.blocks > b.blocks : a.instance < b.instance;
  });
  return out;
}

TierMask ClusterKvIndex::Holds(const std::string& instance, const BlockHash& hash) const {
  std::lock_guard lock(mu_);
  auto it = instances_.find(instance);
  if (it == instances_.end()) return 0;
  auto b = it->second.blocks.find(hash);
  return b == it->second.blocks.end() ? 0 : b->second;
}

std::map<std::string, ClusterKvIndex::InstanceStatus> ClusterKvIndex::status() const {
  std::lock_guard lock(mu_);
  std::map<std::string, InstanceStatus> out;
  for (const auto& [name, in] : instances_) {
    if (in.removed) continue;
    out[name] = InstanceStatus{in.incarnation, in.applied, in.blocks.size(), in.pending.size(), in.needs_snapshot};
  }
  return out;
}

}  // namespace strata::kvcache
