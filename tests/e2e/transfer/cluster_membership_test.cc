// Cluster membership with real processes: `strata serve` instances register
// in a real etcd (started by the test) or in `strata meta`; a killed instance
// disappears within its lease, a stopped one leaves at once, and when the
// store restarts empty the instances register again while they keep serving.
#include <gtest/gtest.h>
#include <signal.h>

#include <thread>

#include "tests/e2e/server/serve_test_util.h"
#include "tests/support/metadata_store.h"
#include "tests/support/run_command.h"
#include "tests/support/test_env.h"
#include "transfer/metadata.h"

namespace strata::testing {
namespace {

using namespace std::chrono_literals;
using transfer::InstanceInfo;
using transfer::MetadataClient;

using Store = MetadataStoreProcess;

class ClusterMembershipTest : public ::testing::TestWithParam<bool> {};

TEST_P(ClusterMembershipTest, InstancesRegisterLeaveAndRecover) {
  Store store(GetParam());
  // a: a long lease, so that only its revocation can remove it quickly on
  // SIGTERM; b: a short one, to see a killed instance expire.
  auto a = StartTinyServer({"--metadata", store.url(), "--instance-name", "inst-a", "--metadata-lease-seconds", "30"});
  auto b = StartTinyServer({"--metadata", store.url(), "--instance-name", "inst-b", "--metadata-lease-seconds", "2"});
  ASSERT_TRUE(a && b);
  EXPECT_EQ(store.WaitFor({"inst-a", "inst-b"}, 5s), (std::vector<std::string>{"inst-a", "inst-b"}));
  for (const auto& i : store.List()) {
    const auto& p = i.name == "inst-a" ? a : b;
    EXPECT_EQ(i.role, "both");
    EXPECT_EQ(i.transfer_address, "127.0.0.1:" + std::to_string(p->port("transfer")));
    EXPECT_EQ(i.http_address, "127.0.0.1:" + std::to_string(p->port("http")));
    EXPECT_EQ(i.model_namespace.size(), 64u);
    EXPECT_EQ(i.incarnation.size(), 16u);
  }

  // kill -9: gone within the lease (2 s) plus a keepalive period.
  b->Signal(SIGKILL);
  auto t0 = std::chrono::steady_clock::now();
  EXPECT_EQ(store.WaitFor({"inst-a"}, 6s), std::vector<std::string>{"inst-a"});
  EXPECT_LT(std::chrono::steady_clock::now() - t0, 5s);

  // The store restarts empty: inst-a registers again and serves meanwhile.
  store.Stop();
  auto r = PostJson(a->port("http"), "/v1/completions", json{{"model", "tiny"}, {"prompt", "hi"}, {"max_tokens", 3}});
  EXPECT_EQ(r.status, 200) << r.raw;
  std::this_thread::sleep_for(1500ms);
  store.Start();
  // Noticed at its next keepalive (every 10 s with a 30 s lease).
  EXPECT_EQ(store.WaitFor({"inst-a"}, 15s), std::vector<std::string>{"inst-a"});

  std::string m = WaitForMetrics(a->port("http"), [](const std::string& text) {
    return Gauge(text, "strata_kv_device_blocks_in_use") == 0;
  });
  EXPECT_EQ(Gauge(m, "strata_kv_device_blocks_in_use"), 0) << "the device pool is back to empty";

  // SIGTERM: it leaves at once, not when its 30 s lease runs out.
  ASSERT_TRUE(a->Signal(SIGTERM));
  EXPECT_EQ(store.WaitFor({}, 5s), std::vector<std::string>{});
  auto code = a->Wait(60);
  ASSERT_TRUE(code.has_value()) << code.error().ToString();
  EXPECT_EQ(*code, 0);
}

INSTANTIATE_TEST_SUITE_P(Stores, ClusterMembershipTest, ::testing::Values(true, false),
                         [](const auto& info) { return std::string(info.param ? "etcd" : "meta"); });

TEST(ClusterMembership, ABadMetadataUrlIsRefusedAtStart) {
  auto model = TinyModelPath();
  ASSERT_TRUE(model.has_value());
  auto r = RunCommand(StrataCli() + " serve --model " + *model + " --port 0 --grpc-port -1 --metadata http://x:1");
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("etcd://"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace strata::testing
