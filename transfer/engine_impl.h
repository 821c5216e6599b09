#pragma once
// Internals of the transfer engine (transfer_engine.h); not a public header.
// engine.cc: start/stop, exports, batches, deadlines, faults, stats.
// target.cc: the listener and the connections peers opened to us.
// requester.cc: peers we connected to, tcp data connections, shm copies.

#include <sys/socket.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "transfer/transfer_engine.h"
#include "transfer/wire.h"

namespace strata::transfer::detail {

struct Batch;

struct Op {
  std::shared_ptr<Batch> batch;
  size_t index = 0;
  uint64_t id = 0;  // request id on the wire
  OpKind kind = OpKind::kRead;
  uint8_t* local = nullptr;
  uint64_t length = 0;
  uint64_t peer = 0;
  uint64_t handle = 0;
  uint64_t offset = 0;
  Transport transport = Transport::kTcp;
  Clock::time_point deadline;
  Clock::time_point start;
  Clock::time_point release_at;  // faults: held until then (max: dropped)
  bool corrupt = false;
  bool teardown = false;
  bool faults_applied = false;
  int retries = 0;
  std::atomic<bool> finished{false};
};
using OpPtr = std::shared_ptr<Op>;

struct Batch {
  uint64_t id = 0;
  Clock::time_point start;
  std::mutex mu;
  std::vector<Status> results;
  uint64_t bytes = 0;
  size_t remaining = 0;
  Clock::time_point end;
};

// Same-host direct access to an opened export (shm transport).
struct DirectHandle {
  uint64_t base = 0;
  uint64_t length = 0;
  bool writable = false;
  int64_t expires_ns = 0;
  uint8_t* mapped = nullptr;  // the export mapped into this process (memfd), else null: cross-memory attach
  void* map_base = nullptr;   // what to munmap
  size_t map_length = 0;
  void Unmap();
};

struct DataConn {
  uint64_t id = 0;
  int fd = -1;
  std::mutex mu;                 // guards sent, broken, why, sender_done
  std::condition_variable cv;
  std::deque<OpPtr> sent;        // sent (or being sent), awaiting replies, in order
  bool broken = false;
  Status why;
  bool sender_done = false;
  std::atomic<bool> finished{false};  // both threads done, ops reaped
  std::thread sender, receiver;
};

struct Peer {
  uint64_t id = 0;
  std::string address;  // host:port as connected
  std::string host;
  int port = 0;
  std::string name;     // the target's authenticated instance name
  Transport transport = Transport::kTcp;
  int pid = 0;

  int control_fd = -1;
  std::mutex control_write_mu;
  std::thread control_reader;
  std::mutex reply_mu;
  std::condition_variable reply_cv;
  std::map<uint64_t, std::pair<FrameHeader, std::string>> replies;
  std::unordered_set<uint64_t> waiting;  // request ids a ControlCall waits for
  std::atomic<bool> control_broken{false};

  std::shared_mutex direct_mu;  // shared while a copy runs; exclusive to revoke
  std::unordered_map<uint64_t, DirectHandle> direct;
  std::unordered_set<uint64_t> revoked;  // revoked handles (a revoke may overtake its open's completion)

  std::mutex q_mu;              // guards queue and conns
  std::condition_variable q_cv;
  std::deque<OpPtr> queue;      // tcp ops waiting for a connection
  std::vector<std::shared_ptr<DataConn>> conns;
  std::atomic<bool> closing{false};
  std::atomic<int> dialing{0};
};

// Hello contents.
struct Hello {
  std::string name, nonce, host, boot_id, role;
  int pid = 0;
  uint64_t probe_address = 0;  // target: 8 bytes peers may read to test shm
  std::string mac;             // hex
};

// Handshake pieces (target.cc), shared by both sides and by tests that
// speak the protocol by hand.
std::string PeerMac(const std::string& secret, const Hello& target, const Hello& peer);
std::string TargetMac(const std::string& secret, const Hello& target, const Hello& peer);
bool HexEqual(const std::string& a, const std::string& b);
std::string HelloText(const Hello& h);  // JSON
Result<Hello> ParseHello(const std::string& payload);

class EngineImpl final : public TransferEngine {
 public:
  EngineImpl(TransferOptions options, SegmentTable* segments);
  ~EngineImpl() override;
  Status Init();

  int port() const override { return port_; }
  std::string address() const override;
  const std::string& instance_name() const override { return opt_.instance_name; }

  Result<uint64_t> ExportSegment(SegmentId segment, std::string name) override;
  Status Unexport(const std::string& name) override;
  Result<uint64_t> Grant(const Region& region, std::string grantee, std::chrono::nanoseconds lease) override;
  Status Revoke(uint64_t handle) override;
  bool Quiesced(uint64_t handle) override;

  Result<uint64_t> Connect(const std::string& address) override;
  Result<std::string> PeerName(uint64_t peer) override;
  Result<RemoteHandle> OpenSegment(uint64_t peer, const std::string& name) override;
  Result<RemoteHandle> OpenGrant(uint64_t peer, uint64_t grant) override;

  Result<uint64_t> Submit(std::vector<TransferOp> ops, Clock::time_point deadline) override;
  std::optional<BatchResult> Poll(uint64_t batch) override;
  BatchResult Wait(uint64_t batch) override;

  TransferStats stats() const override;
  void SetFaults(std::vector<FaultRule> rules) override;
  void TearDownPeer(uint64_t peer) override;

 private:
  // A connection a peer opened to us. Its thread reads requests and sends
  // replies; Revoke (any thread) may send a revoke notice or shut it down.
  struct Served {
    uint64_t id = 0;
    std::mutex write_mu;  // one frame at a time; held for a whole reply
    std::mutex fd_mu;     // guards fd: close sets -1 (under both), shutdown needs only this
    int fd = -1;
    std::string peer;     // set once after the handshake, under served_mu_
    std::string role;
    bool done = false;    // under served_mu_
    std::thread th;
    void Shutdown() {
      std::lock_guard lock(fd_mu);
      if (fd >= 0) ::shutdown(fd, SHUT_RDWR);
    }
  };

  // engine.cc
  void CompleteOp(const OpPtr& op, Status s);
  void Dispatch(const OpPtr& op);
  void ApplyFaults(Op& op);
  void TimerLoop();
  void CheckDeadlines(Clock::time_point now);
  // target.cc
  Hello MakeHello(const std::string& role) const;  // this process, a fresh nonce
  void ListenLoop();
  void ServeConnection(std::shared_ptr<Served> sc);
  Result<Hello> ServerHandshake(Served& sc);
  void HandleOpen(Served& sc, const FrameHeader& h, const std::string& payload);
  Status HandleRead(Served& sc, const FrameHeader& h);
  Status HandleWrite(Served& sc, const FrameHeader& h);
  Status SendToServed(Served& sc, FrameHeader h, std::string_view payload);
  void NotifyRevoke(uint64_t handle);
  void ShutdownServed(const std::vector<uint64_t>& ids);
  void CloseServed(Served& sc);
  // requester.cc
  Result<int> Dial(const std::string& host, int port, const std::string& role, Hello* target);
  void ControlReader(std::shared_ptr<Peer> peer);
  Result<std::pair<FrameHeader, std::string>> ControlCall(Peer& peer, FrameHeader h, const std::string& payload);
  Result<RemoteHandle> FinishOpen(Peer& peer, const std::pair<FrameHeader, std::string>& reply);
  Status AddDataConn(const std::shared_ptr<Peer>& peer);
  void SenderLoop(std::shared_ptr<Peer> peer, std::shared_ptr<DataConn> c);
  void ReceiverLoop(std::shared_ptr<Peer> peer, std::shared_ptr<DataConn> c);
  void BreakConn(DataConn& c, Status why);
  void ReapConn(Peer& peer, DataConn& c);
  void MaintainPeers();
  void ShmLoop();
  Status ShmCopy(Op& op);
  void ClosePeer(Peer& peer);
  std::shared_ptr<Peer> FindPeer(uint64_t id);

  TransferOptions opt_;
  SegmentTable* segments_;
  ExportTable exports_;
  std::string host_, boot_id_;
  alignas(8) uint64_t probe_word_ = 0x5354524154415348ull;  // "STRATASH"
  int listen_fd_ = -1;
  int port_ = 0;
  int stop_fd_ = -1;  // eventfd: wakes the listener
  std::atomic<bool> stopping_{false};
  std::thread listener_, timer_;
  std::vector<std::thread> shm_workers_;

  std::mutex served_mu_;
  std::map<uint64_t, std::shared_ptr<Served>> served_;
  std::atomic<uint64_t> next_conn_id_{1};

  std::mutex peers_mu_;
  std::map<uint64_t, std::shared_ptr<Peer>> peers_;
  std::map<std::string, uint64_t> peer_by_address_;
  uint64_t next_peer_ = 1;

  mutable std::mutex batch_mu_;
  std::unordered_map<uint64_t, std::shared_ptr<Batch>> batches_;
  uint64_t next_batch_ = 1;
  std::atomic<uint64_t> next_op_id_{1};

  std::mutex held_mu_;
  std::vector<OpPtr> held_;  // fault-delayed or dropped ops

  std::mutex shm_mu_;
  std::condition_variable shm_cv_;
  std::deque<OpPtr> shm_queue_;

  std::mutex timer_mu_;
  std::condition_variable timer_cv_;

  // Background threads (redials, peer closes): the destructor waits for them.
  std::mutex bg_mu_;
  std::condition_variable bg_cv_;
  int background_ = 0;
  template <typename F>
  void RunInBackground(F f) {
    {
      std::lock_guard lock(bg_mu_);
      ++background_;
    }
    std::thread([this, f = std::move(f)]() mutable {
      f();
      std::lock_guard lock(bg_mu_);
      --background_;
      bg_cv_.notify_all();
    }).detach();
  }

  std::mutex fault_mu_;
  std::vector<FaultRule> faults_;
  std::vector<uint64_t> fault_seen_;

  // stats
  struct Counters {
    std::atomic<uint64_t> read_bytes{0}, write_bytes{0}, reads{0}, writes{0}, failures{0};
  };
  Counters tcp_, shm_;
  std::atomic<uint64_t> served_read_bytes_{0}, served_write_bytes_{0}, timeouts_{0}, refused_locally_{0},
      failed_handshakes_{0}, connections_{0};
  mutable std::mutex hist_mu_;
  std::vector<uint64_t> hist_counts_;
  double hist_sum_ = 0;
  uint64_t hist_count_ = 0;
};

extern const std::vector<double> kLatencyBuckets;

}  // namespace strata::transfer::detail
