#pragma once
// Memory segments and regions: where KV bytes live, named so that a copy
// engine, a transfer engine (remote reads into a segment and offset), an
// RDMA NIC or a GPU can be told *which memory* a block is in, not just a
// pointer.
//
// A segment is a registered range of memory of one kind: host DRAM (pageable
// or pinned), device memory (the backend's KV pool on a GPU), or a file (a
// disk tier's storage, reached only through its store's I/O). A region is
// (segment, offset, length) inside one. The SegmentTable owns nothing: the
// memory belongs to whoever registered it, who must Unregister it before
// freeing it.
//
// Thread-safety: SegmentTable is safe to call from any thread (a transfer
// engine resolves regions on its own threads while the engine thread
// registers staging buffers). Segment and Region are plain values.

#include <cstdint>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>

#include "common/status.h"
#include "common/strong_id.h"

namespace strata {

enum class SegmentKind : unsigned char {
  kHost,        // pageable host DRAM
  kPinnedHost,  // page-locked host DRAM (cudaHostRegister): DMA-able
  kDevice,      // memory of the backend's device (a GPU's HBM): not host-addressable
  kFile,        // a file's bytes: reached through its store's I/O, never by pointer
};

std::string_view SegmentKindName(SegmentKind k);
// Host and pinned host memory can be read and written through `base`.
constexpr bool HostAddressable(SegmentKind k) { return k == SegmentKind::kHost || k == SegmentKind::kPinnedHost; }

// Registered ids start at 1: SegmentId() (0) names no segment.
constexpr bool IsValid(SegmentId id) { return id.value() != 0; }

struct Segment {
  SegmentId id;
  SegmentKind kind = SegmentKind::kHost;
  uint8_t* base = nullptr;  // the first byte (a device pointer for kDevice; null for kFile)
  uint64_t size = 0;        // bytes
  std::string name;         // for messages: "device-kv", "host tier", "staging 3", ...
};

struct Region {
  SegmentId segment;
  uint64_t offset = 0;
  uint64_t length = 0;
  friend bool operator==(const Region&, const Region&) = default;
};

class SegmentTable {
 public:
  SegmentTable() = default;
  SegmentTable(const SegmentTable&) = delete;
  SegmentTable& operator=(const SegmentTable&) = delete;

  // Registers [base, base + size) of `kind` under a new id (never reused).
  // InvalidArgument: size 0; a null base for a kind other than kFile; an
  // address range that overflows; a host-addressable range overlapping one
  // already registered (a pointer must locate one segment).
  Result<SegmentId> Register(SegmentKind kind, uint8_t* base, uint64_t size, std::string name);
  // NotFound for an unknown id. Regions of it are refused from then on.
  Status Unregister(SegmentId id);

  std::optional<Segment> Get(SegmentId id) const;
  size_t size() const;

  // OK when `r` names a registered segment, has length > 0 and lies inside
  // it; else InvalidArgument / NotFound saying which segment and bounds.
  Status Check(const Region& r) const;
  // The bytes of a region of host-addressable memory (Check, plus the kind).
  Result<std::span<uint8_t>> Resolve(const Region& r) const;
  // The region of host-addressable memory [p, p + length) lies in: NotFound
  // when no registered segment holds all of it.
  Result<Region> Locate(const uint8_t* p, uint64_t length) const;

 private:
  Status CheckLocked(const Region& r) const;

  mutable std::mutex mu_;
  std::unordered_map<SegmentId, Segment> segments_;
  uint32_t next_id_ = 1;
};

}  // namespace strata
