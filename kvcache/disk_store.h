#pragma once
// The disk tier (DESIGN.md decision 4): KV blocks in fixed slots of slab files
// in one directory, written and read with O_DIRECT through io_uring, indexed
// by a RocksDB database in the same directory. The store survives restarts,
// kill -9 included: reopening the directory serves what was indexed.
//
// Layout of `directory`:
//   index/                RocksDB: hash → {slot, length, checksum, namespace,
//                         last use}; see disk_index.h
//   slab-NNNNN.dat        slab files of `slab_file_bytes`, `slot_bytes` slots
//
// Crash safety: a block's index entry is written only after its data write
// completed, so a crash leaves at worst an orphan slot (reused later), never an
// entry that points at garbage. Each read checks length and checksum (XXH3
// over hash ‖ namespace ‖ data); a mismatch, a slot past the end of its slab
// file or of the store, or a namespace outside `namespaces` completes with an
// error, drops the entry, counts a corrupt block and logs. Nothing unchecked
// is ever handed out.
//
// Space: slab files grow on demand in chunks with fallocate, so a disk that
// fills up shows as write completions with ResourceExhausted (counted in
// write_errors), never a failed Open; after such an error the store stops
// growing and keeps working within the space it has (LRU eviction), reads of
// stored blocks continue. Capacity is counted in slots: capacity_bytes /
// slot_bytes blocks, evicted LRU by last use (kept across restarts).
//
// Memory: reads and writes name regions of host-addressable memory in the
// attached SegmentTable (device memory is refused: stage it through host
// memory first). Attach registers the slab files as one kFile segment of
// the store's capacity and the bounce buffers (bounce_buffers slots, used
// when a caller's region is not 4096-aligned) as host memory.
//
// Thread-safety: as BlockStore, one thread drives a store. Two stores must not
// share a directory (RocksDB's lock makes the second Open fail).

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "common/sha256.h"
#include "common/status.h"
#include "kvcache/block_store.h"

namespace strata::kvcache {

struct DiskStoreOptions {
  std::string directory;        // created (one level) if missing
  uint64_t capacity_bytes = 0;  // > 0; rounded down to whole slots
  uint64_t block_bytes = 0;     // fixed per store, >= 4096
  // Rounded down to whole slots (at least one slot per slab).
  uint64_t slab_file_bytes = 1ull << 30;
  // Slab files grow by this much at a time (rounded to slots, capped by the
  // slab size); a failed chunk falls back to one slot.
  uint64_t grow_bytes = 64ull << 20;
  // Free space slabs never grow into: RocksDB must never meet a full disk
  // (Debian's build asserts on a failed WAL write). Growth that would leave
  // less than this free is refused like ENOSPC.
  uint64_t reserve_bytes = 32ull << 20;
  // I/Os in flight (the io_uring's size). The store has no thread: it
  // starts queued I/Os only when polled or handed a new one, so this bounds
  // what one poll gets going. The engine polls twice a step, and a step
  // commits up to max_batch_tokens / block_size blocks, each written
  // through, with the host tier's drops coming down too: with 32, a long
  // prefill's writes fell seconds behind (docs/simulator.md).
  unsigned queue_depth = 256;
  // Bounce buffers (one slot each) for I/O on memory that is not
  // 4096-aligned; such I/O waits for a free one. At most queue_depth.
  unsigned bounce_buffers = 32;
  // Namespaces this store serves; empty = every namespace. A stored block of
  // another namespace is foreign: not counted by Contains/CountPrefix, and a
  // read of it fails, drops it and counts it corrupt.
  std::vector<Sha256Digest> namespaces;
  // Which stored block a full store evicts (kvcache/eviction_policy.h
  // names). Each block's last use is kept in the index, so after a reopen
  // lru resumes its order; the other policies restart from that order with
  // no history (hits, frequencies, ghosts). Under a host tier, a write-back
  // or exclusive disk gets its view of the KvManager's hierarchy policy
  // instead (ReplaceEvictionPolicy; kvcache/hierarchy_policy.h).
  std::string eviction_policy = kDefaultEvictionPolicy;
};

class DiskStore : public BlockStore {
 public:
  // Opens or creates the store in options.directory and rebuilds the free-slot
  // list and the eviction order (by each block's last use) from the index.
  // Index records that cannot be valid (bad encoding, wrong length, slot past
  // the end of the store or of its slab file) are dropped, logged and counted
  // in corrupt_blocks. A directory written with another block or slot size is
  // wiped (logged), since its slots cannot be read with this geometry. Fails
  // with InvalidArgument for bad options (an unknown eviction_policy too),
  // IoError when the directory, index or io_uring cannot be opened.
  static Result<std::unique_ptr<DiskStore>> Open(const DiskStoreOptions& options);

  // Slot size: block_bytes rounded up to 4096.
  virtual uint64_t slot_bytes() const = 0;
  virtual const DiskStoreOptions& options() const = 0;
  // I/Os submitted to the kernel and not yet completed (at most
  // queue_depth), and I/Os queued behind them (waiting for room in the
  // ring or for a bounce buffer).
  virtual size_t ios_in_flight() const = 0;
  virtual size_t ios_queued() const = 0;
};

}  // namespace strata::kvcache
