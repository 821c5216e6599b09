#include "kvcache/disk_store.h"

#include "kvcache/clock.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <deque>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "common/logging.h"
#include "kvcache/disk_index.h"
#include "kvcache/disk_io.h"
#include "kvcache/eviction_policy.h"

namespace strata::kvcache {
namespace {

struct HashOfBlockHash {
  size_t operator()(const BlockHash& h) const {
    uint64_t v;
    std::memcpy(&v, h.digest.data(), sizeof(v));
    return static_cast<size_t>(v);
  }
};

std::string Short(const BlockHash& h) { return ToHex(h.digest.data(), 8); }

std::string SlabPath(const std::string& dir, uint64_t k) {
  char name[32];
  std::snprintf(name, sizeof(name), "slab-%05llu.dat", static_cast<unsigned long long>(k));
  return dir + "/" + name;
}

bool IsNoSpace(int err) { return err == ENOSPC || err == EDQUOT || err == EFBIG; }

Status WriteErrorStatus(std::string_view what, const std::string& path, int err) {
  Status s = Status::IoError(what, path, err);
  if (IsNoSpace(err)) return Status::ResourceExhausted(s.message());
  return s;
}

enum class OpKind { kWrite, kRead };

// One queued or in-flight I/O. Lives in DiskStoreImpl::ops_ from Submit* until
// its completion is produced.
struct Op {
  uint64_t id = 0;
  OpKind kind = OpKind::kWrite;
  uint64_t tag = 0;
  BlockHash hash;
  DiskIndexRecord rec;           // write: what will be indexed; read: what was expected
  const uint8_t* src = nullptr;  // write: the caller's block
  uint8_t* dst = nullptr;        // read: the caller's buffer
  int buffer = -1;               // bounce buffer index, -1 = I/O on the caller's memory
  bool started = false;
  bool cancelled = false;  // write: removed or flushed before it was indexed
};

struct Entry {
  DiskIndexRecord rec;  // rec.slot is the block's slot in policy_ too
};

class DiskStoreImpl final : public DiskStore {
 public:
  explicit DiskStoreImpl(DiskStoreOptions options) : options_(std::move(options)) {}
  ~DiskStoreImpl() override;

  Status Init();

  std::string_view name() const override { return "disk"; }
  TierKind kind() const override { return TierKind::kDisk; }
  StoreStats stats() const override;
  bool Contains(const BlockHash& h) const override;
  size_t CountPrefix(std::span<const BlockHash> chain) const override;
  Status SubmitWrite(const BlockHash& h, const Sha256Digest& ns, const Region& src,
                     uint64_t tag) override;
  Status SubmitRead(const BlockHash& h, const Region& dst, uint64_t tag) override;
  size_t Poll(std::vector<StoreCompletion>* out) override;
  void Drain(std::vector<StoreCompletion>* out) override;
  Status Remove(const BlockHash& h) override;
  // Honoured with the real clock: the policy evicts a kept block only when
  // no other block is evictable (an ask for a block still being written is
  // remembered until its write completes).
  void KeepFor(const BlockHash& h, int64_t nanos) override;
  // A pinned block is not the policy's victim, and its slot is not reused
  // until the last Unpin (a Remove or Flush meanwhile drops its entry, as
  // for a block being read).
  bool Pin(const BlockHash& h) override;
  void Unpin(const BlockHash& h) override;
  std::vector<BlockHash> HeldBlocks() const override {
    std::vector<BlockHash> out;
    out.reserve(entries_.size());
    for (const auto& [h, e] : entries_) out.push_back(h);
    return out;
  }
  Status Flush(const Sha256Digest* ns) override;
  // Also when blocks are held (a reopened store): they enter the new policy
  // in the old one's order, next victim first, with their keep_until.
  Status ReplaceEvictionPolicy(const PolicyFactory& make) override;
  uint64_t slot_bytes() const override { return slot_bytes_; }
  const DiskStoreOptions& options() const override { return options_; }
  size_t ios_in_flight() const override { return in_flight_; }
  bool Refresh(const BlockHash& h) override {
    auto it = entries_.find(h);
    if (it == entries_.end()) return false;
    Touch(it->second, h);
    return true;
  }
  size_t ios_queued() const override { return pending_.size(); }

 private:
  // The slab files as one kFile segment (capacity bytes, reached only
  // through this store's I/O) and the bounce buffers as host memory.
  Status RegisterMemory() override;
  bool NamespaceAllowed(const Sha256Digest& ns) const;
  uint64_t SlabOf(uint32_t slot) const { return slot / slots_per_slab_; }
  uint64_t OffsetOf(uint32_t slot) const { return (slot % slots_per_slab_) * slot_bytes_; }
  uint64_t EndOf(uint32_t slot) const { return OffsetOf(slot) + slot_bytes_; }
  bool SlotBacked(uint32_t slot) const { return backed_[SlabOf(slot)] >= EndOf(slot); }

  Status OpenSlab(uint64_t k, bool create);
  Status LoadIndex();
  Status WipeIndex();
  Status EnsureBacked(uint32_t slot);
  std::optional<uint32_t> AllocateSlot();
  void FreeSlot(uint32_t slot);
  bool EvictOne();
  // Forgets a stored block: memory, index and slot. `corrupt` counts and logs it.
  // `evicted`: the policy's choice (counted as its eviction), not a removal.
  Status DropEntry(const BlockHash& h, bool corrupt, std::string_view why, bool evicted = false);
  void Touch(Entry& e, const BlockHash& h);

  // Forgets that `op` is the write in progress for its hash (if it still is).
  void ForgetWriting(const Op& op) {
    auto w = writing_.find(op.hash);
    if (w != writing_.end() && w->second == op.id) writing_.erase(w);
  }
  void Finish(uint64_t tag, Status s, bool refused = false) {
    ready_.push_back(StoreCompletion{tag, std::move(s), refused});
  }
  void StartPending();
  // Prepares the I/O of ops_[id]; false when it finished at once (error).
  bool Start(uint64_t id, Op& op);
  void Complete(const DiskCompletion& c);
  void CompleteWrite(Op& op, int32_t res);
  void CompleteRead(Op& op, int32_t res);
  void FlushDirty();

  DiskStoreOptions options_;
  uint64_t slot_bytes_ = 0;
  uint64_t slots_per_slab_ = 0;
  uint64_t slab_bytes_ = 0;  // slots_per_slab_ * slot_bytes_
  uint32_t total_slots_ = 0;
  uint64_t num_slabs_ = 0;

  std::unique_ptr<DiskIndex> index_;
  std::unique_ptr<DiskRing> ring_;
  AlignedBuffer bounce_;
  bool fixed_buffers_ = false;
  std::vector<int> free_buffers_;

  std::vector<int> fds_;          // per slab; -1 until created
  std::vector<uint64_t> backed_;  // per slab: bytes with space allocated
  bool growth_disabled_ = false;  // the disk filled up: use only backed slots
  bool fallocate_supported_ = true;

  std::unordered_map<BlockHash, Entry, HashOfBlockHash> entries_;
  // The eviction policy over the stored blocks' slots (options_.eviction_policy;
  // kvcache/eviction_policy.h), and which block each held slot stores.
  std::unique_ptr<EvictionPolicy> policy_;
  std::unordered_map<uint32_t, BlockHash> slot_hash_;
  // cache_ttl_seconds asks for blocks whose write has not completed yet.
  std::unordered_map<BlockHash, int64_t, HashOfBlockHash> keep_;
  std::unordered_set<BlockHash, HashOfBlockHash> dirty_;  // last_use to persist
  uint64_t use_seq_ = 0;

  std::vector<uint32_t> free_slots_;
  uint32_t next_fresh_ = 0;  // every slot >= this is free
  std::unordered_map<uint32_t, uint32_t> slot_readers_;
  std::unordered_set<uint32_t> deferred_free_;  // freed while being read
  struct PinCount {
    uint32_t slot = 0;
    uint32_t count = 0;
  };
  std::unordered_map<BlockHash, PinCount, HashOfBlockHash> pins_;  // each pinned block holds one reader of its slot

  std::unordered_map<uint64_t, Op> ops_;
  std::unordered_map<BlockHash, uint64_t, HashOfBlockHash> writing_;  // hash → op id
  std::deque<uint64_t> pending_;
  uint64_t next_op_id_ = 1;
  unsigned in_flight_ = 0;
  std::vector<StoreCompletion> ready_;

  StoreStats stats_;
};

DiskStoreImpl::~DiskStoreImpl() {
  if (ring_) {
    std::vector<StoreCompletion> discarded;
    Drain(&discarded);
  }
  for (int fd : fds_) {
    if (fd >= 0) close(fd);
  }
}

Status DiskStoreImpl::Init() {
  const DiskStoreOptions& o = options_;
  if (o.directory.empty()) return Status::InvalidArgument("disk store: directory is empty");
  if (o.block_bytes < kDiskAlign) {
    return Status::InvalidArgument("disk store: block_bytes " + std::to_string(o.block_bytes) +
                                   " < 4096");
  }
  if (o.block_bytes > (1ull << 30)) {
    return Status::InvalidArgument("disk store: block_bytes over 1 GiB");
  }
  if (o.queue_depth == 0 || o.queue_depth > 4096) {
    return Status::InvalidArgument("disk store: queue_depth must be in 1..4096");
  }
  if (o.bounce_buffers == 0) return Status::InvalidArgument("disk store: bounce_buffers must be >= 1");
  slot_bytes_ = AlignUp(o.block_bytes, kDiskAlign);
  slots_per_slab_ = std::max<uint64_t>(1, o.slab_file_bytes / slot_bytes_);
  slab_bytes_ = slots_per_slab_ * slot_bytes_;
  uint64_t slots = o.capacity_bytes / slot_bytes_;
  if (slots == 0) {
    return Status::InvalidArgument("disk store: capacity_bytes " +
                                   std::to_string(o.capacity_bytes) + " holds no slot of " +
                                   std::to_string(slot_bytes_) + " bytes");
  }
  if (slots > static_cast<uint64_t>(INT32_MAX)) {
    return Status::InvalidArgument("disk store: " + std::to_string(slots) + " slots, more than " +
                                   std::to_string(INT32_MAX) + " (use larger blocks or less capacity)");
  }
  total_slots_ = static_cast<uint32_t>(slots);
  {
    auto policy = MakeEvictionPolicy(o.eviction_policy, static_cast<int32_t>(total_slots_));
    if (!policy.ok()) return Status::InvalidArgument("disk store: " + policy.error().message());
    policy_ = std::move(policy).value();
  }
  num_slabs_ = (total_slots_ + slots_per_slab_ - 1) / slots_per_slab_;
  stats_.capacity_bytes = uint64_t{total_slots_} * slot_bytes_;

  if (mkdir(o.directory.c_str(), 0755) != 0 && errno != EEXIST) {
    return Status::IoError("mkdir", o.directory, errno);
  }
  // Fail here, not at the first write, on a filesystem without O_DIRECT.
  std::string probe = o.directory + "/.odirect-probe";
  int pfd = open(probe.c_str(), O_RDWR | O_CREAT | O_DIRECT | O_CLOEXEC, 0644);
  if (pfd < 0) {
    if (errno == EINVAL) return Status::Unsupported("O_DIRECT not supported in " + o.directory);
    return Status::IoError("open", probe, errno);
  }
  close(pfd);
  unlink(probe.c_str());

  STRATA_ASSIGN_OR_RETURN(index_, DiskIndex::Open(o.directory + "/index"));
  STRATA_ASSIGN_OR_RETURN(ring_, DiskRing::Create(o.queue_depth));
  const unsigned bounce = std::min(o.bounce_buffers, o.queue_depth);
  STRATA_ASSIGN_OR_RETURN(bounce_, AlignedBuffer::Allocate(bounce * slot_bytes_));
  std::vector<std::span<uint8_t>> bufs;
  for (unsigned i = 0; i < bounce; ++i) {
    bufs.push_back(bounce_.span().subspan(i * slot_bytes_, slot_bytes_));
    free_buffers_.push_back(static_cast<int>(bounce - 1 - i));
  }
  fixed_buffers_ = ring_->RegisterBuffers(bufs);
  if (!fixed_buffers_) STRATA_LOG_DEBUG("disk store: io_uring fixed buffers refused; using plain");

  fds_.assign(num_slabs_, -1);
  backed_.assign(num_slabs_, 0);
  for (uint64_t k = 0; k < num_slabs_; ++k) STRATA_RETURN_IF_ERROR(OpenSlab(k, false));
  return LoadIndex();
}

Status DiskStoreImpl::RegisterMemory() {
  STRATA_RETURN_IF_ERROR(Own(SegmentKind::kFile, nullptr, stats_.capacity_bytes, "disk tier " + options_.directory)
                             .status());
  return Own(SegmentKind::kHost, bounce_.data(), bounce_.span().size(),
             "disk tier bounce buffers " + options_.directory)
      .status();
}

Status DiskStoreImpl::OpenSlab(uint64_t k, bool create) {
  std::string path = SlabPath(options_.directory, k);
  int flags = O_RDWR | O_DIRECT | O_CLOEXEC | (create ? O_CREAT : 0);
  int fd = open(path.c_str(), flags, 0644);
  if (fd < 0) {
    if (!create && errno == ENOENT) return Status::Ok();
    return WriteErrorStatus("open slab", path, errno);
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    int err = errno;
    close(fd);
    return Status::IoError("fstat", path, err);
  }
  fds_[k] = fd;
  backed_[k] = std::min<uint64_t>(slab_bytes_, uint64_t(st.st_size) / slot_bytes_ * slot_bytes_);
  return Status::Ok();
}

Status DiskStoreImpl::WipeIndex() {
  std::vector<std::string> keys;
  STRATA_RETURN_IF_ERROR(index_->ForEach(
      [&](const BlockHash& h, const DiskIndexRecord&) {
        keys.emplace_back(reinterpret_cast<const char*>(h.digest.data()), h.digest.size());
      },
      [&](const std::string& key, const std::string&) { keys.push_back(key); }));
  for (const auto& k : keys) STRATA_RETURN_IF_ERROR(index_->DeleteRaw(k));
  for (uint64_t k = 0;; ++k) {
    std::string path = SlabPath(options_.directory, k);
    if (unlink(path.c_str()) != 0) break;
  }
  return Status::Ok();
}

Status DiskStoreImpl::LoadIndex() {
  DiskGeometry want{slot_bytes_, slots_per_slab_, options_.block_bytes};
  STRATA_ASSIGN_OR_RETURN(std::optional<DiskGeometry> have, index_->GetGeometry());
  if (have && !(*have == want)) {
    STRATA_LOG_WARN(
        "disk store {}: written with slot {} B x {} per slab, block {} B; now slot {} x {}, "
        "block {}: wiping it",
        options_.directory, have->slot_bytes, have->slots_per_slab, have->block_bytes,
        want.slot_bytes, want.slots_per_slab, want.block_bytes);
    for (int& fd : fds_) {
      if (fd >= 0) close(fd);
      fd = -1;
    }
    std::fill(backed_.begin(), backed_.end(), 0);
    STRATA_RETURN_IF_ERROR(WipeIndex());
  }
  if (!have || !(*have == want)) STRATA_RETURN_IF_ERROR(index_->PutGeometry(want));

  std::vector<bool> used(total_slots_, false);
  std::vector<std::pair<uint64_t, BlockHash>> order;  // (last_use, hash)
  std::vector<std::string> bad_keys;
  std::vector<BlockHash> evicted;
  STRATA_RETURN_IF_ERROR(index_->ForEach(
      [&](const BlockHash& h, const DiskIndexRecord& rec) {
        std::string why;
        if (rec.length != options_.block_bytes) {
          why = "length " + std::to_string(rec.length);
        } else if (rec.slot >= total_slots_) {
          // Past the end of the store: a smaller capacity than before (the
          // slab still holds it) is an eviction; anything else is corrupt.
          uint64_t k = SlabOf(rec.slot);
          bool in_old_slab = false;
          struct stat st;
          if (stat(SlabPath(options_.directory, k).c_str(), &st) == 0) {
            in_old_slab = uint64_t(st.st_size) >= EndOf(rec.slot);
          }
          if (in_old_slab) {
            evicted.push_back(h);
            return;
          }
          why = "slot " + std::to_string(rec.slot) + " past the end of the store";
        } else if (EndOf(rec.slot) > backed_[SlabOf(rec.slot)]) {
          why = "slot " + std::to_string(rec.slot) + " past the end of its slab file";
        } else if (used[rec.slot]) {
          why = "slot " + std::to_string(rec.slot) + " claimed twice";
        }
        if (!why.empty()) {
          STRATA_LOG_WARN("disk store {}: dropping index entry {}: {}", options_.directory,
                          Short(h), why);
          ++stats_.corrupt_blocks;
          bad_keys.emplace_back(reinterpret_cast<const char*>(h.digest.data()), h.digest.size());
          return;
        }
        used[rec.slot] = true;
        entries_.emplace(h, Entry{rec});
        order.emplace_back(rec.last_use, h);
        use_seq_ = std::max(use_seq_, rec.last_use);
      },
      [&](const std::string& key, const std::string& why) {
        STRATA_LOG_WARN("disk store {}: dropping malformed index record: {}", options_.directory,
                        why);
        ++stats_.corrupt_blocks;
        bad_keys.push_back(key);
      }));
  for (const auto& k : bad_keys) STRATA_RETURN_IF_ERROR(index_->DeleteRaw(k));
  if (!evicted.empty()) {
    STRATA_RETURN_IF_ERROR(index_->Apply({}, evicted));
    stats_.evictions += evicted.size();
    STRATA_LOG_INFO("disk store {}: {} blocks beyond the new capacity evicted", options_.directory,
                    evicted.size());
  }
  for (uint64_t k = num_slabs_;; ++k) {  // slab files beyond a reduced capacity
    if (unlink(SlabPath(options_.directory, k).c_str()) != 0) break;
  }

  std::sort(order.begin(), order.end(),
            [](const auto& a, const auto& b) { return a.first < b.first; });
  for (const auto& [use, h] : order) {  // oldest first: lru resumes its order
    const uint32_t slot = entries_.at(h).rec.slot;
    BlockTraits traits;
    traits.key = HashOfBlockHash{}(h);
    policy_->Insert(static_cast<int32_t>(slot), traits, /*evictable=*/true);
    slot_hash_[slot] = h;
  }
  uint32_t high = 0;
  for (uint32_t s = 0; s < total_slots_; ++s) {
    if (used[s]) high = s + 1;
  }
  for (uint32_t s = high; s-- > 0;) {
    if (!used[s]) free_slots_.push_back(s);  // lowest slot on top
  }
  next_fresh_ = high;
  stats_.blocks = entries_.size();
  stats_.used_bytes = entries_.size() * slot_bytes_;
  if (!entries_.empty()) {
    STRATA_LOG_INFO("disk store {}: reopened with {} blocks", options_.directory, entries_.size());
  }
  return Status::Ok();
}

bool DiskStoreImpl::NamespaceAllowed(const Sha256Digest& ns) const {
  return options_.namespaces.empty() ||
         std::find(options_.namespaces.begin(), options_.namespaces.end(), ns) !=
             options_.namespaces.end();
}

StoreStats DiskStoreImpl::stats() const {
  StoreStats s = stats_;
  s.eviction_policy = std::string(policy_->name());
  s.policy = policy_->stats();
  return s;
}

bool DiskStoreImpl::Contains(const BlockHash& h) const {
  auto it = entries_.find(h);
  return it != entries_.end() && NamespaceAllowed(it->second.rec.ns);
}

size_t DiskStoreImpl::CountPrefix(std::span<const BlockHash> chain) const {
  size_t n = 0;
  while (n < chain.size() && Contains(chain[n])) ++n;
  return n;
}

Status DiskStoreImpl::EnsureBacked(uint32_t slot) {
  uint64_t k = SlabOf(slot);
  if (fds_[k] < 0) STRATA_RETURN_IF_ERROR(OpenSlab(k, true));
  uint64_t end = EndOf(slot);
  if (backed_[k] >= end) return Status::Ok();
  if (growth_disabled_) return Status::ResourceExhausted("disk full: slab growth stopped");
  if (!fallocate_supported_) return Status::Ok();  // the write itself extends the file
  uint64_t grow = std::max<uint64_t>(slot_bytes_, options_.grow_bytes / slot_bytes_ * slot_bytes_);
  uint64_t target = std::min(slab_bytes_, std::max(end, backed_[k] + grow));
  int fd = fds_[k];
  struct statvfs vfs;
  if (fstatvfs(fd, &vfs) == 0) {
    uint64_t avail = uint64_t(vfs.f_bavail) * vfs.f_frsize;
    uint64_t need = options_.reserve_bytes + (end - backed_[k]);
    if (avail < need) {
      growth_disabled_ = true;
      std::erase_if(free_slots_, [this](uint32_t s) { return !SlotBacked(s); });
      STRATA_LOG_WARN(
          "disk store {}: disk full at {} blocks ({} bytes free, {} reserved for "
          "the index); no more growth until reopened",
          options_.directory, entries_.size(), avail, options_.reserve_bytes);
      return Status::ResourceExhausted("disk store: disk full (" + std::to_string(avail) +
                                       " bytes free, " + std::to_string(options_.reserve_bytes) +
                                       " reserved)");
    }
    target =
        std::min(target, backed_[k] + (avail - options_.reserve_bytes) / slot_bytes_ * slot_bytes_);
    target = std::max(target, end);
  }
  int rc =
      fallocate(fd, 0, static_cast<off_t>(backed_[k]), static_cast<off_t>(target - backed_[k]));
  if (rc != 0 && IsNoSpace(errno) && target > end) {
    target = end;
    rc = fallocate(fd, 0, static_cast<off_t>(backed_[k]), static_cast<off_t>(end - backed_[k]));
  }
  if (rc != 0) {
    int err = errno;
    if (err == EOPNOTSUPP) {
      fallocate_supported_ = false;
      return Status::Ok();
    }
    std::string path = SlabPath(options_.directory, k);
    if (IsNoSpace(err)) {
      growth_disabled_ = true;
      std::erase_if(free_slots_, [this](uint32_t s) { return !SlotBacked(s); });
      STRATA_LOG_WARN("disk store {}: disk full at {} blocks; no more growth until reopened",
                      options_.directory, entries_.size());
    }
    return WriteErrorStatus("fallocate", path, err);
  }
  backed_[k] = target;
  return Status::Ok();
}

std::optional<uint32_t> DiskStoreImpl::AllocateSlot() {
  for (;;) {
    if (!free_slots_.empty()) {
      uint32_t s = free_slots_.back();
      free_slots_.pop_back();
      return s;
    }
    if (next_fresh_ < total_slots_ && (!growth_disabled_ || SlotBacked(next_fresh_))) {
      return next_fresh_++;
    }
    if (!EvictOne()) return std::nullopt;
  }
}

void DiskStoreImpl::FreeSlot(uint32_t slot) {
  if (slot_readers_.contains(slot)) {
    deferred_free_.insert(slot);
    return;
  }
  if (growth_disabled_ && !SlotBacked(slot)) return;  // no space behind it any more
  free_slots_.push_back(slot);
}

bool DiskStoreImpl::Pin(const BlockHash& h) {
  auto it = entries_.find(h);
  if (it == entries_.end()) return false;
  const uint32_t slot = it->second.rec.slot;
  auto [p, inserted] = pins_.emplace(h, PinCount{slot, 0});
  if (!inserted && p->second.slot != slot) return false;  // an older copy of h, dropped while pinned
  if (p->second.count++ == 0) {
    ++slot_readers_[slot];
    policy_->SetEvictable(static_cast<int32_t>(slot), false);
  }
  return true;
}

void DiskStoreImpl::Unpin(const BlockHash& h) {
  auto it = pins_.find(h);
  if (it == pins_.end()) return;
  if (--it->second.count > 0) return;
  const uint32_t slot = it->second.slot;
  pins_.erase(it);
  if (auto e = entries_.find(h); e != entries_.end() && e->second.rec.slot == slot)
    policy_->SetEvictable(static_cast<int32_t>(slot), true);
  if (auto r = slot_readers_.find(slot); r != slot_readers_.end() && --r->second == 0) {
    slot_readers_.erase(r);
    if (deferred_free_.erase(slot) != 0) FreeSlot(slot);
  }
}

void DiskStoreImpl::KeepFor(const BlockHash& h, int64_t nanos) {
  const int64_t until_nanos = RealClock()->NowNanos() + nanos;
  if (auto e = entries_.find(h); e != entries_.end()) {
    policy_->KeepUntil(static_cast<int32_t>(e->second.rec.slot), until_nanos);
    return;
  }
  if (keep_.size() > 65536) {  // expired asks, and asks for blocks that never arrived
    const int64_t now = RealClock()->NowNanos();
    for (auto it = keep_.begin(); it != keep_.end();) it = it->second <= now ? keep_.erase(it) : std::next(it);
  }
  int64_t& k = keep_[h];
  k = std::max(k, until_nanos);
}

bool DiskStoreImpl::EvictOne() {
  policy_->SetNow(RealClock()->NowNanos());
  const int32_t slot = policy_->Victim();
  if (slot < 0) return false;
  const BlockHash victim = slot_hash_.at(static_cast<uint32_t>(slot));
  Status s = DropEntry(victim, false, "evicted", /*evicted=*/true);
  if (!s.ok())
    STRATA_LOG_WARN("disk store {}: evicting {}: {}", options_.directory, Short(victim),
                    s.ToString());
  ++stats_.evictions;
  return true;
}

Status DiskStoreImpl::DropEntry(const BlockHash& h, bool corrupt, std::string_view why, bool evicted) {
  auto it = entries_.find(h);
  if (it == entries_.end()) return Status::Ok();
  uint32_t slot = it->second.rec.slot;
  policy_->Erase(static_cast<int32_t>(slot), evicted);
  slot_hash_.erase(slot);
  entries_.erase(it);
  dirty_.erase(h);
  NotifyChanged(h, false);
  stats_.blocks = entries_.size();
  stats_.used_bytes = entries_.size() * slot_bytes_;
  if (corrupt) {
    ++stats_.corrupt_blocks;
    STRATA_LOG_WARN("disk store {}: block {} in slot {} dropped: {}", options_.directory, Short(h),
                    slot, why);
  }
  // The delete reaches the WAL before the slot can be rewritten; were it lost,
  // the entry would fail its checksum (the hash is part of it), not serve junk.
  Status s = index_->Delete(h);
  FreeSlot(slot);
  return s;
}

void DiskStoreImpl::Touch(Entry& e, const BlockHash& h) {
  e.rec.last_use = ++use_seq_;
  policy_->Access(static_cast<int32_t>(e.rec.slot));
  dirty_.insert(h);
}

Status DiskStoreImpl::SubmitWrite(const BlockHash& h, const Sha256Digest& ns, const Region& src, uint64_t tag) {
  STRATA_ASSIGN_OR_RETURN(std::span<uint8_t> data, HostBytes(src, options_.block_bytes, false));
  if (!NamespaceAllowed(ns)) {
    return Status::InvalidArgument("disk store: namespace not served by this store");
  }
  if (entries_.contains(h) || writing_.contains(h)) {
    Finish(tag, Status::Ok());
    return Status::Ok();
  }
  uint64_t id = next_op_id_++;
  Op& op = ops_[id];
  op.id = id;
  op.kind = OpKind::kWrite;
  op.tag = tag;
  op.hash = h;
  op.rec.ns = ns;
  op.rec.length = static_cast<uint32_t>(data.size());
  // Recency is the order of the requests, not of the I/O completions (which
  // a loaded disk reorders): eviction, now and after a restart, does not
  // depend on the disk's timing.
  op.rec.last_use = ++use_seq_;
  op.src = data.data();
  writing_[h] = id;
  pending_.push_back(id);
  StartPending();
  return Status::Ok();
}

Status DiskStoreImpl::SubmitRead(const BlockHash& h, const Region& dst_region, uint64_t tag) {
  STRATA_ASSIGN_OR_RETURN(std::span<uint8_t> dst, HostBytes(dst_region, options_.block_bytes, false));
  auto it = entries_.find(h);
  if (it == entries_.end()) {
    Finish(tag, Status::NotFound("disk store: block " + Short(h) + " not stored"));
    return Status::Ok();
  }
  if (!NamespaceAllowed(it->second.rec.ns)) {
    Status d = DropEntry(h, true, "foreign namespace " + ToHex(it->second.rec.ns.data(), 8));
    if (!d.ok()) STRATA_LOG_WARN("disk store {}: {}", options_.directory, d.ToString());
    Finish(tag, Status::Corrupt("disk store: block " + Short(h) + " has a foreign namespace"));
    return Status::Ok();
  }
  uint64_t id = next_op_id_++;
  Op& op = ops_[id];
  op.id = id;
  op.kind = OpKind::kRead;
  op.tag = tag;
  op.hash = h;
  op.rec = it->second.rec;
  op.dst = dst.data();
  ++slot_readers_[op.rec.slot];  // pin: the slot is not reused until this read is done
  pending_.push_back(id);
  StartPending();
  return Status::Ok();
}

void DiskStoreImpl::StartPending() {
  bool prepared = false;
  while (!pending_.empty() && in_flight_ < options_.queue_depth) {
    uint64_t id = pending_.front();
    Op& op = ops_.at(id);
    bool aligned_io = slot_bytes_ == options_.block_bytes &&
                      IsAligned(op.kind == OpKind::kWrite ? op.src : op.dst);
    if (!aligned_io && free_buffers_.empty()) break;
    pending_.pop_front();
    if (!aligned_io) {
      op.buffer = free_buffers_.back();
      free_buffers_.pop_back();
    }
    if (Start(id, op)) {
      prepared = true;
      ++in_flight_;
    } else {
      if (op.buffer >= 0) free_buffers_.push_back(op.buffer);
      ops_.erase(id);
    }
  }
  if (prepared) {
    Status s = ring_->Submit();
    // The entries stay in the submission queue; the next Submit retries them.
    if (!s.ok()) STRATA_LOG_ERROR("disk store {}: {}", options_.directory, s.ToString());
  }
}

bool DiskStoreImpl::Start(uint64_t id, Op& op) {
  op.started = true;
  uint8_t* buf = op.buffer >= 0 ? bounce_.data() + op.buffer * slot_bytes_ : nullptr;
  int fixed = (op.buffer >= 0 && fixed_buffers_) ? op.buffer : -1;
  if (op.kind == OpKind::kRead) {
    uint64_t k = SlabOf(op.rec.slot);
    if (fds_[k] < 0) {
      CompleteRead(op, 0);  // the slab file is gone: a truncated slab
      return false;
    }
    std::span<uint8_t> target(buf ? buf : op.dst, slot_bytes_);
    ring_->PrepRead(fds_[k], target, OffsetOf(op.rec.slot), fixed, id);
    return true;
  }
  if (op.cancelled) {
    ForgetWriting(op);
    Finish(op.tag, Status::Cancelled("disk store: block removed or flushed before it was written"));
    return false;
  }
  std::optional<uint32_t> slot = AllocateSlot();
  if (!slot) {  // every slot busy with reads or writes in flight: no room now, nothing failed
    ForgetWriting(op);
    Finish(op.tag, Status::ResourceExhausted("disk store: no free slot (all busy)"), /*refused=*/true);
    return false;
  }
  Status backed = EnsureBacked(*slot);
  if (!backed.ok()) {
    FreeSlot(*slot);
    ForgetWriting(op);
    ++stats_.write_errors;
    STRATA_LOG_WARN("disk store {}: write of {} failed: {}", options_.directory, Short(op.hash),
                    backed.ToString());
    Finish(op.tag, backed);
    return false;
  }
  op.rec.slot = *slot;
  std::span<const uint8_t> data(op.src, options_.block_bytes);
  op.rec.checksum = DiskBlockChecksum(op.hash, op.rec.ns, data);
  if (buf) {
    std::memcpy(buf, op.src, data.size());
    std::memset(buf + data.size(), 0, slot_bytes_ - data.size());
  }
  std::span<const uint8_t> source(buf ? buf : op.src, slot_bytes_);
  ring_->PrepWrite(fds_[SlabOf(*slot)], source, OffsetOf(*slot), fixed, id);
  return true;
}

void DiskStoreImpl::Complete(const DiskCompletion& c) {
  auto it = ops_.find(c.user_data);
  if (it == ops_.end()) {
    STRATA_LOG_ERROR("disk store {}: completion for unknown op {}", options_.directory,
                     c.user_data);
    return;
  }
  --in_flight_;
  Op& op = it->second;
  if (op.kind == OpKind::kWrite) {
    CompleteWrite(op, c.res);
  } else {
    CompleteRead(op, c.res);
  }
  if (op.buffer >= 0) free_buffers_.push_back(op.buffer);
  ops_.erase(it);
}

void DiskStoreImpl::CompleteWrite(Op& op, int32_t res) {
  ForgetWriting(op);
  uint32_t slot = op.rec.slot;
  if (res < 0 || uint64_t(res) != slot_bytes_) {
    Status s =
        res < 0 ? WriteErrorStatus("write slab", SlabPath(options_.directory, SlabOf(slot)), -res)
                : Status(StatusCode::kIoError,
                         "disk store: short write of " + std::to_string(res) + " bytes");
    if (res < 0 && IsNoSpace(-res)) growth_disabled_ = true;
    ++stats_.write_errors;
    STRATA_LOG_WARN("disk store {}: write of {} failed: {}", options_.directory, Short(op.hash),
                    s.ToString());
    FreeSlot(slot);
    Finish(op.tag, std::move(s));
    return;
  }
  if (!fallocate_supported_) {
    uint64_t k = SlabOf(slot);
    backed_[k] = std::max(backed_[k], EndOf(slot));
  }
  if (op.cancelled) {
    FreeSlot(slot);
    Finish(op.tag, Status::Cancelled("disk store: block removed or flushed before it was written"));
    return;
  }
  // Only now, with the data on disk, may the index point at it.
  Status s = index_->Put(op.hash, op.rec);
  if (!s.ok()) {
    ++stats_.write_errors;
    STRATA_LOG_WARN("disk store {}: indexing {} failed: {}", options_.directory, Short(op.hash),
                    s.ToString());
    FreeSlot(slot);
    Finish(op.tag, std::move(s));
    return;
  }
  // The most recent block now (its persisted last_use is its request's:
  // after a restart, lru places it among the blocks of that time).
  BlockTraits traits;
  traits.key = HashOfBlockHash{}(op.hash);
  if (auto k = keep_.find(op.hash); k != keep_.end()) {
    traits.keep_until_nanos = k->second;
    keep_.erase(k);
  }
  policy_->SetNow(RealClock()->NowNanos());
  policy_->Insert(static_cast<int32_t>(slot), traits, /*evictable=*/true);
  slot_hash_[slot] = op.hash;
  entries_[op.hash] = Entry{op.rec};
  NotifyChanged(op.hash, true);
  stats_.blocks = entries_.size();
  stats_.used_bytes = entries_.size() * slot_bytes_;
  Finish(op.tag, Status::Ok());
}

void DiskStoreImpl::CompleteRead(Op& op, int32_t res) {
  uint32_t slot = op.rec.slot;
  if (auto r = slot_readers_.find(slot); r != slot_readers_.end() && --r->second == 0) {
    slot_readers_.erase(r);
    if (deferred_free_.erase(slot) != 0) FreeSlot(slot);
  }
  // Is the entry this read was for still the stored one?
  auto it = entries_.find(op.hash);
  bool current = it != entries_.end() && it->second.rec.slot == slot &&
                 it->second.rec.checksum == op.rec.checksum;
  auto fail = [&](Status s, bool corrupt) {
    if (current) {
      Status d = DropEntry(op.hash, corrupt, s.message());
      if (!d.ok()) STRATA_LOG_WARN("disk store {}: {}", options_.directory, d.ToString());
    }
    Finish(op.tag, std::move(s));
  };
  if (res < 0) {
    fail(Status::IoError("read slab", SlabPath(options_.directory, SlabOf(slot)), -res), true);
    return;
  }
  if (uint64_t(res) < slot_bytes_) {
    // The slab ends inside this slot: it was truncated. Believe its new size.
    uint64_t k = SlabOf(slot);
    struct stat st;
    if (fds_[k] >= 0 && fstat(fds_[k], &st) == 0) {
      backed_[k] = std::min(backed_[k], uint64_t(st.st_size) / slot_bytes_ * slot_bytes_);
    }
    fail(Status::Corrupt("disk store: slab truncated inside slot " + std::to_string(slot) +
                         " (read " + std::to_string(res) + " bytes)"),
         true);
    return;
  }
  const uint8_t* data = op.buffer >= 0 ? bounce_.data() + op.buffer * slot_bytes_ : op.dst;
  uint64_t sum = DiskBlockChecksum(op.hash, op.rec.ns, {data, op.rec.length});
  if (op.rec.length != options_.block_bytes || sum != op.rec.checksum) {
    fail(Status::Corrupt("disk store: checksum mismatch in slot " + std::to_string(slot)), true);
    return;
  }
  if (op.buffer >= 0) std::memcpy(op.dst, data, op.rec.length);
  if (current) Touch(it->second, op.hash);
  Finish(op.tag, Status::Ok());
}

void DiskStoreImpl::FlushDirty() {
  if (dirty_.empty()) return;
  std::vector<std::pair<BlockHash, DiskIndexRecord>> puts;
  puts.reserve(dirty_.size());
  for (const auto& h : dirty_) {
    auto it = entries_.find(h);
    if (it != entries_.end()) puts.emplace_back(h, it->second.rec);
  }
  dirty_.clear();
  Status s = index_->Apply(puts, {});
  // Losing a last-use update only makes eviction order after a restart staler.
  if (!s.ok())
    STRATA_LOG_WARN("disk store {}: saving last use: {}", options_.directory, s.ToString());
}

size_t DiskStoreImpl::Poll(std::vector<StoreCompletion>* out) {
  DiskCompletion c;
  while (ring_->Peek(&c)) Complete(c);
  StartPending();
  size_t n = ready_.size();
  out->insert(out->end(), std::make_move_iterator(ready_.begin()),
              std::make_move_iterator(ready_.end()));
  ready_.clear();
  FlushDirty();
  return n;
}

void DiskStoreImpl::Drain(std::vector<StoreCompletion>* out) {
  for (;;) {
    StartPending();
    if (in_flight_ == 0 && pending_.empty()) break;
    DiskCompletion c;
    Status s = ring_->Wait(&c);
    if (!s.ok()) {
      STRATA_LOG_ERROR("disk store {}: {}", options_.directory, s.ToString());
      break;
    }
    Complete(c);
    while (ring_->Peek(&c)) Complete(c);
  }
  Poll(out);
}

Status DiskStoreImpl::ReplaceEvictionPolicy(const PolicyFactory& make) {
  const std::vector<int32_t> order = policy_->Order();
  if (order.size() != entries_.size())  // every stored block is evictable; a policy that says otherwise is not replaced
    return Status::Unsupported("disk store: its eviction policy lists " + std::to_string(order.size()) + " of " +
                               std::to_string(entries_.size()) + " blocks");
  STRATA_ASSIGN_OR_RETURN(std::unique_ptr<EvictionPolicy> p, make(static_cast<int32_t>(total_slots_), policy_->name()));
  p->SetNow(RealClock()->NowNanos());
  for (int32_t slot : order) {
    BlockTraits traits;
    traits.key = HashOfBlockHash{}(slot_hash_.at(static_cast<uint32_t>(slot)));
    traits.keep_until_nanos = policy_->keep_until(slot);
    p->Insert(slot, traits, /*evictable=*/true);
  }
  policy_ = std::move(p);
  return Status::Ok();
}

Status DiskStoreImpl::Remove(const BlockHash& h) {
  if (auto w = writing_.find(h); w != writing_.end()) {
    ops_.at(w->second).cancelled = true;
    writing_.erase(w);
  }
  return DropEntry(h, false, "removed");
}

Status DiskStoreImpl::Flush(const Sha256Digest* ns) {
  for (auto& [id, op] : ops_) {
    if (op.kind == OpKind::kWrite && (ns == nullptr || op.rec.ns == *ns)) {
      op.cancelled = true;
      ForgetWriting(op);
    }
  }
  std::vector<BlockHash> victims;
  for (const auto& [h, e] : entries_) {
    if (ns == nullptr || e.rec.ns == *ns) victims.push_back(h);
  }
  Status s = index_->Apply({}, victims);
  for (const auto& h : victims) {
    auto it = entries_.find(h);
    uint32_t slot = it->second.rec.slot;
    policy_->Erase(static_cast<int32_t>(slot), /*evicted=*/false);
    slot_hash_.erase(slot);
    entries_.erase(it);
    dirty_.erase(h);
    NotifyChanged(h, false);
    FreeSlot(slot);
  }
  stats_.blocks = entries_.size();
  stats_.used_bytes = entries_.size() * slot_bytes_;
  return s;
}

}  // namespace

Result<std::unique_ptr<DiskStore>> DiskStore::Open(const DiskStoreOptions& options) {
  auto store = std::make_unique<DiskStoreImpl>(options);
  STRATA_RETURN_IF_ERROR(store->Init().WithContext("disk store " + options.directory));
  return std::unique_ptr<DiskStore>(std::move(store));
}

}  // namespace strata::kvcache
