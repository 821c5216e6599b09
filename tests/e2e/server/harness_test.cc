// The serving tests' harness itself (tests/support/server_process.h): a
// server that cannot start is a clear error carrying its stderr, a running
// one reports ports, RSS and liveness, SIGTERM gives its exit code, any
// subcommand can be started with its own ports, and the Prometheus text
// helpers read labelled samples exactly.

#include <gtest/gtest.h>

#include <string>

#include "tests/e2e/server/serve_test_util.h"

namespace strata {
namespace {

TEST(ServerHarness, AServerThatCannotStartIsAClearError) {
  auto model = testing::TinyModelPath();
  ASSERT_TRUE(model) << model.error().ToString();
  testing::ServerStartOptions options;
  options.ready_timeout_seconds = 60;
  auto server = testing::ServerProcess::Start({"--model", *model, "--no-such-flag"}, options);
  ASSERT_FALSE(server);
  const std::string message = server.error().ToString();
  EXPECT_NE(message.find("exited with code"), std::string::npos) << message;
  EXPECT_NE(message.find("--no-such-flag"), std::string::npos) << "the server's stderr is missing:\n" << message;

  auto missing = testing::ServerProcess::Start({"--model", "/nonexistent/model.gguf"}, options);
  ASSERT_FALSE(missing);
  EXPECT_NE(missing.error().ToString().find("/nonexistent/model.gguf"), std::string::npos)
      << missing.error().ToString();
}

TEST(ServerHarness, ReportsPortsMemoryAndExitCode) {
  auto server = testing::StartTinyServer({"--served-model-name", "harness"});
  ASSERT_NE(server, nullptr);
  EXPECT_GT(server->http_port(), 0);
  EXPECT_GT(server->grpc_port(), 0);
  EXPECT_NE(server->http_port(), server->grpc_port());
  EXPECT_TRUE(server->alive());
  auto rss = server->RssBytes();
  auto peak = server->PeakRssBytes();
  ASSERT_TRUE(rss && peak);
  EXPECT_GT(*rss, 1 << 20);
  EXPECT_GE(*peak, *rss);
  auto models = testing::SimpleHttp(server->http_port(), "GET", "/v1/models");
  EXPECT_EQ(models.status, 200) << models.error;
  EXPECT_NE(models.body.find("\"harness\""), std::string::npos) << models.body;
  EXPECT_NE(models.header("x-request-id"), "");

  auto code = server->Stop(60);
  ASSERT_TRUE(code) << code.error().ToString();
  EXPECT_EQ(*code, 0) << server->stderr_tail();
  EXPECT_FALSE(server->alive());
  EXPECT_FALSE(server->RssBytes().has_value());
  EXPECT_FALSE(server->Stop(1)) << "a second Stop must say the process is gone";
}

// Any subcommand: a role that listens gets free ports and its port file is
// read (two at once never collide); one that does not listen just runs, and
// its exit code and output are there.
TEST(ServerHarness, StartsAnySubcommandWithItsOwnPorts) {
  auto model = testing::TinyModelPath();
  ASSERT_TRUE(model) << model.error().ToString();
  auto a = testing::ServerProcess::StartRole("serve", {"--model", *model}, testing::ServeRole());
  ASSERT_TRUE(a) << a.error().ToString();
  auto b = testing::ServerProcess::StartRole("serve", {"--model", *model}, testing::ServeRole());
  ASSERT_TRUE(b) << b.error().ToString();
  EXPECT_EQ((*a)->port("http"), (*a)->http_port());
  EXPECT_EQ((*a)->port("grpc"), (*a)->grpc_port());
  EXPECT_EQ((*a)->port("no-such-port"), 0);
  EXPECT_NE((*a)->http_port(), (*b)->http_port());
  EXPECT_EQ(testing::SimpleHttp((*b)->http_port(), "GET", "/health").status, 200);
  // Every instance's device pool is empty at the end.
  for (auto* srv : {a->get(), b->get()}) {
    const auto m = testing::SimpleHttp(srv->http_port(), "GET", "/metrics");
    EXPECT_EQ(testing::MetricValue(m.body, "strata_kv_device_blocks_in_use"), 0) << m.body;
  }
  EXPECT_EQ(*(*a)->Stop(60), 0);
  EXPECT_EQ(*(*b)->Stop(60), 0);

  auto info = testing::ServerProcess::StartRole("model info", {*model, "--json"}, testing::RoleOptions{});
  ASSERT_TRUE(info) << info.error().ToString();
  auto code = (*info)->Wait(60);
  ASSERT_TRUE(code) << code.error().ToString();
  EXPECT_EQ(*code, 0) << (*info)->stderr_tail();
  EXPECT_NE((*info)->stdout_text().find("llama"), std::string::npos) << (*info)->stdout_text();
}

TEST(ServerHarness, PrometheusTextHelpers) {
  const std::string text =
      "# HELP strata_requests_total Finished requests.\n"
      "# TYPE strata_requests_total counter\n"
      "strata_requests_total{model_name=\"tiny\",finish_reason=\"length\"} 7\n"
      "strata_requests_total{model_name=\"tiny\",finish_reason=\"abort\"} 3\n"
      "strata_request_errors_total{model_name=\"tiny\",code=\"429\"} 12\n"
      "strata_request_errors_total{model_name=\"tiny\",code=\"4291\"} 5\n"
      "strata_num_requests_running{model_name=\"tiny\"} 0\n"
      "strata_ttft_seconds_bucket{model_name=\"tiny\",le=\"+Inf\"} 10\n"
      "strata_plain 2.5e3\n";
  EXPECT_EQ(testing::MetricSum(text, "strata_requests_total"), 10);
  EXPECT_EQ(testing::MetricValue(text, "strata_requests_total", R"(finish_reason="abort")"), 3);
  EXPECT_EQ(testing::MetricValue(text, "strata_request_errors_total", R"(code="429")"), 12);
  EXPECT_FALSE(testing::MetricValue(text, "strata_request_errors_total", R"(code="500")").has_value());
  EXPECT_EQ(testing::MetricValue(text, "strata_num_requests_running"), 0);
  EXPECT_EQ(testing::MetricValue(text, "strata_plain"), 2500);
  EXPECT_FALSE(testing::MetricValue(text, "strata_requests").has_value());  // no prefix matches
  EXPECT_TRUE(testing::HasMetric(text, "strata_requests_total"));
  EXPECT_FALSE(testing::HasMetric(text, "strata_ttft_seconds"));
  EXPECT_TRUE(testing::HasMetric(text, "strata_ttft_seconds_bucket"));
}

}  // namespace
}  // namespace strata
