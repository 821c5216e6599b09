#include "tools/serve_process.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>

namespace strata::cli {

namespace {

// SIGINT/SIGTERM go through a pipe: the handler may run on any thread
// (libraries start threads of their own before main, with the signals
// unblocked), so it only writes the signal number; the main thread reads it.
// Later signals during shutdown are absorbed by the same handler.
int g_signal_pipe[2] = {-1, -1};

extern "C" void OnShutdownSignal(int sig) {
  const unsigned char b = static_cast<unsigned char>(sig);
  const int saved = errno;
  [[maybe_unused]] ssize_t n = write(g_signal_pipe[1], &b, 1);
  errno = saved;
}

}  // namespace

Status InstallShutdownSignals() {
  if (pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) return Status::Internal("pipe2 failed");
  struct sigaction sa {};
  sa.sa_handler = OnShutdownSignal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  if (sigaction(SIGTERM, &sa, nullptr) != 0 || sigaction(SIGINT, &sa, nullptr) != 0)
    return Status::Internal("sigaction failed");
  return Status::Ok();
}

int WaitForShutdownSignal() {
  while (true) {
    pollfd p{g_signal_pipe[0], POLLIN, 0};
    if (poll(&p, 1, -1) < 0 && errno != EINTR) return SIGTERM;
    unsigned char b = 0;
    if (read(g_signal_pipe[0], &b, 1) == 1) return b;
  }
}

Status WritePortFile(const std::string& path, int http_port, int grpc_port, int transfer_port, int metadata_port) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out) return Status::InvalidArgument("--port-file " + path + ": cannot write");
    nlohmann::json j{{"http", http_port},
                     {"grpc", grpc_port},
                     {"transfer", transfer_port},
                     {"pid", static_cast<int>(getpid())}};
    if (metadata_port >= 0) j["metadata"] = metadata_port;
    out << j.dump() << "\n";
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    return Status::InvalidArgument("--port-file " + path + ": cannot rename into place");
  return Status::Ok();
}

namespace {

int64_t NowMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}

}  // namespace

Result<std::unique_ptr<server::HttpServer>> StartMetadataServer(const std::string& host, int port,
                                                                transfer::MetaStore* store, std::string bearer) {
  server::HttpServerOptions o;
  o.host = host;
  o.port = port;
  o.max_body_bytes = 1 << 20;
  auto http = server::HttpServer::Create(o, [store, bearer = std::move(bearer)](
                                                server::HttpRequest&& req, std::shared_ptr<server::ResponseWriter> w) {
    if (req.path == "/health") return w->Send(200, "application/json", R"({"status":"ok"})");
    if (!bearer.empty() && req.header("authorization") != "Bearer " + bearer) {
      return w->Send(401, "application/json",
                     R"({"error":"the cluster secret does not match","message":"the cluster secret does not match","code":16})");
    }
    if (req.method != "POST") {
      return w->Send(405, "application/json", R"({"error":"POST only","message":"POST only","code":12})");
    }
    int status = 200;
    std::string body = store->Handle(req.path, req.body, NowMs(), &status);
    w->Send(status, "application/json", std::move(body));
  });
  if (!http) return http.error();
  (*http)->Start();
  return std::move(*http);
}

}  // namespace strata::cli
