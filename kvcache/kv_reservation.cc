// KvManager's reservations: device blocks another instance fills
// (kv_manager.h, "Blocks a peer fills").

#include <algorithm>
#include <string>

#include "kvcache/kv_manager.h"

namespace strata::kvcache {

Result<AllocOutcome> KvManager::Reserve(uint64_t id, std::span<const int32_t> prompt, std::string_view cache_salt,
                                        int64_t expires_nanos, Reservation* out) {
  if (prompt.empty()) return Status::InvalidArgument("kv manager: empty prompt");
  if (reservations_.contains(id))
    return Status::InvalidArgument("kv manager: reservation " + std::to_string(id) + " exists");
  std::vector<BlockHash> chain = HashPrefix(options_.ns, prompt, options_.block_size, cache_salt);
  const size_t max_blocks = static_cast<size_t>(MaxCachedBlocks(prompt.size(), chain.size()));
  chain.resize(max_blocks);
  const size_t d = CountDeviceHits(chain, max_blocks);
  std::vector<BlockId> hits;
  int32_t cached_hits = 0;  // evictable now, not once referenced
  for (size_t i = 0; i < d; ++i) {
    hits.push_back(*pool_.Lookup(chain[i]));
    if (pool_.ref(hits.back()) == 0) ++cached_hits;
  }
  const size_t need = max_blocks - d;
  if (static_cast<int64_t>(need) > pool_.num_allocatable() - cached_hits) return AllocOutcome::kNotNow;
  pool_.SetNow(clock_->NowNanos());
  for (BlockId b : hits) pool_.Ref(b);
  std::vector<BlockId> fresh;
  if (!pool_.Allocate(static_cast<int32_t>(need), &fresh)) {
    for (auto b = hits.rbegin(); b != hits.rend(); ++b) pool_.Release(*b);
    return Status::Internal("kv manager: pool allocation failed after the capacity check");
  }
  mover_->WriteBackEvicted();
  for (BlockId b : hits) pool_.Hit(b);  // a use, as a request's device hit
  Reserved rs;
  rs.r.chain = std::move(chain);
  rs.r.blocks = std::move(hits);
  rs.r.blocks.insert(rs.r.blocks.end(), fresh.begin(), fresh.end());
  rs.r.held_blocks = static_cast<int32_t>(d);
  rs.prompt_tokens = prompt.size();
  rs.expires_nanos = expires_nanos;
  *out = rs.r;
  reservations_.emplace(id, std::move(rs));
  return AllocOutcome::kAllocated;
}

Status KvManager::CompleteReservation(uint64_t id, int32_t filled) {
  auto it = reservations_.find(id);
  if (it == reservations_.end()) return Status::NotFound("kv manager: no reservation " + std::to_string(id));
  Reserved& rs = it->second;
  Reservation& r = rs.r;
  const auto total = static_cast<int32_t>(r.blocks.size());
  if (rs.completed) return Status::InvalidArgument("kv manager: reservation " + std::to_string(id) + " completed twice");
  if (filled < 0 || r.held_blocks + filled > total)
    return Status::InvalidArgument("kv manager: reservation " + std::to_string(id) + ": " + std::to_string(filled) +
                                   " blocks filled, " + std::to_string(total - r.held_blocks) + " reserved");
  const int32_t end = r.held_blocks + filled;
  for (int32_t i = r.held_blocks; i < end; ++i) {
    const auto k = static_cast<size_t>(i);
    BlockPool::RegisterHints h;
    h.depth = i;
    h.chain_blocks = static_cast<int32_t>(rs.prompt_tokens / static_cast<size_t>(options_.block_size));
    h.parent = k > 0 ? &r.chain[k - 1] : nullptr;
    if (pool_.Register(r.blocks[k], r.chain[k], h)) {
      mover_->OnCommitted(r.blocks[k], r.chain[k]);
    } else if (auto named = pool_.Lookup(r.chain[k])) {
      pool_.Hit(*named);  // computed meanwhile here too: a use of that copy (as Commit)
    }
  }
  for (auto k = r.blocks.size(); k > static_cast<size_t>(end); --k) pool_.Release(r.blocks[k - 1]);
  r.blocks.resize(static_cast<size_t>(end));
  r.chain.resize(static_cast<size_t>(end));
  rs.completed = true;
  return Status::Ok();
}

void KvManager::ReleaseReservation(uint64_t id) {
  auto it = reservations_.find(id);
  if (it == reservations_.end()) return;
  const auto& blocks = it->second.r.blocks;
  for (auto b = blocks.rbegin(); b != blocks.rend(); ++b) pool_.Release(*b);  // tail first, as Free
  reservations_.erase(it);
}

size_t KvManager::ExpireReservations() {
  const int64_t now = clock_->NowNanos();
  std::vector<uint64_t> lapsed;
  for (const auto& [id, rs] : reservations_)
    if (rs.expires_nanos <= now) lapsed.push_back(id);
  for (uint64_t id : lapsed) ReleaseReservation(id);
  return lapsed.size();
}

}  // namespace strata::kvcache
