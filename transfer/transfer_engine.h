#pragma once
// The transfer engine: moves bytes between this process's registered memory
// and other Strata processes' (Mooncake's Transfer Engine vocabulary).
//
// A process starts one engine under a cluster-unique instance name. It
// exports segments (readable by every authenticated peer) and grants regions
// (writable by one named peer for a lease); a peer connects, opens a remote
// segment or grant, and submits batches of reads and writes
// {local region, remote handle, remote offset, length} with a deadline.
// Completions are polled: Submit and Poll never block on the network.
//
// Transports (native; docs/PERFORMANCE.md "transfer" has the measurements that
// chose them over UCX's):
//   - tcp: the target checks every access when it arrives against its export
//     table (bounds, grant holder, lease, revocation), then receives the bytes
//     straight into registered memory or sends them straight from it. Several
//     connections per peer, requests pipelined on each.
//   - shm: same-host peers (same boot id) copy directly between address
//     spaces with process_vm_readv/writev (cross-memory attach), after the
//     requester checks bounds, grant and lease itself; the owner's
//     revocation waits for the requester's acknowledgement, so no copy is in
//     flight when it reuses the memory. Needs ptrace rights between the
//     processes; where they are refused, tcp is used.
//   - rdma: not built (docs/status.md).
// `transports` orders what may be used: the first one that works with a peer
// is chosen when it is opened.
//
// Faults: a deadline passes → the op completes with DeadlineExceeded and its
// connection is shut down before the op is retired, so late bytes never land
// in the caller's memory; ops not yet sent on that connection move to another.
// A dead peer → Unavailable. A FaultInjector (tests) can delay, drop, corrupt,
// fail chosen ops or tear their connection down.
//
// Thread-safety: every public method may be called from any thread. The
// engine runs its own threads (listener, one per served connection, two per
// outgoing data connection, a timer, shm copiers).

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/memory_segment.h"
#include "common/status.h"
#include "transfer/exports.h"

namespace strata::transfer {

enum class Transport : uint8_t { kTcp, kShm };
std::string_view TransportName(Transport t);
// "tcp", "shm", "shm,tcp": InvalidArgument names an unknown entry (and says
// that rdma is not built).
Result<std::vector<Transport>> ParseTransports(std::string_view list);

struct TransferOptions {
  std::string instance_name;              // cluster-unique; required
  std::string bind_address = "127.0.0.1";
  int port = 0;                           // 0: an ephemeral port
  std::string advertise_address;          // what peers are told; default bind_address
  std::vector<Transport> transports = {Transport::kShm, Transport::kTcp};
  std::string cluster_secret;             // empty: no secret, loopback binding only
  int connections_per_peer = 4;           // tcp data connections to each peer
  int max_inflight_per_connection = 16;   // pipelined requests per tcp connection
  double connect_timeout_s = 5.0;
  bool listen = true;                     // false: a client-only engine
};

// A remote segment or grant, opened (plain value; valid until the peer
// revokes it or disconnects).
struct RemoteHandle {
  uint64_t peer = 0;    // from Connect
  uint64_t handle = 0;  // the owner's export handle
  uint64_t length = 0;
  bool writable = false;
  Transport transport = Transport::kTcp;
  std::string name;
};

enum class OpKind : uint8_t { kRead, kWrite };  // read: remote → local; write: local → remote

struct TransferOp {
  OpKind kind = OpKind::kRead;
  Region local;           // in this process's SegmentTable (host memory)
  RemoteHandle remote;
  uint64_t remote_offset = 0;
  // length = local.length
};

struct BatchResult {
  Status status;                 // OK, or the first failed op's status
  std::vector<Status> ops;       // one per op, in submission order
  double seconds = 0;            // submit → last completion
  uint64_t bytes = 0;            // bytes of the ops that succeeded
};

// Transfer statistics (cumulative; plain values for /metrics).
struct TransferStats {
  struct ByTransport {
    uint64_t read_bytes = 0, write_bytes = 0;
    uint64_t reads = 0, writes = 0;
    uint64_t failures = 0;
  };
  ByTransport tcp, shm;
  uint64_t served_read_bytes = 0, served_write_bytes = 0;  // as target
  uint64_t timeouts = 0;
  uint64_t refused = 0;              // accesses this process refused as target (bounds, grants, revoked)
  uint64_t refused_locally = 0;      // ops this process refused before sending (its own checks)
  uint64_t failed_handshakes = 0;    // both sides: bad secret, bad hello, wrong protocol
  uint64_t connections = 0;          // open, both directions
  uint64_t batches_in_flight = 0;    // submitted, not yet polled to completion
  std::vector<double> latency_buckets;      // upper bounds (seconds)
  std::vector<uint64_t> latency_counts;     // per bucket (cumulative-free), last = +Inf
  double latency_sum = 0;
  uint64_t latency_count = 0;
};

// Test-only faults applied at the transfer API (requester side).
struct FaultRule {
  enum class Action : uint8_t { kDelay, kDrop, kCorrupt, kFail, kTeardown };
  Action action = Action::kFail;
  std::optional<OpKind> kind;  // only ops of this kind (any when unset)
  uint64_t skip = 0;           // let this many matching ops pass first
  uint64_t count = 1;          // then apply to this many (UINT64_MAX: all)
  double delay_s = 0;          // kDelay
};

class TransferEngine {
 public:
  // Starts the engine (binds the listener unless !options.listen). `segments`
  // resolves local regions and must outlive the engine. InvalidArgument:
  // no instance name; a non-loopback bind address without a secret.
  static Result<std::unique_ptr<TransferEngine>> Start(TransferOptions options, SegmentTable* segments);
  virtual ~TransferEngine() = default;

  virtual int port() const = 0;
  // advertise_address:port
  virtual std::string address() const = 0;
  virtual const std::string& instance_name() const = 0;

  // --- owner side ---
  virtual Result<uint64_t> ExportSegment(SegmentId segment, std::string name) = 0;
  virtual Status Unexport(const std::string& name) = 0;
  virtual Result<uint64_t> Grant(const Region& region, std::string grantee, std::chrono::nanoseconds lease) = 0;
  // Stops new accesses at once; in-flight tcp accesses have their
  // connections shut down; direct mappers are asked to acknowledge.
  virtual Status Revoke(uint64_t handle) = 0;
  // True once the memory may be handed out again (see ExportTable).
  virtual bool Quiesced(uint64_t handle) = 0;

  // --- requester side (blocking control round trips: not on the engine thread) ---
  // Connects (authenticated) to "host:port"; returns a peer id. Reuses an
  // open connection to the same address.
  virtual Result<uint64_t> Connect(const std::string& address) = 0;
  virtual Result<std::string> PeerName(uint64_t peer) = 0;
  virtual Result<RemoteHandle> OpenSegment(uint64_t peer, const std::string& name) = 0;
  virtual Result<RemoteHandle> OpenGrant(uint64_t peer, uint64_t grant) = 0;

  // Queues a batch; never blocks on the network. InvalidArgument for a local
  // region outside this process's segments or an empty batch (then nothing
  // is queued). Ops that fail their local checks (bounds, read-only,
  // revoked) complete at once with their error.
  virtual Result<uint64_t> Submit(std::vector<TransferOp> ops, Clock::time_point deadline) = 0;
  // The batch's result once every op completed (then the id is forgotten);
  // nullopt while in flight. NotFound-like misuse returns a failed result.
  virtual std::optional<BatchResult> Poll(uint64_t batch) = 0;
  // Polls until done (tools and tests).
  virtual BatchResult Wait(uint64_t batch) = 0;

  virtual TransferStats stats() const = 0;
  // Test-only fault injection (replaces the rules).
  virtual void SetFaults(std::vector<FaultRule> rules) = 0;
  // Test-only: shuts every outgoing connection to `peer` down now.
  virtual void TearDownPeer(uint64_t peer) = 0;
};

// Prometheus text exposition of `s` (strata_transfer_* families).
std::string RenderTransferMetrics(const TransferStats& s);

}  // namespace strata::transfer
