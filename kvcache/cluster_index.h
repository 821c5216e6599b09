#pragma once
// The cluster KV index: which instance holds which block, in which tier,
// built from the instances' published events (issue 18; DESIGN.md
// decision 7). A library: the remote tier asks it who holds the blocks the
// local tiers lack, and the router (later) asks it how much of a prompt
// each instance has cached.
//
// Each instance publishes batches of `stored` / `removed` events for its
// blocks (hash, tier), numbered with consecutive per-instance sequence
// numbers and tagged with the process's incarnation (random per start).
// The index applies them in order:
//   - a batch already applied (or the applied part of an overlapping one)
//     is ignored: duplicates are harmless;
//   - a batch from the future (a gap) waits, up to kMaxPending batches per
//     instance; past that the instance needs a snapshot. A subscriber also
//     asks for one when a gap lasts (status().pending > 0 for longer than
//     reordering explains, e.g. it joined after the instance's first
//     batches);
//   - a newer incarnation drops everything the older one published at once
//     (the new process lacks those blocks) and expects its sequence 1;
//     batches and snapshots of an older incarnation than the newest seen
//     are ignored (kStale), also after the instance was removed;
//   - a snapshot (the instance's whole state as of sequence S, asked of
//     the live process) replaces the instance's state, then waiting batches
//     after S apply; a snapshot older than what was applied is ignored.
// It is exact for what was applied: no block is reported that the
// instance's applied events do not say it holds.
//
// Thread-safety: all methods may be called from any thread (one mutex).

#include <cstdint>
#include <map>
#include <mutex>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/sha256.h"
#include "kvcache/block_hash.h"
#include "kvcache/tier_kind.h"

namespace strata::kvcache {

struct KvEvent {
  enum class Kind : uint8_t { kStored, kRemoved };
  Kind kind = Kind::kStored;
  BlockHash hash;
  TierKind tier = TierKind::kDevice;
};

// Incarnations are ordered by (epoch, id): epoch is the process's start
// time (Unix ms), id is random, so a restart is always newer and late
// traffic from an older process is recognised.

// Events seq_first, seq_first + 1, ... (one per event), from one instance.
struct KvEventBatch {
  std::string instance;
  std::string incarnation;
  uint64_t epoch = 0;      // start time of the incarnation (Unix ms)
  uint64_t seq_first = 1;  // sequence numbers start at 1 in each incarnation
  std::vector<KvEvent> events;
};

// An instance's whole state after applying its events up to `seq`.
struct KvSnapshot {
  std::string instance;
  std::string incarnation;
  uint64_t epoch = 0;
  uint64_t seq = 0;
  std::vector<std::pair<BlockHash, TierKind>> blocks;
};

// Which tiers of one instance hold a block.
using TierMask = uint8_t;
inline constexpr TierMask MaskOf(TierKind t) { return static_cast<TierMask>(1u << static_cast<unsigned>(t)); }

struct PrefixHolder {
  std::string instance;
  size_t blocks = 0;           // leading blocks of the chain it holds
  std::vector<TierMask> tiers; // per block of that prefix
};

class ClusterKvIndex {
 public:
  static constexpr size_t kMaxPending = 64;

  enum class ApplyResult {
    kApplied,       // the new events are applied (maybe along with waiting ones)
    kDuplicate,     // nothing new
    kWaiting,       // after a gap: kept until the missing batches come
    kNeedSnapshot,  // the instance's state is unknown until ApplySnapshot
    kStale,         // from a retired incarnation: ignored
  };
  ApplyResult Apply(const KvEventBatch& batch);
  // Replaces the instance's state; false (ignored) for an older incarnation
  // or an older sequence than already applied.
  bool ApplySnapshot(const KvSnapshot& snapshot);
  // The instance left (its lease ended): forget its blocks. Its incarnation
  // (and older ones) stay retired: their late traffic is ignored.
  void RemoveInstance(const std::string& instance);
  // The subscriber sees `instance` listed as a member again under the very
  // incarnation it removed (it was only unreachable, or the store lost it
  // for a while): lifts the tombstone so that a snapshot from the live
  // process applies again. No-op for any other incarnation.
  void Readmit(const std::string& instance, const std::string& incarnation);

  // Every instance holding at least the first block of `chain`, with how many
  // leading blocks it holds, longest first (ties by name).
  std::vector<PrefixHolder> LongestPrefix(std::span<const BlockHash> chain) const;
  // The tiers of `instance` holding `hash` (0 if none).
  TierMask Holds(const std::string& instance, const BlockHash& hash) const;

  struct InstanceStatus {
    std::string incarnation;
    uint64_t applied_seq = 0;   // last sequence number applied
    size_t blocks = 0;          // distinct blocks held
    size_t pending = 0;         // batches waiting after a gap
    bool needs_snapshot = false;
  };
  std::map<std::string, InstanceStatus> status() const;

 private:
  struct Instance {
    std::string incarnation;
    uint64_t epoch = 0;
    bool removed = false;       // a tombstone: (epoch, incarnation) and older are stale
    uint64_t applied = 0;
    bool needs_snapshot = false;
    std::map<uint64_t, KvEventBatch> pending;  // by seq_first
    std::unordered_map<BlockHash, TierMask, BlockHashHasher> blocks;
  };
  void ApplyEvents(const std::string& name, Instance& in, const KvEventBatch& b, uint64_t from_seq);
  void DrainPending(const std::string& name, Instance& in);
  void Clear(const std::string& name, Instance& in);
  // Switches `in` to a newer incarnation, dropping the older one's state.
  void Reincarnate(const std::string& name, Instance& in, uint64_t epoch, const std::string& incarnation);
  // -1: (epoch, inc) is older than the instance's; 0: the same; 1: newer
  // (or the instance is fresh).
  static int Compare(const Instance& in, bool fresh, uint64_t epoch, const std::string& incarnation);
  void AddPending(Instance& in, const KvEventBatch& b);
  void Set(const std::string& name, Instance& in, const BlockHash& h, TierMask mask);

  mutable std::mutex mu_;
  std::map<std::string, Instance> instances_;
  // hash → instances holding it (for prefix queries).
  std::unordered_map<BlockHash, std::map<std::string, TierMask>, BlockHashHasher> holders_;
};

}  // namespace strata::kvcache
