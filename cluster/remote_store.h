#pragma once
// The remote tier (issue 18): a BlockStore, last in the KV manager's chain
// (`{kind: remote}` in kv.tiers, or --kv-remote), whose blocks are the ones
// other instances hold in their host or disk tiers (a holder stages a
// disk-only block into host memory first), as the cluster index says
// (cluster/kv_directory.h). Nothing is ever written to it: each instance's
// own tiers are its share of the pool.
//
//   lookup   CountPrefix: the longest run of the chain that one reachable
//            peer with a transfer engine holds in its host or disk tier
//            (from the index; no network).
//   read     SubmitRead only queues; Poll() hands the queued reads to the
//            store's worker thread as one batch (the KV manager submits a
//            prefix's loads together). The worker picks for each block a
//            holder (same host before other hosts, then the holder of the
//            most of the batch, then the one with more of it in its host
//            tier rather than on disk), asks each holder to resolve and pin its
//            blocks (POST /internal/kv/resolve, with a lease), reads the
//            bytes with the transfer engine straight into the destination
//            (the device block, or the mover's staging buffer), checks each
//            block's XXH3 against the holder's, completes the reads, then
//            releases the lease.
//   failure  a block the holder no longer has, a timeout, a refused or
//            failed transfer, a checksum mismatch, a dead holder: that
//            block's read fails (the KV manager recomputes it and the rest
//            of the chain); the cause is counted (stats()).
// The measured rate of successful reads (resolve round trip and transfer)
// feeds the `auto` load policy (measured_read_bytes_per_s); a measurement
// older than kRateTtl is forgotten (rate unknown: hits are loaded), so a
// slow moment never turns the remote tier off for good.
//
// Thread-safety: BlockStore's rule (one driving thread); stats() from any
// thread. The worker thread touches only the queued reads' destination
// memory, which the caller keeps registered until their completions.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "cluster/kv_directory.h"
#include "kvcache/block_store.h"
#include "transfer/transfer_engine.h"

namespace strata::cluster {

struct RemoteStoreOptions {
  uint64_t block_bytes = 0;       // REQUIRES: > 0
  double timeout_s = 2.0;         // resolve + transfer of one batch
  int64_t lease_ms = 5000;        // pin lease asked of holders
  std::string admin_token;        // sent to holders' /internal/kv/ routes
};

struct RemoteStats {
  uint64_t blocks_read = 0;        // read, checked and delivered
  uint64_t bytes_read = 0;
  uint64_t misses = 0;             // the holder no longer had it, or no holder
  uint64_t checksum_mismatches = 0;
  uint64_t transfer_failures = 0;  // timeouts, refusals, broken connections
  uint64_t holder_failures = 0;    // resolve calls that failed (holder dead, unreachable)
  uint64_t batches = 0;
};

class RemoteStore final : public kvcache::BlockStore {
 public:
  static Result<std::unique_ptr<RemoteStore>> Create(const RemoteStoreOptions& options);
  // Fails reads still queued and joins the worker.
  ~RemoteStore() override;

  // Connects the store to the cluster (until then it holds nothing). Both
  // outlive the store or it is destroyed first. The engine must run over
  // the segment table the store is attached to.
  void Bind(ClusterDirectory* directory, transfer::TransferEngine* engine);

  std::string_view name() const override { return "remote"; }
  kvcache::TierKind kind() const override { return kvcache::TierKind::kRemote; }
  kvcache::StoreStats stats() const override;
  RemoteStats remote_stats() const;
  double measured_read_bytes_per_s() const override;

  bool Contains(const BlockHash& h) const override;
  size_t CountPrefix(std::span<const BlockHash> chain) const override;
  // Refused: the remote tier is read-only (write_policy none).
  Status SubmitWrite(const BlockHash& h, const Sha256Digest& ns, const Region& src, uint64_t tag) override;
  Status SubmitRead(const BlockHash& h, const Region& dst, uint64_t tag) override;
  size_t Poll(std::vector<kvcache::StoreCompletion>* out) override;
  void Drain(std::vector<kvcache::StoreCompletion>* out) override;
  Status Remove(const BlockHash& h) override;
  Status Flush(const Sha256Digest* ns) override;

 private:
  struct Read {
    BlockHash hash;
    Region dst;
    std::span<uint8_t> bytes;
    uint64_t tag = 0;
  };
  struct Holder {
    std::string name;
    transfer::InstanceInfo info;
  };
  explicit RemoteStore(const RemoteStoreOptions& options) : options_(options) {}
  void WorkerLoop();
  void RunBatch(std::vector<Read> batch);
  // Reads `reads` (in chain order) from `holder`; completes each.
  void ReadFrom(const transfer::InstanceInfo& holder, std::vector<Read> reads);
  void Finish(const Read& r, Status s);
  // Whether `peer` runs on this machine (its transfer address names this
  // host: loopback or our own advertised host).
  bool SameHost(const transfer::InstanceInfo& peer) const;
  Result<uint64_t> PeerId(const std::string& address);

  const RemoteStoreOptions options_;
  // Set once by Bind (the engine thread may already ask CountPrefix).
  std::atomic<ClusterDirectory*> directory_{nullptr};
  std::atomic<transfer::TransferEngine*> engine_{nullptr};
  std::vector<Read> submitted_;  // driving thread, until Poll hands them over

  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::deque<std::vector<Read>> queue_;
  size_t busy_ = 0;  // batches queued or running
  std::vector<kvcache::StoreCompletion> done_;
  RemoteStats stats_;
  uint64_t corrupt_ = 0;
  double rate_ = 0;  // bytes/s, smoothed
  std::chrono::steady_clock::time_point rate_at_{};
  static constexpr std::chrono::seconds kRateTtl{5};
  std::map<std::string, uint64_t> peers_;  // transfer address → peer id (worker only)
  std::thread worker_;
};

}  // namespace strata::cluster
