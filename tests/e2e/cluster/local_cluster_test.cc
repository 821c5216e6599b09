// The one-command local cluster (docs/disaggregation.md):
// `scripts/local-cluster.sh` starts `strata router` (serving the metadata)
// and its prefill and decode instances; a completion goes through them
// (its headers name the instances), and SIGTERM to the script stops every
// process it started. STRATA_BIN points the script at the binary under
// test, which skips its install-and-build step.

#include <signal.h>

#include "tests/e2e/cluster/router_test_util.h"
#include "tests/e2e/server/serve_test_util.h"
#include "tests/support/ports.h"
#include "tests/support/run_command.h"
#include "tests/support/test_env.h"

namespace strata::testing {
namespace {

TEST(LocalCluster, OneCommandStartsARouterWithPrefillAndDecodeInstancesAndStopsThemAll) {
  auto model = TinyModelPath();
  ASSERT_TRUE(model.ok()) << model.error().ToString();
  const int http = FreePort(), grpc = FreePort(), meta = FreePort();
  ServerStartOptions so;
  so.binary = "/bin/bash";
  so.extra_env = {"STRATA_BIN=" + StrataCli()};
  RoleOptions role;  // no port file: the script's ports are given
  auto script = ServerProcess::StartRole(
      SourceDir() + "/scripts/local-cluster.sh",
      {"--model", *model, "--port", std::to_string(http), "--grpc-port", std::to_string(grpc), "--metadata-port",
       std::to_string(meta), "--decode", "2", "--", "--threads", "1"},
      role, so);
  ASSERT_TRUE(script.ok()) << script.error().ToString();
  ASSERT_TRUE(WaitForInstances(http, 1, 2)) << (*script)->stderr_tail();
  json body = {{"model", "tiny"}, {"prompt", "Once upon a time"}, {"max_tokens", 5}, {"temperature", 0}};
  auto r = PostJson(http, "/v1/completions", body);
  ASSERT_EQ(r.status, 200) << r.raw;
  EXPECT_EQ(r.http.header("x-strata-prefill-instance"), "prefill-1");
  EXPECT_FALSE(r.http.header("x-strata-decode-instance").empty());
  EXPECT_EQ(r.body["usage"]["completion_tokens"], 5);
  // SIGTERM (Ctrl-C does the same through the terminal): everything stops.
  ASSERT_TRUE((*script)->Signal(SIGTERM));
  auto code = (*script)->Wait(60);
  ASSERT_TRUE(code.ok()) << code.error().ToString();
  for (int port : {http, meta}) {
    EXPECT_EQ(SimpleHttp(port, "GET", "/health", "", {}, 2).status, 0) << "port " << port << " still answers";
  }
}

}  // namespace
}  // namespace strata::testing
