#pragma once
// The KV cache's plain types, shared by the KV manager (kv_manager.h), the
// tier mover (tier_mover.h), the tier registry and the engine: policies,
// options, the lower-tier chain's entries and prefix matches (statistics are
// in kv_stats.h).
//
// Thread-safety: plain values.

#include <array>
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "common/copy_engine.h"
#include "common/memory_segment.h"
#include "common/sha256.h"
#include "common/strong_id.h"
#include "kvcache/block_store.h"
#include "kvcache/kv_stats.h"

namespace strata::kvcache {

enum class WritePolicy {
  kNone,          // nothing goes down to the lower tier
  kWriteThrough,  // every newly full block is copied down when committed
  kWriteBack,     // a block is copied down when the device pool evicts it
  // Write-back, and a block loaded from this tier moves up: once the device
  // holds it, the tier drops its copy (promotion on hit), so the tiers hold
  // no block twice and their capacities add up (an exclusive hierarchy).
  // Costs a write each time the device evicts a block again.
  kExclusive,
};

enum class LoadPolicy {
  kAuto,    // load when cheaper than recomputing (estimates below); unknown → load
  kAlways,  // always load lower-tier hits
  kNever,   // never load; recompute (lower tier still written)
};

struct KvManagerOptions {
  int block_size = 16;
  int32_t num_device_blocks = 0;
  uint64_t block_bytes = 0;  // bytes of one block (KvLayout::block_bytes); >0 with memory
  Sha256Digest ns{};         // NamespaceDigest of the model
  WritePolicy write_policy = WritePolicy::kWriteThrough;
  LoadPolicy load_policy = LoadPolicy::kAuto;
  // Estimates for kAuto (measured at start by the engine); 0 = unknown.
  double lower_read_bytes_per_s = 0;
  double recompute_tokens_per_s = 0;
  // Staging memory (kvcache/tier_mover.h) for write-back tiers, and for
  // every load and write when the device memory is not host-addressable:
  // at most max(1, this / block_bytes) block buffers, allocated on demand.
  uint64_t writeback_staging_bytes = 64ull << 20;
  // What memory the device blocks are when given as a BlockMemoryFn (the
  // CPU backend's pool is host memory); a DeviceKv's segment says its own.
  SegmentKind device_memory_kind = SegmentKind::kHost;
  // The device pool's eviction policy (kvcache/eviction_policy.h names).
  std::string eviction_policy = kDefaultEvictionPolicy;
};

// The device KV pool as the KV manager sees it; the backend allocates it
// (model/backend/backend.h) and hands the same pool to the forward pass.
// Segment `segment` of `segments` holds num_device_blocks blocks of
// block_bytes each from offset 0, and `copy` moves bytes between it and host
// memory registered in `segments`. Nothing is owned; all outlive the
// manager. A segment that is not host-addressable (a GPU's memory) is never
// handed to a store: loads and writes stage through host buffers the mover
// registers in `segments`, copied by `copy`. An invalid segment (with the
// table and engine still given) is metadata-only mode.
struct DeviceKv {
  SegmentTable* segments = nullptr;
  SegmentId segment;
  CopyEngine* copy = nullptr;
};

// Device block memory given as a function, a convenience for tests and
// tools that own a plain host buffer: the start of block `id` (block_bytes
// long). The blocks must form one contiguous range (block i at block 0 +
// i * block_bytes); the manager registers it, with
// KvManagerOptions::device_memory_kind, in a segment table of its own and
// copies with a CpuCopyEngine of its own. Empty function = metadata-only.
using BlockMemoryFn = std::function<uint8_t*(BlockId)>;

// How much of a prompt is cached: `device_tokens` leading tokens in device
// blocks, then `lower_tokens` more in the lower tier. Already capped at
// prompt_tokens - 1 and whole blocks.
struct PrefixMatch {
  int32_t device_tokens = 0;
  int32_t lower_tokens = 0;               // sum over lower tiers
  std::vector<int32_t> lower_tier_tokens;  // per lower tier, in chain order
  // The lower hits block by block: the source tier (index into the chain)
  // of blocks [device_tokens / block_size, + lower_sources.size()).
  std::vector<int> lower_sources;
  int32_t total() const { return device_tokens + lower_tokens; }
};

// An asynchronous lookup's state (KvManager::TakeLookup).
enum class LookupState {
  kPending,  // not answered yet, deadline not passed
  kDone,     // answered
  kExpired,  // the deadline passed first: the lower tiers count as a miss
};

// One lower tier of the chain, in order (host before disk).
struct LowerTier {
  BlockStore* store = nullptr;  // not owned; must outlive the manager
  WritePolicy write_policy = WritePolicy::kWriteThrough;
  // 0: every newly full block is written when committed. N > 0: a block is
  // written only once it was hit (served from cache to a request) N times;
  // hits are counted per hash in this process's memory (not across restarts).
  uint32_t admit_after = 0;
  double read_bytes_per_s = 0;  // kAuto estimate for this tier; 0 = unknown
  // The tier's name in stats, the API and metrics (unique when the tier
  // registry built the chain); empty = the store's name().
  std::string name = {};
  // Set by the KvManager, not by callers: a write-through tier that is the
  // last of the one hierarchy policy also takes the blocks the level above
  // drops when it lacks them, as a write-back tier does (it evicts its
  // copies of blocks held above first: kvcache/hierarchy_policy.h).
  bool takes_drops = false;
};

enum class AllocOutcome { kAllocated, kNotNow };

// Where a cached block of a request came from.
inline constexpr int kDeviceTier = 0;  // lower tier i is reported as i + 1

}  // namespace strata::kvcache
