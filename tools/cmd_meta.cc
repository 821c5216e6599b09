// strata meta: the embedded cluster metadata store (transfer/metadata.h), so
// a cluster on one machine needs no etcd. It answers the etcd v3 JSON
// gateway's subset that Strata uses (lease grant/keepalive/revoke, kv
// put/range/deleterange) and GET /health. State is in memory: a restarted
// meta starts empty and instances register again within a keepalive period.
// SIGTERM or SIGINT: exit 0.

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/logging.h"
#include "server/http_server.h"
#include "tools/commands.h"
#include "transfer/metadata.h"

namespace strata::cli {

namespace {

struct MetaFlags {
  std::string host = "127.0.0.1";
  int port = 2389;
  std::string port_file;
};

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

int RunMeta(const MetaFlags& f) {
  // Signals are taken by sigwait on this thread; the server's threads
  // inherit the mask.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  transfer::MetaStore store;
  server::HttpServerOptions o;
  o.host = f.host;
  o.port = f.port;
  o.max_body_bytes = 1 << 20;
  auto http = server::HttpServer::Create(o, [&store](server::HttpRequest&& req,
                                                     std::shared_ptr<server::ResponseWriter> w) {
    if (req.path == "/health") return w->Send(200, "application/json", R"({"status":"ok"})");
    if (req.method != "POST") {
      return w->Send(405, "application/json", R"({"error":"POST only","message":"POST only","code":12})");
    }
    int status = 200;
    std::string body = store.Handle(req.path, req.body, NowMs(), &status);
    w->Send(status, "application/json", std::move(body));
  });
  if (!http) {
    std::fprintf(stderr, "strata meta: %s\n", http.error().message().c_str());
    return 1;
  }
  (*http)->Start();
  STRATA_LOG_INFO("metadata store listening on {}:{} (strata://{}:{})", f.host, (*http)->port(), f.host,
                  (*http)->port());
  if (!f.port_file.empty()) {
    std::string tmp = f.port_file + ".tmp";
    std::ofstream(tmp) << nlohmann::json{{"http", (*http)->port()}, {"pid", getpid()}}.dump() << "\n";
    std::rename(tmp.c_str(), f.port_file.c_str());
  }
  int sig = 0;
  sigwait(&set, &sig);
  STRATA_LOG_INFO("metadata store: {} received, stopping", sig == SIGTERM ? "SIGTERM" : "SIGINT");
  (*http)->Stop();
  return 0;
}

}  // namespace

void RegisterMeta(CLI::App& app, int* exit_code) {
  auto f = std::make_shared<MetaFlags>();
  CLI::App* cmd = app.add_subcommand("meta", "the embedded cluster metadata store (etcd's v3 JSON API subset)");
  cmd->add_option("--host", f->host, "listen address")->capture_default_str();
  cmd->add_option("--port", f->port, "listen port (0: any free port)")->check(CLI::Range(0, 65535))->capture_default_str();
  cmd->add_option("--port-file", f->port_file, "write {\"http\": P, \"pid\": N} here once listening");
  cmd->callback([f, exit_code] { *exit_code = RunMeta(*f); });
}

}  // namespace strata::cli
