// strata serve: the all-in-one server (DESIGN.md "Process roles"): HTTP
// (OpenAI API, /metrics, /admin) and gRPC front ends over one continuous-
// batching engine and the tiered KV cache.
//
// Start-up order: the HTTP server listens first (so /health answers 503
// while the model loads), then the model, KV stack, engine and gRPC start,
// then /health turns 200 and --port-file is written. SIGTERM or SIGINT:
// /health 503, new requests 503, listeners close, in-flight requests get
// --shutdown-grace-seconds to finish (then they are cancelled), the disk
// tier's outstanding writes are drained, exit 0. Further signals during the
// shutdown are ignored.

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>

#include <cstdio>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench/cost_model.h"
#include "cluster/pd_decode.h"
#include "cluster/pd_lookup.h"
#include "cluster/pd_prefill.h"
#include "common/config.h"
#include "common/logging.h"
#include "common/thread_pool.h"
#include "kvcache/clock.h"
#include "model/model_loader.h"
#include "scheduler/engine.h"
#include "server/admin_routes.h"
#include "server/frontend.h"
#include "server/grpc_service.h"
#include "server/http_server.h"
#include "server/metrics.h"
#include "server/openai_routes.h"
#include "server/service.h"
#include "tools/commands.h"
#include "tools/kv_stack.h"
#include "tools/serve_cluster.h"
#include "tools/serve_process.h"
#include "kvcache/block_hash.h"
#include "tools/transfer_flags.h"
#include "transfer/metadata.h"
#include "transfer/transfer_engine.h"
#include "transfer/wire.h"

namespace strata::cli {

namespace {

struct ServeFlags {
  EngineFlags engine;
  std::string model;
  std::string served_model_name;
  std::string host = "127.0.0.1";
  int port = 8000;
  int grpc_port = 50051;  // -1 = no gRPC
  std::string port_file;
  std::string api_key;
  std::string admin_token;
  double debug_step_time_factor = 1;
  std::string calibration;
  int max_num_seqs = 64;
  int max_waiting = 1024;
  int max_batch_tokens = 512;
  int max_n = 16;
  std::string max_body_bytes = "16M";
  double shutdown_grace_seconds = 30;
  int io_threads = 2;
  double write_timeout_seconds = 30;
  std::string stream_buffer_bytes = "1M";
  int parse_threads = 2;
  std::string small_body_bytes = "256K";
  int small_lane_queue = 1024;
  int large_lane_queue = 16;
  std::string kv_default_cap = "4G";
  std::string instance_name;  // default: <hostname>:<http port>
  TransferFlags transfer;     // port -1: no transfer engine
  std::string metadata;       // etcd://HOST:PORT or strata://HOST:PORT; empty: not in a cluster
  int metadata_lease_seconds = 10;
  std::string role = "both";  // prefill | decode | both (docs/disaggregation.md)
  int pd_grants_timeout_ms = 10000;  // a prefill at its first token waits this long for grants that follow
};

int Fail(const Status& s) {
  std::fprintf(stderr, "strata serve: %s\n", s.message().c_str());
  return s.code() == StatusCode::kInvalidArgument ? 2 : 1;
}

// The server.* / engine.* keys `strata serve` reads (configs/strata.yaml).
const std::vector<std::string>& ServeKeys() {
  static const std::vector<std::string> keys = {
      "server.host",          "server.port",           "server.grpc_port",          "server.api_key",
      "server.admin_token",   "server.served_model_name", "server.max_body_bytes",  "server.io_threads",
      "server.shutdown_grace_seconds", "server.max_n",  "engine.max_num_seqs",       "engine.max_waiting",
      "server.parse_threads", "server.small_body_bytes", "server.small_lane_queue", "server.large_lane_queue",
      "server.write_timeout_seconds", "server.stream_buffer_bytes",
      "engine.max_batch_tokens", "server.instance_name", "transfer.transports", "transfer.port",
      "transfer.bind_address", "transfer.advertise_address", "transfer.cluster_secret_file", "transfer.connections",
      "cluster.metadata", "cluster.metadata_lease_seconds", "cluster.role",
  };
  return keys;
}

// YAML values under the flags the user did not give.
Status ApplyServeConfig(CLI::App* cmd, ServeFlags* f) {
  if (f->engine.config_path.empty()) return Status::Ok();
  STRATA_ASSIGN_OR_RETURN(Config cfg, Config::LoadFile(f->engine.config_path));
  auto unset = [&](const char* flag) { return cmd->count(flag) == 0; };
  auto str = [&](const char* flag, const char* key, std::string* v) -> Status {
    if (!unset(flag)) return Status::Ok();
    STRATA_ASSIGN_OR_RETURN(*v, cfg.GetString(key, *v));
    return Status::Ok();
  };
  auto integer = [&](const char* flag, const char* key, int* v, int lo, int hi) -> Status {
    if (!unset(flag)) return Status::Ok();
    STRATA_ASSIGN_OR_RETURN(int64_t x, cfg.GetInt(key, *v));
    if (x < lo || x > hi)
      return Status::InvalidArgument(f->engine.config_path + ": " + key + " = " + std::to_string(x) +
                                     " is out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    *v = static_cast<int>(x);
    return Status::Ok();
  };
  STRATA_RETURN_IF_ERROR(str("--host", "server.host", &f->host));
  STRATA_RETURN_IF_ERROR(integer("--port", "server.port", &f->port, 0, 65535));
  STRATA_RETURN_IF_ERROR(integer("--grpc-port", "server.grpc_port", &f->grpc_port, -1, 65535));
  STRATA_RETURN_IF_ERROR(str("--api-key", "server.api_key", &f->api_key));
  STRATA_RETURN_IF_ERROR(str("--admin-token", "server.admin_token", &f->admin_token));
  STRATA_RETURN_IF_ERROR(str("--served-model-name", "server.served_model_name", &f->served_model_name));
  STRATA_RETURN_IF_ERROR(str("--max-body-bytes", "server.max_body_bytes", &f->max_body_bytes));
  STRATA_RETURN_IF_ERROR(integer("--io-threads", "server.io_threads", &f->io_threads, 1, 256));
  STRATA_RETURN_IF_ERROR(integer("--max-n", "server.max_n", &f->max_n, 1, 128));
  STRATA_RETURN_IF_ERROR(integer("--parse-threads", "server.parse_threads", &f->parse_threads, 1, 256));
  STRATA_RETURN_IF_ERROR(str("--small-body-bytes", "server.small_body_bytes", &f->small_body_bytes));
  STRATA_RETURN_IF_ERROR(str("--stream-buffer-bytes", "server.stream_buffer_bytes", &f->stream_buffer_bytes));
  STRATA_RETURN_IF_ERROR(
      integer("--small-lane-queue", "server.small_lane_queue", &f->small_lane_queue, 1, 1 << 20));
  STRATA_RETURN_IF_ERROR(
      integer("--large-lane-queue", "server.large_lane_queue", &f->large_lane_queue, 1, 1 << 20));
  STRATA_RETURN_IF_ERROR(integer("--max-num-seqs", "engine.max_num_seqs", &f->max_num_seqs, 1, 65536));
  STRATA_RETURN_IF_ERROR(integer("--max-waiting", "engine.max_waiting", &f->max_waiting, 0, 1 << 24));
  STRATA_RETURN_IF_ERROR(integer("--max-batch-tokens", "engine.max_batch_tokens", &f->max_batch_tokens, 1, 1 << 20));
  STRATA_RETURN_IF_ERROR(str("--instance-name", "server.instance_name", &f->instance_name));
  STRATA_RETURN_IF_ERROR(str("--transfer-transports", "transfer.transports", &f->transfer.transports));
  STRATA_RETURN_IF_ERROR(integer("--transfer-port", "transfer.port", &f->transfer.port, -1, 65535));
  STRATA_RETURN_IF_ERROR(str("--transfer-bind-address", "transfer.bind_address", &f->transfer.bind_address));
  STRATA_RETURN_IF_ERROR(
      str("--transfer-advertise-address", "transfer.advertise_address", &f->transfer.advertise_address));
  STRATA_RETURN_IF_ERROR(str("--cluster-secret-file", "transfer.cluster_secret_file", &f->transfer.secret_file));
  STRATA_RETURN_IF_ERROR(integer("--transfer-connections", "transfer.connections", &f->transfer.connections, 1, 64));
  STRATA_RETURN_IF_ERROR(str("--metadata", "cluster.metadata", &f->metadata));
  STRATA_RETURN_IF_ERROR(integer("--metadata-lease-seconds", "cluster.metadata_lease_seconds",
                                 &f->metadata_lease_seconds, 2, 3600));
  STRATA_RETURN_IF_ERROR(str("--role", "cluster.role", &f->role));
  if (f->role != "prefill" && f->role != "decode" && f->role != "both")
    return Status::InvalidArgument("--role (cluster.role) must be prefill, decode or both, not '" + f->role + "'");
  STRATA_RETURN_IF_ERROR(integer("--pd-grants-timeout-ms", "cluster.pd_grants_timeout_ms", &f->pd_grants_timeout_ms,
                                 1, 600000));
  if (f->role != "both" && (f->metadata.empty() || f->transfer.port < 0))
    return Status::InvalidArgument("--role " + f->role +
                                   " needs --metadata (the router finds instances there) and a transfer engine "
                                   "(--transfer-port not -1)");
  if (unset("--write-timeout-seconds")) {
    STRATA_ASSIGN_OR_RETURN(f->write_timeout_seconds,
                            cfg.GetDouble("server.write_timeout_seconds", f->write_timeout_seconds));
    if (!(f->write_timeout_seconds > 0 && f->write_timeout_seconds <= 86400))
      return Status::InvalidArgument(f->engine.config_path + ": server.write_timeout_seconds must be in (0, 86400]");
  }
  if (unset("--shutdown-grace-seconds")) {
    STRATA_ASSIGN_OR_RETURN(f->shutdown_grace_seconds,
                            cfg.GetDouble("server.shutdown_grace_seconds", f->shutdown_grace_seconds));
    if (f->shutdown_grace_seconds < 0)
      return Status::InvalidArgument(f->engine.config_path + ": server.shutdown_grace_seconds must be >= 0");
  }
  return Status::Ok();
}


int Run(CLI::App* cmd, ServeFlags& f) {
  if (Status s = InstallShutdownSignals(); !s.ok()) return Fail(s);
  f.engine.extra_config_keys = ServeKeys();
  std::string err;
  if (!ResolveEngineFlags(cmd, &f.engine, &f.model, &err)) return Fail(Status::InvalidArgument(err));
  if (Status s = ApplyServeConfig(cmd, &f); !s.ok()) return Fail(s);
  auto body_limit = ParseByteSize(f.max_body_bytes);
  if (!body_limit || *body_limit == 0)
    return Fail(Status::InvalidArgument("--max-body-bytes (server.max_body_bytes): '" + f.max_body_bytes +
                                        "' is not a positive size"));
  auto kv_cap = ParseByteSize(f.kv_default_cap);
  if (!kv_cap) return Fail(kv_cap.error());
  auto stream_buffer = ParseByteSize(f.stream_buffer_bytes);
  if (!stream_buffer || *stream_buffer == 0)
    return Fail(Status::InvalidArgument("--stream-buffer-bytes (server.stream_buffer_bytes): '" +
                                        f.stream_buffer_bytes + "' is not a positive size"));
  auto small_body = ParseByteSize(f.small_body_bytes);
  if (!small_body)
    return Fail(Status::InvalidArgument("--small-body-bytes (server.small_body_bytes): '" + f.small_body_bytes +
                                        "' is not a size"));

  // The calls between cluster processes carry the cluster secret's bearer
  // token when there is a secret, else the admin token.
  std::string cluster_bearer;
  if (!f.transfer.secret_file.empty()) {
    auto secret = ReadClusterSecret(f.transfer.secret_file);
    if (!secret) return Fail(secret.error());
    cluster_bearer = transfer::ClusterBearer(*secret);
  }
  const std::string internal_token = cluster_bearer.empty() ? f.admin_token : cluster_bearer;

  // 1. HTTP first: /health says 503 while the model loads.
  server::ServiceOptions so;
  so.api_key = f.api_key;
  so.admin_token = f.admin_token;
  so.internal_token = internal_token;
  so.lanes.small_body_bytes = *small_body;
  so.lanes.small = {f.parse_threads, f.small_lane_queue};
  so.lanes.large = {f.parse_threads, f.large_lane_queue};
  server::Service service(so);
  server::HttpServerOptions ho;
  ho.host = f.host;
  ho.port = f.port;
  ho.io_threads = f.io_threads;
  ho.write_timeout_seconds = f.write_timeout_seconds;
  ho.max_buffered_bytes = *stream_buffer;
  ho.max_body_bytes = *body_limit;
  auto http = server::HttpServer::Create(
      ho, [&service](server::HttpRequest&& r, std::shared_ptr<server::ResponseWriter> w) {
        service.Handle(std::move(r), std::move(w));
      },
      [&service](const server::AccessRecord& a) { service.OnAccess(a); });
  if (!http) return Fail(http.error().WithContext("HTTP on " + f.host + ":" + std::to_string(f.port)));
  (*http)->Start();
  STRATA_LOG_INFO("HTTP listening on {}:{} (model loading)", f.host, (*http)->port());

  // 2. Model, KV stack, engine.
  auto loaded = LoadCommandModel(f.engine, &f.model);
  if (!loaded) return Fail(loaded.error());
  LoadedModel& m = **loaded;
  const ModelConfig& c = m.weights.config;
  const std::string name = f.served_model_name.empty() ? m.id : f.served_model_name;

  ThreadPool pool(f.engine.threads);
  KvOptions kv;
  kv.block_size = f.engine.kv_block_size;
  kv.dtype = *DTypeFromName(f.engine.kv_dtype);
  const KvLayout layout{c.n_layers, c.n_kv_heads, c.head_dim, kv.block_size, kv.dtype};
  auto blocks = ServingDeviceBlocks(f.engine.kv, layout, c.context_length, f.max_num_seqs, *kv_cap);
  if (!blocks) return Fail(blocks.error());
  kv.num_blocks = *blocks;
  // In a cluster a host tier defaults to write-through (peers read it).
  f.engine.kv.cluster = !f.metadata.empty();
  std::vector<std::string> warnings;
  if (Status s = kvcache::ValidateKvCacheConfig(f.engine.kv, layout.block_bytes() * static_cast<uint64_t>(kv.num_blocks),
                                                &warnings);
      !s.ok())
    return Fail(s);
  for (const auto& w : warnings) STRATA_LOG_WARN("{}", w);
  auto cpu = OpenCpuModel(m, kv, &pool);
  if (!cpu) return Fail(cpu.error());
  CpuModel& model = **cpu;
  cluster::RemoteStore* remote = nullptr;  // the remote tier's store, when configured (owned by the stack)
  auto stack = OpenKvStack(f.engine.kv, m, *model.backend, model.pool, *model.forward, kvcache::RealClock(),
                           ServeStoreMaker(!f.metadata.empty(), internal_token, &remote));
  if (!stack) return Fail(stack.error());
  scheduler::ForwardEngineRunner runner(model.forward.get());
  scheduler::EngineOptions eo;
  eo.max_running = f.max_num_seqs;
  eo.max_waiting = f.max_waiting;
  eo.max_batch_tokens = f.max_batch_tokens;
  eo.prefetch_max_requests = f.engine.kv.prefetch_max_requests;
  eo.lookup_timeout_seconds = f.engine.kv.lookup_timeout_ms / 1000.0;
  eo.step_time_factor = f.debug_step_time_factor;
  if (!f.calibration.empty()) {
    auto cm = bench::LoadCostModel(f.calibration);
    if (!cm) return Fail(cm.error().WithContext("--calibration"));
    const scheduler::CalibratedRates r = scheduler::RatesFromCostModel(*cm);
    eo.calibrated_prefill_tokens_per_s = r.prefill_tokens_per_s;
    eo.calibrated_decode_step_seconds = r.decode_step_seconds;
  }
  auto engine = scheduler::Engine::Create(eo, &runner, (*stack)->manager.get(), m.tokenizer.get(), kvcache::RealClock());
  if (!engine) return Fail(engine.error());
  (*engine)->Start();

  server::ServerMetrics metrics(name, c.context_length);
  server::FrontendOptions fo;
  fo.served_model_name = name;
  fo.max_n = f.max_n;
  fo.observer = &metrics;
  server::Frontend frontend(m, **engine, fo);
  server::OpenAiRoutes openai(frontend);
  server::AdminRoutes admin(frontend, f.admin_token);

  std::unique_ptr<server::GrpcServer> grpc;
  if (f.grpc_port >= 0) {
    server::GrpcServerOptions go;
    go.host = f.host;
    go.port = f.grpc_port;
    go.max_message_bytes = static_cast<int>(std::min<uint64_t>(*body_limit, 1u << 30));
    go.api_key = f.api_key;
    go.admin_token = f.admin_token;
    go.retry_after_seconds = so.retry_after_seconds;
    go.write_timeout_seconds = f.write_timeout_seconds;
    go.on_write_timeout = [&service] { service.CountWriteTimeout(); };
    auto g = server::GrpcServer::Create(go, frontend, service.lanes());
    if (!g) {
      (*engine)->Stop(0);
      (*http)->Stop();
      return Fail(g.error().WithContext("gRPC on " + f.host + ":" + std::to_string(f.grpc_port)));
    }
    grpc = std::move(*g);
  }
  // The transfer engine over the KV manager's segments (device pool, host
  // tier arena, staging buffers): registered, none exported yet; grants and
  // exports come from the cluster roles (docs/status.md).
  const std::string instance = InstanceName(f.instance_name, (*http)->port());
  auto stop_early = [&](const Status& s) {
    grpc.reset();
    (*engine)->Stop(0);
    (*http)->Stop();
    return Fail(s);
  };
  auto started = StartServeTransfer(f.transfer, f.host, instance, &(*stack)->manager->segments());
  if (!started) return stop_early(started.error());
  std::unique_ptr<transfer::TransferEngine> xfer = std::move(*started);
  const int grpc_port = grpc ? grpc->port() : -1;
  const int transfer_port = xfer ? xfer->port() : -1;
  // Cluster membership: register under the instance name with a lease.
  std::unique_ptr<transfer::MetadataClient> meta;
  const std::string meta_incarnation = transfer::RandomHex(8);
  if (!f.metadata.empty()) {
    transfer::InstanceInfo self;
    self.name = instance;
    self.incarnation = meta_incarnation;
    self.role = f.role;
    self.http_address = AdvertisedHost(f.host, f.transfer.advertise_address) + ":" + std::to_string((*http)->port());
    if (xfer) {
      self.transfer_address = xfer->address();
      auto transports = transfer::ParseTransports(f.transfer.transports);  // valid: the engine started with it
      if (transports) {
        for (auto t : *transports) self.transports.emplace_back(transfer::TransportName(t));
      }
    }
    self.model_namespace =
        ToHex(kvcache::NamespaceDigest(m.weights.digest, c.arch, f.engine.kv.dtype, f.engine.kv.block_size));
    self.model = name;
    auto joined = JoinCluster(f.metadata, self, f.metadata_lease_seconds, cluster_bearer);
    if (!joined) {
      xfer.reset();
      return stop_early(joined.error());
    }
    meta = std::move(*joined);
  }
  if (f.role != "both") {
    // The handoff reads and writes device blocks as host memory; a GPU pool
    // would need staging through pinned buffers (not built).
    const auto device = (*stack)->manager->segments().Get((*stack)->manager->device_segment());
    if (!device || !HostAddressable(device->kind)) {
      meta.reset();
      xfer.reset();
      return stop_early(Status::Unsupported("--role " + f.role +
                                            ": the device KV pool is not host-addressable (a GPU); prefill/decode "
                                            "handoffs through device memory are not built yet"));
    }
  }
  // The cluster KV pool: publish this instance's blocks, serve peers, read theirs.
  std::unique_ptr<ServePool> kv_pool;
  std::unique_ptr<cluster::PdDecode> pd_decode;
  std::unique_ptr<cluster::PdPrefill> pd_prefill;
  if (meta) {
    transfer::InstanceInfo self;
    self.name = instance;
    self.incarnation = meta_incarnation;
    self.model_namespace = ToHex(kvcache::NamespaceDigest(m.weights.digest, c.arch, f.engine.kv.dtype,
                                                          f.engine.kv.block_size));
    auto started_pool = StartServePool(self, **engine, xfer.get(), meta.get(), remote, internal_token);
    if (!started_pool) {
      meta.reset();
      xfer.reset();
      return stop_early(started_pool.error());
    }
    kv_pool = std::move(*started_pool);
    if (kv_pool->directory) {
      admin.SetClusterLookup([p = kv_pool.get(), ns = kvcache::NamespaceDigest(m.weights.digest, c.arch,
                                                                               f.engine.kv.dtype, f.engine.kv.block_size),
                              bs = f.engine.kv.block_size](const std::vector<int32_t>& tokens, const std::string& salt) {
        return ClusterLookupJson(*p->directory, kvcache::HashPrefix(ns, tokens, bs, salt), bs);
      });
    }
    // Prefill/decode handoffs (issue 19): every role serves the side it plays.
    const SegmentId seg = (*stack)->manager->device_segment();
    if (xfer) {
      cluster::PostFn post = [e = engine->get()](cluster::EngineTask t) { return e->Post(std::move(t)); };
      const uint64_t bb = layout.block_bytes();
      if (f.role != "prefill") pd_decode = std::make_unique<cluster::PdDecode>(post, engine->get(), xfer.get(), seg, bb);
      if (f.role != "decode")
        pd_prefill = std::make_unique<cluster::PdPrefill>(post, engine->get(), (*stack)->manager.get(), xfer.get(), seg,
                                                          bb, f.engine.kv_block_size, std::chrono::seconds(30),
                                                          std::chrono::milliseconds(f.pd_grants_timeout_ms));
      // The handoffs' requests count in the request metrics like the API's.
      auto observe = [&metrics](const scheduler::RequestOutput& ev) { metrics.OnEvent(ev); };
      if (pd_decode) pd_decode->SetObserver(observe);
      if (pd_prefill) pd_prefill->SetObserver(observe);
    }
    service.SetInternalRoutes([p = kv_pool.get(), d = pd_decode.get(), pf = pd_prefill.get(), e = engine->get()](
                                  const server::HttpRequest& r, const std::shared_ptr<server::ResponseWriter>& w) {
      cluster::ReplyFn reply = [w](int status, std::string body) {
        w->Send(status, "application/json", std::move(body));
      };
      if (r.path.rfind("/internal/pd/", 0) == 0) {
        if (cluster::HandlePdLookup(e, r.method, r.path, r.body, reply)) return true;
        if (pf != nullptr && pf->Handle(r.method, r.path, r.body, reply,
                                        [w](std::function<void()> f) { w->OnClose(std::move(f)); }))
          return true;
        cluster::StreamReply stream{[w](int status, std::string type) { w->StartStream(status, std::move(type)); },
                                    [w](std::string data) { return w->Write(std::move(data)); }, [w] { w->End(); },
                                    [w](std::function<void()> f) { w->OnClose(std::move(f)); }, reply};
        return d != nullptr && d->Handle(r.method, r.path, r.body, std::move(stream));
      }
      return p->holder->Handle(r.method, r.path, r.query, r.body, reply);
    });
  }
  std::function<std::string()> extra_metrics = [e = xfer.get(), p = kv_pool.get(), d = pd_decode.get(),
                                                pf = pd_prefill.get()] {
    std::string text = e != nullptr ? transfer::RenderTransferMetrics(e->stats()) : std::string();
    if (p != nullptr) text += RenderPoolMetrics(*p);
    if (d != nullptr || pf != nullptr) text += RenderPdMetrics(d, pf);
    return text;
  };
  service.SetBackend(&frontend, &openai, &admin, &metrics, std::move(extra_metrics));
  STRATA_LOG_INFO(
      "serving model {} as '{}' ({}; {} layers, dim {}, context {}): HTTP {}:{}, gRPC {}, {} KV blocks of {} "
      "tokens ({} MiB), {} threads, max {} running / {} waiting / {} tokens per step",
      m.path, name, m.format, c.n_layers, c.dim, c.context_length, f.host, (*http)->port(),
      grpc_port >= 0 ? f.host + ":" + std::to_string(grpc_port) : std::string("off"), kv.num_blocks, kv.block_size,
      (layout.block_bytes() * static_cast<uint64_t>(kv.num_blocks)) >> 20, pool.num_threads(), eo.max_running,
      eo.max_waiting, eo.max_batch_tokens);
  if (!f.port_file.empty()) {
    if (Status s = WritePortFile(f.port_file, (*http)->port(), grpc_port, transfer_port); !s.ok()) {
      STRATA_LOG_ERROR("{}", s.message());
    }
  }

  // 3. Wait for SIGTERM / SIGINT, then shut down gracefully.
  const int sig = WaitForShutdownSignal();
  STRATA_LOG_INFO("received {}: draining (grace {} s, {} requests unfinished)", sig == SIGTERM ? "SIGTERM" : "SIGINT",
                  f.shutdown_grace_seconds, (*engine)->num_unfinished());
  service.SetDraining();
  if (pd_decode) pd_decode->SetDraining();
  if (pd_prefill) pd_prefill->SetDraining();
  if (meta) {
    // Leave the cluster first, so no router sends more work here.
    if (Status s = meta->Deregister(); !s.ok()) STRATA_LOG_WARN("cluster: leaving: {}", s.message());
  }
  (*engine)->BeginDrain();
  (*http)->StopAccepting();
  if (grpc) grpc->Shutdown(f.shutdown_grace_seconds);
  (*engine)->Stop(f.shutdown_grace_seconds);  // cancels what is left after the grace period
  // Let the final chunks (and the [DONE] of cancelled streams) go out.
  if (!(*http)->WaitForResponses(5)) STRATA_LOG_WARN("some HTTP responses were still being written at shutdown");
  (*http)->Stop();
  service.Stop();  // what the request lanes still hold runs (503: draining) before the routes go away
  if (pd_prefill) pd_prefill->Stop();  // its queued handoffs finish (the engine has stopped: nothing new)
  if (pd_decode) pd_decode->Stop();
  const kvcache::KvManagerStats ks = (*stack)->manager->stats();
  if (kv_pool) StopServing(*kv_pool);  // no more resolves; host tiers no longer exported
  grpc.reset();
  engine->reset();  // before the KV stack it points into
  if (f.engine.kv.stop_write_down_seconds > 0) {
    // The engine has stopped: the disk tier takes what the device and host
    // hold, so a restart finds it (a full disk holds what they do not).
    const kvcache::WriteDownResult w = (*stack)->manager->WriteDown(f.engine.kv.stop_write_down_seconds);
    if (w.tier >= 0) {
      STRATA_LOG_INFO(
          "kv: wrote {} blocks down to the {} tier in {:.3f} s ({} kept there, {} of them held already; {} refused, "
          "{} failed, {} left at the {} s limit)",
          w.written, (*stack)->manager->tier_name(w.tier + 1), w.seconds, w.kept, w.already, w.refused, w.failed,
          w.not_submitted, f.engine.kv.stop_write_down_seconds);
    }
  }
  stack->reset();   // drains the lower tiers (the remote tier's reads use the directory and transfer engine)
  kv_pool.reset();
  pd_prefill.reset();
  pd_decode.reset();
  xfer.reset();
  meta.reset();
  STRATA_LOG_INFO("stopped: {} prefix-cache queries, {} device-hit tokens, {} lower-tier-hit tokens", ks.queries,
                  ks.device.tokens, ks.lower.tokens);
  return 0;
}

}  // namespace

void RegisterServe(CLI::App& app, int* exit_code) {
  auto f = std::make_shared<ServeFlags>();
  CLI::App* cmd = app.add_subcommand("serve", "serve a model over HTTP (OpenAI API) and gRPC");
  cmd->add_option("--model", f->model, "GGUF file or Hugging Face directory (default: a synthetic model with random weights)");
  cmd->add_option("--served-model-name", f->served_model_name,
                  "model id in the API (default: the model file's base name without extension)");
  cmd->add_option("--host", f->host, "address to bind (HTTP and gRPC)")->capture_default_str();
  cmd->add_option("--port", f->port, "HTTP port (0 = any free port)")->check(CLI::Range(0, 65535))->capture_default_str();
  cmd->add_option("--grpc-port", f->grpc_port, "gRPC port (0 = any free port, -1 = no gRPC)")
      ->check(CLI::Range(-1, 65535))
      ->capture_default_str();
  cmd->add_option("--port-file", f->port_file,
                  "write {\"http\": P, \"grpc\": G, \"transfer\": T, \"pid\": N} here once serving");
  cmd->add_option("--instance-name", f->instance_name,
                  "this instance's cluster-unique name (default: <hostname>:<http port>)");
  AddTransferFlags(cmd, &f->transfer);
  cmd->add_option("--metadata", f->metadata,
                  "cluster metadata store: etcd://HOST:PORT or strata://HOST:PORT (strata meta); this instance "
                  "registers there under --instance-name");
  cmd->add_option("--role", f->role,
                  "prefill | decode | both: the side of a prefill/decode handoff this instance serves to a "
                  "router (both: it also serves requests whole)")
      ->capture_default_str();
  cmd->add_option("--pd-grants-timeout-ms", f->pd_grants_timeout_ms,
                  "prefill role: how long a prefill at its first token waits for the decode instance's grants "
                  "when the router sends them after the prefill request; then it answers with no block written "
                  "(the decode instance recomputes)")
      ->check(CLI::Range(1, 600000))
      ->capture_default_str();
  cmd->add_option("--metadata-lease-seconds", f->metadata_lease_seconds,
                  "lease of this instance's registration: it disappears this long after it dies")
      ->check(CLI::Range(2, 3600))
      ->capture_default_str();
  cmd->add_option("--api-key", f->api_key, "require 'Authorization: Bearer KEY' on the API (default: open)");
  cmd->add_option("--admin-token", f->admin_token, "require 'Authorization: Bearer TOKEN' on /admin/ (default: open)");
  cmd->add_option("--max-num-seqs", f->max_num_seqs, "sequences running at once")
      ->check(CLI::Range(1, 65536))
      ->capture_default_str();
  cmd->add_option("--max-waiting", f->max_waiting, "requests queued beyond the running ones; more get 429")
      ->check(CLI::Range(0, 1 << 24))
      ->capture_default_str();
  cmd->add_option("--max-batch-tokens", f->max_batch_tokens, "tokens per engine step (decode + prompt chunks)")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--max-n", f->max_n, "largest n (choices per request)")->check(CLI::Range(1, 128))->capture_default_str();
  cmd->add_option("--max-body-bytes", f->max_body_bytes, "largest request body; larger get 413")->capture_default_str();
  cmd->add_option("--shutdown-grace-seconds", f->shutdown_grace_seconds,
                  "on SIGTERM, time in-flight requests get to finish before they are cancelled")
      ->check(CLI::Range(0.0, 3600.0))
      ->capture_default_str();
  cmd->add_option("--io-threads", f->io_threads, "HTTP I/O threads (they only move bytes)")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  cmd->add_option("--write-timeout-seconds", f->write_timeout_seconds,
                  "a stream whose client reads nothing for this long is cancelled like a hang-up")
      ->check(CLI::Range(0.001, 86400.0))
      ->capture_default_str();
  cmd->add_option("--stream-buffer-bytes", f->stream_buffer_bytes,
                  "output queued per connection beyond which a stream's generation is held until the client reads")
      ->capture_default_str();
  cmd->add_option("--parse-threads", f->parse_threads,
                  "workers per request lane (parse, chat template, tokenize, render); two lanes: small and large bodies")
      ->check(CLI::Range(1, 256))
      ->capture_default_str();
  cmd->add_option("--small-body-bytes", f->small_body_bytes, "bodies up to this size use the small lane")
      ->capture_default_str();
  cmd->add_option("--small-lane-queue", f->small_lane_queue, "requests waiting in the small lane; more get 503")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--large-lane-queue", f->large_lane_queue, "requests waiting in the large lane; more get 503")
      ->check(CLI::Range(1, 1 << 20))
      ->capture_default_str();
  cmd->add_option("--kv-default-device-cap", f->kv_default_cap,
                  "without --kv-device-bytes: the device KV pool is max-num-seqs full contexts, at most this size")
      ->capture_default_str();
  AddEngineFlags(cmd, &f->engine);
  cmd->add_option("--calibration", f->calibration,
                  "this instance's rates from `strata bench calibrate --out F`: reported to routers (prefill "
                  "tokens/s, decode step) until its own steps measure them")
      ->check(CLI::ExistingFile);
  cmd->add_option("--debug-step-time-factor", f->debug_step_time_factor,
                  "test-only: each forward pass takes this many times its time (a sleep after it)")
      ->check(CLI::Range(1.0, 10000.0))
      ->group("Testing");
  cmd->callback([cmd, f, exit_code] { *exit_code = Run(cmd, *f); });
}

}  // namespace strata::cli
