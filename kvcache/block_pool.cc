#include "kvcache/block_pool.h"

#include <algorithm>
#include <cassert>
#include <string>

namespace strata::kvcache {

BlockPool::BlockPool(int32_t num_blocks, std::unique_ptr<EvictionPolicy> policy)
    : ref_(static_cast<size_t>(num_blocks), 0),
      hashed_(static_cast<size_t>(num_blocks), false),
      hash_(static_cast<size_t>(num_blocks)),
      policy_(std::move(policy)) {
  if (policy_ == nullptr) policy_ = std::move(MakeEvictionPolicy("lru", num_blocks)).value();
  free_.reserve(static_cast<size_t>(num_blocks));
  // Stack: block 0 comes out first.
  for (int32_t i = num_blocks - 1; i >= 0; --i) free_.push_back(i);
  index_.reserve(static_cast<size_t>(num_blocks));
}

BlockPoolStats BlockPool::stats() const {
  BlockPoolStats s;
  s.num_blocks = num_blocks();
  s.free = static_cast<int32_t>(free_.size());
  s.cached = policy_->num_evictable();
  s.in_use = s.num_blocks - s.free - s.cached;
  s.indexed = static_cast<int32_t>(index_.size());
  s.evictions = evictions_;
  s.eviction_policy = std::string(policy_->name());
  s.policy = policy_->stats();
  return s;
}

void BlockPool::DropHash(int32_t i) {
  const size_t u = static_cast<size_t>(i);
  if (change_hook_) change_hook_(hash_[u], false);
  index_.erase(hash_[u]);
  hashed_[u] = false;
  hash_[u] = BlockHash{};
}

bool BlockPool::Allocate(int32_t n, std::vector<BlockId>* out) {
  if (n < 0 || n > num_allocatable()) return false;
  for (int32_t k = 0; k < n; ++k) {
    int32_t i;
    if (!free_.empty()) {
      i = free_.back();
      free_.pop_back();
    } else {
      i = policy_->Victim();
      assert(i >= 0);
      // Before the policy forgets it: the hook may ask keep_until().
      if (evict_hook_) evict_hook_(BlockId(static_cast<uint32_t>(i)), hash_[static_cast<size_t>(i)]);
      policy_->Erase(i, /*evicted=*/true);
      DropHash(i);
      ++evictions_;
    }
    ref_[static_cast<size_t>(i)] = 1;
    out->push_back(BlockId(static_cast<uint32_t>(i)));
  }
  return true;
}

std::optional<BlockId> BlockPool::Lookup(const BlockHash& h) const {
  auto it = index_.find(h);
  if (it == index_.end()) return std::nullopt;
  return BlockId(static_cast<uint32_t>(it->second));
}

void BlockPool::Ref(BlockId id) {
  const int32_t i = static_cast<int32_t>(id.value());
  int32_t& r = ref_[id.value()];
  if (r == 0) {
    assert(policy_->evictable(i));
    policy_->SetEvictable(i, false);
  }
  ++r;
}

void BlockPool::Release(BlockId id) {
  const int32_t i = static_cast<int32_t>(id.value());
  int32_t& r = ref_[id.value()];
  assert(r > 0);
  if (--r > 0) return;
  if (hashed_[id.value()]) {
    policy_->SetEvictable(i, true);
  } else {
    free_.push_back(i);
  }
}

bool BlockPool::Register(BlockId id, const BlockHash& h, const RegisterHints& hints) {
  assert(ref_[id.value()] > 0 && !hashed_[id.value()]);
  auto [it, inserted] = index_.emplace(h, static_cast<int32_t>(id.value()));
  if (!inserted) return false;
  hashed_[id.value()] = true;
  hash_[id.value()] = h;
  BlockTraits traits;
  traits.key = BlockHashHasher{}(h);
  traits.depth = hints.depth;
  traits.chain_blocks = hints.chain_blocks;
  traits.keep_until_nanos = hints.keep_until_nanos;
  if (hints.parent != nullptr) {
    auto p = index_.find(*hints.parent);
    if (p != index_.end()) traits.parent = p->second;
  }
  policy_->Insert(static_cast<int32_t>(id.value()), traits, /*evictable=*/false);
  if (change_hook_) change_hook_(h, true);
  return true;
}

std::vector<BlockHash> BlockPool::Hashes() const {
  std::vector<BlockHash> out;
  out.reserve(index_.size());
  for (const auto& [h, i] : index_) out.push_back(h);
  return out;
}

int32_t BlockPool::EvictAllCached() {
  int32_t n = 0;
  for (int32_t i : policy_->Order()) {
    policy_->Erase(i, /*evicted=*/false);
    DropHash(i);
    free_.push_back(i);
    ++n;
  }
  evictions_ += static_cast<uint64_t>(n);
  return n;
}

std::vector<BlockId> BlockPool::EvictionOrder() const {
  std::vector<BlockId> out;
  for (int32_t i : policy_->Order()) out.push_back(BlockId(static_cast<uint32_t>(i)));
  return out;
}

Status BlockPool::CheckConsistency() const {
  const int32_t n = num_blocks();
  std::vector<int> in_free(static_cast<size_t>(n), 0);
  for (int32_t i : free_) {
    if (i < 0 || i >= n) return Status::Internal("free list holds bad id " + std::to_string(i));
    if (++in_free[static_cast<size_t>(i)] > 1)
      return Status::Internal("block " + std::to_string(i) + " twice in the free list");
  }
  int32_t hashed = 0;
  for (int32_t i = 0; i < n; ++i) {
    const size_t u = static_cast<size_t>(i);
    const std::string b = "block " + std::to_string(i);
    if (ref_[u] < 0) return Status::Internal(b + " has a negative ref count");
    const bool free = in_free[u] > 0, cached = policy_->evictable(i);
    if (hashed_[u] != policy_->held(i)) return Status::Internal(b + ": the policy disagrees on whether it is named");
    if (free && cached) return Status::Internal(b + " is both free and cached");
    if (ref_[u] > 0 && (free || cached)) return Status::Internal(b + " is in use and listed");
    if (ref_[u] == 0 && !free && !cached) return Status::Internal(b + " is lost");
    if (free && hashed_[u]) return Status::Internal(b + " is free with a hash");
    if (cached && !hashed_[u]) return Status::Internal(b + " is cached without a hash");
    if (hashed_[u]) {
      ++hashed;
      auto it = index_.find(hash_[u]);
      if (it == index_.end() || it->second != i)
        return Status::Internal(b + "'s hash is not indexed to it");
    }
  }
  if (hashed != static_cast<int32_t>(index_.size()))
    return Status::Internal("index holds entries for no block");
  return policy_->CheckConsistency();
}

}  // namespace strata::kvcache
