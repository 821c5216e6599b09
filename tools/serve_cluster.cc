#include "tools/serve_cluster.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <future>
#include <mutex>
#include <thread>

#include "common/logging.h"

namespace strata::cli {

namespace {
std::string HostName() {
  char hn[256] = {};
  gethostname(hn, sizeof(hn) - 1);
  return hn;
}
}  // namespace

std::string InstanceName(const std::string& flag, int http_port) {
  return flag.empty() ? HostName() + ":" + std::to_string(http_port) : flag;
}

std::string AdvertisedHost(const std::string& bind_host, const std::string& transfer_advertise) {
  if (!bind_host.empty() && bind_host != "0.0.0.0" && bind_host != "::") return bind_host;
  return transfer_advertise.empty() ? HostName() : transfer_advertise;
}

Result<std::unique_ptr<transfer::TransferEngine>> StartServeTransfer(const TransferFlags& flags,
                                                                      const std::string& serve_host,
                                                                      const std::string& instance,
                                                                      SegmentTable* segments) {
  if (flags.port < 0) return std::unique_ptr<transfer::TransferEngine>();
  TransferFlags tf = flags;
  if (tf.bind_address.empty()) tf.bind_address = tf.secret_file.empty() ? "127.0.0.1" : serve_host;
  STRATA_ASSIGN_OR_RETURN(transfer::TransferOptions options, ToOptions(tf, instance));
  auto engine = transfer::TransferEngine::Start(options, segments);
  if (!engine) return engine.error().WithContext("transfer engine");
  if (!flags.faults.empty()) {
    STRATA_ASSIGN_OR_RETURN(auto rules, ParseFaultRules(flags.faults));
    STRATA_LOG_WARN("transfer engine: injecting test faults: {}", flags.faults);
    (*engine)->SetFaults(std::move(rules));
  }
  STRATA_LOG_INFO("transfer engine '{}' listening on {}", (*engine)->instance_name(), (*engine)->address());
  return std::move(*engine);
}

Result<std::unique_ptr<transfer::MetadataClient>> JoinCluster(const std::string& url,
                                                              const transfer::InstanceInfo& self, int lease_seconds,
                                                              const std::string& bearer) {
  auto parsed = transfer::ParseMetadataUrl(url);
  if (!parsed) return parsed.error().WithContext("--metadata");
  STRATA_ASSIGN_OR_RETURN(auto client, transfer::MetadataClient::Create(*parsed, 2.0, bearer));
  if (Status s = client->Register(self, lease_seconds); !s.ok()) return s.WithContext("--metadata");
  STRATA_LOG_INFO("cluster: instance '{}' (incarnation {}) registers at {} with a {} s lease", self.name,
                  self.incarnation, url, lease_seconds);
  return client;
}

}  // namespace strata::cli

namespace strata::cli {

kvcache::StoreMaker ServeStoreMaker(bool in_cluster, const std::string& admin_token, cluster::RemoteStore** remote) {
  return [in_cluster, admin_token, remote](const kvcache::TierSpec& spec,
                                           uint64_t block_bytes) -> Result<std::unique_ptr<kvcache::BlockStore>> {
    if (spec.kind != kvcache::TierKind::kRemote || !in_cluster) return kvcache::OpenStore(spec, block_bytes);
    cluster::RemoteStoreOptions o;
    o.block_bytes = block_bytes;
    o.admin_token = admin_token;
    STRATA_ASSIGN_OR_RETURN(std::unique_ptr<cluster::RemoteStore> r, cluster::RemoteStore::Create(o));
    *remote = r.get();
    return std::unique_ptr<kvcache::BlockStore>(std::move(r));
  };
}

// The KV manager's tiers as the pool needs them (read on the engine thread).
struct ServeTiers {
  struct Host {
    size_t index;
    std::string name;
    SegmentId segment;
  };
  std::vector<Host> hosts;
  std::vector<size_t> disks;
  uint64_t block_bytes = 0;
  SegmentTable* segments = nullptr;
};

// The rest of StartServePool, after the log is installed: exports, the
// staging area, the holder, the directory.
Status FinishServePool(ServePool* pool, const ServeTiers& tiers, const transfer::InstanceInfo& self,
                       scheduler::Engine& engine, transfer::TransferEngine* xfer, transfer::MetadataClient* meta,
                       cluster::RemoteStore* remote, const std::string& admin_token);

Result<std::unique_ptr<ServePool>> StartServePool(const transfer::InstanceInfo& self, scheduler::Engine& engine,
                                                  transfer::TransferEngine* xfer, transfer::MetadataClient* meta,
                                                  cluster::RemoteStore* remote, const std::string& admin_token) {
  auto pool = std::make_unique<ServePool>();
  const auto epoch = std::chrono::duration_cast<std::chrono::milliseconds>(
                         std::chrono::system_clock::now().time_since_epoch())
                         .count();
  pool->log = std::make_shared<kvcache::KvEventLog>(self.name, self.incarnation, static_cast<uint64_t>(epoch));
  pool->xfer = xfer;
  pool->remote = remote;
  // On the engine thread: publish, and find the host and disk tiers.
  using Tiers = ServeTiers;
  // The set-up task installs the log unless the wait below gave up first
  // (then it does nothing): the manager never keeps a log this function
  // may free.
  struct SetUp {
    std::mutex mu;
    bool cancelled = false;
    std::promise<Tiers> found;
  };
  auto setup = std::make_shared<SetUp>();
  auto done = setup->found.get_future();
  if (!engine.Post([log = pool->log.get(), setup](kvcache::KvManager& kv) {
        std::lock_guard lock(setup->mu);
        if (setup->cancelled) return;
        kv.SetEventLog(log);
        Tiers t;
        t.block_bytes = kv.options().block_bytes;
        t.segments = &kv.segments();
        for (size_t i = 0; i < kv.num_lower_tiers(); ++i) {
          const int tier = static_cast<int>(i) + 1;
          const auto& segs = kv.lower_store(i).own_segments();
          if (kv.tier_kind(tier) == kvcache::TierKind::kHost && !segs.empty())
            t.hosts.push_back({i, std::string(kv.tier_name(tier)), segs.front()});
          if (kv.tier_kind(tier) == kvcache::TierKind::kDisk) t.disks.push_back(i);
        }
        setup->found.set_value(std::move(t));
      }))
    return Status::Unavailable("cluster pool: the engine is stopping");
  if (done.wait_for(std::chrono::seconds(60)) != std::future_status::ready) {
    std::lock_guard lock(setup->mu);
    if (done.wait_for(std::chrono::seconds(0)) != std::future_status::ready) {
      setup->cancelled = true;
      return Status::Unavailable("cluster pool: the engine thread did not run the set-up task");
    }
  }
  Tiers tiers = done.get();
  auto r = FinishServePool(pool.get(), tiers, self, engine, xfer, meta, remote, admin_token);
  if (!r.ok()) {
    // Detach the log from the manager before it is freed with the pool.
    auto detached = std::make_shared<std::promise<void>>();
    auto gone = detached->get_future();
    if (engine.Post([detached](kvcache::KvManager& kv) {
          kv.SetEventLog(nullptr);
          detached->set_value();
        })) {
      gone.wait();
    } else {
      // The engine is stopping and will not run the detach: the manager may
      // still record into the log, so it must outlive the process's use of
      // it. Keep it (deliberately never freed; start-up failure only).
      new std::shared_ptr<kvcache::KvEventLog>(pool->log);
    }
    StopServing(*pool);
    return r;
  }
  return pool;
}

Status FinishServePool(ServePool* pool, const ServeTiers& tiers, const transfer::InstanceInfo& self,
                       scheduler::Engine& engine, transfer::TransferEngine* xfer, transfer::MetadataClient* meta,
                       cluster::RemoteStore* remote, const std::string& admin_token) {
  std::vector<cluster::ExportedTier> exported;
  cluster::StagingArea staging;
  if (xfer != nullptr) {
    for (const auto& h : tiers.hosts) {
      const std::string name = "kv." + h.name;
      auto r = xfer->ExportSegment(h.segment, name);
      if (!r) return r.error().WithContext("cluster pool: exporting " + name);
      pool->exports.push_back(name);
      pool->export_handles.push_back(*r);
      exported.push_back({h.index, name});
    }
    if (!tiers.disks.empty()) {
      // Disk-only blocks are staged here for peers (cluster/kv_holder.h).
      staging.stride = (tiers.block_bytes + 4095) / 4096 * 4096;
      staging.block_bytes = tiers.block_bytes;
      staging.slots = ServePool::kStagingBlocks;
      const uint64_t bytes = staging.stride * static_cast<uint64_t>(staging.slots);
      pool->staging.reset(static_cast<uint8_t*>(std::aligned_alloc(4096, bytes)));
      if (!pool->staging) return Status::ResourceExhausted("cluster pool: no memory for the staging area");
      STRATA_ASSIGN_OR_RETURN(pool->staging_segment,
                              tiers.segments->Register(SegmentKind::kHost, pool->staging.get(), bytes, "cluster staging"));
      pool->segments = tiers.segments;
      staging.segment = "kv.staging";
      staging.segment_id = pool->staging_segment;
      staging.base = pool->staging.get();
      auto r = xfer->ExportSegment(pool->staging_segment, staging.segment);
      if (!r) return r.error().WithContext("cluster pool: exporting the staging area");
      pool->exports.push_back(staging.segment);
      pool->export_handles.push_back(*r);
    }
  }
  cluster::PostFn post = [&engine](cluster::EngineTask t) { return engine.Post(std::move(t)); };
  pool->holder = std::make_unique<cluster::KvHolder>(pool->log.get(), std::move(post), std::move(exported),
                                                     std::chrono::seconds(30), tiers.disks, staging);
  if (remote != nullptr) {
    cluster::DirectoryOptions d;
    d.self = self.name;
    d.model_namespace = self.model_namespace;
    d.admin_token = admin_token;
    pool->directory = std::make_unique<cluster::ClusterDirectory>(d, meta);
    remote->Bind(pool->directory.get(), xfer);
  }
  STRATA_LOG_INFO("cluster pool: publishing blocks as '{}'; exported: {}{}", self.name, pool->exports.size(),
                  remote != nullptr ? "; reading peers' blocks (remote tier)" : "");
  return Status::Ok();
}

ServePool::~ServePool() {
  holder.reset();
  directory.reset();
  if (segments != nullptr && IsValid(staging_segment)) (void)segments->Unregister(staging_segment);
}

void StopServing(ServePool& pool) {
  if (pool.holder) pool.holder->Stop();
  if (pool.xfer == nullptr) return;
  for (const auto& name : pool.exports) (void)pool.xfer->Unexport(name);
  // No peer may still be reading that memory when it goes (bounded wait).
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  for (uint64_t h : pool.export_handles) {
    while (!pool.xfer->Quiesced(h) && std::chrono::steady_clock::now() < until)
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    if (!pool.xfer->Quiesced(h)) STRATA_LOG_WARN("cluster pool: an export was not quiesced after 5 s");
  }
  pool.exports.clear();
  pool.export_handles.clear();
}

nlohmann::json ClusterLookupJson(const cluster::ClusterDirectory& directory, const std::vector<BlockHash>& chain,
                                 int block_size) {
  nlohmann::json out = nlohmann::json::array();
  for (const auto& h : directory.index().LongestPrefix(chain)) {
    if (h.instance == directory.options().self) continue;
    nlohmann::json by = nlohmann::json::object();
    for (kvcache::TierKind k : kvcache::kAllTierKinds) {
      int64_t n = 0;
      for (kvcache::TierMask m : h.tiers) n += (m & kvcache::MaskOf(k)) != 0;
      if (n > 0) by[std::string(kvcache::TierKindName(k))] = n;
    }
    out.push_back({{"instance", h.instance},
                   {"blocks", h.blocks},
                   {"tokens", h.blocks * static_cast<size_t>(block_size)},
                   {"blocks_by_tier", by}});
  }
  return out;
}

std::string RenderPoolMetrics(const ServePool& pool) {
  std::string out;
  auto family = [&](const char* name, const char* type, const char* help, double value) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n" + name + " ";
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.17g\n", value);
    out += buf;
  };
  if (pool.log) family("strata_kv_events_last_seq", "gauge", "Sequence number of the last published KV event batch.",
                       static_cast<double>(pool.log->last_seq()));
  if (pool.holder) {
    const cluster::HolderStats h = pool.holder->stats();
    family("strata_kv_holder_resolves_total", "counter", "Resolve requests from peers answered.",
           static_cast<double>(h.resolves));
    family("strata_kv_holder_blocks_pinned_total", "counter", "Blocks resolved and pinned for peers.",
           static_cast<double>(h.blocks_pinned));
    family("strata_kv_holder_releases_total", "counter", "Pin leases released by their readers.",
           static_cast<double>(h.releases));
    family("strata_kv_holder_leases_expired_total", "counter", "Pin leases unpinned at their deadline.",
           static_cast<double>(h.leases_expired));
    family("strata_kv_holder_leases_active", "gauge", "Pin leases held now.", static_cast<double>(h.leases_active));
    family("strata_kv_holder_blocks_staged_total", "counter", "Disk-only blocks staged into host memory for peers.",
           static_cast<double>(h.blocks_staged));
    family("strata_kv_holder_stage_failures_total", "counter",
           "Stagings that failed (disk read error) or found no free staging slot.",
           static_cast<double>(h.stage_failures));
  }
  if (pool.directory) {
    const cluster::DirectoryStats d = pool.directory->stats();
    family("strata_cluster_peers", "gauge", "Peers known (same model namespace).", static_cast<double>(d.members));
    family("strata_cluster_event_polls_total", "counter", "Peer event polls answered.", static_cast<double>(d.polls));
    family("strata_cluster_event_poll_failures_total", "counter", "Peer event or snapshot requests that failed.",
           static_cast<double>(d.poll_failures));
    family("strata_cluster_snapshots_total", "counter", "Peer snapshots applied to the index.",
           static_cast<double>(d.snapshots));
    family("strata_cluster_membership_failures_total", "counter", "Membership reads that failed.",
           static_cast<double>(d.member_failures));
    out += "# HELP strata_cluster_index_blocks Blocks the cluster index knows each peer to hold (any tier).\n"
           "# TYPE strata_cluster_index_blocks gauge\n";
    for (const auto& [name, st] : pool.directory->index().status()) {
      std::string label;
      for (char ch : name) {
        if (ch == '"' || ch == '\\') label += '\\';
        label += ch;
      }
      out += "strata_cluster_index_blocks{instance=\"" + label + "\"} " + std::to_string(st.blocks) + "\n";
    }
  }
  if (pool.remote != nullptr) {
    const cluster::RemoteStats r = pool.remote->remote_stats();
    family("strata_kv_remote_blocks_read_total", "counter", "Blocks read from peers, checked and used.",
           static_cast<double>(r.blocks_read));
    family("strata_kv_remote_bytes_read_total", "counter", "Bytes read from peers.", static_cast<double>(r.bytes_read));
    family("strata_kv_remote_misses_total", "counter", "Remote reads of blocks no peer had any more.",
           static_cast<double>(r.misses));
    family("strata_kv_remote_checksum_mismatches_total", "counter", "Remote blocks refused for a checksum mismatch.",
           static_cast<double>(r.checksum_mismatches));
    family("strata_kv_remote_transfer_failures_total", "counter",
           "Remote reads failed in transfer (timeout, refusal, broken connection).",
           static_cast<double>(r.transfer_failures));
    family("strata_kv_remote_holder_failures_total", "counter", "Remote reads whose holder did not resolve them.",
           static_cast<double>(r.holder_failures));
    family("strata_kv_remote_read_bytes_per_second", "gauge", "Measured remote read rate (smoothed).",
           pool.remote->measured_read_bytes_per_s());
  }
  return out;
}

std::string RenderPdMetrics(const cluster::PdDecode* decode, const cluster::PdPrefill* prefill) {
  std::string out;
  auto family = [&](const char* name, const char* type, const char* help, uint64_t value) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n" + name + " " +
           std::to_string(value) + "\n";
  };
  if (decode != nullptr) {
    const cluster::PdDecodeStats d = decode->stats();
    family("strata_pd_reservations_total", "counter", "Decode side: reservations granted to prefill instances.",
           d.reserved);
    family("strata_pd_reservations_not_now_total", "counter",
           "Decode side: reservations refused for now (the KV pool was short).", d.not_now);
    family("strata_pd_reservations_active", "gauge", "Decode side: reservations not yet released.", d.active);
    family("strata_pd_reservations_expired_total", "counter",
           "Decode side: reservations freed at their lease (never decoded).", d.expired);
    family("strata_pd_reservations_cancelled_total", "counter", "Decode side: reservations cancelled.", d.cancelled);
    family("strata_pd_reservations_untrusted_total", "counter",
           "Decode side: handoffs whose grants did not quiesce in time (the prompt was recomputed).", d.untrusted);
    family("strata_pd_blocks_granted_total", "counter", "Decode side: blocks prefill instances were allowed to write.",
           d.blocks_granted);
    family("strata_pd_blocks_received_total", "counter", "Decode side: blocks received and named.",
           d.blocks_received);
    family("strata_pd_blocks_corrupt_total", "counter",
           "Decode side: received blocks whose bytes did not match the sender's checksum (recomputed from there).",
           d.corrupt);
    family("strata_pd_blocks_held_total", "counter",
           "Decode side: blocks a reservation found already here (not sent again).", d.blocks_held);
    family("strata_pd_decodes_total", "counter", "Decode side: continuations started.", d.decoded);
  }
  if (prefill != nullptr) {
    const cluster::PdPrefillStats p = prefill->stats();
    family("strata_pd_prefills_total", "counter", "Prefill side: requests run to their first token and handed over.",
           p.prefills);
    family("strata_pd_blocks_sent_total", "counter", "Prefill side: blocks written to decode instances.",
           p.blocks_written);
    family("strata_pd_blocks_sent_early_total", "counter",
           "Prefill side: blocks queued for sending while later prompt chunks were still to compute (overlapped).",
           p.blocks_early);
    family("strata_pd_bytes_sent_total", "counter", "Prefill side: KV bytes written to decode instances.",
           p.bytes_written);
    family("strata_pd_prefills_abandoned_total", "counter",
           "Prefill side: requests cancelled because the router hung up before the answer.", p.abandoned);
    family("strata_pd_send_failures_total", "counter", "Prefill side: handoffs where some block did not land.",
           p.write_failures);
    family("strata_pd_finished_at_prefill_total", "counter",
           "Prefill side: requests that ended at their first token (nothing handed over).", p.finished_early);
  }
  return out;
}

}  // namespace strata::cli
