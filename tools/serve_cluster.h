#pragma once
// The cluster parts of `strata serve`: its transfer engine over the KV
// manager's segments, and its registration in the metadata store.

#include <cstdlib>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>

#include "cluster/kv_directory.h"
#include "cluster/kv_holder.h"
#include "cluster/pd_decode.h"
#include "cluster/pd_prefill.h"
#include "cluster/remote_store.h"
#include "common/memory_segment.h"
#include "kvcache/kv_event_log.h"
#include "kvcache/tier_registry.h"
#include "scheduler/engine.h"
#include "common/status.h"
#include "tools/transfer_flags.h"
#include "transfer/metadata.h"
#include "transfer/transfer_engine.h"

namespace strata::cli {

// `flag` when set, else "<hostname>:<http_port>".
std::string InstanceName(const std::string& flag, int http_port);
// The host peers reach this instance at: `bind_host`, unless it is a
// wildcard (then `transfer_advertise`'s host, else this host's name).
std::string AdvertisedHost(const std::string& bind_host, const std::string& transfer_advertise);

// The transfer engine of `strata serve` (null when --transfer-port is -1).
// Without a bind address it binds loopback, or `serve_host` with a secret.
Result<std::unique_ptr<transfer::TransferEngine>> StartServeTransfer(const TransferFlags& flags,
                                                                      const std::string& serve_host,
                                                                      const std::string& instance,
                                                                      SegmentTable* segments);

// Registers `self` at `url` (--metadata) with a lease; the client keeps it.
// `bearer`: ClusterBearer of the cluster secret, or empty.
Result<std::unique_ptr<transfer::MetadataClient>> JoinCluster(const std::string& url, const transfer::InstanceInfo& self,
                                                              int lease_seconds, const std::string& bearer = "");

// The cluster KV pool inside `strata serve` (issue 18; docs/cluster.md):
// this instance publishes its blocks (event log, served with the holder's
// /internal/kv/ routes), exports its host tiers to the transfer engine,
// and, with a remote tier, follows its peers (directory) and reads from
// them (the remote store, owned by the KV stack).
struct ServePool {
  std::shared_ptr<kvcache::KvEventLog> log;
  std::unique_ptr<cluster::KvHolder> holder;
  std::unique_ptr<cluster::ClusterDirectory> directory;
  cluster::RemoteStore* remote = nullptr;  // owned by the KV stack
  transfer::TransferEngine* xfer = nullptr;
  std::vector<std::string> exports;  // export names of the host tiers and the staging area
  std::vector<uint64_t> export_handles;
  // Where disk-only blocks are staged for peers (with a disk tier and a
  // transfer engine): kStagingBlocks slots, registered in `segments`.
  static constexpr int kStagingBlocks = 64;
  struct FreeDeleter {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  std::unique_ptr<uint8_t, FreeDeleter> staging;
  SegmentTable* segments = nullptr;
  SegmentId staging_segment;
  ~ServePool();
};

// The store maker for OpenKvStack: a remote tier (kv.tiers {kind: remote}
// or --kv-remote) becomes a RemoteStore (*remote points at it) when the
// instance is in a cluster; every other kind opens as usual.
kvcache::StoreMaker ServeStoreMaker(bool in_cluster, const std::string& admin_token, cluster::RemoteStore** remote);

// Starts the pool: the event log under `self`'s name and incarnation
// (installed in the KV manager on the engine thread), the host tiers'
// exports (when `xfer` is set), the holder, and with `remote` the
// directory over `meta` bound to the remote store. `meta` and `xfer`
// outlive the pool.
Result<std::unique_ptr<ServePool>> StartServePool(const transfer::InstanceInfo& self, scheduler::Engine& engine,
                                                  transfer::TransferEngine* xfer, transfer::MetadataClient* meta,
                                                  cluster::RemoteStore* remote, const std::string& admin_token);
// Shutdown, before the KV stack goes: no more resolves (the holder stays
// until the pool is destroyed, after the stack: staging reads may still
// complete into it), host tiers and the staging area no longer exported and
// quiesced (no peer reads them any more; bounded wait), while the directory
// and the transfer engine stay until the stack has drained the remote
// tier's reads.
void StopServing(ServePool& pool);

// Which peers hold a prefix of `chain` (blocks of `block_size` tokens),
// longest first: [{"instance","blocks","tokens","blocks_by_tier":{tier: n}}]
// for /admin/cache/lookup (`strata cache lookup`).
nlohmann::json ClusterLookupJson(const cluster::ClusterDirectory& directory, const std::vector<BlockHash>& chain,
                                 int block_size);

// The pool's metric families (docs/metrics.md: strata_kv_remote_*,
// strata_cluster_*, strata_kv_holder_*).
std::string RenderPoolMetrics(const ServePool& pool);

// The prefill/decode handoff families (docs/metrics.md: strata_pd_*); either may be null.
std::string RenderPdMetrics(const cluster::PdDecode* decode, const cluster::PdPrefill* prefill);

}  // namespace strata::cli
