#pragma once
// The decode side of prefill/decode disaggregation (issue 19), behind
// `strata serve`'s /internal/pd/ routes (cluster/pd_wire.h):
//
//   reserve  on the engine thread: KvManager::Reserve for the prompt; each
//            block to be written is granted (transfer engine, write access
//            for the lease) to the named prefill instance; 503 when the
//            pool cannot hold it now.
//   decode   revokes the grants and waits until they are quiesced (no
//            write of the peer can land any more), names the blocks the
//            peer wrote (CompleteReservation), submits the continuation to
//            the engine and streams its outputs; the reservation's
//            references are dropped once the continuation has taken its
//            own (its first output). A reservation whose grants do not
//            quiesce within a second is not trusted: its blocks are freed
//            unnamed and the continuation recomputes the prompt.
//   cancel   revokes and frees a reservation.
// A reservation not decoded within its lease is revoked and freed by the
// timer (a prefill instance or router that died never keeps blocks).
//
// Thread-safety: Handle and stats from any thread; KV work runs through
// `post` on the engine thread.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "cluster/kv_holder.h"
#include "cluster/pd_wire.h"
#include "scheduler/engine_client.h"
#include "transfer/transfer_engine.h"

namespace strata::cluster {

// A streamed reply (server-sent events), adapted from the HTTP writer.
struct StreamReply {
  std::function<void(int status, std::string content_type)> start;
  std::function<bool(std::string data)> write;  // false once the client left
  std::function<void()> end;
  std::function<void(std::function<void()>)> on_close;  // runs once if the client hangs up first
  ReplyFn reply;                                         // a whole reply instead of a stream (errors)
};

struct PdDecodeStats {
  uint64_t reserved = 0;         // reservations granted
  uint64_t not_now = 0;          // answered 503 (the pool was short)
  uint64_t blocks_granted = 0;   // blocks peers were allowed to write
  uint64_t blocks_received = 0;  // blocks named after a handoff
  uint64_t blocks_held = 0;      // blocks a reservation found already here (not sent)
  uint64_t decoded = 0;          // continuations started
  uint64_t untrusted = 0;        // reservations dropped because their grants did not quiesce
  uint64_t corrupt = 0;          // blocks whose bytes did not match the sender's checksum (recomputed from there)
  uint64_t expired = 0;          // reservations freed at their lease
  uint64_t cancelled = 0;
  uint64_t active = 0;
};

class PdDecode {
 public:
  // `engine` (Submit, Cancel), `xfer` and the KV manager behind `post` outlive
  // this. `device_segment`: the device pool's segment in the transfer
  // engine's table; block i is at i * block_bytes.
  PdDecode(PostFn post, scheduler::EngineClient* engine, transfer::TransferEngine* xfer, SegmentId device_segment,
           uint64_t block_bytes, std::chrono::milliseconds max_lease = std::chrono::seconds(30));
  ~PdDecode();  // Stop()
  // SIGTERM: new reservations are refused (503: the router picks another
  // instance); reservations held still decode while the engine takes work.
  void SetDraining() { draining_.store(true); }
  // No more requests; the timer stops. Reservations left are freed with the KV manager.
  void Stop();
  // Sees every engine event of the requests this side runs (the server's
  // request metrics), on the engine thread before the event is used; must
  // not block. Set before the first request, or never.
  void SetObserver(std::function<void(const scheduler::RequestOutput&)> observer) { observer_ = std::move(observer); }
  PdDecode(const PdDecode&) = delete;
  PdDecode& operator=(const PdDecode&) = delete;

  // Serves POST /internal/pd/{reserve,decode,cancel}; false for other paths.
  bool Handle(const std::string& method, const std::string& path, const std::string& body, StreamReply reply);
  PdDecodeStats stats() const;

 private:
  struct Held {
    std::vector<uint64_t> grants;
    std::chrono::steady_clock::time_point deadline;
    bool decoding = false;
  };
  void Reserve(const std::string& body, const ReplyFn& reply);
  void Decode(const std::string& body, StreamReply reply);
  void Cancel(const std::string& body, const ReplyFn& reply);
  // Engine thread: how many of the blocks the peer says it wrote match
  // their checksums, leading ones (a block without a checksum counts as bad).
  int32_t Verified(kvcache::KvManager& kv, uint64_t id, const DecodeRequest& d);
  // Revokes reservation `id`'s `grants` and runs `then(kv, quiesced)` on
  // the engine thread once all are quiesced (no write of the peer can land
  // any more) or the wait (about a second, polled by the timer) gave up.
  // When it gave up, `then` must leave the reservation alone: its blocks
  // stay out of use, and are released here once the grants do quiesce.
  // `abandoned` (optional) runs instead of `then` when the engine stops
  // first (no task can run any more).
  using AfterRevoke = std::function<void(kvcache::KvManager&, bool quiesced)>;
  void RevokeThen(uint64_t id, std::vector<uint64_t> grants, AfterRevoke then,
                  std::function<void()> abandoned = {});
  void CheckRevoked(uint64_t id, std::vector<uint64_t> grants, AfterRevoke then, int tries,
                    std::function<void()> abandoned);
  // Claims reservation `id` if it is held and not already being decoded,
  // in one step: for a decode it is marked decoding, for a cancel it leaves
  // the table; returns its grants, or nullopt when it could not be claimed
  // (unknown, expired, or claimed by another call).
  std::optional<std::vector<uint64_t>> Claim(uint64_t id, bool for_decode);
  void TimerLoop();

  const PostFn post_;
  scheduler::EngineClient* const engine_;
  transfer::TransferEngine* const xfer_;
  const SegmentId segment_;
  const uint64_t block_bytes_;
  const std::chrono::milliseconds max_lease_;
  std::function<void(const scheduler::RequestOutput&)> observer_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::atomic<bool> draining_{false};
  std::map<uint64_t, Held> held_;
  struct Revoking {
    uint64_t id = 0;
    std::vector<uint64_t> grants;
    AfterRevoke then;
    int tries = 0;
    std::function<void()> abandoned;
  };
  std::vector<Revoking> revoking_;  // checked again by the timer
  PdDecodeStats stats_;
  std::thread timer_;
};

}  // namespace strata::cluster
