#include "kvcache/kv_manager.h"

#include <algorithm>
#include <string>

#include "common/logging.h"

namespace strata::kvcache {

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

namespace {

Status CheckOptions(const KvManagerOptions& options, const Clock* clock) {
  if (options.block_size <= 0) return Status::InvalidArgument("kv manager: block_size must be > 0");
  if (options.num_device_blocks < 0) return Status::InvalidArgument("kv manager: num_device_blocks must be >= 0");
  if (clock == nullptr) return Status::InvalidArgument("kv manager: clock is null");
  if (!IsEvictionPolicy(options.eviction_policy))
    return MakeEvictionPolicy(options.eviction_policy, 0).status();
  return Status::Ok();
}

// The lower tiers one policy spans with the device: from the first, each
// that can take a policy from outside (a host, a disk or a simulated tier)
// and runs the first one's policy name; a write-through tier below the
// first is the last one (DevicePolicy); a remote tier, or one that cannot,
// ends the run. Each store is asked with a factory that records its slots
// and fails, so nothing is replaced yet.
std::vector<int32_t> HierarchyTiers(const std::vector<LowerTier>& lowers, std::string* name, Status* error) {
  std::vector<int32_t> slots;
  for (const LowerTier& t : lowers) {
    if (slots.size() == HierarchyPolicy::kMaxTiers || t.store == nullptr || t.store->kind() == TierKind::kRemote) break;
    int32_t n = -1;
    std::string policy;
    const Status s = t.store->ReplaceEvictionPolicy(
        [&](int32_t tier_slots, std::string_view tier_policy) -> Result<std::unique_ptr<EvictionPolicy>> {
          n = tier_slots;
          policy = std::string(tier_policy);
          return Status::Cancelled("probe");
        });
    if (n < 0) {  // the store refused before asking
      if (s.code() != StatusCode::kUnsupported) *error = s;
      if (slots.empty()) STRATA_LOG_INFO("kv manager: per-tier eviction policies ({})", s.message());
      break;
    }
    if (!slots.empty() && policy != *name) break;
    if (slots.empty()) *name = policy;
    slots.push_back(n);
    if (slots.size() > 1 && t.write_policy == WritePolicy::kWriteThrough) break;
  }
  return slots;
}

// The device pool's policy. The device and the lower tiers HierarchyTiers
// names share one (kvcache/hierarchy_policy.h), under the first tier's
// policy name (which kv.eviction_policy defaults), whatever their write
// policies; with none the pool has its own.
// A write-through last tier of the one policy (a host right under the
// device included) evicts its copies of blocks held above first and takes
// the blocks the level above drops (sets LowerTier::takes_drops): the tiers
// then hold each block once, as an exclusive chain does, while every computed block still reaches the tier
// when computed (docs/simulator.md, "Write-through in the one policy").
Result<std::unique_ptr<EvictionPolicy>> DevicePolicy(const KvManagerOptions& options, std::vector<LowerTier>& lowers,
                                                     std::shared_ptr<HierarchyPolicy>* hierarchy) {
  std::string name;
  Status error = Status::Ok();
  const std::vector<int32_t> slots = HierarchyTiers(lowers, &name, &error);
  STRATA_RETURN_IF_ERROR(error);
  if (slots.empty()) return MakeEvictionPolicy(options.eviction_policy, options.num_device_blocks);
  // A write-back last tier drops its copies first too (it keeps the copy of
  // a block a load promoted); an exclusive one holds none for long. Taking
  // drops, a small tier can meet a write with every slot busy with loads:
  // that write is refused (LowerTierStats::writes_refused), not failed.
  // A lone host tier in a cluster pool (a remote tier below) keeps the older
  // rule, its copies last: not measured there (pooled hit ratios, peers'
  // loads), so not changed.
  LowerTier& last = lowers[slots.size() - 1];
  const bool pooled = std::any_of(lowers.begin(), lowers.end(), [](const LowerTier& t) {
    return t.store != nullptr && t.store->kind() == TierKind::kRemote;
  });
  const bool copies_first =
      (slots.size() > 1 || !pooled) &&
      (last.write_policy == WritePolicy::kWriteThrough || last.write_policy == WritePolicy::kWriteBack);
  STRATA_ASSIGN_OR_RETURN(std::shared_ptr<HierarchyPolicy> h,
                          HierarchyPolicy::Create(name, options.num_device_blocks, slots, copies_first));
  last.takes_drops = copies_first && last.write_policy == WritePolicy::kWriteThrough;
  for (size_t i = 0; i < slots.size(); ++i) {
    STRATA_RETURN_IF_ERROR(lowers[i].store->ReplaceEvictionPolicy(
        [&](int32_t, std::string_view) -> Result<std::unique_ptr<EvictionPolicy>> { return h->TierView(i); }));
  }
  *hierarchy = h;
  return h->DeviceView();
}

}  // namespace

Result<std::unique_ptr<KvManager>> KvManager::Create(const KvManagerOptions& options,
                                                     BlockMemoryFn device_memory,
                                                     std::vector<LowerTier> lowers, Clock* clock) {
  STRATA_RETURN_IF_ERROR(CheckOptions(options, clock));
  std::shared_ptr<HierarchyPolicy> hierarchy;
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<EvictionPolicy> device_policy, DevicePolicy(options, lowers, &hierarchy));
  std::unique_ptr<KvManager> m(new KvManager(options, clock, std::move(device_policy)));
  m->hierarchy_ = std::move(hierarchy);
  KvManager* self = m.get();
  STRATA_ASSIGN_OR_RETURN(m->mover_, TierMover::Create(options, std::move(device_memory), std::move(lowers), &m->pool_,
                                                       clock, [self](const LoadDone& d) { self->OnLoadDone(d); }));
  m->mover_->set_hierarchy(m->hierarchy_.get());
  return m;
}

Result<std::unique_ptr<KvManager>> KvManager::Create(const KvManagerOptions& options, DeviceKv device,
                                                     std::vector<LowerTier> lowers, Clock* clock) {
  STRATA_RETURN_IF_ERROR(CheckOptions(options, clock));
  std::shared_ptr<HierarchyPolicy> hierarchy;
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<EvictionPolicy> device_policy, DevicePolicy(options, lowers, &hierarchy));
  std::unique_ptr<KvManager> m(new KvManager(options, clock, std::move(device_policy)));
  m->hierarchy_ = std::move(hierarchy);
  KvManager* self = m.get();
  STRATA_ASSIGN_OR_RETURN(m->mover_, TierMover::Create(options, device, std::move(lowers), &m->pool_, clock,
                                                       [self](const LoadDone& d) { self->OnLoadDone(d); }));
  m->mover_->set_hierarchy(m->hierarchy_.get());
  return m;
}

KvManager::KvManager(const KvManagerOptions& options, Clock* clock, std::unique_ptr<EvictionPolicy> device_policy)
    : options_(options), clock_(clock), pool_(options.num_device_blocks, std::move(device_policy)) {}

KvManager::~KvManager() {
  if (events_ != nullptr) SetEventLog(nullptr);  // the stores outlive the manager; the log may not
  mover_.reset();  // drains the stores while the requests its loads report to still exist
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

PrefixMatch KvManager::Match(std::span<const int32_t> prompt, std::string_view cache_salt) const {
  const auto chain = HashPrefix(options_.ns, prompt, options_.block_size, cache_salt);
  const size_t max_blocks = static_cast<size_t>(MaxCachedBlocks(prompt.size(), chain.size()));
  const size_t d = CountDeviceHits(chain, max_blocks);
  const auto src = mover_->LowerHits(chain, d, max_blocks);
  PrefixMatch m;
  m.device_tokens = static_cast<int32_t>(d) * options_.block_size;
  m.lower_tokens = static_cast<int32_t>(src.size()) * options_.block_size;
  m.lower_tier_tokens.assign(mover_->num_tiers(), 0);
  for (int t : src) m.lower_tier_tokens[static_cast<size_t>(t)] += options_.block_size;
  m.lower_sources = src;
  return m;
}

double KvManager::EstimateLoadSeconds(const PrefixMatch& m) const {
  double seconds = 0;
  for (size_t t = 0; t < m.lower_tier_tokens.size() && t < mover_->num_tiers(); ++t) {
    const double rate = mover_->ReadBytesPerS(t);
    if (rate <= 0 || m.lower_tier_tokens[t] <= 0) continue;
    const double blocks = static_cast<double>(m.lower_tier_tokens[t]) / options_.block_size;
    seconds += blocks * static_cast<double>(options_.block_bytes) / rate;
  }
  return seconds;
}

uint64_t KvManager::SubmitLookup(std::span<const int32_t> prompt, std::string_view cache_salt,
                                 int64_t deadline_nanos) {
  PendingLookup l;
  l.chain = HashPrefix(options_.ns, prompt, options_.block_size, cache_salt);
  l.max_blocks = static_cast<size_t>(MaxCachedBlocks(prompt.size(), l.chain.size()));
  l.device_blocks = CountDeviceHits(l.chain, l.max_blocks);
  l.mover_id = mover_->SubmitLookup(l.chain, l.device_blocks, l.max_blocks, deadline_nanos);
  const uint64_t id = next_lookup_++;
  lookups_.emplace(id, std::move(l));
  return id;
}

std::vector<int> KvManager::Rebase(size_t from, std::vector<int> src, size_t device) {
  if (device < from) return {};
  const size_t drop = device - from;
  if (drop >= src.size()) return {};
  src.erase(src.begin(), src.begin() + static_cast<std::ptrdiff_t>(drop));
  return src;
}

LookupState KvManager::TakeLookup(uint64_t id, PrefixMatch* out) {
  auto it = lookups_.find(id);
  if (it == lookups_.end()) {  // unknown, or already taken: no answer
    *out = PrefixMatch{};
    out->lower_tier_tokens.assign(mover_->num_tiers(), 0);
    return LookupState::kExpired;
  }
  PendingLookup& l = it->second;
  std::vector<int> src;
  const LookupState state = mover_->TakeLookup(l.mover_id, &src);
  if (state == LookupState::kPending) return state;
  const size_t d = CountDeviceHits(l.chain, l.max_blocks);
  *out = PrefixMatch{};
  out->device_tokens = static_cast<int32_t>(d) * options_.block_size;
  out->lower_sources = Rebase(l.device_blocks, std::move(src), d);
  out->lower_tokens = static_cast<int32_t>(out->lower_sources.size()) * options_.block_size;
  out->lower_tier_tokens.assign(mover_->num_tiers(), 0);
  for (int t : out->lower_sources) out->lower_tier_tokens[static_cast<size_t>(t)] += options_.block_size;
  lookups_.erase(it);
  return state;
}

int32_t KvManager::PrefixTokens(RequestId id) const {
  auto it = requests_.find(id);
  if (it == requests_.end()) return 0;
  const Request& r = it->second;
  if (r.prefix_taken) return r.cached_blocks * options_.block_size;
  const size_t max_blocks = static_cast<size_t>(MaxCachedBlocks(r.prompt.size(), r.chain.size()));
  const size_t d = CountDeviceHits(r.chain, max_blocks);
  const size_t h = r.has_hint ? Rebase(static_cast<size_t>(r.hint_from), r.hint, d).size()
                              : mover_->LowerHits(r.chain, d, max_blocks).size();
  return static_cast<int32_t>(std::min(max_blocks, d + h)) * options_.block_size;
}

void KvManager::CancelLookup(uint64_t id) {
  auto it = lookups_.find(id);
  if (it == lookups_.end()) return;
  mover_->CancelLookup(it->second.mover_id);
  lookups_.erase(it);
}

Status KvManager::AddRequest(RequestId id, std::span<const int32_t> prompt, std::string_view cache_salt,
                             const PrefixMatch* looked_up, double keep_seconds) {
  if (prompt.empty()) return Status::InvalidArgument("kv manager: empty prompt");
  if (!(keep_seconds >= 0) || keep_seconds > 1e9)
    return Status::InvalidArgument("kv manager: keep_seconds must be in [0, 1e9]");
  if (requests_.contains(id))
    return Status::InvalidArgument("kv manager: request " + std::to_string(id.value()) +
                                   " is already tracked");
  Request r;
  r.prompt.assign(prompt.begin(), prompt.end());
  r.salt.assign(cache_salt);
  r.chain = HashPrefix(options_.ns, prompt, options_.block_size, cache_salt);
  r.epoch = next_epoch_++;
  r.keep_nanos = static_cast<int64_t>(keep_seconds * 1e9);
  if (looked_up != nullptr) {
    r.has_hint = true;
    r.hint_from = looked_up->device_tokens / options_.block_size;
    r.hint = looked_up->lower_sources;
  }
  requests_.emplace(id, std::move(r));
  return Status::Ok();
}

Result<AllocOutcome> KvManager::Allocate(RequestId id, int32_t num_tokens) {
  auto it = requests_.find(id);
  if (it == requests_.end())
    return Status::NotFound("kv manager: unknown request " + std::to_string(id.value()));
  if (num_tokens < 0) return Status::InvalidArgument("kv manager: negative token count");
  Request& r = it->second;
  pool_.SetNow(clock_->NowNanos());  // for the blocks requests asked to keep
  if (!r.prefix_taken) return TakePrefix(id, r, num_tokens);
  const size_t bs = static_cast<size_t>(options_.block_size);
  const size_t need = (static_cast<size_t>(num_tokens) + bs - 1) / bs;
  if (need <= r.table.size()) return AllocOutcome::kAllocated;
  std::vector<BlockId> got;
  if (!pool_.Allocate(static_cast<int32_t>(need - r.table.size()), &got)) return AllocOutcome::kNotNow;
  mover_->WriteBackEvicted();
  for (BlockId b : got) r.table.push_back(static_cast<int32_t>(b.value()));
  return AllocOutcome::kAllocated;
}

Result<AllocOutcome> KvManager::TakePrefix(RequestId id, Request& r, int32_t num_tokens) {
  const size_t bs = static_cast<size_t>(options_.block_size);
  const size_t max_blocks = static_cast<size_t>(MaxCachedBlocks(r.prompt.size(), r.chain.size()));
  const size_t d = CountDeviceHits(r.chain, max_blocks);
  // A looked-up answer stands in for asking the tiers (kept until the prefix
  // is taken: a kNotNow below changes nothing).
  std::vector<int> src = r.has_hint ? Rebase(static_cast<size_t>(r.hint_from), r.hint, d)
                                    : mover_->LowerHits(r.chain, d, max_blocks);
  if (src.size() > max_blocks - std::min(max_blocks, d)) src.resize(max_blocks - std::min(max_blocks, d));
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
  // The blocks this request loads stay in their tiers until their loads are
  // submitted: the device's evictions go down first, and a write-back tier
  // making room for them must not evict what is about to be read (it would
  // be recomputed). A store that cannot pin (a remote tier) answers false.
  std::vector<std::pair<BlockStore*, BlockHash>> pinned;
  for (size_t i = 0; i < h; ++i) {
    BlockStore* store = mover_->tier(static_cast<size_t>(src[i])).store;
    if (store->Pin(r.chain[d + i])) pinned.emplace_back(store, r.chain[d + i]);
  }
  mover_->WriteBackEvicted(src);  // before the loads below overwrite evicted blocks
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
  for (BlockId b : hits) pool_.Hit(b);  // a use, whether others hold the block now or not
  if (const int64_t keep = KeepUntil(r); keep > 0)
    for (BlockId b : hits) pool_.KeepUntil(b, keep);
  for (size_t i = 0; i < d; ++i) mover_->OnHit(hits[i], r.chain[i], -1);
  for (size_t i = d; i < d + h; ++i) {
    const auto index = static_cast<int32_t>(i);
    const BlockId block(static_cast<uint32_t>(r.table[i]));
    ++r.loads_pending;
    if (!mover_->SubmitLoad(src[i - d], block, r.chain[i], id, r.epoch, index).ok()) {
      --r.loads_pending;
      r.load_ok_until = std::min(r.load_ok_until, index);
    }
  }
  for (const auto& [store, hash] : pinned) store->Unpin(hash);
  if (r.loads_pending == 0) FinishLoads(r);
  return AllocOutcome::kAllocated;
}

void KvManager::FinishLoads(Request& r) {
  // Loaded blocks are named only now, and only the contiguous good prefix:
  // anything after a failed load is recomputed into these same blocks.
  for (int32_t i = r.device_hit_blocks; i < r.load_ok_until; ++i) {
    const size_t k = static_cast<size_t>(i);
    const BlockId b(static_cast<uint32_t>(r.table[k]));
    (void)pool_.Register(b, r.chain[k], Hints(r, k));  // a duplicate stays private
    const int source = r.block_tier[k] - 1;
    mover_->CountLoadHit(source);
    mover_->OnHit(b, r.chain[k], source);
  }
  r.cached_blocks = r.load_ok_until;
  r.committed_blocks = r.load_ok_until;
  r.block_tier.resize(static_cast<size_t>(r.cached_blocks));
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
    if (pool_.Register(b, r.chain[i], Hints(r, i))) {
      mover_->OnCommitted(b, r.chain[i]);
    } else if (auto named = pool_.Lookup(r.chain[i])) {
      // Recomputed (an earlier block of the chain missed) while another
      // block holds the same content: that copy stays the cached one, and
      // this request used its content, so it counts as a use.
      pool_.Hit(*named);
    }
  }
  r.committed_blocks = std::max(r.committed_blocks, static_cast<int32_t>(full));
  return Status::Ok();
}

void KvManager::Free(RequestId id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  const auto& table = it->second.table;
  // "Kept this long after each use": the ask runs from the release, the same
  // time for the whole chain.
  if (const int64_t keep = KeepUntil(it->second); keep > 0)
    for (int32_t b : table)
      if (pool_.has_hash(BlockId(static_cast<uint32_t>(b)))) pool_.KeepUntil(BlockId(static_cast<uint32_t>(b)), keep);
  for (auto b = table.rbegin(); b != table.rend(); ++b) pool_.Release(BlockId(static_cast<uint32_t>(*b)));
  requests_.erase(it);
}

void KvManager::OnLoadDone(const LoadDone& d) {
  // The manager is being destroyed (~KvManager: reset() nulls mover_ before
  // the mover's drain reports its loads): nothing is left to settle.
  if (mover_ == nullptr) return;
  // A load of an earlier incarnation of this id (freed and re-added while
  // the load was in flight) only releases its block (the mover does).
  auto rit = requests_.find(d.request);
  if (rit == requests_.end() || rit->second.epoch != d.epoch) return;
  Request& r = rit->second;
  if (!d.ok) r.load_ok_until = std::min(r.load_ok_until, d.block_index);
  if (--r.loads_pending == 0) {
    FinishLoads(r);
    const int32_t loaded = r.cached_blocks - r.device_hit_blocks;
    stats_.lower.blocks += static_cast<uint64_t>(loaded);
    stats_.lower.tokens += static_cast<uint64_t>(loaded) * static_cast<uint64_t>(options_.block_size);
  }
}

size_t KvManager::Poll() {
  const size_t n = mover_->Poll();
  if (events_ != nullptr) (void)events_->Flush();
  return n;
}

void KvManager::SetEventLog(KvEventLog* log) {
  events_ = log;
  if (log == nullptr) {
    pool_.set_change_hook(nullptr);
    for (size_t i = 0; i < mover_->num_tiers(); ++i) mover_->tier(i).store->SetChangeListener(nullptr);
    return;
  }
  for (const BlockHash& h : pool_.Hashes()) log->Stored(h, TierKind::kDevice);
  pool_.set_change_hook([log](const BlockHash& h, bool named) {
    if (named) {
      log->Stored(h, TierKind::kDevice);
    } else {
      log->Removed(h, TierKind::kDevice);
    }
  });
  for (size_t i = 0; i < mover_->num_tiers(); ++i) {
    BlockStore* store = mover_->tier(i).store;
    const TierKind kind = store->kind();
    if (kind == TierKind::kRemote) continue;  // other instances' blocks: they publish them
    store->SetChangeListener([log, kind](const BlockHash& h, bool stored) {
      if (stored) {
        log->Stored(h, kind);
      } else {
        log->Removed(h, kind);
      }
    });
  }
  (void)log->Flush();
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
  if (tier <= kDeviceTier || static_cast<size_t>(tier) > mover_->num_tiers()) return "device";
  return mover_->tier(static_cast<size_t>(tier - 1)).name;
}

TierKind KvManager::tier_kind(int tier) const {
  if (tier <= kDeviceTier || static_cast<size_t>(tier) > mover_->num_tiers()) return TierKind::kDevice;
  return mover_->tier(static_cast<size_t>(tier - 1)).store->kind();
}

Result<FlushResult> KvManager::Flush(bool device, const std::vector<bool>& lower_tiers, bool all_namespaces) {
  FlushResult out;
  if (device) out.device_blocks = static_cast<uint64_t>(pool_.EvictAllCached());
  STRATA_RETURN_IF_ERROR(mover_->Flush(lower_tiers, all_namespaces ? nullptr : &options_.ns, &out.lower_blocks));
  return out;
}

KvManagerStats KvManager::stats() const {
  KvManagerStats s = stats_;
  s.device_pool = pool_.stats();
  mover_->FillStats(&s);
  return s;
}

}  // namespace strata::kvcache
