#pragma once
// A cluster metadata store for end-to-end tests: a real etcd (started on
// free ports) or `strata meta`, which the test can stop and start again,
// empty, on the same port. Header-only.

#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "tests/support/etcd_process.h"
#include "tests/support/server_process.h"
#include "tests/support/test_env.h"
#include "transfer/metadata.h"

namespace strata::testing {

// A metadata store the test can stop and start again, empty, on the same port.
class MetadataStoreProcess {
 public:
  explicit MetadataStoreProcess(bool etcd) : etcd_(etcd), dir_(MakeTempDir("cluster-meta")) { Start(); }
  void Start() {
    if (etcd_) {
      etcd_proc_ = std::make_unique<EtcdProcess>(dir_ + "/data" + std::to_string(starts_++), port_);
      ASSERT_TRUE(etcd_proc_->started());
      port_ = etcd_proc_->client_port();
    } else {
      std::vector<std::string> args;
      if (port_ != 0) args = {"--port", std::to_string(port_)};
      RoleOptions role;
      role.zero_port_flags = port_ != 0 ? std::vector<std::string>{} : std::vector<std::string>{"--port"};
      role.port_file_flag = "--port-file";
      role.host_flag = true;
      role.ready_path = "/health";
      auto p = ServerProcess::StartRole("meta", args, role);
      ASSERT_TRUE(p.has_value()) << p.error().ToString();
      meta_ = std::move(*p);
      port_ = meta_->port("http");
    }
  }
  void Stop() {
    if (etcd_) {
      etcd_proc_->Stop();
    } else {
      auto code = meta_->Stop(10);
      EXPECT_TRUE(code.has_value());
    }
  }
  std::string url() const { return std::string(etcd_ ? "etcd" : "strata") + "://127.0.0.1:" + std::to_string(port_); }
  std::vector<transfer::InstanceInfo> List() {
    auto c = transfer::MetadataClient::Create(*transfer::ParseMetadataUrl(url()));
    auto l = (*c)->List();
    return l ? *l : std::vector<transfer::InstanceInfo>{};
  }
  // The names registered, waiting up to `timeout` for `want`.
  std::vector<std::string> WaitFor(const std::vector<std::string>& want, std::chrono::milliseconds timeout) {
    using namespace std::chrono_literals;
    std::vector<std::string> names;
    auto until = std::chrono::steady_clock::now() + timeout;
    do {
      names.clear();
      for (const auto& i : List()) names.push_back(i.name);
      std::sort(names.begin(), names.end());
      if (names == want) break;
      std::this_thread::sleep_for(100ms);
    } while (std::chrono::steady_clock::now() < until);
    return names;
  }

 private:
  bool etcd_;
  std::string dir_;
  int port_ = 0;
  int starts_ = 0;
  std::unique_ptr<EtcdProcess> etcd_proc_;
  std::unique_ptr<ServerProcess> meta_;
};

}  // namespace strata::testing
