// strata meta: the embedded cluster metadata store (transfer/metadata.h), so
// a cluster on one machine needs no etcd. It answers the etcd v3 JSON
// gateway's subset that Strata uses (lease grant/keepalive/revoke, kv
// put/range/deleterange) and GET /health. State is in memory: a restarted
// meta starts empty and instances register again within a keepalive period.
// With --cluster-secret-file every call but GET /health must carry the
// secret's bearer token (transfer::ClusterBearer). SIGTERM or SIGINT: exit 0.

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/logging.h"
#include "server/http_server.h"
#include "tools/commands.h"
#include "tools/serve_process.h"
#include "tools/transfer_flags.h"
#include "transfer/metadata.h"

namespace strata::cli {

namespace {

struct MetaFlags {
  std::string host = "127.0.0.1";
  int port = 2389;
  std::string port_file;
  std::string secret_file;
};

int RunMeta(const MetaFlags& f) {
  // Signals are taken by sigwait on this thread; the server's threads
  // inherit the mask.
  sigset_t set;
  sigemptyset(&set);
  sigaddset(&set, SIGTERM);
  sigaddset(&set, SIGINT);
  pthread_sigmask(SIG_BLOCK, &set, nullptr);
  std::string bearer;
  if (!f.secret_file.empty()) {
    auto secret = ReadClusterSecret(f.secret_file);
    if (!secret) {
      std::fprintf(stderr, "strata meta: %s\n", secret.error().message().c_str());
      return 1;
    }
    bearer = transfer::ClusterBearer(*secret);
  }
  transfer::MetaStore store;
  auto http = StartMetadataServer(f.host, f.port, &store, bearer);
  if (!http) {
    std::fprintf(stderr, "strata meta: %s\n", http.error().message().c_str());
    return 1;
  }
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
  cmd->add_option("--cluster-secret-file", f->secret_file,
                  "the cluster secret (first line): every call but /health needs its bearer token, as every "
                  "cluster process sends it");
  cmd->add_option("--port-file", f->port_file, "write {\"http\": P, \"pid\": N} here once listening");
  cmd->callback([f, exit_code] { *exit_code = RunMeta(*f); });
}

}  // namespace strata::cli
