#include "tests/support/etcd_process.h"

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <thread>
#include <vector>

#include "common/http_client.h"
#include "tests/support/ports.h"

namespace strata::testing {

EtcdProcess::EtcdProcess(const std::string& data_dir, int client_port) {
  client_port_ = client_port > 0 ? client_port : FreePort();
  int peer_port = FreePort();
  while (peer_port == client_port_) peer_port = FreePort();
  std::string client = "http://127.0.0.1:" + std::to_string(client_port_);
  std::string peer = "http://127.0.0.1:" + std::to_string(peer_port);
  std::vector<std::string> args = {"etcd",
                                   "--name", "strata-test",
                                   "--data-dir", data_dir,
                                   "--listen-client-urls", client,
                                   "--advertise-client-urls", client,
                                   "--listen-peer-urls", peer,
                                   "--initial-advertise-peer-urls", peer,
                                   "--initial-cluster", "strata-test=" + peer,
                                   "--log-level", "error"};
  pid_ = fork();
  if (pid_ == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execvp("etcd", argv.data());
    _exit(127);
  }
  auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < until) {
    auto r = HttpCall("127.0.0.1", client_port_, "GET", "/health", "", {}, 1.0);
    if (r && r->status == 200 && r->body.find("true") != std::string::npos) {
      started_ = true;
      return;
    }
    int st;
    if (waitpid(pid_, &st, WNOHANG) == pid_) {
      pid_ = -1;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  ADD_FAILURE() << "etcd did not start on port " << client_port_ << " (is etcd-server installed?)";
}

void EtcdProcess::Stop() {
  if (pid_ <= 0) return;
  kill(pid_, SIGTERM);
  waitpid(pid_, nullptr, 0);
  pid_ = -1;
}

EtcdProcess::~EtcdProcess() {
  if (pid_ > 0) {
    kill(pid_, SIGKILL);
    waitpid(pid_, nullptr, 0);
  }
}

}  // namespace strata::testing
