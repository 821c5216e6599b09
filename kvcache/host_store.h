#pragma once
// The host DRAM tier: a BlockStore over fixed-size slots in one buffer of
// `capacity_bytes` (rounded down to whole blocks). Plain memory for now;
// pinned memory comes with the CUDA backend.
//
// Operations finish inside Submit*: the memcpy is done before SubmitWrite or
// SubmitRead returns, and the completion is queued for the next Poll(). So
// the caller may reuse `data` as soon as SubmitWrite returns (stronger than
// BlockStore's contract). A full store evicts its least recently used block
// (written or read) to make room.
//
// Metadata-only mode (`metadata_only`): no buffer; writes record the hash,
// reads complete OK without touching `dst` (which may be empty). Lets the
// simulator run the same policy over capacities larger than memory.
//
// Thread-safety: one thread (the mover) drives a store, as BlockStore says.

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "kvcache/block_hash.h"
#include "kvcache/block_store.h"
#include "kvcache/lru_list.h"

namespace strata::kvcache {

struct HostStoreOptions {
  uint64_t capacity_bytes = 0;  // 0 = the tier is off (every write fails)
  uint64_t block_bytes = 0;     // REQUIRES: > 0
  bool metadata_only = false;
};

class HostStore final : public BlockStore {
 public:
  // Allocates the slot buffer (untouched pages cost nothing until written).
  static Result<std::unique_ptr<HostStore>> Create(const HostStoreOptions& options);

  std::string_view name() const override { return "host"; }
  StoreStats stats() const override;
  int32_t num_slots() const { return static_cast<int32_t>(slot_hash_.size()); }

  bool Contains(const BlockHash& h) const override;
  size_t CountPrefix(std::span<const BlockHash> chain) const override;

  // REQUIRES: data.size() == block_bytes (unless metadata_only). A write of a
  // held hash touches it and completes OK.
  Status SubmitWrite(const BlockHash& h, const Sha256Digest& ns, std::span<const uint8_t> data,
                     uint64_t tag) override;
  // REQUIRES: dst.size() == block_bytes (unless metadata_only). A miss
  // completes with NotFound.
  Status SubmitRead(const BlockHash& h, std::span<uint8_t> dst, uint64_t tag) override;
  size_t Poll(std::vector<StoreCompletion>* out) override;
  void Drain(std::vector<StoreCompletion>* out) override;

  Status Remove(const BlockHash& h) override;
  Status Flush(const Sha256Digest* ns) override;

 private:
  explicit HostStore(const HostStoreOptions& options, int32_t slots);
  uint8_t* slot_data(int32_t slot) { return buffer_.get() + static_cast<size_t>(slot) * block_bytes_; }
  void FreeSlot(int32_t slot);

  const uint64_t block_bytes_;
  const bool metadata_only_;
  std::unique_ptr<uint8_t[]> buffer_;
  std::vector<BlockHash> slot_hash_;
  std::vector<Sha256Digest> slot_ns_;
  std::vector<bool> slot_used_;
  std::vector<int32_t> free_slots_;
  LruList lru_;  // used slots, least recently used first
  std::unordered_map<BlockHash, int32_t, BlockHashHasher> index_;
  std::vector<StoreCompletion> done_;
  uint64_t evictions_ = 0;
  uint64_t write_errors_ = 0;
};

}  // namespace strata::kvcache
