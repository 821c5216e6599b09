#pragma once
// A real etcd (Debian's etcd-server) for tests: its own data directory and
// free ports on 127.0.0.1 (client and peer), ready when GET /health says so.

#include <sys/types.h>

#include <string>

namespace strata::testing {

class EtcdProcess {
 public:
  // Starts etcd with `data_dir` on `client_port` (0: a free one). Fails the
  // calling test when it does not come up within 20 s.
  EtcdProcess(const std::string& data_dir, int client_port = 0);
  ~EtcdProcess();
  EtcdProcess(const EtcdProcess&) = delete;
  EtcdProcess& operator=(const EtcdProcess&) = delete;

  bool started() const { return started_; }
  int client_port() const { return client_port_; }
  std::string url() const { return "etcd://127.0.0.1:" + std::to_string(client_port_); }
  // SIGTERM and wait.
  void Stop();

 private:
  pid_t pid_ = -1;
  int client_port_ = 0;
  bool started_ = false;
};

}  // namespace strata::testing
