#pragma once
// The prefill side of prefill/decode disaggregation (issue 19), behind
// `strata serve`'s POST /internal/pd/prefill (cluster/pd_wire.h): opens the
// decode instance's grants (blocking round trips, on the request's lane
// worker), runs the request to its first token (pause_after), and writes
// each block the decode instance asked for as soon as a prefill step has
// filled it (EngineRequest::on_computed, on the engine thread: the write
// is queued to the transfer engine, which never blocks), so the transfer
// overlaps the rest of the prefill. When the first token is out it pins
// the prompt's blocks (a KvManager reservation on its own pool), sends
// what is left, waits for every write (this class's worker thread) and
// answers with the paused stream (first token, continuation), how many
// leading blocks landed (a failed block ends the run: the decode instance
// recomputes from there) and each sent block's XXH3-64, taken when it was
// queued.
//
// Thread-safety: Handle and stats from any thread; `kv` is used on the
// engine thread only (inside on_computed and posted tasks).

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>

#include "cluster/kv_holder.h"
#include "cluster/pd_wire.h"
#include "scheduler/engine_client.h"
#include "transfer/transfer_engine.h"

namespace strata::cluster {

struct PdPrefillStats {
  uint64_t prefills = 0;          // requests run to their first token and handed over
  uint64_t blocks_written = 0;    // blocks that landed at decode instances
  uint64_t blocks_early = 0;      // blocks queued while later prompt chunks were still to compute (overlapped)
  uint64_t bytes_written = 0;
  uint64_t write_failures = 0;    // handoffs where some block did not land
  uint64_t finished_early = 0;    // requests that ended at their first token (nothing to hand over)
  uint64_t abandoned = 0;         // requests cancelled because the caller hung up before the answer
};

class PdPrefill {
 public:
  // `engine`, `kv`, `xfer` and the engine behind `post` outlive this.
  // `device_segment`: the device pool's segment in the transfer engine's
  // table; block i is at i * block_bytes; blocks hold `block_size` tokens.
  // `write_timeout`: the deadline of one handoff's writes.
  PdPrefill(PostFn post, scheduler::EngineClient* engine, kvcache::KvManager* kv, transfer::TransferEngine* xfer,
            SegmentId device_segment, uint64_t block_bytes, int block_size,
            std::chrono::milliseconds write_timeout = std::chrono::seconds(30),
            std::chrono::milliseconds grants_timeout = std::chrono::seconds(10));
  ~PdPrefill();  // Stop()
  // SIGTERM: new prefills are refused (503); those running finish.
  void SetDraining() { draining_.store(true); }
  // Handoffs queued still finish; the worker joins.
  void Stop();
  // Sees every engine event of the requests this side runs (the server's
  // request metrics), on the engine thread before the event is used; must
  // not block. Set before the first request, or never.
  void SetObserver(std::function<void(const scheduler::RequestOutput&)> observer) { observer_ = std::move(observer); }
  PdPrefill(const PdPrefill&) = delete;
  PdPrefill& operator=(const PdPrefill&) = delete;

  // Serves POST /internal/pd/prefill; false for other paths. `on_close`
  // (optional) registers a callback the server runs if the caller hangs up
  // before the answer: the request is cancelled (a router that left, or
  // gave up on this instance, wastes no more compute here).
  //
  // Also serves POST /internal/pd/grants (GrantsMessage): the grants of a
  // prefill sent with a `grants_key` (the router reserves at the decode
  // instance while the prefill runs). Blocks computed before they came are
  // sent when they come; a prefill at its first token without them waits
  // for them up to `grants_timeout`, then answers with no block written
  // (as when they are absent). Grants that come before their prefill
  // request are kept for it (202) up to `grants_timeout`.
  bool Handle(const std::string& method, const std::string& path, const std::string& body, ReplyFn reply,
              std::function<void(std::function<void()>)> on_close = {});
  PdPrefillStats stats() const;

 private:
  // One handoff. Fields after `engine_id` are the engine thread's until the
  // flight is queued to the worker (then the worker's).
  struct Flight {
    uint64_t grants_key = 0;                   // non-zero: the grants follow (in waiting_ until they come)
    ReserveReply decode;
    scheduler::EngineRequest request;          // as given (its prompt and salt name the blocks)
    std::vector<transfer::RemoteHandle> remote;  // one per grant; empty when they could not be opened
    Status open_error;
    ReplyFn reply;
    std::atomic<uint64_t> engine_id{0};        // 0 until Submit returned or the first on_computed
    int32_t next = 0;                          // next block index to send
    bool submit_failed = false;
    std::vector<uint64_t> checksums;           // per block queued, from decode.held_blocks on
    std::vector<uint64_t> batches;             // transfer batches, in order (ops in block order)
    uint64_t early = 0;                        // blocks queued before the prompt's last chunk
    uint64_t pin = 0;                          // this pool's reservation holding the blocks (0: none)
    PrefillReply answer;
    // How Finish answers: 0 = the handoff; 1 = ended at its first token
    // (nothing handed over); 2 = the engine stopped (503).
    int outcome = 0;
    bool grants_ready = true;                  // false while the grants are to come
    bool handed_over = false;                  // HandOver ran while they were still to come
    bool queued = false;                       // given to the worker
    int32_t computed = 0;                      // prompt tokens computed so far
    std::chrono::steady_clock::time_point deadline{};  // mu_: set at HandOver while the grants are to come
  };
  // Opens `decode`'s grants (blocking round trips); an error empties `remote`.
  void OpenGrants(const ReserveReply& decode, std::vector<transfer::RemoteHandle>* remote, Status* error);
  // POST /internal/pd/grants.
  void Grants(const std::string& body, const ReplyFn& reply);
  // Engine thread: the grants of a waiting flight came (`decode` absent:
  // none will); sends what is computed, and answers if handed over.
  void ApplyGrants(const std::shared_ptr<Flight>& f, const std::optional<ReserveReply>& decode,
                   std::vector<transfer::RemoteHandle> remote, const Status& open_error);
  // Engine thread (or any, once the engine stopped): the grants did not
  // come in time; the flight answers with no block written.
  void Expire(const std::shared_ptr<Flight>& f, const std::string& why);
  // Engine thread: queues the blocks the running request `id` has filled
  // (f.computed prompt tokens), counting those queued before the prompt's
  // end as early.
  void SendFilled(Flight& f, RequestId id);
  // Engine thread: queues the blocks of the flight's pin (f.pin != 0) not sent yet.
  void SendPinned(Flight& f);
  // Engine thread: queues the writes of blocks [next, end); block i is `block_of(i)`.
  void Send(Flight& f, int32_t end, const std::function<uint64_t(int32_t)>& block_of);
  // Engine thread, once the prompt's blocks are all full (still held by the
  // request): pins them until the writes are done. False when it could not.
  bool Pin(Flight& f);
  // Engine thread, after the paused final event: pins (if not yet), sends the rest, queues the flight.
  void HandOver(const std::shared_ptr<Flight>& f);
  // Queues the flight to the worker (which waits for its writes, then answers).
  void Queue(std::shared_ptr<Flight> f);
  // Worker: waits for the flight's writes and answers.
  void Finish(Flight& f);
  void WorkerLoop();

  const PostFn post_;
  scheduler::EngineClient* const engine_;
  kvcache::KvManager* const kv_;
  transfer::TransferEngine* const xfer_;
  const SegmentId segment_;
  const uint64_t block_bytes_;
  const int block_size_;
  const std::chrono::milliseconds write_timeout_;
  const std::chrono::milliseconds grants_timeout_;
  std::function<void(const scheduler::RequestOutput&)> observer_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::atomic<bool> draining_{false};
  std::deque<std::shared_ptr<Flight>> done_;  // flights whose writes are all queued
  std::map<uint64_t, std::shared_ptr<Flight>> waiting_;  // by grants_key: flights whose grants are to come
  // Grants that came before their prefill request (kept grants_timeout).
  std::map<uint64_t, std::pair<GrantsMessage, std::chrono::steady_clock::time_point>> early_;
  uint64_t next_pin_ = 1ull << 63;            // apart from the ids a router gives decode reservations
  PdPrefillStats stats_;
  std::thread worker_;
};

}  // namespace strata::cluster
