// strata router: the front door of a prefill/decode cluster (issue 19;
// docs/disaggregation.md). It speaks the same OpenAI HTTP and gRPC APIs as
// `strata serve`, through the same front end, over cluster::PdRouter: each
// request is prefilled on a prefill instance, its KV handed to a decode
// instance, and the decode instance's tokens streamed back. `--model` gives
// the tokenizer and chat template (the weights are mapped, never computed
// with); requests go to the instances registered in the cluster metadata
// (--metadata) under the same served model name.
//
// --serve-metadata: the router also serves the embedded metadata store at
// the address of its --metadata strata://HOST:PORT, so a cluster on one
// machine needs only the router and its instances.
//
// SIGTERM or SIGINT: /health 503, new requests 503, requests in flight get
// --shutdown-grace-seconds, then they are cancelled; exit 0.

#include <signal.h>

#include <charconv>
#include <cstdio>
#include <iterator>
#include <map>
#include <memory>
#include <string>

#include "bench/cost_model.h"
#include "cluster/pd_router.h"
#include "scheduler/router.h"
#include "common/logging.h"
#include "model/model_loader.h"
#include "server/admin_routes.h"
#include "server/frontend.h"
#include "server/grpc_service.h"
#include "server/http_server.h"
#include "server/metrics.h"
#include "server/openai_routes.h"
#include "server/service.h"
#include "tools/commands.h"
#include "tools/serve_process.h"
#include "tools/transfer_flags.h"
#include "transfer/metadata.h"

namespace strata::cli {

namespace {

struct RouterFlags {
  std::string model;
  std::string chat_template;
  std::string served_model_name;
  std::string metadata;
  bool serve_metadata = false;
  std::string host = "127.0.0.1";
  int port = 8000;
  int grpc_port = -1;
  std::string port_file;
  std::string secret_file;
  std::string api_key;
  std::string admin_token;
  int max_n = 16;
  int64_t lease_ms = 30000;
  int max_attempts = 4;
  bool reserve_beside_prefill = true;
  std::string routing = "least-loaded";
  std::string slo;
  std::string calibration;
  double shutdown_grace_seconds = 30;
  int io_threads = 2;
  double write_timeout_seconds = 30;
};

// "ttft=2s,tpot=100ms" (units s or ms; either part may be left out).
Status ParseSlo(const std::string& text, double* ttft, double* tpot) {
  size_t pos = 0;
  while (pos < text.size()) {
    size_t comma = text.find(',', pos);
    if (comma == std::string::npos) comma = text.size();
    const std::string part = text.substr(pos, comma - pos);
    pos = comma + 1;
    const size_t eq = part.find('=');
    const std::string key = part.substr(0, eq);
    std::string value = eq == std::string::npos ? "" : part.substr(eq + 1);
    double scale = 1;
    if (value.ends_with("ms")) {
      scale = 1e-3;
      value.resize(value.size() - 2);
    } else if (value.ends_with("s")) {
      value.resize(value.size() - 1);
    }
    double v = 0;
    auto r = std::from_chars(value.data(), value.data() + value.size(), v);
    if (value.empty() || r.ec != std::errc() || r.ptr != value.data() + value.size() || v <= 0)
      return Status::InvalidArgument("--slo '" + text + "': '" + part + "' is not ttft=DURATION or tpot=DURATION (e.g. 2s, 100ms)");
    if (key == "ttft") {
      *ttft = v * scale;
    } else if (key == "tpot") {
      *tpot = v * scale;
    } else {
      return Status::InvalidArgument("--slo '" + text + "': unknown level '" + key + "' (ttft, tpot)");
    }
  }
  return Status::Ok();
}

int Fail(const Status& s) {
  std::fprintf(stderr, "strata router: %s\n", s.message().c_str());
  return 1;
}

std::string RenderRouterMetrics(const cluster::PdRouter& router) {
  const cluster::PdRouterStats s = router.stats();
  std::string out;
  auto head = [&](const char* name, const char* type, const char* help) {
    out += std::string("# HELP ") + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
  };
  auto family = [&](const char* name, const char* type, const char* help, uint64_t value) {
    head(name, type, help);
    out += std::string(name) + " " + std::to_string(value) + "\n";
  };
  family("strata_router_requests_total", "counter", "Requests the router accepted.", s.requests);
  family("strata_router_handoffs_total", "counter", "Prefills answered and handed to a decode instance.", s.handoffs);
  family("strata_router_not_now_total", "counter", "Reservations a decode instance refused for now (its pool was short).",
         s.not_now);
  family("strata_router_replay_mismatches_total", "counter",
         "Streams resumed after a failover that differed from what was delivered (ended with an error).",
         s.replay_mismatches);
  family("strata_router_no_instance_total", "counter", "Requests that failed because no instance could serve them.",
         s.no_instance);
  family("strata_router_requests_in_flight", "gauge", "Requests the router is serving now.",
         static_cast<uint64_t>(s.in_flight));
  head("strata_router_refused_total", "counter", "Requests refused at once because no instance was predicted to meet the SLO.");
  out += "strata_router_refused_total{reason=\"slo_ttft\"} " + std::to_string(s.refused_slo_ttft) + "\n";
  out += "strata_router_refused_total{reason=\"slo_tpot\"} " + std::to_string(s.refused_slo_tpot) + "\n";
  head("strata_router_ttft_prediction_ratio", "histogram",
       "Observed time to first token divided by the prediction of the instance chosen (when one was known).");
  uint64_t cumulative = 0;
  for (size_t b = 0; b < std::size(cluster::kTtftRatioBounds); ++b) {
    cumulative += s.ttft_ratio_buckets[b];
    char le[32];
    std::snprintf(le, sizeof(le), "%g", cluster::kTtftRatioBounds[b]);
    out += std::string("strata_router_ttft_prediction_ratio_bucket{le=\"") + le + "\"} " + std::to_string(cumulative) + "\n";
  }
  out += "strata_router_ttft_prediction_ratio_bucket{le=\"+Inf\"} " + std::to_string(s.ttft_ratio_count) + "\n";
  char sum[64];
  std::snprintf(sum, sizeof(sum), "%.6g", s.ttft_ratio_sum);
  out += std::string("strata_router_ttft_prediction_ratio_sum ") + sum + "\n";
  out += "strata_router_ttft_prediction_ratio_count " + std::to_string(s.ttft_ratio_count) + "\n";
  head("strata_router_failovers_total", "counter", "Calls that failed and were retried on another instance, by phase.");
  out += "strata_router_failovers_total{phase=\"prefill\"} " + std::to_string(s.prefill_failovers) + "\n";
  out += "strata_router_failovers_total{phase=\"decode\"} " + std::to_string(s.decode_failovers) + "\n";
  head("strata_router_routed_total", "counter", "Prefill calls answered and decode streams started, by instance.");
  for (const auto& [name, n] : s.prefills_by_instance)
    out += "strata_router_routed_total{phase=\"prefill\",instance=\"" + name + "\"} " + std::to_string(n) + "\n";
  for (const auto& [name, n] : s.decodes_by_instance)
    out += "strata_router_routed_total{phase=\"decode\",instance=\"" + name + "\"} " + std::to_string(n) + "\n";
  head("strata_router_instances", "gauge", "Instances of the served model in the cluster metadata, by role.");
  std::map<std::string, int> by_role{{"prefill", 0}, {"decode", 0}, {"both", 0}};
  for (const cluster::PdInstance& i : router.instances()) {
    if (by_role.count(i.role) > 0) ++by_role[i.role];
  }
  for (const auto& [role, n] : by_role)
    out += "strata_router_instances{role=\"" + role + "\"} " + std::to_string(n) + "\n";
  return out;
}

int Run(const RouterFlags& f) {
  if (Status s = InstallShutdownSignals(); !s.ok()) return Fail(s);
  auto url = transfer::ParseMetadataUrl(f.metadata);
  if (!url) return Fail(url.error().WithContext("--metadata"));
  std::string bearer;
  if (!f.secret_file.empty()) {
    auto secret = ReadClusterSecret(f.secret_file);
    if (!secret) return Fail(secret.error());
    bearer = transfer::ClusterBearer(*secret);
  }
  // The embedded metadata store first: instances may be waiting for it.
  transfer::MetaStore store;
  std::unique_ptr<server::HttpServer> meta_http;
  if (f.serve_metadata) {
    if (url->kind != transfer::MetadataUrl::Kind::kStrata)
      return Fail(Status::InvalidArgument("--serve-metadata needs --metadata strata://HOST:PORT (not etcd://)"));
    auto m = StartMetadataServer(url->host, url->port, &store, bearer);
    if (!m) return Fail(m.error().WithContext("--serve-metadata on " + url->host + ":" + std::to_string(url->port)));
    meta_http = std::move(*m);
    url->port = meta_http->port();
    STRATA_LOG_INFO("metadata store listening on strata://{}:{}", url->host, url->port);
  }
  LoadOptions lo;
  lo.chat_template = f.chat_template;
  lo.pack_weights = false;  // the router tokenizes; it runs no forward pass
  std::string model_path = f.model;
  if (model_path.empty()) {
    // The instances' default (`strata serve` without --model).
    auto d = EnsureDefaultModel();
    if (!d) return Fail(d.error());
    model_path = *d;
  }
  auto loaded = LoadModel(model_path, lo);
  if (!loaded) return Fail(loaded.error().WithContext("--model"));
  const LoadedModel& m = **loaded;
  const std::string name = f.served_model_name.empty() ? m.id : f.served_model_name;
  auto meta = transfer::MetadataClient::Create(*url, 2.0, bearer);
  if (!meta) return Fail(meta.error());

  cluster::PdRouterOptions ro;
  ro.model = name;
  const std::string internal = bearer.empty() ? f.admin_token : bearer;
  if (!internal.empty()) ro.auth.emplace_back("Authorization", "Bearer " + internal);
  ro.lease_ms = f.lease_ms;
  ro.max_attempts = f.max_attempts;
  ro.overlap_reserve = f.reserve_beside_prefill;
  ro.routing = *scheduler::RoutingPolicyFromName(f.routing);  // IsMember checked it
  if (Status s = ParseSlo(f.slo, &ro.slo_ttft_seconds, &ro.slo_tpot_seconds); !s.ok()) return Fail(s);
  if (!f.calibration.empty()) {
    auto cal = bench::LoadClusterCalibration(f.calibration);
    if (!cal) return Fail(cal.error().WithContext("--calibration"));
    if (cal->default_model) ro.default_calibration = scheduler::RatesFromCostModel(*cal->default_model);
    for (const auto& [instance, cm] : cal->instances) ro.calibration[instance] = scheduler::RatesFromCostModel(cm);
  }
  cluster::PdRouter router([c = meta->get()] { return c->List(); }, ro);

  server::ServiceOptions so;
  so.api_key = f.api_key;
  so.admin_token = f.admin_token;
  server::Service service(so);
  server::HttpServerOptions ho;
  ho.host = f.host;
  ho.port = f.port;
  ho.io_threads = f.io_threads;
  ho.write_timeout_seconds = f.write_timeout_seconds;
  auto http = server::HttpServer::Create(
      ho, [&service](server::HttpRequest&& r, std::shared_ptr<server::ResponseWriter> w) {
        service.Handle(std::move(r), std::move(w));
      },
      [&service](const server::AccessRecord& a) { service.OnAccess(a); });
  if (!http) return Fail(http.error().WithContext("HTTP on " + f.host + ":" + std::to_string(f.port)));
  server::ServerMetrics metrics(name, m.weights.config.context_length);
  server::FrontendOptions fo;
  fo.served_model_name = name;
  fo.max_n = f.max_n;
  fo.observer = &metrics;
  server::Frontend frontend(m, router, fo);
  server::OpenAiRoutes openai(frontend);
  server::AdminRoutes admin(frontend, f.admin_token);
  service.SetBackend(&frontend, &openai, &admin, &metrics, [&router] { return RenderRouterMetrics(router); });
  (*http)->Start();
  std::unique_ptr<server::GrpcServer> grpc;
  if (f.grpc_port >= 0) {
    server::GrpcServerOptions go;
    go.host = f.host;
    go.port = f.grpc_port;
    go.api_key = f.api_key;
    go.admin_token = f.admin_token;
    go.write_timeout_seconds = f.write_timeout_seconds;
    go.on_write_timeout = [&service] { service.CountWriteTimeout(); };
    auto g = server::GrpcServer::Create(go, frontend, service.lanes());
    if (!g) {
      (*http)->Stop();
      return Fail(g.error().WithContext("gRPC on " + f.host + ":" + std::to_string(f.grpc_port)));
    }
    grpc = std::move(*g);
  }
  const int grpc_port = grpc ? grpc->port() : -1;
  STRATA_LOG_INFO("router for model '{}' (tokenizer of {}): HTTP {}:{}, gRPC {}, instances from {}, routing {}", name,
                  m.path, f.host, (*http)->port(), grpc_port >= 0 ? f.host + ":" + std::to_string(grpc_port) : "off",
                  f.metadata, f.routing);
  if (!f.port_file.empty()) {
    if (Status s = WritePortFile(f.port_file, (*http)->port(), grpc_port, -1, meta_http ? meta_http->port() : -1);
        !s.ok())
      STRATA_LOG_ERROR("{}", s.message());
  }

  const int sig = WaitForShutdownSignal();
  STRATA_LOG_INFO("received {}: draining (grace {} s)", sig == SIGTERM ? "SIGTERM" : "SIGINT",
                  f.shutdown_grace_seconds);
  service.SetDraining();
  router.SetDraining();
  (*http)->StopAccepting();
  if (grpc) grpc->Shutdown(f.shutdown_grace_seconds);
  router.Stop(f.shutdown_grace_seconds);
  if (!(*http)->WaitForResponses(5)) STRATA_LOG_WARN("some HTTP responses were still being written at shutdown");
  (*http)->Stop();
  service.Stop();
  grpc.reset();
  if (meta_http) meta_http->Stop();
  return 0;
}

}  // namespace

void RegisterRouter(CLI::App& app, int* exit_code) {
  auto f = std::make_shared<RouterFlags>();
  CLI::App* cmd = app.add_subcommand(
      "router", "the OpenAI API in front of prefill and decode instances (prefill/decode disaggregation)");
  cmd->add_option("--model", f->model,
                  "the model's GGUF file or directory: tokenizer and chat template (default: the synthetic default "
                  "model, as `strata serve`)");
  cmd->add_option("--chat-template", f->chat_template, "override the chat format detected from the model");
  cmd->add_option("--served-model-name", f->served_model_name,
                  "model id in the API and of the instances to route to (default: the model file's base name)");
  cmd->add_option("--metadata", f->metadata,
                  "cluster metadata store where the instances register: etcd://HOST:PORT or strata://HOST:PORT")
      ->required();
  cmd->add_flag("--serve-metadata", f->serve_metadata,
                "serve the embedded metadata store at the --metadata strata://HOST:PORT address (port 0: any; the "
                "port file's \"metadata\" field says which)");
  cmd->add_option("--host", f->host, "address to bind (HTTP and gRPC)")->capture_default_str();
  cmd->add_option("--port", f->port, "HTTP port (0 = any free port)")->check(CLI::Range(0, 65535))->capture_default_str();
  cmd->add_option("--grpc-port", f->grpc_port, "gRPC port (0 = any free port, -1 = no gRPC)")
      ->check(CLI::Range(-1, 65535))
      ->capture_default_str();
  cmd->add_option("--port-file", f->port_file,
                  "write {\"http\": P, \"grpc\": G, \"metadata\": M (with --serve-metadata), \"pid\": N} once serving");
  cmd->add_option("--cluster-secret-file", f->secret_file,
                  "the cluster secret: the router authenticates to the metadata store and the instances with it");
  cmd->add_option("--api-key", f->api_key, "require 'Authorization: Bearer KEY' on the API (default: open)");
  cmd->add_option("--admin-token", f->admin_token,
                  "require 'Authorization: Bearer TOKEN' on /admin/; without a cluster secret, also sent to the "
                  "instances' /internal/ routes (their --admin-token)");
  cmd->add_option("--max-n", f->max_n, "largest n (choices per request)")->check(CLI::Range(1, 128))->capture_default_str();
  cmd->add_option("--lease-ms", f->lease_ms,
                  "lease of a decode reservation: the prefill and its block writes must finish within it")
      ->check(CLI::Range(int64_t{100}, int64_t{3600000}))
      ->capture_default_str();
  cmd->add_option("--routing", f->routing,
                  "how instances are chosen: least-loaded, round-robin, longest-prefix (most of the prompt cached), "
                  "ttft (lowest predicted time to first token: queue and uncached tokens over the measured rate)")
      ->check(CLI::IsMember({"least-loaded", "round-robin", "longest-prefix", "ttft"}))
      ->capture_default_str();
  cmd->add_option("--slo", f->slo,
                  "service levels, e.g. ttft=2s,tpot=100ms: a request whose best predicted time to first token or "
                  "per output token misses them is refused at once (429, code slo_unattainable)")
      ->check([](const std::string& v) {
        double ttft = 0, tpot = 0;
        const Status s = ParseSlo(v, &ttft, &tpot);
        return s.ok() ? std::string() : s.message();
      });
  cmd->add_option("--calibration", f->calibration,
                  "calibrated rates for instances that have not measured their own yet: the JSON of `strata bench "
                  "calibrate --out` (every instance), or {\"instances\": {NAME: that, ...}, \"default\": that}")
      ->check(CLI::ExistingFile);
  cmd->add_option("--max-attempts", f->max_attempts,
                  "handoffs tried per request (a failed prefill or a broken decode stream starts another)")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  cmd->add_option("--reserve-beside-prefill", f->reserve_beside_prefill,
                  "reserve at the decode instance while the prefill runs (its grants follow the prefill request); "
                  "false: reserve first, then send the prefill")
      ->capture_default_str();
  cmd->add_option("--shutdown-grace-seconds", f->shutdown_grace_seconds,
                  "on SIGTERM, time in-flight requests get to finish before they are cancelled")
      ->check(CLI::Range(0.0, 3600.0))
      ->capture_default_str();
  cmd->add_option("--io-threads", f->io_threads, "HTTP I/O threads")->check(CLI::Range(1, 256))->capture_default_str();
  cmd->add_option("--write-timeout-seconds", f->write_timeout_seconds,
                  "a stream whose client reads nothing for this long is cancelled like a hang-up")
      ->check(CLI::Range(0.001, 86400.0))
      ->capture_default_str();
  cmd->callback([f, exit_code] { *exit_code = Run(*f); });
}

}  // namespace strata::cli
