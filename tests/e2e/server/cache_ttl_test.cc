// cache_ttl_seconds through `strata serve`: a prompt sent with it keeps its
// cached prefix through a flood of other prompts that evicts an unkept one
// (the device pool holds one context's worth of blocks), under the default
// policy and under s3fifo; bad values are refused with the field named.

#include <gtest/gtest.h>

#include <string>

#include "tests/e2e/server/serve_test_util.h"

namespace strata {
namespace {

using testing::json;

constexpr int kBlock = 16;

json Prompt(int first, int n) {
  json ids = json::array();
  for (int i = 0; i < n; ++i) ids.push_back(3 + (first + i * 7) % 500);
  return ids;
}

json Complete(int port, const json& prompt, double ttl = 0) {
  json body = {{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 1}, {"temperature", 0}};
  if (ttl > 0) body["cache_ttl_seconds"] = ttl;
  auto r = testing::PostJson(port, "/v1/completions", body);
  EXPECT_EQ(r.status, 200) << r.raw;
  return r.body;
}

int Cached(const json& response) {
  return response.at("usage").at("prompt_tokens_details").at("cached_tokens").get<int>();
}

class CacheTtlTest : public ::testing::TestWithParam<std::string> {};

TEST_P(CacheTtlTest, KeptPrefixSurvivesAFloodAnUnkeptOneDoesNot) {
  // 128 KiB: 32 blocks of 16 tokens (tiny: 256 bytes of f16 KV per token),
  // one 512-token context.
  auto server = testing::StartTinyServer({"--kv-block-size", std::to_string(kBlock), "--kv-device-bytes", "128K",
                                          "--kv-eviction-policy", GetParam()});
  ASSERT_NE(server, nullptr);
  const int port = server->http_port();
  const json kept = Prompt(1, 40), unkept = Prompt(2, 40);
  Complete(port, kept, /*ttl=*/600);
  Complete(port, unkept);
  for (int i = 0; i < 6; ++i) Complete(port, Prompt(100 + i, 300));  // 19 blocks each
  EXPECT_EQ(Cached(Complete(port, kept, 600)), 32) << "its two full blocks stayed";
  EXPECT_EQ(Cached(Complete(port, unkept)), 0) << "evicted by the flood";

  auto m = testing::SimpleHttp(port, "GET", "/metrics");
  ASSERT_EQ(m.status, 200);
  EXPECT_EQ(testing::MetricValue(m.body, "strata_kv_device_blocks_in_use"), 0);
  EXPECT_GT(testing::MetricValue(m.body, "strata_kv_policy_decisions_total",
                                 "tier=\"device\",policy=\"" + GetParam() + "\",decision=\"evicted\"")
                .value_or(0),
            0);
  testing::StopCleanly(server.get());
}

INSTANTIATE_TEST_SUITE_P(Policies, CacheTtlTest, ::testing::Values("lru", "s3fifo"),
                         [](const auto& info) { return info.param; });

TEST(CacheTtlValidationTest, BadValuesAreRefusedWithTheField) {
  auto server = testing::StartTinyServer({});
  ASSERT_NE(server, nullptr);
  for (const json& bad : {json(-1), json(1e9), json("60"), json(nullptr)}) {
    json body = {{"model", "tiny"}, {"prompt", "hello"}, {"max_tokens", 1}, {"cache_ttl_seconds", bad}};
    auto r = testing::PostJson(server->http_port(), "/v1/completions", body);
    if (bad.is_null()) {  // null is "not given", as for every optional field
      EXPECT_EQ(r.status, 200) << r.raw;
      continue;
    }
    EXPECT_EQ(r.status, 400) << bad.dump() << " -> " << r.raw;
    EXPECT_EQ(r.body["error"]["param"], "cache_ttl_seconds") << r.raw;
  }
  json chat = {{"model", "tiny"},
               {"messages", json::array({{{"role", "user"}, {"content", "hi"}}})},
               {"max_tokens", 1},
               {"cache_ttl_seconds", 3600}};
  EXPECT_EQ(testing::PostJson(server->http_port(), "/v1/chat/completions", chat).status, 200);
  testing::StopCleanly(server.get());
}

}  // namespace
}  // namespace strata
