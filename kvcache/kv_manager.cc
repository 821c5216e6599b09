#include "kvcache/kv_manager.h"

#include <algorithm>
#include <cstring>
#include <new>
#include <string>

#include "common/logging.h"

namespace strata::kvcache {

namespace {
constexpr size_t kStagingAlign = 4096;  // O_DIRECT
}  // namespace

void KvManager::AlignedFree::operator()(uint8_t* p) const {
  ::operator delete[](p, std::align_val_t(kStagingAlign));
}

Result<std::unique_ptr<KvManager>> KvManager::Create(const KvManagerOptions& options,
                                                     BlockMemoryFn device_memory,
                                                     BlockStore* lower, Clock* clock) {
  std::vector<LowerTier> lowers;
  if (lower != nullptr)
    lowers.push_back(LowerTier{.store = lower,
                               .write_policy = options.write_policy,
                               .admit_after = 0,
                               .read_bytes_per_s = options.lower_read_bytes_per_s});
  return Create(options, std::move(device_memory), std::move(lowers), clock);
}

Result<std::unique_ptr<KvManager>> KvManager::Create(const KvManagerOptions& options,
                                                     BlockMemoryFn device_memory,
                                                     std::vector<LowerTier> lowers, Clock* clock) {
  for (auto& t : lowers) {
    if (t.store == nullptr) return Status::InvalidArgument("kv manager: a lower tier's store is null");
    if (t.name.empty()) t.name = std::string(t.store->name());
  }
  if (options.block_size <= 0) return Status::InvalidArgument("kv manager: block_size must be > 0");
  if (options.num_device_blocks < 0)
    return Status::InvalidArgument("kv manager: num_device_blocks must be >= 0");
  if (device_memory && options.block_bytes == 0)
    return Status::InvalidArgument("kv manager: block_bytes must be > 0 with device memory");
  if (clock == nullptr) return Status::InvalidArgument("kv manager: clock is null");
  std::unique_ptr<KvManager> m(new KvManager(options, std::move(device_memory), std::move(lowers), clock));
  STRATA_RETURN_IF_ERROR(m->RegisterSegments());
  return m;
}

Status KvManager::RegisterSegments() {
  const uint64_t bb = options_.block_bytes;
  const auto n = static_cast<uint32_t>(options_.num_device_blocks);
  if (memory_ && n > 0) {
    uint8_t* base = memory_(BlockId(0));
    if (memory_(BlockId(n - 1)) != base + static_cast<size_t>(n - 1) * bb)
      return Status::InvalidArgument("kv manager: device blocks must form one contiguous range");
    STRATA_ASSIGN_OR_RETURN(device_segment_,
                            segments_.Register(options_.device_memory_kind, base, n * bb, "device KV pool"));
  }
  for (const auto& t : lowers_) {
    const BlockStore::Memory mem = t.store->memory();
    if (!mem.bytes.empty())
      STRATA_RETURN_IF_ERROR(
          segments_.Register(mem.kind, mem.bytes.data(), mem.bytes.size(), "tier " + t.name).status());
  }
  return Status::Ok();
}

KvManager::KvManager(const KvManagerOptions& options, BlockMemoryFn device_memory,
                     std::vector<LowerTier> lowers, Clock* clock)
    : options_(options),
      memory_(std::move(device_memory)),
      copy_(std::make_unique<CpuCopyEngine>(&segments_)),
      lowers_(std::move(lowers)),
      clock_(clock),
      pool_(options.num_device_blocks),
      writes_in_flight_(lowers_.size()) {
  for (const auto& t : lowers_) {
    LowerTierStats ts;
    ts.name = t.name;
    ts.kind = t.store->kind();
    stats_.tiers.push_back(std::move(ts));
    if (t.write_policy == WritePolicy::kWriteBack) any_writeback_ = true;
  }
  if (any_writeback_) {
    const uint64_t bb = std::max<uint64_t>(options_.block_bytes, 1);
    max_staging_ = std::max<uint64_t>(1, options_.writeback_staging_bytes / bb);
    pool_.set_evict_hook([this](BlockId b, const BlockHash& h) { evicted_.emplace_back(b, h); });
    // A tier above a write-back tier passes its own evictions down.
    for (size_t i = 0; i + 1 < lowers_.size(); ++i) {
      bool below = false;
      for (size_t j = i + 1; j < lowers_.size(); ++j) below = below || lowers_[j].write_policy == WritePolicy::kWriteBack;
      if (below)
        lowers_[i].store->SetEvictionListener(
            [this, i](const BlockHash& h, std::span<const uint8_t> data) { OnLowerEvicted(i, h, data); });
    }
  }
}

KvManager::~KvManager() {
  for (const auto& t : lowers_) t.store->SetEvictionListener(nullptr);
  for (const auto& t : lowers_) {
    if (ops_.empty()) return;
    std::vector<StoreCompletion> done;
    t.store->Drain(&done);
    for (const auto& c : done) Complete(c);  // op tags are unique across tiers
  }
}

std::span<uint8_t> KvManager::BlockSpan(BlockId id) const {
  if (!memory_) return {};
  return {memory_(id), static_cast<size_t>(options_.block_bytes)};
}

int32_t KvManager::MaxCachedBlocks(size_t prompt_tokens, size_t chain_blocks) const {
  // The last prompt token is always computed: at most prompt_tokens - 1 from cache.
  const size_t cap = prompt_tokens == 0 ? 0 : (prompt_tokens - 1) / static_cast<size_t>(options_.block_size);
  return static_cast<int32_t>(std::min(cap, chain_blocks));
}

size_t KvManager::CountDeviceHits(std::span<const BlockHash> chain, size_t max_blocks) const {
  size_t d = 0;
  while (d < max_blocks && pool_.Lookup(chain[d]).has_value()) ++d;
  return d;
}

bool KvManager::WorthLoading(const LowerTier& t, size_t blocks) const {
  if (options_.load_policy == LoadPolicy::kAlways) return true;
  // kAuto: load only when moving the bytes beats recomputing the tokens.
  if (t.read_bytes_per_s <= 0 || options_.recompute_tokens_per_s <= 0) return true;
  const double load_s = static_cast<double>(blocks * options_.block_bytes) / t.read_bytes_per_s;
  const double compute_s =
      static_cast<double>(blocks * static_cast<size_t>(options_.block_size)) / options_.recompute_tokens_per_s;
  return load_s < compute_s;
}

std::vector<int> KvManager::CountLowerHits(std::span<const BlockHash> chain, size_t from,
                                           size_t max_blocks) const {
  std::vector<int> src;
  if (options_.load_policy == LoadPolicy::kNever) return src;
  size_t pos = from;
  bool advanced = true;
  while (pos < max_blocks && advanced) {
    advanced = false;
    for (size_t t = 0; t < lowers_.size(); ++t) {
      const size_t h = lowers_[t].store->CountPrefix(chain.subspan(pos, max_blocks - pos));
      if (h == 0) continue;
      if (!WorthLoading(lowers_[t], h)) return src;  // recompute from here on
      src.insert(src.end(), h, static_cast<int>(t));
      pos += h;
      advanced = true;
      break;  // the next block: ask from the top tier again
    }
  }
  return src;
}

PrefixMatch KvManager::Match(std::span<const int32_t> prompt, std::string_view cache_salt) const {
  const auto chain = HashPrefix(options_.ns, prompt, options_.block_size, cache_salt);
  const size_t max_blocks = static_cast<size_t>(MaxCachedBlocks(prompt.size(), chain.size()));
  const size_t d = CountDeviceHits(chain, max_blocks);
  const auto src = CountLowerHits(chain, d, max_blocks);
  PrefixMatch m;
  m.device_tokens = static_cast<int32_t>(d) * options_.block_size;
  m.lower_tokens = static_cast<int32_t>(src.size()) * options_.block_size;
  m.lower_tier_tokens.assign(lowers_.size(), 0);
  for (int t : src) m.lower_tier_tokens[static_cast<size_t>(t)] += options_.block_size;
  return m;
}

Status KvManager::AddRequest(RequestId id, std::span<const int32_t> prompt,
                             std::string_view cache_salt) {
  if (prompt.empty()) return Status::InvalidArgument("kv manager: empty prompt");
  if (requests_.contains(id))
    return Status::InvalidArgument("kv manager: request " + std::to_string(id.value()) +
                                   " is already tracked");
  Request r;
  r.prompt.assign(prompt.begin(), prompt.end());
  r.salt.assign(cache_salt);
  r.chain = HashPrefix(options_.ns, prompt, options_.block_size, cache_salt);
  r.epoch = next_epoch_++;
  requests_.emplace(id, std::move(r));
  return Status::Ok();
}

Result<AllocOutcome> KvManager::Allocate(RequestId id, int32_t num_tokens) {
  auto it = requests_.find(id);
  if (it == requests_.end())
    return Status::NotFound("kv manager: unknown request " + std::to_string(id.value()));
  if (num_tokens < 0) return Status::InvalidArgument("kv manager: negative token count");
  Request& r = it->second;
  if (!r.prefix_taken) return TakePrefix(id, r, num_tokens);
  const size_t bs = static_cast<size_t>(options_.block_size);
  const size_t need = (static_cast<size_t>(num_tokens) + bs - 1) / bs;
  if (need <= r.table.size()) return AllocOutcome::kAllocated;
  std::vector<BlockId> got;
  if (!pool_.Allocate(static_cast<int32_t>(need - r.table.size()), &got)) return AllocOutcome::kNotNow;
  WriteBackEvicted();
  for (BlockId b : got) r.table.push_back(static_cast<int32_t>(b.value()));
  return AllocOutcome::kAllocated;
}

Result<AllocOutcome> KvManager::TakePrefix(RequestId id, Request& r, int32_t num_tokens) {
  const size_t bs = static_cast<size_t>(options_.block_size);
  const size_t max_blocks = static_cast<size_t>(MaxCachedBlocks(r.prompt.size(), r.chain.size()));
  const size_t d = CountDeviceHits(r.chain, max_blocks);
  const auto src = CountLowerHits(r.chain, d, max_blocks);
  const size_t h = src.size();
  const size_t need = std::max((static_cast<size_t>(num_tokens) + bs - 1) / bs, d + h);

  // Device hits that sit in the LRU stop being allocatable once referenced.
  std::vector<BlockId> hits;
  int32_t cached_hits = 0;
  for (size_t i = 0; i < d; ++i) {
    hits.push_back(*pool_.Lookup(r.chain[i]));
    if (pool_.ref(hits.back()) == 0) ++cached_hits;
  }
  if (static_cast<int64_t>(need - d) > pool_.num_allocatable() - cached_hits) return AllocOutcome::kNotNow;
  for (BlockId b : hits) pool_.Ref(b);
  std::vector<BlockId> fresh;
  if (!pool_.Allocate(static_cast<int32_t>(need - d), &fresh)) {
    // Unreachable by the check above; undo to keep "nothing changed".
    for (auto b = hits.rbegin(); b != hits.rend(); ++b) pool_.Release(*b);
    return Status::Internal("kv manager: pool allocation failed after the capacity check");
  }
  WriteBackEvicted();  // before the loads below overwrite evicted blocks
  r.table.clear();
  for (BlockId b : hits) r.table.push_back(static_cast<int32_t>(b.value()));
  for (BlockId b : fresh) r.table.push_back(static_cast<int32_t>(b.value()));

  r.prefix_taken = true;
  r.device_hit_blocks = static_cast<int32_t>(d);
  r.cached_blocks = static_cast<int32_t>(d + h);
  r.committed_blocks = static_cast<int32_t>(d);
  r.load_ok_until = static_cast<int32_t>(d + h);
  r.block_tier.assign(d, kDeviceTier);
  for (int t : src) r.block_tier.push_back(t + 1);
  ++stats_.queries;
  stats_.query_tokens += r.prompt.size();
  stats_.device.blocks += d;
  stats_.device.tokens += d * bs;
  for (size_t i = 0; i < d; ++i) OnHit(hits[i], r.chain[i], -1);
  for (size_t i = d; i < d + h; ++i) SubmitLoad(id, r, static_cast<int32_t>(i), src[i - d]);
  if (r.loads_pending == 0) FinishLoads(r);
  return AllocOutcome::kAllocated;
}

void KvManager::SubmitLoad(RequestId id, Request& r, int32_t index, int tier) {
  const BlockId block(static_cast<uint32_t>(r.table[static_cast<size_t>(index)]));
  const uint64_t tag = next_tag_++;
  // The op holds its own reference: the block is not reused while the store
  // may still write into it, even if the request is freed meanwhile.
  pool_.Ref(block);
  Op op{OpKind::kLoad, tier, id, index, block, r.chain[static_cast<size_t>(index)], clock_->NowNanos()};
  op.request_epoch = r.epoch;
  ops_.emplace(tag, op);
  ++r.loads_pending;
  BlockStore* store = lowers_[static_cast<size_t>(tier)].store;
  Status s = store->SubmitRead(r.chain[static_cast<size_t>(index)], BlockSpan(block), tag);
  if (!s.ok()) {
    ops_.erase(tag);
    pool_.Release(block);
    --r.loads_pending;
    ++stats_.loads_failed;
    ++stats_.tiers[static_cast<size_t>(tier)].loads_failed;
    r.load_ok_until = std::min(r.load_ok_until, index);
    STRATA_LOG_WARN("kv manager: load from {} not submitted: {}", store->name(), s.ToString());
  }
}

void KvManager::FinishLoads(Request& r) {
  // Loaded blocks are named only now, and only the contiguous good prefix:
  // anything after a failed load is recomputed into these same blocks.
  for (int32_t i = r.device_hit_blocks; i < r.load_ok_until; ++i) {
    const size_t k = static_cast<size_t>(i);
    const BlockId b(static_cast<uint32_t>(r.table[k]));
    (void)pool_.Register(b, r.chain[k]);  // a duplicate stays private
    const int source = r.block_tier[k] - 1;
    stats_.tiers[static_cast<size_t>(source)].hits.blocks += 1;
    stats_.tiers[static_cast<size_t>(source)].hits.tokens += static_cast<uint64_t>(options_.block_size);
    OnHit(b, r.chain[k], source);
  }
  r.cached_blocks = r.load_ok_until;
  r.committed_blocks = r.load_ok_until;
  r.block_tier.resize(static_cast<size_t>(r.cached_blocks));
}

void KvManager::OnCommitted(BlockId block, const BlockHash& h) {
  for (size_t t = 0; t < lowers_.size(); ++t) {
    if (lowers_[t].write_policy != WritePolicy::kWriteThrough) continue;
    if (lowers_[t].admit_after == 0) {
      SubmitWrite(static_cast<int>(t), block, h);
    } else {
      ++stats_.tiers[t].admissions_deferred;
    }
  }
}

void KvManager::OnHit(BlockId block, const BlockHash& h, int source) {
  if (lowers_.empty()) return;
  uint32_t hits = 0;
  bool counting = false;
  for (const auto& t : lowers_) counting = counting || t.admit_after > 0;
  if (counting) {
    if (hit_counts_.size() >= kMaxHitCounts && !hit_counts_.contains(h)) hit_counts_.clear();
    hits = ++hit_counts_[h];
  }
  for (size_t t = 0; t < lowers_.size(); ++t) {
    const LowerTier& tier = lowers_[t];
    if (tier.write_policy != WritePolicy::kWriteThrough || static_cast<int>(t) == source) continue;
    // Above the source: promote (write-through keeps the chain inclusive).
    // Below it (or a device hit): admit once the block was hit often enough.
    const bool promote = source >= 0 && static_cast<int>(t) < source;
    if (promote || (tier.admit_after > 0 && hits >= tier.admit_after)) SubmitWrite(static_cast<int>(t), block, h);
  }
}

int32_t KvManager::AcquireStaging(bool may_poll) {
  if (free_staging_.empty() && staging_.size() < max_staging_) {
    auto* p = static_cast<uint8_t*>(
        ::operator new[](static_cast<size_t>(options_.block_bytes), std::align_val_t(kStagingAlign)));
    auto seg = segments_.Register(SegmentKind::kHost, p, options_.block_bytes,
                                  "staging " + std::to_string(staging_.size()));
    if (!seg) {  // cannot happen for fresh memory; without a segment the buffer is useless
      ::operator delete[](p, std::align_val_t(kStagingAlign));
      STRATA_LOG_WARN("kv manager: staging buffer not registered: {}", seg.error().ToString());
      return -1;
    }
    staging_.emplace_back(p);
    staging_segments_.push_back(*seg);
    staging_refs_.push_back(0);
    free_staging_.push_back(static_cast<int32_t>(staging_.size() - 1));
  }
  if (free_staging_.empty() && may_poll) PollStores();  // finished write-backs free theirs; never blocks
  if (free_staging_.empty()) return -1;
  const int32_t i = free_staging_.back();
  free_staging_.pop_back();
  return i;
}

void KvManager::ReleaseStaging(int32_t staging) {
  if (staging < 0) return;
  if (--staging_refs_[static_cast<size_t>(staging)] == 0) free_staging_.push_back(staging);
}

bool KvManager::AdmitsWriteBack(size_t t, const BlockHash& h) {
  const LowerTier& tier = lowers_[t];
  if (tier.write_policy != WritePolicy::kWriteBack) return false;
  if (writes_in_flight_[t].contains(h) || tier.store->Contains(h)) return false;
  if (tier.admit_after > 0) {
    auto hc = hit_counts_.find(h);
    if (hc == hit_counts_.end() || hc->second < tier.admit_after) {
      ++stats_.tiers[t].admissions_deferred;
      return false;
    }
  }
  return true;
}

bool KvManager::StageOnce(size_t t, int32_t* staging, const Region& src, bool may_poll) {
  if (*staging >= 0) return true;
  *staging = AcquireStaging(may_poll);
  if (*staging < 0) {
    ++stats_.tiers[t].writebacks_dropped;
    return false;
  }
  const Region dst{staging_segments_[static_cast<size_t>(*staging)], 0, src.length};
  if (Status s = copy_->Submit(dst, src, 0); !s.ok()) {
    STRATA_LOG_WARN("kv manager: write-back staging copy refused: {}", s.ToString());
    free_staging_.push_back(*staging);
    *staging = -1;
    ++stats_.tiers[t].writebacks_dropped;
    return false;
  }
  // The caller reuses the source right after (Allocate hands the evicted
  // block out again; the evicting store overwrites its slot): the copy must
  // have landed.
  copy_->Wait(copy_->Fence());
  copy_done_.clear();
  copy_->Poll(&copy_done_);
  return true;
}

void KvManager::FreeIfUnused(int32_t staging) {
  if (staging >= 0 && staging_refs_[static_cast<size_t>(staging)] == 0) free_staging_.push_back(staging);
}

void KvManager::WriteBackEvicted() {
  if (evicted_.empty()) return;
  // Moved out first: PollStores below may complete loads whose promotions
  // allocate nothing, but keep this loop independent of evicted_ anyway.
  std::vector<std::pair<BlockId, BlockHash>> evicted;
  evicted.swap(evicted_);
  const size_t block_bytes = static_cast<size_t>(options_.block_bytes);
  for (const auto& [block, h] : evicted) {
    int32_t staging = -1;
    for (size_t t = 0; t < lowers_.size(); ++t) {
      if (!AdmitsWriteBack(t, h)) continue;
      std::span<const uint8_t> data;
      if (memory_) {
        const Region src{device_segment_, static_cast<uint64_t>(block.value()) * options_.block_bytes,
                         options_.block_bytes};
        if (!StageOnce(t, &staging, src, /*may_poll=*/true)) continue;
        data = {staging_[static_cast<size_t>(staging)].get(), block_bytes};
      }
      SubmitWriteBack(t, block, h, data, staging);
    }
    FreeIfUnused(staging);  // taken, but every submission failed
  }
}

void KvManager::SubmitWriteBack(size_t t, BlockId block, const BlockHash& h, std::span<const uint8_t> data,
                                int32_t staging) {
  const uint64_t tag = next_tag_++;
  Op op{OpKind::kWrite, static_cast<int>(t), RequestId(), 0, block, h, clock_->NowNanos()};
  op.holds_block = false;
  op.staging = staging;
  ops_.emplace(tag, op);
  if (staging >= 0) ++staging_refs_[static_cast<size_t>(staging)];
  writes_in_flight_[t].insert(h);
  ++stats_.tiers[t].writes;
  ++stats_.tiers[t].writebacks;
  BlockStore* store = lowers_[t].store;
  Status s = store->SubmitWrite(h, options_.ns, data, tag);
  if (!s.ok()) {
    ops_.erase(tag);
    writes_in_flight_[t].erase(h);
    if (staging >= 0) --staging_refs_[static_cast<size_t>(staging)];
    ++stats_.writes_failed;
    ++stats_.tiers[t].writes_failed;
    STRATA_LOG_WARN("kv manager: write-back to {} not submitted: {}", store->name(), s.ToString());
  }
}

void KvManager::OnLowerEvicted(size_t from, const BlockHash& h, std::span<const uint8_t> data) {
  const size_t block_bytes = static_cast<size_t>(options_.block_bytes);
  int32_t staging = -1;
  // The evicted bytes lie in the store's registered memory (BlockStore::memory()).
  Result<Region> where = data.empty() ? Result<Region>(Region{}) : segments_.Locate(data.data(), data.size());
  for (size_t t = from + 1; t < lowers_.size(); ++t) {
    if (!AdmitsWriteBack(t, h)) continue;
    std::span<const uint8_t> src;
    if (!data.empty()) {
      if (!where) {
        STRATA_LOG_WARN("kv manager: write-back of a block {} evicted dropped: {}", lowers_[from].name,
                        where.error().ToString());
        ++stats_.tiers[t].writebacks_dropped;
        continue;
      }
      // Called from inside the evicting store: no polling here.
      if (!StageOnce(t, &staging, *where, /*may_poll=*/false)) continue;
      src = {staging_[static_cast<size_t>(staging)].get(), block_bytes};
    }
    SubmitWriteBack(t, BlockId(), h, src, staging);
  }
  FreeIfUnused(staging);
}

void KvManager::SubmitWrite(int tier, BlockId block, const BlockHash& h) {
  const size_t t = static_cast<size_t>(tier);
  BlockStore* store = lowers_[t].store;
  if (writes_in_flight_[t].contains(h) || store->Contains(h)) return;
  const uint64_t tag = next_tag_++;
  pool_.Ref(block);  // not overwritten while the store reads it
  ops_.emplace(tag, Op{OpKind::kWrite, tier, RequestId(), 0, block, h, clock_->NowNanos()});
  writes_in_flight_[t].insert(h);
  ++stats_.tiers[t].writes;
  Status s = store->SubmitWrite(h, options_.ns, BlockSpan(block), tag);
  if (!s.ok()) {
    ops_.erase(tag);
    writes_in_flight_[t].erase(h);
    pool_.Release(block);
    ++stats_.writes_failed;
    ++stats_.tiers[t].writes_failed;
    STRATA_LOG_WARN("kv manager: write to {} not submitted: {}", store->name(), s.ToString());
  }
}

Status KvManager::Commit(RequestId id, std::span<const int32_t> tokens) {
  auto it = requests_.find(id);
  if (it == requests_.end())
    return Status::NotFound("kv manager: unknown request " + std::to_string(id.value()));
  Request& r = it->second;
  if (r.loads_pending > 0) return Status::InvalidArgument("kv manager: commit while loads are in flight");
  const size_t bs = static_cast<size_t>(options_.block_size);
  const size_t full = tokens.size() / bs;
  if (full > r.table.size())
    return Status::InvalidArgument("kv manager: commit of " + std::to_string(tokens.size()) +
                                   " tokens beyond the " + std::to_string(r.table.size()) + " allocated blocks");
  if (full > r.chain.size()) ExtendHashChain(options_.ns, tokens, options_.block_size, r.salt, &r.chain);
  for (size_t i = static_cast<size_t>(r.committed_blocks); i < full; ++i) {
    const BlockId b(static_cast<uint32_t>(r.table[i]));
    if (pool_.Register(b, r.chain[i])) OnCommitted(b, r.chain[i]);
  }
  r.committed_blocks = std::max(r.committed_blocks, static_cast<int32_t>(full));
  return Status::Ok();
}

void KvManager::Free(RequestId id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  const auto& table = it->second.table;
  for (auto b = table.rbegin(); b != table.rend(); ++b) pool_.Release(BlockId(static_cast<uint32_t>(*b)));
  requests_.erase(it);
}

void KvManager::Complete(const StoreCompletion& c) {
  auto it = ops_.find(c.tag);
  if (it == ops_.end()) return;  // not ours
  const Op op = it->second;
  ops_.erase(it);
  const uint64_t bytes = options_.block_bytes;
  const size_t t = static_cast<size_t>(op.tier);
  LowerTierStats& ts = stats_.tiers[t];
  const std::string_view name = lowers_[t].store->name();
  const int64_t op_nanos = clock_->NowNanos() - op.start_nanos;
  auto bucket = [](int64_t nanos) {
    const double sec = static_cast<double>(nanos) * 1e-9;
    size_t b = 0;
    while (b < kTierLatencyBounds.size() && sec > kTierLatencyBounds[b]) ++b;
    return b;
  };
  if (op.kind == OpKind::kWrite) {
    ++ts.write_latency[bucket(op_nanos)];
    ts.write_nanos += op_nanos;
    writes_in_flight_[t].erase(op.hash);
    if (c.status.ok()) {
      stats_.bytes_down += bytes;
      ts.bytes_down += bytes;
    } else {
      ++stats_.writes_failed;
      ++ts.writes_failed;
      STRATA_LOG_DEBUG("kv manager: write to {} failed: {}", name, c.status.ToString());
    }
    if (op.holds_block) pool_.Release(op.block);
    ReleaseStaging(op.staging);
    return;
  }
  const int64_t nanos = op_nanos;
  ++ts.load_latency[bucket(nanos)];
  stats_.load_nanos += nanos;
  ts.load_nanos += nanos;
  auto rit = requests_.find(op.request);
  if (c.status.ok()) {
    stats_.bytes_up += bytes;
    ts.bytes_up += bytes;
  } else {
    ++stats_.loads_failed;
    ++ts.loads_failed;
    STRATA_LOG_WARN("kv manager: load from {} failed, recomputing: {}", name, c.status.ToString());
  }
  // A load of an earlier incarnation of this id (freed and re-added while
  // the load was in flight) only releases its block.
  if (rit != requests_.end() && rit->second.epoch == op.request_epoch) {
    Request& r = rit->second;
    if (!c.status.ok()) r.load_ok_until = std::min(r.load_ok_until, op.block_index);
    if (--r.loads_pending == 0) {
      FinishLoads(r);
      const int32_t loaded = r.cached_blocks - r.device_hit_blocks;
      stats_.lower.blocks += static_cast<uint64_t>(loaded);
      stats_.lower.tokens += static_cast<uint64_t>(loaded) * static_cast<uint64_t>(options_.block_size);
    }
  }
  pool_.Release(op.block);
}

size_t KvManager::Poll() { return PollStores(); }

size_t KvManager::PollStores() {
  size_t n = 0;
  for (const auto& t : lowers_) {
    completions_.clear();
    n += t.store->Poll(&completions_);
    for (const auto& c : completions_) Complete(c);
  }
  return n;
}

std::span<const int32_t> KvManager::BlockTable(RequestId id) const {
  auto it = requests_.find(id);
  if (it == requests_.end()) return {};
  return it->second.table;
}

bool KvManager::IsReady(RequestId id) const {
  auto it = requests_.find(id);
  return it == requests_.end() || it->second.loads_pending == 0;
}

int32_t KvManager::CachedTokens(RequestId id) const {
  auto it = requests_.find(id);
  if (it == requests_.end()) return 0;
  return it->second.cached_blocks * options_.block_size;
}

std::vector<int> KvManager::CachedBlockTiers(RequestId id) const {
  auto it = requests_.find(id);
  if (it == requests_.end()) return {};
  const auto& bt = it->second.block_tier;
  const size_t n = std::min(bt.size(), static_cast<size_t>(it->second.cached_blocks));
  return {bt.begin(), bt.begin() + static_cast<std::ptrdiff_t>(n)};
}

std::string_view KvManager::tier_name(int tier) const {
  if (tier <= kDeviceTier || static_cast<size_t>(tier) > lowers_.size()) return "device";
  return lowers_[static_cast<size_t>(tier - 1)].name;
}

TierKind KvManager::tier_kind(int tier) const {
  if (tier <= kDeviceTier || static_cast<size_t>(tier) > lowers_.size()) return TierKind::kDevice;
  return lowers_[static_cast<size_t>(tier - 1)].store->kind();
}

Result<FlushResult> KvManager::Flush(bool device, const std::vector<bool>& lower_tiers, bool all_namespaces) {
  FlushResult out;
  out.lower_blocks.assign(lowers_.size(), 0);
  if (device) out.device_blocks = static_cast<uint64_t>(pool_.EvictAllCached());
  for (size_t t = 0; t < lowers_.size() && t < lower_tiers.size(); ++t) {
    if (!lower_tiers[t]) continue;
    BlockStore* store = lowers_[t].store;
    const uint64_t before = store->stats().blocks;
    Status s = store->Flush(all_namespaces ? nullptr : &options_.ns);
    const uint64_t after = store->stats().blocks;
    out.lower_blocks[t] = before > after ? before - after : 0;
    if (!s.ok()) return s.WithContext("kv manager: flush of " + lowers_[t].name);
    STRATA_LOG_INFO("kv manager: flushed {} blocks from {}", out.lower_blocks[t], lowers_[t].name);
  }
  return out;
}

KvManagerStats KvManager::stats() const {
  KvManagerStats s = stats_;
  s.device_pool = pool_.stats();
  for (size_t i = 0; i < s.tiers.size() && i < lowers_.size(); ++i)
    s.tiers[i].corrupt_blocks = lowers_[i].store->stats().corrupt_blocks;
  return s;
}

}  // namespace strata::kvcache
