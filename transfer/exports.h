#pragma once
// What a process lets its peers touch: the owner side of the transfer
// engine's access rules.
//
// Two kinds of export, each named by a handle (never reused):
//   - a readable segment: any authenticated peer may open it by name and read
//     any bytes inside it, never write;
//   - a grant: one region of a host segment, writable (and readable) by one
//     named peer, until its lease ends or the owner revokes it (a decode
//     instance grants the blocks it reserved for a request to that request's
//     prefill instance).
// Every remote access is checked here when it arrives (Begin), and holds the
// export "active" until End. Revocation before reuse: Revoke stops new
// accesses at once and returns the connections whose accesses are in flight
// (the engine shuts them down, so a stalled write's late bytes never land);
// Quiesced(handle) turns true when no access is in flight and every peer that
// maps the memory directly (shared memory) has acknowledged. Only then may
// the owner hand the memory out again.
//
// Thread-safety: every method may be called from any thread.

#include <chrono>
#include <cstdint>
#include <mutex>
#include <optional>
#include <set>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/memory_segment.h"
#include "common/status.h"

namespace strata::transfer {

using Clock = std::chrono::steady_clock;

enum class Access : uint8_t {
  kPrivate,   // registered, not exported: peers reach it only through grants
  kReadable,  // any authenticated peer may read it
};

// What a peer learns when it opens an export.
struct ExportView {
  uint64_t handle = 0;
  uint64_t length = 0;
  bool writable = false;
  uint64_t base_address = 0;  // the owner's virtual address (used by same-host shared-memory access)
  int64_t expires_ns = 0;     // CLOCK_MONOTONIC of the lease end; 0 = no lease (readable segments)
  std::string name;
  int memfd = -1;             // the owner's memfd holding it (SharedHostMemory), -1 when none
  uint64_t memfd_offset = 0;  // where it starts in that memfd
};

class ExportTable {
 public:
  // Exports a host-addressable segment for reading by every peer under
  // `name` (unique). kPrivate segments are not exported (nothing to do).
  Result<uint64_t> ExportSegment(const Segment& seg, std::string name);
  // Withdraws a readable segment (same rules as Revoke).
  Status Unexport(const std::string& name);

  // Grants `grantee` read and write access to [base, base + length) (host
  // memory) until now + lease. InvalidArgument: empty grantee, zero length,
  // lease <= 0.
  Result<uint64_t> Grant(uint8_t* base, uint64_t length, std::string grantee, std::chrono::nanoseconds lease);
  // Stops new accesses to `handle` now. Returns the ids of the connections
  // whose accesses to it are in flight (to be shut down). NotFound for an
  // unknown handle.
  Result<std::vector<uint64_t>> Revoke(uint64_t handle);
  // Revoked (or withdrawn), no access in flight, no direct mapper left.
  bool Quiesced(uint64_t handle) const;
  // Forgets a quiesced handle (its number is never reused).
  void Forget(uint64_t handle);

  // Opening, for `peer` (its authenticated name). `direct_conn` != 0: the
  // peer will access the memory directly (same-host shared memory), and
  // that control connection must then acknowledge a revocation (AckRevoke)
  // or close (ConnectionGone).
  Result<ExportView> OpenSegment(const std::string& name, const std::string& peer, uint64_t direct_conn);
  Result<ExportView> OpenGrant(uint64_t handle, const std::string& peer, uint64_t direct_conn,
                               Clock::time_point now);
  // The handle of a readable segment exported under `name`.
  std::optional<uint64_t> HandleOf(const std::string& name) const;

  // Checks an access on arrival and marks it in flight on `connection`.
  // Returns the memory to read or write. PermissionDenied-like errors are
  // InvalidArgument (unknown handle, no grant for this peer, write to a
  // readable segment, revoked, lease over) and OutOfRange (bounds).
  Result<uint8_t*> Begin(uint64_t handle, const std::string& peer, uint64_t offset, uint64_t length, bool write,
                         uint64_t connection, Clock::time_point now);
  void End(uint64_t handle, uint64_t connection);

  // The control connections that must acknowledge a revocation of `handle`.
  std::vector<uint64_t> DirectMappers(uint64_t handle) const;
  void AckRevoke(uint64_t handle, uint64_t conn);
  // A control connection closed: its direct mappings and acknowledgements
  // no longer matter (the peer drops every mapping when it loses it).
  void ConnectionGone(uint64_t conn);

  size_t live_exports() const;
  uint64_t refused() const;

 private:
  struct Entry {
    uint64_t handle = 0;
    std::string name;
    uint8_t* base = nullptr;
    uint64_t length = 0;
    bool writable = false;
    std::string grantee;  // empty for readable segments
    int memfd = -1;
    uint64_t memfd_offset = 0;
    Clock::time_point expires = Clock::time_point::max();
    bool revoked = false;
    std::unordered_map<uint64_t, int> active;  // connection → accesses in flight
    std::set<uint64_t> direct;                 // control connections mapping it directly (unacknowledged)
  };
  Result<ExportView> View(const Entry& e) const;

  mutable std::mutex mu_;
  std::unordered_map<uint64_t, Entry> entries_;
  std::unordered_map<std::string, uint64_t> by_name_;
  uint64_t next_handle_ = 1;
  uint64_t refused_ = 0;
};

}  // namespace strata::transfer
