#pragma once
// The reader side of the cluster KV index (issue 18): which peers exist
// (cluster membership, transfer/metadata.h) and which blocks each holds
// (their event streams, cluster/kv_wire.h), kept in one ClusterKvIndex.
//
// One background thread:
//   - every `members_interval` lists the members of the metadata store and
//     keeps those with this instance's model namespace (not itself). A
//     member whose lease ended is removed from the index (its blocks go at
//     once) when it does not answer either, or once it stayed missing for
//     absent_grace_s (see DirectoryOptions). When the store is unreachable (etcd stopped) the known members
//     are kept: serving continues on what is known, and membership recovers
//     when the store returns;
//   - every `poll_interval` asks each member for its event batches after
//     the last applied sequence (GET /internal/kv/events?since=S). A new
//     incarnation, a 410 (batches no longer kept), or a gap the index cannot
//     bridge makes it ask for a snapshot (GET /internal/kv/snapshot).
//   - a member that does not answer (or answers only stale state) is
//     marked unreachable (readers skip it) until it answers again, and is
//     polled with a backoff (doubling from 100 ms to 5 s); its blocks stay in the index until its lease
//     ends, since it may only be slow.
// Where the index runs: in each instance that reads from the pool (this
// class), so a reader never waits on another process to learn who holds a
// block; the router (later issues) runs the same class for its routing.
//
// Thread-safety: every method from any thread.

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "kvcache/cluster_index.h"
#include "transfer/metadata.h"

namespace strata::cluster {

struct DirectoryOptions {
  std::string self;             // this instance's name (never its own peer)
  std::string model_namespace;  // hex; only members with the same one are peers
  std::string admin_token;      // sent to peers' /internal/kv/ routes (they require theirs)
  double poll_interval_s = 0.1;
  double members_interval_s = 1.0;
  double call_timeout_s = 1.0;
  // A peer missing from the membership listing is removed at once when it
  // does not answer either, else after this long: a store restarted empty
  // (etcd lost its data) lists nobody until the instances register again.
  double absent_grace_s = 10.0;
};

struct DirectoryStats {
  uint64_t polls = 0;            // event requests answered
  uint64_t poll_failures = 0;    // event or snapshot requests that failed
  uint64_t snapshots = 0;        // snapshots applied
  uint64_t member_listings = 0;  // successful membership reads
  uint64_t member_failures = 0;  // membership reads that failed (store unreachable)
  uint64_t members = 0;          // peers known now
};

class ClusterDirectory {
 public:
  // `meta` (not owned) outlives the directory. Starts the thread.
  ClusterDirectory(DirectoryOptions options, transfer::MetadataClient* meta);
  ~ClusterDirectory();
  ClusterDirectory(const ClusterDirectory&) = delete;
  ClusterDirectory& operator=(const ClusterDirectory&) = delete;

  const kvcache::ClusterKvIndex& index() const { return index_; }
  // A known peer (nullopt when unknown or unreachable).
  std::optional<transfer::InstanceInfo> Peer(const std::string& name) const;
  std::vector<transfer::InstanceInfo> Peers() const;
  const DirectoryOptions& options() const { return options_; }
  DirectoryStats stats() const;
  // Runs one membership read and one poll of every peer now (tests).
  void PollNow();

 private:
  struct PeerState {
    transfer::InstanceInfo info;
    std::string incarnation;  // of the events applied (empty: none yet)
    uint64_t applied = 0;
    bool reachable = true;
    std::chrono::steady_clock::time_point absent_since{};  // missing from the listing since (epoch: listed)
    int failures = 0;                                  // consecutive failed polls
    std::chrono::steady_clock::time_point retry_at{};  // no poll before (backoff after failures)
  };
  void Loop();
  void RefreshMembers();
  void PollPeer(const std::string& name);
  bool FetchSnapshot(const std::string& name, const std::string& http_address);

  const DirectoryOptions options_;
  transfer::MetadataClient* const meta_;
  kvcache::ClusterKvIndex index_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool stop_ = false;
  std::map<std::string, PeerState> peers_;
  DirectoryStats stats_;
  std::mutex poll_mu_;  // one poller at a time (the thread or PollNow)
  std::thread thread_;
};

}  // namespace strata::cluster
