#pragma once
// The holder side of the cluster KV pool (issue 18): what one `strata
// serve` answers to its peers about its own blocks, behind the HTTP routes
// of cluster/kv_wire.h.
//
//   events / snapshot   read from the instance's KvEventLog (the KV manager
//                       records into it and flushes one batch per step).
//   resolve             on the engine thread (the KV manager is not
//                       thread-safe; the caller gives Engine::Post): for the
//                       leading requested blocks held in an exported tier
//                       (the host tier, whose memory the transfer engine
//                       exports), answers (segment, offset, length, XXH3)
//                       and pins each block so it is neither evicted nor
//                       moved until the lease ends or the reader releases it.
//                       A block held only in a disk tier is first staged:
//                       read (through the KV manager's mover) into a slot of
//                       the staging area, which is exported too; the answer
//                       waits for those reads. Host before disk: a block in
//                       both is answered from the host tier.
//   release             unpins a lease's blocks and frees its staging slots.
// A lease not released by its deadline is unpinned by the holder's own
// timer thread (through the engine thread): a reader that died or stalled
// never keeps blocks pinned. A reader still reading after that may read
// bytes that were meanwhile replaced: its checksum check catches it.
//
// Thread-safety: Handle and stats from any thread; replies are sent from
// the engine thread (resolve) or the caller's.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "kvcache/kv_event_log.h"
#include "kvcache/kv_manager.h"

namespace strata::cluster {

using ReplyFn = std::function<void(int status, std::string body)>;
using EngineTask = std::function<void(kvcache::KvManager&)>;
// Runs a task on the engine thread; false when the engine is stopping.
using PostFn = std::function<bool(EngineTask)>;

struct ExportedTier {
  size_t tier = 0;      // lower-tier index in the KV manager's chain
  std::string segment;  // its export name at the transfer engine
};

// Host memory where disk-only blocks are staged for peers (registered in the
// KV manager's segment table, exported to the transfer engine as `segment`):
// `slots` slots of `stride` bytes (block_bytes rounded up to 4 KiB) from
// `base`, at offsets slot * stride of the segment.
struct StagingArea {
  std::string segment;
  SegmentId segment_id;
  uint8_t* base = nullptr;
  uint64_t stride = 0;
  uint64_t block_bytes = 0;
  int slots = 0;
};

struct HolderStats {
  uint64_t resolves = 0;        // resolve requests answered
  uint64_t blocks_pinned = 0;   // blocks answered (and pinned)
  uint64_t releases = 0;        // leases released by their readers
  uint64_t leases_expired = 0;  // leases unpinned at their deadline
  uint64_t leases_active = 0;
  uint64_t blocks_staged = 0;   // disk-only blocks staged into host memory for a peer
  uint64_t stage_failures = 0;  // stagings that failed (read error) or found no free slot
};

class KvHolder {
 public:
  // `log` outlives the holder; `max_lease` caps what a reader may ask.
  // `disk_tiers`: lower-tier indices whose blocks may be staged into
  // `staging` (none without a staging area).
  KvHolder(kvcache::KvEventLog* log, PostFn post, std::vector<ExportedTier> tiers,
           std::chrono::milliseconds max_lease = std::chrono::seconds(30), std::vector<size_t> disk_tiers = {},
           StagingArea staging = {});
  // Stop(). Pins still held are left to the KV manager's stores (destroyed
  // with them).
  ~KvHolder();
  // Shutdown, before the KV manager drains: the timer stops, requests get
  // 503, and resolves still waiting for a staging read are dropped without
  // a reply when it completes. The holder must stay alive until the KV
  // manager is destroyed (its staging callbacks may still run). Idempotent.
  void Stop();
  KvHolder(const KvHolder&) = delete;
  KvHolder& operator=(const KvHolder&) = delete;

  // Answers a request under /internal/kv/ through `reply` (exactly once);
  // false (reply not called) for a path it does not serve.
  bool Handle(const std::string& method, const std::string& path, const std::string& query, const std::string& body,
              ReplyFn reply);
  HolderStats stats() const;

 private:
  struct Lease {
    std::chrono::steady_clock::time_point deadline;
    std::vector<std::pair<size_t, BlockHash>> pins;  // (tier, hash)
    std::vector<int> slots;                          // staging slots
  };
  struct PendingResolve;
  // On the engine thread: answers the request once its stagings are done.
  void FinishResolve(const std::shared_ptr<PendingResolve>& p);
  int TakeSlot();
  // Frees a lease's staging slots and unpins its blocks.
  void Drop(Lease lease);
  void Events(const std::string& query, const ReplyFn& reply) const;
  void Resolve(const std::string& body, ReplyFn reply);
  void Release(const std::string& body, const ReplyFn& reply);
  // Unpins on the engine thread (dropped when the engine is stopping).
  void Unpin(std::vector<std::pair<size_t, BlockHash>> pins);
  void TimerLoop();

  kvcache::KvEventLog* const log_;
  const PostFn post_;
  const std::vector<ExportedTier> tiers_;
  const std::chrono::milliseconds max_lease_;
  const std::vector<size_t> disk_tiers_;
  const StagingArea staging_;
  std::vector<int> free_slots_;  // mu_
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::map<uint64_t, Lease> leases_;
  std::atomic<bool> stopped_{false};
  uint64_t next_lease_ = 1;
  HolderStats stats_;
  std::thread timer_;
};

}  // namespace strata::cluster
