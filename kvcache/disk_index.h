#pragma once
// The disk tier's persistent index: one RocksDB database mapping a block hash
// to where its bytes live in the slab files and how to check them. Internal to
// the disk tier (DiskStore uses it; tests use it to plant bad records); the
// RocksDB types stay in disk_index.cc.
//
// Record (value, little-endian, 80 bytes): u8 version, u8[3] zero, u32 slot,
// u32 length, u32 zero, u64 checksum, u8[32] namespace digest, u64 last_use,
// u8[16] zero (reserved). Key: the 32-byte block hash. One extra key of another
// length ("strata.disk.geometry") holds the store's geometry.
//
// Durability: writes go through RocksDB's WAL without fsync. That survives
// kill -9 (the WAL is in the page cache) and, after a power loss, RocksDB
// recovers a prefix of the writes (point-in-time recovery), so the order in
// which DiskStore writes records is the order in which they can be lost.
//
// Thread-safety: one thread at a time (the disk tier's mover thread).

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>

#include "common/sha256.h"
#include "common/status.h"

namespace strata::kvcache {

struct DiskIndexRecord {
  uint32_t slot = 0;      // global slot number: slab = slot / slots_per_slab
  uint32_t length = 0;    // bytes of block data in the slot
  uint64_t checksum = 0;  // DiskBlockChecksum(hash, ns, data)
  Sha256Digest ns{};      // namespace digest of the model that wrote it
  uint64_t last_use = 0;  // logical use sequence; larger = more recent
};

// What the slab layout was when the store was created. A store reopened with a
// different geometry cannot interpret its slots.
struct DiskGeometry {
  uint64_t slot_bytes = 0;
  uint64_t slots_per_slab = 0;
  uint64_t block_bytes = 0;
  friend bool operator==(const DiskGeometry&, const DiskGeometry&) = default;
};

// XXH3-64 over hash ‖ namespace ‖ data: a slot that holds another block's
// bytes, or a record whose namespace was altered, fails the check too.
uint64_t DiskBlockChecksum(const BlockHash& h, const Sha256Digest& ns,
                           std::span<const uint8_t> data);

class DiskIndex {
 public:
  // Opens (creating if missing) the database at `path`. Fails with IoError
  // when RocksDB cannot open it (locked by another process, unreadable).
  static Result<std::unique_ptr<DiskIndex>> Open(const std::string& path);
  ~DiskIndex();
  DiskIndex(const DiskIndex&) = delete;
  DiskIndex& operator=(const DiskIndex&) = delete;

  Status Put(const BlockHash& h, const DiskIndexRecord& rec);
  Status Delete(const BlockHash& h);
  // Applies all puts and deletes atomically (one WAL record).
  Status Apply(std::span<const std::pair<BlockHash, DiskIndexRecord>> puts,
               std::span<const BlockHash> deletes);
  // NotFound when absent; Corrupt when the stored value does not decode.
  Result<DiskIndexRecord> Get(const BlockHash& h) const;

  // Calls `fn` for every well-formed record. Keys or values that do not decode
  // are passed to `bad` (raw key bytes, reason) instead; the callback decides.
  Status ForEach(
      const std::function<void(const BlockHash&, const DiskIndexRecord&)>& fn,
      const std::function<void(const std::string& key, const std::string& why)>& bad) const;
  // Deletes a raw key (used for undecodable records found by ForEach).
  Status DeleteRaw(const std::string& key);
  // Writes a raw value under a block hash key (tests plant malformed records).
  Status PutRaw(const BlockHash& h, const std::string& value);

  // The stored geometry, or nullopt for a new database.
  Result<std::optional<DiskGeometry>> GetGeometry() const;
  Status PutGeometry(const DiskGeometry& g);

 private:
  struct Rep;
  explicit DiskIndex(std::unique_ptr<Rep> rep);
  std::unique_ptr<Rep> rep_;
};

std::string EncodeDiskIndexRecord(const DiskIndexRecord& rec);
Result<DiskIndexRecord> DecodeDiskIndexRecord(std::string_view value);

}  // namespace strata::kvcache
