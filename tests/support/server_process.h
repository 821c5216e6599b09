#pragma once
// Runs a `strata` subcommand as a child process for end-to-end tests: any
// role (StartRole: its port flags get 0 so it picks free ports, its port
// file is read, readiness is an HTTP path answering 200, or none), and
// `strata serve` with its defaults (Start: --port 0 --grpc-port 0
// --port-file, GET /health 200). Multi-process tests start several roles
// the same way. Also waits until GET /health is 200,
// reads the child's resident memory, stops it with SIGTERM and checks its
// exit code. Also small helpers to read Prometheus text.
//
// The child dies with the test process (PR_SET_PDEATHSIG) and is killed by
// the destructor if still running, so a failing test never leaves a server
// behind.
//
// Thread-safety: a ServerProcess is used from one thread, except http_port(),
// grpc_port(), pid(), RssBytes() and alive(), which any thread may call
// while the process runs (the load test samples RSS from a second thread).

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace strata::testing {

// How StartRole runs a subcommand.
struct RoleOptions {
  // Flags given "0" so the child picks free ports and reports them in its
  // port file (serve: --port, --grpc-port).
  std::vector<std::string> zero_port_flags;
  // The flag naming the port file ({"NAME": PORT, ...}); empty: none, and
  // no ports are read.
  std::string port_file_flag;
  // Adds "--host 127.0.0.1".
  bool host_flag = false;
  // Ready when GET of this path on the port file's "http" port is 200;
  // empty: ready once the port file is read (or at once without one).
  std::string ready_path;
};
// `strata serve`'s: --port, --grpc-port, --port-file, --host, /health.
RoleOptions ServeRole();

struct ServerStartOptions {
  // How long to wait for the port file and then for /health to be 200.
  double ready_timeout_seconds = 120;
  // Appended to the environment of the child ("NAME=value").
  std::vector<std::string> extra_env;
  // The binary; empty = StrataCli().
  std::string binary;
};

class ServerProcess {
 public:
  // Starts `<binary> serve <args...> --host 127.0.0.1 --port 0 --grpc-port 0
  // --port-file <tmp>` (pass --model and any other flags in `args`), waits
  // for the port file and for /health to answer 200. Errors (the process
  // exited, or the timeout passed) carry the exit status and the server's
  // stderr so a test failure shows why.
  static Result<std::unique_ptr<ServerProcess>> Start(const std::vector<std::string>& args,
                                                      const ServerStartOptions& options = {});
  // Starts `<binary> <subcommand...> <args...>` plus what `role` adds (its
  // port flags with 0, --host, the port file), then waits as `role` says.
  // `subcommand` may be several words ("bench run"). Errors as Start's.
  static Result<std::unique_ptr<ServerProcess>> StartRole(const std::string& subcommand,
                                                          const std::vector<std::string>& args, const RoleOptions& role,
                                                          const ServerStartOptions& options = {});

  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;
  // SIGKILLs and reaps the child if it is still running.
  ~ServerProcess();

  int http_port() const { return http_port_; }
  int grpc_port() const { return grpc_port_; }
  // A port from the port file by its key ("http", "grpc", ...); 0 if absent.
  int port(const std::string& name) const;
  pid_t pid() const { return pid_; }
  // "http://127.0.0.1:PORT" (no trailing slash).
  std::string base_url() const;

  // Resident set size (VmRSS) and its high-water mark (VmHWM) of the child
  // from /proc/PID/status, in bytes; nullopt once the process is gone.
  std::optional<int64_t> RssBytes() const;
  std::optional<int64_t> PeakRssBytes() const;

  // True while the child has not exited (does not reap it).
  bool alive() const;

  // Sends SIGTERM and waits up to `timeout_seconds` for the exit. Returns the
  // exit code (128 + signal if it was killed by one); an error if it did not
  // exit in time (it is then SIGKILLed) or had already been reaped.
  Result<int> Stop(double timeout_seconds = 60);
  // Sends `sig` to the child (no wait); false if it is gone.
  bool Signal(int sig);
  // Waits up to `timeout_seconds` for the child to exit on its own (after a
  // Signal); returns its exit code, or an error (it is then SIGKILLed).
  Result<int> Wait(double timeout_seconds = 60);

  // Everything the child wrote to stderr / stdout so far.
  std::string stderr_text() const;
  std::string stdout_text() const;
  // The last `max_bytes` of stderr, for failure messages.
  std::string stderr_tail(size_t max_bytes = 4000) const;

 private:
  ServerProcess() = default;
  // Reaps the child if it exited; fills exit_code_. Returns true if exited.
  bool Reap(bool block);

  pid_t pid_ = -1;
  bool reaped_ = false;
  int exit_code_ = -1;
  int http_port_ = 0;
  int grpc_port_ = 0;
  std::vector<std::pair<std::string, int>> ports_;  // the port file's integer fields
  std::string dir_;  // port file, stdout and stderr captures
};

// The synthetic "tiny" model (random weights, the synthetic 512-token
// vocabulary, context 512, f32), written once per test process into a
// temporary directory as tiny.gguf (so its served id is "tiny"). Safe to call
// from several threads.
Result<std::string> TinyModelPath();

// ---- Plain HTTP for the harness and simple checks ---------------------------

struct SimpleHttpResponse {
  int status = 0;  // 0: no response (connection refused, closed, timeout)
  std::string headers;  // raw header block, lower-cased names
  std::string body;
  std::string error;  // why status is 0
  // First value of header `name` (lower-case), or "".
  std::string header(const std::string& name) const;
};

// One request on a fresh connection to 127.0.0.1:port with "Connection:
// close"; reads until the server closes (chunked bodies are decoded).
// `extra_headers` are whole lines without CRLF, e.g. "Authorization: Bearer x".
SimpleHttpResponse SimpleHttp(int port, const std::string& method, const std::string& target,
                              const std::string& body = "", const std::vector<std::string>& extra_headers = {},
                              double timeout_seconds = 30);

// ---- Prometheus text ----------------------------------------------------------

// The value of the sample `name` whose label set contains every
// `label="value"` pair of `labels` (e.g. R"(code="429")"); with empty
// `labels`, the unlabelled sample (or the first one when all are labelled).
// nullopt when there is none.
std::optional<double> MetricValue(const std::string& text, const std::string& name, const std::string& labels = "");
// Sum of every sample named exactly `name` (all label sets); 0 if none.
double MetricSum(const std::string& text, const std::string& name);
// Whether any sample, TYPE or HELP line names `name`.
bool HasMetric(const std::string& text, const std::string& name);

}  // namespace strata::testing
