#include "kvcache/tier_mover.h"

#include <algorithm>
#include <new>
#include <string>

#include "common/logging.h"

namespace strata::kvcache {

namespace {
// Tiers that receive blocks when the level above evicts them: write-back,
// exclusive, and a write-through tier the KvManager marked (the last of the
// one hierarchy policy, which evicts its copies first).
bool IsWriteBack(const LowerTier& t) {
  return t.write_policy == WritePolicy::kWriteBack || t.write_policy == WritePolicy::kExclusive || t.takes_drops;
}

// Loads from exclusive tiers submitted and not yet ended, over all tiers.
uint64_t PromotionsInFlight(const std::vector<uint32_t>& per_tier) {
  uint64_t n = 0;
  for (uint32_t p : per_tier) n += p;
  return n;
}

// The one tier at or below `first` that a block the level above drops goes
// down to (-1: none). The walk ends at the first tier that holds `h` or is
// writing it (that tier's own eviction passes it on later), else at the
// first write-back tier that `admits` it; write-through tiers that lost
// their copy, write-back tiers not admitting it yet and tiers this
// instance never writes (the remote pool) are passed. So write-back tiers
// form a chain, each taking what the level above drops, and an exclusive
// chain holds every block once.
template <typename Admits>
int NearestWriteBackTier(const std::vector<LowerTier>& lowers,
                         const std::vector<std::unordered_set<BlockHash, BlockHashHasher>>& in_flight, size_t first,
                         const BlockHash& h, Admits admits) {
  for (size_t t = first; t < lowers.size(); ++t) {
    if (lowers[t].write_policy == WritePolicy::kNone) continue;
    if (in_flight[t].contains(h) || lowers[t].store->Contains(h)) return -1;
    if (admits(t)) return static_cast<int>(t);
  }
  return -1;
}
}  // namespace

namespace {

size_t LatencyBucket(int64_t nanos) {
  const double sec = static_cast<double>(nanos) * 1e-9;
  size_t b = 0;
  while (b < kTierLatencyBounds.size() && sec > kTierLatencyBounds[b]) ++b;
  return b;
}

}  // namespace

Result<std::unique_ptr<TierMover>> TierMover::Create(const KvManagerOptions& options, BlockMemoryFn device_memory,
                                                     std::vector<LowerTier> lowers, BlockPool* pool, Clock* clock,
                                                     LoadDoneFn on_load_done) {
  if (device_memory && options.block_bytes == 0)
    return Status::InvalidArgument("kv manager: block_bytes must be > 0 with device memory");
  auto table = std::make_unique<SegmentTable>();
  auto copy = std::make_unique<CpuCopyEngine>(table.get());
  DeviceKv device{table.get(), SegmentId(), copy.get()};
  const uint64_t bb = options.block_bytes;
  const auto n = static_cast<uint32_t>(std::max(options.num_device_blocks, 0));
  if (device_memory && n > 0) {
    uint8_t* base = device_memory(BlockId(0));
    if (device_memory(BlockId(n - 1)) != base + static_cast<size_t>(n - 1) * bb)
      return Status::InvalidArgument("kv manager: device blocks must form one contiguous range");
    STRATA_ASSIGN_OR_RETURN(device.segment,
                            table->Register(options.device_memory_kind, base, n * bb, "device KV pool"));
  }
  // The stores are attached to the table in Init, after which the mover
  // owns it: the table must outlive them while attached.
  std::unique_ptr<TierMover> m(
      new TierMover(options, device, std::move(lowers), pool, clock, std::move(on_load_done)));
  m->own_segments_ = std::move(table);
  m->own_copy_ = std::move(copy);
  STRATA_RETURN_IF_ERROR(m->Init());
  return m;
}

Result<std::unique_ptr<TierMover>> TierMover::Create(const KvManagerOptions& options, DeviceKv device,
                                                     std::vector<LowerTier> lowers, BlockPool* pool, Clock* clock,
                                                     LoadDoneFn on_load_done) {
  if (device.segments == nullptr || device.copy == nullptr)
    return Status::InvalidArgument("kv manager: the device KV needs a segment table and a copy engine");
  std::unique_ptr<TierMover> m(
      new TierMover(options, device, std::move(lowers), pool, clock, std::move(on_load_done)));
  STRATA_RETURN_IF_ERROR(m->Init());
  return m;
}

TierMover::TierMover(const KvManagerOptions& options, DeviceKv device, std::vector<LowerTier> lowers,
                     BlockPool* pool, Clock* clock, LoadDoneFn on_load_done)
    : options_(options),
      segments_(device.segments),
      copy_(device.copy),
      device_segment_(device.segment),
      lowers_(std::move(lowers)),
      pool_(pool),
      clock_(clock),
      on_load_done_(std::move(on_load_done)),
      writes_in_flight_(lowers_.size()),
      promotions_(lowers_.size(), 0) {}

Status TierMover::Init() {
  for (auto& t : lowers_) {
    if (t.store == nullptr) return Status::InvalidArgument("kv manager: a lower tier's store is null");
    if (t.name.empty()) t.name = std::string(t.store->name());
  }
  if (IsValid(device_segment_)) {
    const auto seg = segments_->Get(device_segment_);
    if (!seg) return Status::InvalidArgument("kv manager: the device KV segment is not registered");
    if (options_.block_bytes == 0)
      return Status::InvalidArgument("kv manager: block_bytes must be > 0 with device memory");
    const uint64_t need = static_cast<uint64_t>(std::max(options_.num_device_blocks, 0)) * options_.block_bytes;
    if (seg->size < need)
      return Status::InvalidArgument("kv manager: the device KV segment holds " + std::to_string(seg->size) +
                                     " bytes, " + std::to_string(options_.num_device_blocks) + " blocks need " +
                                     std::to_string(need));
    device_host_ = HostAddressable(seg->kind);
  }
  for (const auto& t : lowers_) {
    if (t.store->segments() == segments_) continue;  // attached by its owner to this table
    if (t.store->segments() != nullptr)
      return Status::InvalidArgument("kv manager: tier " + t.name + " is attached to another segment table");
    STRATA_RETURN_IF_ERROR(t.store->Attach(segments_).WithContext("kv manager: tier " + t.name));
    attached_.push_back(t.store);
  }
  for (const auto& t : lowers_) {
    LowerTierStats ts;
    ts.name = t.name;
    ts.kind = t.store->kind();
    stats_.tiers.push_back(std::move(ts));
    if (IsWriteBack(t)) any_writeback_ = true;
  }
  size_t max_staging = 0;
  if (any_writeback_ || !device_host_) {
    const uint64_t bb = std::max<uint64_t>(options_.block_bytes, 1);
    max_staging = std::max<uint64_t>(1, options_.writeback_staging_bytes / bb);
  }
  staging_ = std::make_unique<StagingBuffers>(segments_, options_.block_bytes, max_staging);
  if (any_writeback_) {
    pool_->set_evict_hook(
        [this](BlockId b, const BlockHash& h) { evicted_.push_back({b, h, pool_->keep_until(b)}); });
    // A tier above a write-back tier passes its own evictions down.
    for (size_t i = 0; i + 1 < lowers_.size(); ++i) {
      bool below = false;
      for (size_t j = i + 1; j < lowers_.size(); ++j) below = below || IsWriteBack(lowers_[j]);
      if (below)
        lowers_[i].store->SetEvictionListener(
            [this, i](const BlockHash& h, const Region& data) { OnLowerEvicted(i, h, data); });
    }
  }
  return Status::Ok();
}

TierMover::~TierMover() {
  draining_ = true;
  if (any_writeback_) {  // Init set these, so no store is null
    for (const auto& t : lowers_) t.store->SetEvictionListener(nullptr);
    pool_->set_evict_hook(nullptr);
  }
  for (const auto& t : lowers_) {
    if (ops_.empty()) break;  // (so no store is null below: ops imply Init succeeded)
    std::vector<StoreCompletion> done;
    t.store->Drain(&done);
    for (const auto& c : done) Complete(c);  // op tags are unique across tiers
  }
  if (copy_ != nullptr) {
    copy_->Wait(copy_->Fence());
    FinishCopiedLoads();
  }
  DropDeferred(nullptr);
  staging_.reset();  // unregisters the buffers
  for (BlockStore* store : attached_) store->Detach();
}

Region TierMover::BlockRegion(BlockId id) const {
  if (!IsValid(device_segment_)) return {};
  return {device_segment_, static_cast<uint64_t>(id.value()) * options_.block_bytes, options_.block_bytes};
}

double TierMover::ReadBytesPerS(size_t i) const {
  const LowerTier& t = lowers_[i];
  const double measured = t.store->measured_read_bytes_per_s();
  return measured > 0 ? measured : t.read_bytes_per_s;
}

bool TierMover::WorthLoading(const LowerTier& t, size_t blocks) const {
  if (options_.load_policy == LoadPolicy::kAlways) return true;
  // kAuto: load only when moving the bytes beats recomputing the tokens.
  // A store's own measured rate (the remote tier's, from its transfers)
  // replaces the configured estimate.
  const double measured = t.store->measured_read_bytes_per_s();
  const double rate = measured > 0 ? measured : t.read_bytes_per_s;
  if (rate <= 0 || options_.recompute_tokens_per_s <= 0) return true;
  const double load_s = static_cast<double>(blocks * options_.block_bytes) / rate;
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
  const size_t t = static_cast<size_t>(tier);
  auto fail = [&](const Status& s) {
    ++stats_.loads_failed;
    ++stats_.tiers[t].loads_failed;
    STRATA_LOG_WARN("kv manager: load from {} not submitted: {}", lowers_[t].name, s.ToString());
    return s;
  };
  // Device memory a store cannot address: the store reads into a staging
  // buffer, copied into the block when the read completes (see the top).
  // Never polls here: the owner is in the middle of setting up the request.
  if (draining_) {
    EndPromotion(t);
    return fail(Status::Cancelled("the KV manager is shutting down"));
  }
  int32_t staging = -1;
  if (!device_host_) {
    staging = AcquireStaging(/*may_poll=*/false);
    if (staging < 0) EndPromotion(t);
    if (staging < 0) return fail(Status::ResourceExhausted("no staging buffer free for a load into device memory"));
    staging_->Ref(staging);
  }
  const uint64_t tag = next_tag_++;
  // The op holds its own reference: the block is not reused while the store
  // (or the copy engine) may still write into it, even if the request is
  // freed meanwhile.
  pool_->Ref(block);
  Op op{OpKind::kLoad, tier, block, hash, clock_->NowNanos()};
  op.request = request;
  op.epoch = epoch;
  op.block_index = block_index;
  op.staging = staging;
  ops_.emplace(tag, op);
  Status s = lowers_[t].store->SubmitRead(hash, staging >= 0 ? staging_->region(staging) : BlockRegion(block), tag);
  if (!s.ok()) {
    ops_.erase(tag);
    pool_->Release(block);
    staging_->Release(staging);
    EndPromotion(t);
    return fail(s);
  }
  return s;
}

Status TierMover::SubmitStage(int tier, const BlockHash& hash, const Region& dst, StageDoneFn done) {
  if (draining_) return Status::Cancelled("the KV manager is shutting down");
  if (tier < 0 || static_cast<size_t>(tier) >= lowers_.size())
    return Status::InvalidArgument("stage: no lower tier " + std::to_string(tier));
  const uint64_t tag = next_tag_++;
  Op op{OpKind::kStage, tier, BlockId(0), hash, clock_->NowNanos()};
  op.holds_block = false;
  op.stage_done = std::move(done);
  ops_.emplace(tag, std::move(op));
  Status s = lowers_[static_cast<size_t>(tier)].store->SubmitRead(hash, dst, tag);
  if (!s.ok()) ops_.erase(tag);
  return s;
}

void TierMover::CountLoadHit(int tier) {
  LowerTierStats& ts = stats_.tiers[static_cast<size_t>(tier)];
  ts.hits.blocks += 1;
  ts.hits.tokens += static_cast<uint64_t>(options_.block_size);
}

void TierMover::OnCommitted(BlockId block, const BlockHash& h) {
  int32_t staging = -1;  // one staging copy serves every tier (device memory a store cannot address)
  for (size_t t = 0; t < lowers_.size(); ++t) {
    if (lowers_[t].write_policy == WritePolicy::kExclusive) {
      // Recomputed after an earlier block of its chain missed: the device
      // holds a fresh copy now, so the older one below is a duplicate.
      if (lowers_[t].store->Contains(h)) Promoted(static_cast<int>(t), h);
      continue;
    }
    if (lowers_[t].write_policy != WritePolicy::kWriteThrough) continue;
    if (lowers_[t].admit_after == 0) {
      SubmitWrite(static_cast<int>(t), block, h, &staging);
    } else {
      ++stats_.tiers[t].admissions_deferred;
    }
  }
  staging_->PutBack(staging);  // taken, but every submission failed
}

void TierMover::OnHit(BlockId block, const BlockHash& h, int source) {
  if (lowers_.empty()) return;
  if (source >= 0 && lowers_[static_cast<size_t>(source)].write_policy == WritePolicy::kExclusive) {
    Promoted(source, h);
  } else if (source >= 0) {
    const int64_t keep = pool_->keep_until(block);
    if (keep > clock_->NowNanos()) lowers_[static_cast<size_t>(source)].store->KeepFor(h, keep - clock_->NowNanos());
  }
  int32_t staging = -1;  // as in OnCommitted
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
    if (promote || (tier.admit_after > 0 && hits >= tier.admit_after))
      SubmitWrite(static_cast<int>(t), block, h, &staging);
  }
  staging_->PutBack(staging);
}

void TierMover::Promoted(int source, const BlockHash& h) {
  // The device holds the block now: an exclusive tier drops its copy, unless
  // another operation of this tier still reads or writes it (then the copy
  // stays until the tier's own policy evicts it: a duplicate, not an error).
  for (const auto& [tag, op] : ops_)
    if (op.tier == source && op.hash == h) return;
  const size_t t = static_cast<size_t>(source);
  if (lowers_[t].store->Remove(h).ok()) {
    ++stats_.tiers[t].promoted;
    FlushDeferred(t, 1);  // into the room the promoted block left
  }
}

void TierMover::SubmitWrite(int tier, BlockId block, const BlockHash& h, int32_t* shared_staging) {
  const size_t t = static_cast<size_t>(tier);
  BlockStore* store = lowers_[t].store;
  if (draining_ || writes_in_flight_[t].contains(h) || store->Contains(h)) return;
  // Device memory a store cannot address: copy the block out first, once
  // for every tier (the stores then read the staging buffer, and the block
  // need not be held).
  int32_t staging = -1;
  if (!device_host_) {
    if (*shared_staging < 0) *shared_staging = StageCopy(BlockRegion(block), /*may_poll=*/false);
    staging = *shared_staging;
    if (staging < 0) {
      ++stats_.writes_failed;
      ++stats_.tiers[t].writes_failed;
      return;
    }
    staging_->Ref(staging);
  }
  const uint64_t tag = next_tag_++;
  Op op{OpKind::kWrite, tier, block, h, clock_->NowNanos()};
  op.holds_block = staging < 0;
  op.staging = staging;
  if (op.holds_block) pool_->Ref(block);  // not overwritten while the store reads it
  ops_.emplace(tag, op);
  writes_in_flight_[t].insert(h);
  ++stats_.tiers[t].writes;
  Status s = store->SubmitWrite(h, options_.ns, staging >= 0 ? staging_->region(staging) : BlockRegion(block), tag);
  if (!s.ok()) {
    ops_.erase(tag);
    writes_in_flight_[t].erase(h);
    if (op.holds_block) pool_->Release(block);
    if (staging >= 0) staging_->Unref(staging);  // the caller puts it back when unused
    ++stats_.writes_failed;
    ++stats_.tiers[t].writes_failed;
    STRATA_LOG_WARN("kv manager: write to {} not submitted: {}", lowers_[t].name, s.ToString());
    return;
  }
  if (const int64_t left = pool_->keep_until(block) - clock_->NowNanos(); pool_->keep_until(block) > 0 && left > 0)
    store->KeepFor(h, left);
}

int32_t TierMover::AcquireStaging(bool may_poll) {
  if (staging_->none_free() && may_poll) {
    // Deferred write-backs hold buffers: submitted now, the tier makes room
    // by its own eviction (what waiting avoided) rather than a write-back
    // being dropped for want of a buffer.
    for (size_t t = 0; t < lowers_.size() && !deferred_.empty(); ++t) FlushDeferred(t, deferred_.size());
    Poll();  // finished writes free theirs; never blocks
  }
  return staging_->Acquire();
}

bool TierMover::AdmitsWriteBack(size_t t, const BlockHash& h) {
  const LowerTier& tier = lowers_[t];
  if (!IsWriteBack(tier)) return false;
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

int32_t TierMover::StageCopy(const Region& src, bool may_poll) {
  const int32_t staging = AcquireStaging(may_poll);
  if (staging < 0) return -1;
  const uint64_t tag = next_tag_++;
  if (Status s = copy_->Submit(staging_->region(staging), src, tag); !s.ok()) {
    STRATA_LOG_WARN("kv manager: staging copy refused: {}", s.ToString());
    staging_->PutBack(staging);
    return -1;
  }
  // The caller reuses the source right after (Allocate hands the evicted
  // block out again; the evicting store overwrites its slot): the copy must
  // have landed, and landed well (else the buffer holds other bytes).
  copy_->Wait(copy_->Fence());
  staging_copy_ = {tag, Status::Internal("staging copy completion not seen")};
  CollectCopies();
  const Status got = staging_copy_.status;
  staging_copy_ = {};
  if (!got.ok()) {
    STRATA_LOG_WARN("kv manager: staging copy failed: {}", got.ToString());
    staging_->PutBack(staging);
    return -1;
  }
  return staging;
}

void TierMover::CollectCopies() {
  copy_done_.clear();
  copy_->Poll(&copy_done_);
  for (auto& c : copy_done_) {
    if (c.tag != 0 && c.tag == staging_copy_.tag) {
      staging_copy_.status = std::move(c.status);  // the one StageCopy waits for
    } else if (auto it = ops_.find(c.tag); it != ops_.end() && it->second.copying) {
      copy_ready_.push_back(std::move(c));  // a staged load's, for Poll
    }
    // Else not ours (the engine's other users): dropped.
  }
}

bool TierMover::StageOnce(size_t t, int32_t* staging, const Region& src, bool may_poll) {
  if (*staging >= 0) return true;
  *staging = StageCopy(src, may_poll);
  if (*staging < 0) {
    ++stats_.tiers[t].writebacks_dropped;
    return false;
  }
  return true;
}

void TierMover::WriteBackEvicted(std::span<const int> loads_from) {
  for (int t : loads_from)
    if (t >= 0 && static_cast<size_t>(t) < lowers_.size() && lowers_[static_cast<size_t>(t)].write_policy == WritePolicy::kExclusive)
      ++promotions_[static_cast<size_t>(t)];
  if (evicted_.empty()) return;
  // Moved out first: Poll (inside AcquireStaging) may complete loads whose
  // promotions allocate nothing, but keep this loop independent of evicted_.
  std::vector<Evicted> evicted;
  evicted.swap(evicted_);
  for (const auto& [block, h, keep] : evicted) {
    const int t = NearestWriteBackTier(lowers_, writes_in_flight_, 0, h,
                                       [&](size_t i) { return AdmitsWriteBack(i, h); });
    if (t < 0) continue;
    int32_t staging = -1;
    Region data;
    if (IsValid(device_segment_)) {
      if (!StageOnce(static_cast<size_t>(t), &staging, BlockRegion(block), /*may_poll=*/true)) continue;
      data = staging_->region(staging);
    }
    SubmitWriteBack(static_cast<size_t>(t), h, data, staging, keep);
    staging_->PutBack(staging);  // taken, but the submission failed
  }
  SettleHierarchy();
}

void TierMover::SettleHierarchy() {
  if (hierarchy_ == nullptr || hierarchy_->in_transit() == 0 || lowers_.empty()) return;
  std::unordered_set<uint64_t> pending;
  for (const auto& tier : writes_in_flight_)  // any tier's: a block a host tier drops goes down to the disk
    for (const BlockHash& h : tier) pending.insert(BlockHashHasher{}(h));
  hierarchy_->Settle([&](uint64_t key) { return pending.contains(key); });
}

void TierMover::SubmitWriteBack(size_t t, const BlockHash& h, const Region& data, int32_t staging,
                                int64_t keep_until) {
  // Any tier's: a request loading from two exclusive tiers (host and disk)
  // names its blocks, and so drops them from their tiers, only when its last
  // load is done; the host must not evict its promoted blocks before.
  if (lowers_[t].write_policy == WritePolicy::kExclusive && PromotionsInFlight(promotions_) > 0 && !draining_) {
    if (staging >= 0) staging_->Ref(staging);
    writes_in_flight_[t].insert(h);  // as a submitted write: not written twice, not admitted again
    deferred_.push_back(Deferred{t, h, data, staging, keep_until});
    ++stats_.tiers[t].writebacks_deferred;
    return;
  }
  SubmitWriteBackNow(t, h, data, staging, keep_until);
}

void TierMover::FlushDeferred(size_t t, size_t max) {
  for (auto it = deferred_.begin(); it != deferred_.end() && max > 0;) {
    if (it->tier != t) {
      ++it;
      continue;
    }
    const Deferred d = *it;
    it = deferred_.erase(it);
    --max;
    writes_in_flight_[t].erase(d.hash);
    if (!lowers_[t].store->Contains(d.hash)) SubmitWriteBackNow(t, d.hash, d.data, d.staging, d.keep_until);
    if (d.staging >= 0) staging_->Release(d.staging);
    it = deferred_.begin();  // SubmitWriteBackNow may have changed the queue (eviction listeners)
  }
}

void TierMover::DropDeferred(const std::vector<bool>* tiers) {
  std::deque<Deferred> keep;
  for (const Deferred& d : deferred_) {
    if (tiers != nullptr && (d.tier >= tiers->size() || !(*tiers)[d.tier])) {
      keep.push_back(d);
      continue;
    }
    writes_in_flight_[d.tier].erase(d.hash);
    ++stats_.tiers[d.tier].writebacks_dropped;
    if (d.staging >= 0 && staging_) staging_->Release(d.staging);
  }
  deferred_.swap(keep);
  SettleHierarchy();
}

void TierMover::SubmitWriteBackNow(size_t t, const BlockHash& h, const Region& data, int32_t staging,
                                   int64_t keep_until) {
  const uint64_t tag = next_tag_++;
  Op op{OpKind::kWrite, static_cast<int>(t), BlockId(), h, clock_->NowNanos()};
  op.holds_block = false;
  op.staging = staging;
  ops_.emplace(tag, op);
  if (staging >= 0) staging_->Ref(staging);
  writes_in_flight_[t].insert(h);
  ++stats_.tiers[t].writes;
  ++stats_.tiers[t].writebacks;
  Status s = lowers_[t].store->SubmitWrite(h, options_.ns, data, tag);
  if (!s.ok()) {
    ops_.erase(tag);
    writes_in_flight_[t].erase(h);
    if (staging >= 0) staging_->Unref(staging);
    ++stats_.writes_failed;
    ++stats_.tiers[t].writes_failed;
    STRATA_LOG_WARN("kv manager: write-back to {} not submitted: {}", lowers_[t].name, s.ToString());
    return;
  }
  if (const int64_t left = keep_until - clock_->NowNanos(); keep_until > 0 && left > 0) lowers_[t].store->KeepFor(h, left);
}

void TierMover::OnLowerEvicted(size_t from, const BlockHash& h, const Region& data) {
  const int t = NearestWriteBackTier(lowers_, writes_in_flight_, from + 1, h,
                                     [&](size_t i) { return AdmitsWriteBack(i, h); });
  if (t < 0) return;
  int32_t staging = -1;
  // `data` is a region of the evicting store's own memory (Region{} when it
  // holds no bytes).
  Region src;
  if (data.length != 0) {
    // Called from inside the evicting store: no polling here.
    if (!StageOnce(static_cast<size_t>(t), &staging, data, /*may_poll=*/false)) return;
    src = staging_->region(staging);
  }
  SubmitWriteBack(static_cast<size_t>(t), h, src, staging, /*keep_until=*/0);
  staging_->PutBack(staging);
}

void TierMover::Complete(const StoreCompletion& c) {
  auto it = ops_.find(c.tag);
  if (it == ops_.end()) return;  // not ours
  if (it->second.kind == OpKind::kLoad && it->second.staging >= 0 && c.status.ok() && !draining_) {
    // A staged load's read landed in host memory: now into the device block.
    Status s = copy_->Submit(BlockRegion(it->second.block), staging_->region(it->second.staging), c.tag);
    if (s.ok()) {
      it->second.copying = true;
      return;
    }
    const Op op = it->second;
    ops_.erase(it);
    FinishLoad(op, s.WithContext("staging to device copy"));
    return;
  }
  const Op op = it->second;
  ops_.erase(it);
  if (op.kind == OpKind::kStage) {
    op.stage_done(c.status);
    return;
  }
  if (op.kind == OpKind::kLoad) {
    FinishLoad(op, draining_ && op.staging >= 0 && c.status.ok() ? Status::Cancelled("shutting down") : c.status);
    return;
  }
  const uint64_t bytes = options_.block_bytes;
  const size_t t = static_cast<size_t>(op.tier);
  LowerTierStats& ts = stats_.tiers[t];
  const int64_t nanos = clock_->NowNanos() - op.start_nanos;
  ++ts.write_latency[LatencyBucket(nanos)];
  ts.write_nanos += nanos;
  writes_in_flight_[t].erase(op.hash);
  if (c.status.ok()) {
    stats_.bytes_down += bytes;
    ts.bytes_down += bytes;
  } else if (c.status.code() == StatusCode::kCancelled) {
    // Removed or flushed (an operator's flush) while queued: wanted gone.
    STRATA_LOG_DEBUG("kv manager: write to {} cancelled: {}", lowers_[t].name, c.status.ToString());
  } else if (c.refused) {
    // No room at the moment (every slot busy) or not admitted: not stored,
    // nothing broken.
    ++ts.writes_refused;
    STRATA_LOG_DEBUG("kv manager: write to {} refused: {}", lowers_[t].name, c.status.ToString());
  } else {
    ++stats_.writes_failed;
    ++ts.writes_failed;
    STRATA_LOG_DEBUG("kv manager: write to {} failed: {}", lowers_[t].name, c.status.ToString());
  }
  if (op.holds_block) pool_->Release(op.block);
  if (op.unpin_tier >= 0) lowers_[static_cast<size_t>(op.unpin_tier)].store->Unpin(op.hash);
  staging_->Release(op.staging);
}

void TierMover::FinishLoad(const Op& op, const Status& status) {
  const uint64_t bytes = options_.block_bytes;
  const size_t t = static_cast<size_t>(op.tier);
  LowerTierStats& ts = stats_.tiers[t];
  const int64_t nanos = clock_->NowNanos() - op.start_nanos;
  ++ts.load_latency[LatencyBucket(nanos)];
  stats_.load_nanos += nanos;
  ts.load_nanos += nanos;
  if (status.ok()) {
    stats_.bytes_up += bytes;
    ts.bytes_up += bytes;
  } else {
    ++stats_.loads_failed;
    ++ts.loads_failed;
    STRATA_LOG_WARN("kv manager: load from {} failed, recomputing: {}", lowers_[t].name, status.ToString());
  }
  staging_->Release(op.staging);
  if (on_load_done_) on_load_done_(LoadDone{op.request, op.epoch, op.block_index, op.tier, status.ok()});
  pool_->Release(op.block);
  // After the callback: a request's last load names its blocks there, and
  // Promoted drops them from this tier, making room for what waited.
  EndPromotion(t);
}

void TierMover::EndPromotion(size_t t) {
  if (promotions_[t] == 0 || --promotions_[t] > 0 || PromotionsInFlight(promotions_) > 0) return;
  for (size_t i = 0; i < lowers_.size(); ++i) FlushDeferred(i, deferred_.size());
}

size_t TierMover::Poll() {
  size_t n = PollLookups();
  for (const auto& t : lowers_) {
    completions_.clear();
    n += t.store->Poll(&completions_);
    for (const auto& c : completions_) Complete(c);
  }
  if (!device_host_) n += FinishCopiedLoads();
  SettleHierarchy();
  return n;
}

size_t TierMover::FinishCopiedLoads() {
  CollectCopies();
  // Swapped out first: a load's callback may stage another copy.
  std::vector<CopyCompletion> ready;
  ready.swap(copy_ready_);
  size_t n = 0;
  for (const auto& c : ready) {
    auto it = ops_.find(c.tag);
    if (it == ops_.end() || !it->second.copying) continue;
    const Op op = it->second;
    ops_.erase(it);
    FinishLoad(op, c.status.ok() ? c.status : c.status.WithContext("staging to device copy"));
    ++n;
  }
  return n;
}

Status TierMover::Flush(const std::vector<bool>& lower_tiers, const Sha256Digest* ns, std::vector<uint64_t>* removed) {
  removed->assign(lowers_.size(), 0);
  DropDeferred(&lower_tiers);  // blocks of this manager's one namespace, so flushed by either form
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
  for (size_t i = 0; i < s->tiers.size() && i < lowers_.size(); ++i) {
    const StoreStats st = lowers_[i].store->stats();
    s->tiers[i].corrupt_blocks = st.corrupt_blocks;
    s->tiers[i].eviction_policy = st.eviction_policy;
    s->tiers[i].policy = st.policy;
  }
}

}  // namespace strata::kvcache
