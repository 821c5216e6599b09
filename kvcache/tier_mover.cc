#include "kvcache/tier_mover.h"

#include <algorithm>
#include <new>
#include <string>

#include "common/logging.h"

namespace strata::kvcache {

namespace {

constexpr size_t kStagingAlign = 4096;  // O_DIRECT

size_t LatencyBucket(int64_t nanos) {
  const double sec = static_cast<double>(nanos) * 1e-9;
  size_t b = 0;
  while (b < kTierLatencyBounds.size() && sec > kTierLatencyBounds[b]) ++b;
  return b;
}

}  // namespace

void TierMover::AlignedFree::operator()(uint8_t* p) const { ::operator delete[](p, std::align_val_t(kStagingAlign)); }

Result<std::unique_ptr<TierMover>> TierMover::Create(const KvManagerOptions& options, BlockMemoryFn device_memory,
                                                     std::vector<LowerTier> lowers, BlockPool* pool, Clock* clock,
                                                     LoadDoneFn on_load_done) {
  for (auto& t : lowers) {
    if (t.store == nullptr) return Status::InvalidArgument("kv manager: a lower tier's store is null");
    if (t.name.empty()) t.name = std::string(t.store->name());
  }
  if (device_memory && options.block_bytes == 0)
    return Status::InvalidArgument("kv manager: block_bytes must be > 0 with device memory");
  std::unique_ptr<TierMover> m(
      new TierMover(options, std::move(device_memory), std::move(lowers), pool, clock, std::move(on_load_done)));
  STRATA_RETURN_IF_ERROR(m->RegisterSegments());
  return m;
}

TierMover::TierMover(const KvManagerOptions& options, BlockMemoryFn device_memory, std::vector<LowerTier> lowers,
                     BlockPool* pool, Clock* clock, LoadDoneFn on_load_done)
    : options_(options),
      memory_(std::move(device_memory)),
      copy_(std::make_unique<CpuCopyEngine>(&segments_)),
      lowers_(std::move(lowers)),
      pool_(pool),
      clock_(clock),
      on_load_done_(std::move(on_load_done)),
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
    pool_->set_evict_hook([this](BlockId b, const BlockHash& h) { evicted_.emplace_back(b, h); });
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

TierMover::~TierMover() {
  for (const auto& t : lowers_) t.store->SetEvictionListener(nullptr);
  if (any_writeback_) pool_->set_evict_hook(nullptr);
  for (const auto& t : lowers_) {
    if (ops_.empty()) return;
    std::vector<StoreCompletion> done;
    t.store->Drain(&done);
    for (const auto& c : done) Complete(c);  // op tags are unique across tiers
  }
}

Status TierMover::RegisterSegments() {
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

std::span<uint8_t> TierMover::BlockSpan(BlockId id) const {
  if (!memory_) return {};
  return {memory_(id), static_cast<size_t>(options_.block_bytes)};
}

bool TierMover::WorthLoading(const LowerTier& t, size_t blocks) const {
  if (options_.load_policy == LoadPolicy::kAlways) return true;
  // kAuto: load only when moving the bytes beats recomputing the tokens.
  if (t.read_bytes_per_s <= 0 || options_.recompute_tokens_per_s <= 0) return true;
  const double load_s = static_cast<double>(blocks * options_.block_bytes) / t.read_bytes_per_s;
  const double compute_s =
      static_cast<double>(blocks * static_cast<size_t>(options_.block_size)) / options_.recompute_tokens_per_s;
  return load_s < compute_s;
}

std::vector<int> TierMover::LowerHits(std::span<const BlockHash> chain, size_t from, size_t max_blocks) const {
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

uint64_t TierMover::SubmitLookup(std::vector<BlockHash> chain, size_t from, size_t max_blocks,
                                 int64_t deadline_nanos) {
  const uint64_t id = next_lookup_++;
  Lookup l;
  l.chain = std::move(chain);
  l.pos = from;
  l.max = std::min(max_blocks, l.chain.size());
  l.deadline_nanos = deadline_nanos;
  l.done = options_.load_policy == LoadPolicy::kNever || lowers_.empty() || l.pos >= l.max;
  lookups_.emplace(id, std::move(l));
  AdvanceLookup(id);
  return id;
}

void TierMover::ApplyAnswer(Lookup& l, size_t blocks) {
  l.asking = 0;
  blocks = std::min(blocks, l.max - l.pos);
  if (blocks == 0) {
    if (++l.tier >= lowers_.size()) l.done = true;  // no tier holds the next block
    return;
  }
  if (!WorthLoading(lowers_[l.tier], blocks)) {
    l.done = true;  // recompute from here on
    return;
  }
  l.src.insert(l.src.end(), blocks, static_cast<int>(l.tier));
  l.pos += blocks;
  l.tier = 0;  // the next block: ask from the top tier again
  if (l.pos >= l.max) l.done = true;
}

uint64_t TierMover::TakeAnswer(const BlockStore::PrefixAnswer& a) {
  auto qit = questions_.find(a.tag);
  if (qit == questions_.end()) return 0;  // a cancelled or expired lookup's
  const uint64_t owner = qit->second;
  questions_.erase(qit);
  auto lit = lookups_.find(owner);
  if (lit == lookups_.end() || lit->second.asking != a.tag) return 0;
  ApplyAnswer(lit->second, a.blocks);
  return owner;
}

void TierMover::AdvanceLookup(uint64_t id) {
  for (;;) {
    auto it = lookups_.find(id);
    if (it == lookups_.end()) return;
    Lookup& l = it->second;
    if (l.done || l.asking != 0) return;
    const uint64_t q = next_tag_++;
    l.asking = q;
    questions_.emplace(q, id);
    BlockStore* store = lowers_[l.tier].store;
    store->SubmitCountPrefix(std::span<const BlockHash>(l.chain).subspan(l.pos, l.max - l.pos), q);
    // A local index has answered already; a remote one answers in Poll().
    // Its own vector: advancing another lookup below polls again.
    std::vector<BlockStore::PrefixAnswer> got;
    store->PollCountPrefix(&got);
    for (const auto& a : got) {
      const uint64_t owner = TakeAnswer(a);
      if (owner != 0 && owner != id) AdvanceLookup(owner);
    }
    if (l.asking == q) return;  // still waiting for this answer
  }
}

size_t TierMover::PollLookups() {
  if (lookups_.empty()) return 0;
  size_t n = 0;
  std::vector<uint64_t> ready;
  for (const auto& t : lowers_) {
    answers_.clear();
    n += t.store->PollCountPrefix(&answers_);
    for (const auto& a : answers_)
      if (const uint64_t owner = TakeAnswer(a); owner != 0) ready.push_back(owner);
  }
  for (uint64_t id : ready) AdvanceLookup(id);
  return n;
}

LookupState TierMover::TakeLookup(uint64_t id, std::vector<int>* src) {
  src->clear();
  auto it = lookups_.find(id);
  if (it == lookups_.end()) return LookupState::kExpired;
  Lookup& l = it->second;
  if (l.done) {
    *src = std::move(l.src);
    CancelLookup(id);
    return LookupState::kDone;
  }
  if (clock_->NowNanos() < l.deadline_nanos) return LookupState::kPending;
  CancelLookup(id);
  return LookupState::kExpired;
}

void TierMover::CancelLookup(uint64_t id) {
  auto it = lookups_.find(id);
  if (it == lookups_.end()) return;
  if (it->second.asking != 0) questions_.erase(it->second.asking);
  lookups_.erase(it);
}

Status TierMover::SubmitLoad(int tier, BlockId block, const BlockHash& hash, RequestId request, uint64_t epoch,
                             int32_t block_index) {
  const uint64_t tag = next_tag_++;
  // The op holds its own reference: the block is not reused while the store
  // may still write into it, even if the request is freed meanwhile.
  pool_->Ref(block);
  Op op{OpKind::kLoad, tier, block, hash, clock_->NowNanos()};
  op.request = request;
  op.epoch = epoch;
  op.block_index = block_index;
  ops_.emplace(tag, op);
  BlockStore* store = lowers_[static_cast<size_t>(tier)].store;
  Status s = store->SubmitRead(hash, BlockSpan(block), tag);
  if (!s.ok()) {
    ops_.erase(tag);
    pool_->Release(block);
    ++stats_.loads_failed;
    ++stats_.tiers[static_cast<size_t>(tier)].loads_failed;
    STRATA_LOG_WARN("kv manager: load from {} not submitted: {}", lowers_[static_cast<size_t>(tier)].name,
                    s.ToString());
  }
  return s;
}

void TierMover::CountLoadHit(int tier) {
  LowerTierStats& ts = stats_.tiers[static_cast<size_t>(tier)];
  ts.hits.blocks += 1;
  ts.hits.tokens += static_cast<uint64_t>(options_.block_size);
}

void TierMover::OnCommitted(BlockId block, const BlockHash& h) {
  for (size_t t = 0; t < lowers_.size(); ++t) {
    if (lowers_[t].write_policy != WritePolicy::kWriteThrough) continue;
    if (lowers_[t].admit_after == 0) {
      SubmitWrite(static_cast<int>(t), block, h);
    } else {
      ++stats_.tiers[t].admissions_deferred;
    }
  }
}

void TierMover::OnHit(BlockId block, const BlockHash& h, int source) {
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

void TierMover::SubmitWrite(int tier, BlockId block, const BlockHash& h) {
  const size_t t = static_cast<size_t>(tier);
  BlockStore* store = lowers_[t].store;
  if (writes_in_flight_[t].contains(h) || store->Contains(h)) return;
  const uint64_t tag = next_tag_++;
  pool_->Ref(block);  // not overwritten while the store reads it
  ops_.emplace(tag, Op{OpKind::kWrite, tier, block, h, clock_->NowNanos()});
  writes_in_flight_[t].insert(h);
  ++stats_.tiers[t].writes;
  Status s = store->SubmitWrite(h, options_.ns, BlockSpan(block), tag);
  if (!s.ok()) {
    ops_.erase(tag);
    writes_in_flight_[t].erase(h);
    pool_->Release(block);
    ++stats_.writes_failed;
    ++stats_.tiers[t].writes_failed;
    STRATA_LOG_WARN("kv manager: write to {} not submitted: {}", lowers_[t].name, s.ToString());
  }
}

int32_t TierMover::AcquireStaging(bool may_poll) {
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
  if (free_staging_.empty() && may_poll) Poll();  // finished write-backs free theirs; never blocks
  if (free_staging_.empty()) return -1;
  const int32_t i = free_staging_.back();
  free_staging_.pop_back();
  return i;
}

void TierMover::ReleaseStaging(int32_t staging) {
  if (staging < 0) return;
  if (--staging_refs_[static_cast<size_t>(staging)] == 0) free_staging_.push_back(staging);
}

bool TierMover::AdmitsWriteBack(size_t t, const BlockHash& h) {
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

bool TierMover::StageOnce(size_t t, int32_t* staging, const Region& src, bool may_poll) {
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

void TierMover::FreeIfUnused(int32_t staging) {
  if (staging >= 0 && staging_refs_[static_cast<size_t>(staging)] == 0) free_staging_.push_back(staging);
}

void TierMover::WriteBackEvicted() {
  if (evicted_.empty()) return;
  // Moved out first: Poll (inside AcquireStaging) may complete loads whose
  // promotions allocate nothing, but keep this loop independent of evicted_.
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

void TierMover::SubmitWriteBack(size_t t, BlockId block, const BlockHash& h, std::span<const uint8_t> data,
                                int32_t staging) {
  const uint64_t tag = next_tag_++;
  Op op{OpKind::kWrite, static_cast<int>(t), block, h, clock_->NowNanos()};
  op.holds_block = false;
  op.staging = staging;
  ops_.emplace(tag, op);
  if (staging >= 0) ++staging_refs_[static_cast<size_t>(staging)];
  writes_in_flight_[t].insert(h);
  ++stats_.tiers[t].writes;
  ++stats_.tiers[t].writebacks;
  Status s = lowers_[t].store->SubmitWrite(h, options_.ns, data, tag);
  if (!s.ok()) {
    ops_.erase(tag);
    writes_in_flight_[t].erase(h);
    if (staging >= 0) --staging_refs_[static_cast<size_t>(staging)];
    ++stats_.writes_failed;
    ++stats_.tiers[t].writes_failed;
    STRATA_LOG_WARN("kv manager: write-back to {} not submitted: {}", lowers_[t].name, s.ToString());
  }
}

void TierMover::OnLowerEvicted(size_t from, const BlockHash& h, std::span<const uint8_t> data) {
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

void TierMover::Complete(const StoreCompletion& c) {
  auto it = ops_.find(c.tag);
  if (it == ops_.end()) return;  // not ours
  const Op op = it->second;
  ops_.erase(it);
  const uint64_t bytes = options_.block_bytes;
  const size_t t = static_cast<size_t>(op.tier);
  LowerTierStats& ts = stats_.tiers[t];
  const int64_t nanos = clock_->NowNanos() - op.start_nanos;
  if (op.kind == OpKind::kWrite) {
    ++ts.write_latency[LatencyBucket(nanos)];
    ts.write_nanos += nanos;
    writes_in_flight_[t].erase(op.hash);
    if (c.status.ok()) {
      stats_.bytes_down += bytes;
      ts.bytes_down += bytes;
    } else {
      ++stats_.writes_failed;
      ++ts.writes_failed;
      STRATA_LOG_DEBUG("kv manager: write to {} failed: {}", lowers_[t].name, c.status.ToString());
    }
    if (op.holds_block) pool_->Release(op.block);
    ReleaseStaging(op.staging);
    return;
  }
  ++ts.load_latency[LatencyBucket(nanos)];
  stats_.load_nanos += nanos;
  ts.load_nanos += nanos;
  if (c.status.ok()) {
    stats_.bytes_up += bytes;
    ts.bytes_up += bytes;
  } else {
    ++stats_.loads_failed;
    ++ts.loads_failed;
    STRATA_LOG_WARN("kv manager: load from {} failed, recomputing: {}", lowers_[t].name, c.status.ToString());
  }
  if (on_load_done_) on_load_done_(LoadDone{op.request, op.epoch, op.block_index, op.tier, c.status.ok()});
  pool_->Release(op.block);
}

size_t TierMover::Poll() {
  size_t n = PollLookups();
  for (const auto& t : lowers_) {
    completions_.clear();
    n += t.store->Poll(&completions_);
    for (const auto& c : completions_) Complete(c);
  }
  return n;
}

Status TierMover::Flush(const std::vector<bool>& lower_tiers, const Sha256Digest* ns, std::vector<uint64_t>* removed) {
  removed->assign(lowers_.size(), 0);
  for (size_t t = 0; t < lowers_.size() && t < lower_tiers.size(); ++t) {
    if (!lower_tiers[t]) continue;
    BlockStore* store = lowers_[t].store;
    const uint64_t before = store->stats().blocks;
    Status s = store->Flush(ns);
    const uint64_t after = store->stats().blocks;
    (*removed)[t] = before > after ? before - after : 0;
    if (!s.ok()) return s.WithContext("kv manager: flush of " + lowers_[t].name);
    STRATA_LOG_INFO("kv manager: flushed {} blocks from {}", (*removed)[t], lowers_[t].name);
  }
  return Status::Ok();
}

void TierMover::FillStats(KvManagerStats* s) const {
  s->bytes_down = stats_.bytes_down;
  s->bytes_up = stats_.bytes_up;
  s->writes_failed = stats_.writes_failed;
  s->loads_failed = stats_.loads_failed;
  s->load_nanos = stats_.load_nanos;
  s->tiers = stats_.tiers;
  for (size_t i = 0; i < s->tiers.size() && i < lowers_.size(); ++i)
    s->tiers[i].corrupt_blocks = lowers_[i].store->stats().corrupt_blocks;
}

}  // namespace strata::kvcache
