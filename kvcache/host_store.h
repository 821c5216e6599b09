#pragma once
// The host DRAM tier: a BlockStore over fixed-size slots in one buffer of
// `capacity_bytes` (rounded down to whole blocks).
//
// Pinned memory: when `pin` is set and a CUDA device is present, the buffer
// is page-locked with cudaHostRegister so device<->host copies can DMA. The
// CUDA runtime is found at run time (dlopen of libcudart.so, .so.13, .so.12,
// ...; no link-time dependency); without it, without a device, or when
// registration fails, the buffer stays plain memory. Create logs which one
// happened; pinned() / pin_status() tell it. A pinned buffer is committed
// (every page resident) from the start.
//
// Operations finish inside Submit*: the memcpy is done before SubmitWrite or
// SubmitRead returns, and the completion is queued for the next Poll(). So
// the caller may reuse the source region as soon as SubmitWrite returns
// (stronger than BlockStore's contract). Attach registers the slot buffer
// as one segment ("host tier", kPinnedHost when pinned); evicted blocks are
// reported as regions of it. A full store evicts the block its eviction
// policy picks (kvcache/eviction_policy.h; lru by default: the least
// recently written or read) to make room, and stores a new block only when
// the policy admits it; pinned blocks (Pin, for peers reading them through
// the cluster pool) are never evicted. Every stored block
// carries the XXH3-64 of its bytes (Locate), which a reader checks.
//
// Metadata-only mode (`metadata_only`): no buffer; writes record the hash,
// reads complete OK without touching `dst` (which may be Region{}). Lets the
// simulator run the same policy over capacities larger than memory.
//
// Thread-safety: one thread (the mover) drives a store, as BlockStore says.

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "kvcache/block_hash.h"
#include "kvcache/block_store.h"
#include "kvcache/eviction_policy.h"

namespace strata::kvcache {

struct HostStoreOptions {
  uint64_t capacity_bytes = 0;  // 0 = the tier is off (every write fails)
  uint64_t block_bytes = 0;     // REQUIRES: > 0
  bool metadata_only = false;
  // Page-lock the buffer when a CUDA device is present (see above).
  bool pin = true;
  // The CUDA runtime library to dlopen; empty = the usual names
  // (libcudart.so, libcudart.so.13, libcudart.so.12, libcudart.so.11.0).
  std::string cudart_library = {};
  // kvcache/eviction_policy.h names; Create refuses an unknown one.
  std::string eviction_policy = kDefaultEvictionPolicy;
};

class HostStore final : public BlockStore {
 public:
  // Allocates the slot buffer (untouched pages cost nothing until written).
  static Result<std::unique_ptr<HostStore>> Create(const HostStoreOptions& options);
  ~HostStore() override;
  HostStore(const HostStore&) = delete;
  HostStore& operator=(const HostStore&) = delete;

  // True when the slot buffer is page-locked (cudaHostRegister).
  bool pinned() const { return pinned_; }
  // Why the buffer is or is not pinned, e.g. "pinned (cudaHostRegister)",
  // "not pinned: no CUDA device (cudaGetDeviceCount error 100)".
  const std::string& pin_status() const { return pin_status_; }

  std::string_view name() const override { return "host"; }
  TierKind kind() const override { return TierKind::kHost; }
  StoreStats stats() const override;
  int32_t num_slots() const { return static_cast<int32_t>(slot_hash_.size()); }

  bool Contains(const BlockHash& h) const override;
  size_t CountPrefix(std::span<const BlockHash> chain) const override;

  // A write of a held hash touches it and completes OK.
  Status SubmitWrite(const BlockHash& h, const Sha256Digest& ns, const Region& src, uint64_t tag) override;
  // A miss completes with NotFound.
  Status SubmitRead(const BlockHash& h, const Region& dst, uint64_t tag) override;
  void SetEvictionListener(EvictionListener listener) override { eviction_listener_ = std::move(listener); }
  size_t Poll(std::vector<StoreCompletion>* out) override;
  void Drain(std::vector<StoreCompletion>* out) override;

  Status Remove(const BlockHash& h) override;
  Status Flush(const Sha256Digest* ns) override;

  // The slot's region and the XXH3-64 of its bytes taken when stored
  // (metadata-only stores: nullopt).
  std::optional<BlockLocation> Locate(const BlockHash& h) const override;
  // Honoured with the real clock (kvcache::RealClock), the engine's.
  void KeepFor(const BlockHash& h, int64_t nanos) override;
  bool Pin(const BlockHash& h) override;
  void Unpin(const BlockHash& h) override;
  std::vector<BlockHash> HeldInEvictionOrder() const override;
  // Slots pinned now (including ones dropped while pinned).
  size_t pinned_slots() const { return pinned_hashes_.size(); }
  const EvictionPolicy& policy() const { return *policy_; }
  Status ReplaceEvictionPolicy(const PolicyFactory& make) override;

 private:
  std::vector<BlockHash> HeldBlocks() const override;
  HostStore(const HostStoreOptions& options, int32_t slots, std::unique_ptr<EvictionPolicy> policy);
  Status RegisterMemory() override;
  uint8_t* slot_data(int32_t slot) { return buffer_.get() + static_cast<size_t>(slot) * block_bytes_; }
  void FreeSlot(int32_t slot, bool evicted);
  // Pins buffer_ when options ask and a device is present; sets pinned_ and
  // pin_status_.
  void MaybePin(const HostStoreOptions& options, uint64_t bytes);

  const uint64_t block_bytes_;
  const bool metadata_only_;
  struct FreeDeleter {
    void operator()(uint8_t* p) const;
  };
  std::unique_ptr<uint8_t, FreeDeleter> buffer_;  // page-aligned
  SegmentId segment_;                              // buffer_'s, while attached
  bool pinned_ = false;
  int (*cuda_unregister_)(void*) = nullptr;  // cudaHostUnregister when pinned_
  std::string pin_status_ = "not pinned: no buffer";
  std::vector<BlockHash> slot_hash_;
  std::vector<Sha256Digest> slot_ns_;
  std::vector<bool> slot_used_;
  std::vector<uint64_t> slot_sum_;     // XXH3-64 of the slot's bytes
  std::vector<int32_t> slot_pins_;     // Pin count; a pinned slot is not evictable
  std::vector<bool> slot_dropped_;     // left the index while pinned: freed at the last Unpin
  std::unordered_map<BlockHash, int32_t, BlockHashHasher> pinned_hashes_;  // hash → its pinned slot
  std::vector<int32_t> free_slots_;
  std::unique_ptr<EvictionPolicy> policy_;  // over the indexed slots
  std::unordered_map<BlockHash, int32_t, BlockHashHasher> index_;
  std::vector<StoreCompletion> done_;
  uint64_t evictions_ = 0;
  EvictionListener eviction_listener_;
};

}  // namespace strata::kvcache
