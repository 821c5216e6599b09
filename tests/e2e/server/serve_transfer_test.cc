// `strata serve` runs a transfer engine: its port is in --port-file, peers
// must authenticate, its KV memory is registered but not exported, and its
// figures are on /metrics.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <fstream>
#include <thread>

#include "tests/e2e/server/serve_test_util.h"
#include "tests/support/run_command.h"
#include "tests/support/test_env.h"
#include "transfer/transfer_engine.h"

namespace strata::testing {
namespace {

using namespace std::chrono_literals;

std::unique_ptr<transfer::TransferEngine> ClientEngine(SegmentTable* t, const std::string& secret) {
  transfer::TransferOptions o;
  o.instance_name = "probe";
  o.cluster_secret = secret;
  o.listen = false;
  o.transports = {transfer::Transport::kTcp};
  auto e = transfer::TransferEngine::Start(o, t);
  EXPECT_TRUE(e.has_value());
  return e ? std::move(*e) : nullptr;
}

TEST(ServeTransfer, PortFileMetricsAndAuthentication) {
  std::string dir = MakeTempDir("serve-transfer");
  std::string secret = dir + "/secret";
  std::ofstream(secret) << "serve-secret\n";
  chmod(secret.c_str(), 0600);
  auto server = StartTinyServer({"--cluster-secret-file", secret, "--instance-name", "serve-1"});
  ASSERT_TRUE(server);
  int tport = server->port("transfer");
  ASSERT_GT(tport, 0) << "the port file names the transfer listener";
  std::string addr = "127.0.0.1:" + std::to_string(tport);

  SegmentTable t;
  auto wrong = ClientEngine(&t, "guess");
  auto p = wrong->Connect(addr);
  ASSERT_FALSE(p.has_value());
  EXPECT_EQ(p.error().code(), StatusCode::kInvalidArgument) << p.error().message();

  auto right = ClientEngine(&t, "serve-secret");
  auto q = right->Connect(addr);
  ASSERT_TRUE(q.has_value()) << q.error().message();
  EXPECT_EQ(*right->PeerName(*q), "serve-1");
  // Its KV memory is registered, not exported: nothing to open by name.
  auto seg = right->OpenSegment(*q, "device-kv");
  ASSERT_FALSE(seg.has_value());
  EXPECT_EQ(seg.error().code(), StatusCode::kNotFound);

  std::string m = WaitForMetrics(server->port("http"), [](const std::string& text) {
    return Gauge(text, "strata_transfer_failed_handshakes_total") >= 1;
  });
  EXPECT_EQ(Gauge(m, "strata_transfer_failed_handshakes_total"), 1);
  EXPECT_GE(Gauge(m, "strata_transfer_refused_total", "side=\"target\""), 1);
  EXPECT_NE(m.find("strata_transfer_op_seconds_bucket"), std::string::npos);
  // The server still serves requests.
  auto r = PostJson(server->port("http"), "/v1/completions",
                    json{{"model", "tiny"}, {"prompt", "hello"}, {"max_tokens", 4}});
  EXPECT_EQ(r.status, 200) << r.raw;
  std::string after = WaitForMetrics(server->port("http"), [](const std::string& text) {
    return Gauge(text, "strata_kv_device_blocks_in_use") == 0;
  });
  EXPECT_EQ(Gauge(after, "strata_kv_device_blocks_in_use"), 0) << "the device pool is back to empty";
  StopCleanly(server.get());
}

TEST(ServeTransfer, NoSecretBindsLoopbackAndAPublicBindIsRefused) {
  auto server = StartTinyServer({"--transfer-port", "0"});
  ASSERT_TRUE(server);
  EXPECT_GT(server->port("transfer"), 0);
  StopCleanly(server.get());
  auto none = StartTinyServer({"--transfer-port", "-1"});
  ASSERT_TRUE(none);
  EXPECT_EQ(none->port("transfer"), -1);
  StopCleanly(none.get());
  auto model = TinyModelPath();
  ASSERT_TRUE(model.has_value());
  auto r = RunCommand(StrataCli() + " serve --model " + *model + " --port 0 --grpc-port -1 --transfer-bind-address 0.0.0.0");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("cluster secret"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace strata::testing
