#pragma once
// KvManager: the narrow interface the scheduler and generation use to get KV
// blocks (DESIGN.md: "blocks, or not now"). Behind it: the device BlockPool
// with its prefix index, and an optional lower tier (host DRAM; any
// BlockStore) that receives full blocks by write-through and serves prefix
// hits by asynchronous loads into device blocks.
//
// Per request:
//   AddRequest(id, prompt, salt)  hashes the prompt's full blocks once.
//   Allocate(id, n)               makes the block table cover n positions.
//                                 The first call takes the cached prefix:
//                                 device hits are shared (ref counted), host
//                                 hits get fresh device blocks and loads are
//                                 queued. kNotNow when the pool cannot supply
//                                 the blocks even after evicting; then nothing
//                                 changed. At most prompt_tokens - 1 tokens
//                                 come from cache (the last is always computed
//                                 for its logits), in whole blocks.
//   IsReady(id) / Poll()          loads finish when Poll() sees their
//                                 completions; until IsReady(id), the request
//                                 must not be run. Then CachedTokens(id)
//                                 positions hold KV (a failed load lowers it:
//                                 the rest is recomputed).
//   Commit(id, tokens)            after a forward step: names the blocks that
//                                 `tokens` (all tokens with KV so far) fill,
//                                 so later requests hit them; queues
//                                 write-through to the lower tier.
//   Free(id)                      releases blocks, tail first (so a chain's
//                                 tail is evicted before its head).
//
// Metadata-only mode: with no device memory function, no bytes move (the
// lower tier should then be metadata-only too); the same policy runs, for the
// cluster simulator. Time comes from the injected Clock.
//
// Thread-safety: none. One thread (the engine loop) calls everything; the
// lower tier is driven from that thread too (BlockStore's rule).

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "common/status.h"
#include "common/strong_id.h"
#include "kvcache/block_hash.h"
#include "kvcache/block_pool.h"
#include "kvcache/block_store.h"
#include "kvcache/clock.h"

namespace strata::kvcache {

enum class WritePolicy {
  kNone,          // nothing goes down to the lower tier
  kWriteThrough,  // every newly full block is copied down when committed
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
};

// Device block memory: the start of block `id` (block_bytes long), e.g.
// ForwardEngine::block_data. Empty function = metadata-only mode.
using BlockMemoryFn = std::function<uint8_t*(BlockId)>;

// How much of a prompt is cached: `device_tokens` leading tokens in device
// blocks, then `lower_tokens` more in the lower tier. Already capped at
// prompt_tokens - 1 and whole blocks.
struct PrefixMatch {
  int32_t device_tokens = 0;
  int32_t lower_tokens = 0;
  int32_t total() const { return device_tokens + lower_tokens; }
};

enum class AllocOutcome { kAllocated, kNotNow };

struct TierHits {
  uint64_t blocks = 0;
  uint64_t tokens = 0;
};

struct KvManagerStats {
  uint64_t queries = 0;        // requests whose prefix was looked up (first Allocate)
  uint64_t query_tokens = 0;   // their prompt tokens
  TierHits device;             // prefix blocks shared from device
  TierHits lower;              // prefix blocks loaded from the lower tier (completed OK)
  uint64_t bytes_down = 0;     // device → lower tier (writes completed OK)
  uint64_t bytes_up = 0;       // lower tier → device (loads completed OK)
  uint64_t writes_failed = 0;
  uint64_t loads_failed = 0;
  int64_t load_nanos = 0;      // sum over loads of submit→completion (Clock time)
  BlockPoolStats device_pool;  // includes device evictions
};

class KvManager {
 public:
  // `lower` (may be null: device only) and `clock` must outlive the manager.
  // REQUIRES: block_size > 0, num_device_blocks >= 0; block_bytes > 0 when
  // `device_memory` is set.
  static Result<std::unique_ptr<KvManager>> Create(const KvManagerOptions& options,
                                                   BlockMemoryFn device_memory,
                                                   BlockStore* lower, Clock* clock);
  // Waits for (drains) the lower tier's outstanding operations.
  ~KvManager();
  KvManager(const KvManager&) = delete;
  KvManager& operator=(const KvManager&) = delete;

  const KvManagerOptions& options() const { return options_; }

  // Pure query (no state change, no stats): how much of `prompt` would hit now.
  PrefixMatch Match(std::span<const int32_t> prompt, std::string_view cache_salt) const;

  // Starts tracking a request. InvalidArgument if `id` is already tracked or
  // the prompt is empty.
  Status AddRequest(RequestId id, std::span<const int32_t> prompt, std::string_view cache_salt);

  // Makes the request's block table cover `num_tokens` positions (the first
  // call also takes the cached prefix, possibly covering more). kNotNow:
  // not enough blocks now; state unchanged, retry after others free. Errors:
  // NotFound for an unknown id.
  Result<AllocOutcome> Allocate(RequestId id, int32_t num_tokens);

  // Block ids for positions [0, block_size * size()) of the request, as ForwardSeq
  // wants them. Valid until the next Allocate/Free of this request. Empty
  // for an unknown id.
  std::span<const int32_t> BlockTable(RequestId id) const;
  // False while loads for the request are in flight. True for unknown ids.
  bool IsReady(RequestId id) const;
  // Leading positions whose KV came from cache (0 before the first
  // Allocate). Final once IsReady(id). This is the "cached tokens" count.
  int32_t CachedTokens(RequestId id) const;

  // `tokens`: every token whose KV is now in the request's blocks (prompt
  // prefix, then generated ones), in order. REQUIRES: IsReady(id), tokens
  // start with the prompt given to AddRequest (or a prefix of it), and the
  // block table covers tokens.size() positions (else InvalidArgument).
  Status Commit(RequestId id, std::span<const int32_t> tokens);

  // Releases the request's blocks (tail first). Loads still in flight keep
  // their blocks until they complete. Unknown ids are ignored.
  void Free(RequestId id);

  // Handles finished lower-tier operations. Never blocks. Returns how many.
  size_t Poll();

  KvManagerStats stats() const;
  size_t num_requests() const { return requests_.size(); }
  const BlockPool& device_pool() const { return pool_; }

 private:
  struct Request {
    std::vector<int32_t> prompt;
    std::string salt;
    std::vector<BlockHash> chain;  // hashes of full blocks known so far
    std::vector<int32_t> table;
    bool prefix_taken = false;
    int32_t cached_blocks = 0;     // leading blocks served from cache
    int32_t device_hit_blocks = 0;
    int32_t loads_pending = 0;
    int32_t load_ok_until = 0;     // loads of blocks >= this failed
    int32_t committed_blocks = 0;  // blocks [0, this) are named or settled
  };
  enum class OpKind { kLoad, kWrite };
  struct Op {
    OpKind kind;
    RequestId request;
    int32_t block_index = 0;  // in the request's chain (loads)
    BlockId block;
    BlockHash hash;
    int64_t start_nanos = 0;
  };

  KvManager(const KvManagerOptions& options, BlockMemoryFn device_memory, BlockStore* lower,
            Clock* clock);
  int32_t MaxCachedBlocks(size_t prompt_tokens, size_t chain_blocks) const;
  size_t CountDeviceHits(std::span<const BlockHash> chain, size_t max_blocks) const;
  size_t CountLowerHits(std::span<const BlockHash> chain, size_t from, size_t max_blocks) const;
  Result<AllocOutcome> TakePrefix(RequestId id, Request& r, int32_t num_tokens);
  void SubmitLoad(RequestId id, Request& r, int32_t index);
  void SubmitWrite(BlockId block, const BlockHash& h);
  void FinishLoads(Request& r);
  void Complete(const StoreCompletion& c);
  std::span<uint8_t> BlockSpan(BlockId id) const;

  const KvManagerOptions options_;
  const BlockMemoryFn memory_;
  BlockStore* const lower_;
  Clock* const clock_;
  BlockPool pool_;
  std::unordered_map<RequestId, Request> requests_;
  std::unordered_map<uint64_t, Op> ops_;
  std::unordered_set<BlockHash, BlockHashHasher> writes_in_flight_;
  uint64_t next_tag_ = 1;
  KvManagerStats stats_;
  std::vector<StoreCompletion> completions_;  // reused by Poll
};

}  // namespace strata::kvcache
