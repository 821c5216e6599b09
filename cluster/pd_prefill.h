#pragma once
// The prefill side of prefill/decode disaggregation (issue 19), behind
// `strata serve`'s POST /internal/pd/prefill (cluster/pd_wire.h): runs the
// request to its first token (pause_after), pins the prompt's blocks it
// computed (a KvManager reservation on its own pool, on the engine
// thread), writes those the decode instance asked for into its grants
// (transfer engine, one write per block, on this class's worker thread:
// opening grants is a blocking round trip), and answers with the paused
// stream (first token, continuation) and how many blocks landed, leading
// ones only: a block that failed ends the run of written blocks (the decode
// instance recomputes from there).
//
// Not yet: blocks are written once the prompt is done, not as each prefill
// chunk completes; no per-block checksum travels with them.
//
// Thread-safety: Handle and stats from any thread.

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "cluster/kv_holder.h"
#include "cluster/pd_wire.h"
#include "scheduler/engine_client.h"
#include "transfer/transfer_engine.h"

namespace strata::cluster {

struct PdPrefillStats {
  uint64_t prefills = 0;          // requests run to their first token
  uint64_t blocks_written = 0;    // blocks that landed at decode instances
  uint64_t bytes_written = 0;
  uint64_t write_failures = 0;    // handoffs where some block did not land
  uint64_t finished_early = 0;    // requests that ended at their first token (nothing to hand over)
};

class PdPrefill {
 public:
  // `engine`, `xfer` and the KV manager behind `post` outlive this.
  // `device_segment`: the device pool's segment in the transfer engine's
  // table; block i is at i * block_bytes. `write_timeout`: the deadline of
  // one handoff's writes.
  PdPrefill(PostFn post, scheduler::EngineClient* engine, transfer::TransferEngine* xfer, SegmentId device_segment,
            uint64_t block_bytes, std::chrono::milliseconds write_timeout = std::chrono::seconds(30));
  ~PdPrefill();  // Stop()
  // Handoffs queued are answered 503; the worker joins.
  void Stop();
  PdPrefill(const PdPrefill&) = delete;
  PdPrefill& operator=(const PdPrefill&) = delete;

  // Serves POST /internal/pd/prefill; false for other paths.
  bool Handle(const std::string& method, const std::string& path, const std::string& body, ReplyFn reply);
  PdPrefillStats stats() const;

 private:
  struct Job {
    uint64_t pin = 0;                    // this pool's reservation holding the blocks
    std::vector<uint64_t> local_blocks;  // block ids to send, in order
    std::vector<uint64_t> checksums;     // XXH3-64 of each, taken while pinned
    ReserveReply decode;
    PrefillReply answer;
    ReplyFn reply;
  };
  // On the engine thread, after the paused final event: pins and queues the writes.
  void HandOver(kvcache::KvManager& kv, const scheduler::EngineRequest& request, const ReserveReply& decode,
                PrefillReply answer, ReplyFn reply);
  void Write(Job& job);
  void WorkerLoop();

  const PostFn post_;
  scheduler::EngineClient* const engine_;
  transfer::TransferEngine* const xfer_;
  const SegmentId segment_;
  const uint64_t block_bytes_;
  const std::chrono::milliseconds write_timeout_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::deque<Job> jobs_;
  uint64_t next_pin_ = 1ull << 63;  // apart from the ids a router gives decode reservations
  PdPrefillStats stats_;
  std::thread worker_;
};

}  // namespace strata::cluster
