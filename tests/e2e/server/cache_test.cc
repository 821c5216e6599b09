// Prefix caching as a client sees it through `strata serve`: a multi-turn
// chat's second turn reports the first turn's prompt (rounded down to whole
// blocks) as usage.prompt_tokens_details.cached_tokens, and tenants with
// different cache_salt share no blocks while one tenant shares its own.
// Raw HTTP, so it runs without the npm packages (openai_client_test has the
// same conversation through the official client).

#include <gtest/gtest.h>

#include <string>

#include "tests/e2e/server/serve_test_util.h"

namespace strata {
namespace {

using testing::json;
using testing::ServerProcess;

constexpr int kBlock = 4;  // --kv-block-size below

class CacheTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    server_ = testing::StartTinyServer({"--kv-block-size", std::to_string(kBlock)}).release();
  }
  static void TearDownTestSuite() {
    if (server_ != nullptr) testing::StopCleanly(server_);
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(server_, nullptr) << "the server did not start (see the first failure)"; }

  // POSTs and returns the body; fails the test unless it is a 200.
  static json Post(const std::string& path, const json& body) {
    auto r = testing::PostJson(server_->http_port(), path, body);
    EXPECT_EQ(r.status, 200) << path << " " << body.dump() << "\n-> " << r.raw << r.http.error;
    return r.body;
  }
  static int Cached(const json& response) {
    const json& usage = response.at("usage");
    EXPECT_TRUE(usage.contains("prompt_tokens_details")) << usage.dump();
    return usage.at("prompt_tokens_details").at("cached_tokens").get<int>();
  }

  static ServerProcess* server_;
};
ServerProcess* CacheTest::server_ = nullptr;

json Chat(const json& messages, int max_tokens, bool stream = false) {
  json j = {{"model", "tiny"}, {"messages", messages}, {"max_tokens", max_tokens}, {"temperature", 0}};
  if (stream) {
    j["stream"] = true;
    j["stream_options"] = {{"include_usage", true}};
  }
  return j;
}

TEST_F(CacheTest, SecondTurnReportsTheFirstTurnsPromptAsCached) {
  json messages = json::array(
      {{{"role", "system"}, {"content", "You are a storyteller for children."}},
       {{"role", "user"},
        {"content", "Once upon a time, there was a little girl named Lily. She saw a big tree and said hello."}}});
  json first = Post("/v1/chat/completions", Chat(messages, 8));
  ASSERT_TRUE(first.contains("usage")) << first.dump();
  const int p1 = first["usage"]["prompt_tokens"].get<int>();
  EXPECT_EQ(Cached(first), 0) << "a prompt never seen before hit the cache: " << first.dump();
  ASSERT_GT(p1, 2 * kBlock);

  messages.push_back({{"role", "assistant"}, {"content", first["choices"][0]["message"]["content"]}});
  messages.push_back({{"role", "user"}, {"content", "And then what did she do with her friend?"}});
  json second = Post("/v1/chat/completions", Chat(messages, 8));
  const int p2 = second["usage"]["prompt_tokens"].get<int>();
  EXPECT_GT(p2, p1);
  EXPECT_GE(Cached(second), p1 / kBlock * kBlock) << "turn 1 prompt " << p1 << "\nturn 2: " << second["usage"].dump();
  EXPECT_LT(Cached(second), p2);  // at least one token is computed
  // Every hit of this in-memory-only server is a device hit.
  EXPECT_EQ(second["usage"]["prompt_tokens_details"]["cached_tokens_by_tier"]["device"].get<int>(), Cached(second));

  // A third turn, streamed: the usage in the last chunk says the same.
  messages.push_back({{"role", "assistant"}, {"content", second["choices"][0]["message"]["content"]}});
  messages.push_back({{"role", "user"}, {"content", "Thank you."}});
  auto r = testing::PostJson(server_->http_port(), "/v1/chat/completions", Chat(messages, 4, /*stream=*/true));
  ASSERT_EQ(r.status, 200) << r.raw;
  testing::SseBody sse = testing::ParseSse(r.raw);
  ASSERT_TRUE(sse.done_last) << r.raw;
  ASSERT_FALSE(sse.events.empty());
  const json& last = sse.events.back();
  ASSERT_TRUE(last.contains("usage") && last["usage"].is_object()) << last.dump();
  EXPECT_GE(last["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), p2 / kBlock * kBlock) << last.dump();
}

TEST_F(CacheTest, TenantsWithDifferentSaltsShareNothing) {
  // A prompt used only by this test, long enough for many blocks.
  const std::string prompt =
      "The happy friend played with the big tree on a sunny day, and they said it was the best day of the year.";
  auto completion = [&](const std::string& salt) {
    json j = {{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", 4}, {"temperature", 0}};
    if (!salt.empty()) j["cache_salt"] = salt;
    return Post("/v1/completions", j);
  };
  json a1 = completion("tenant-a");
  const int p = a1["usage"]["prompt_tokens"].get<int>();
  ASSERT_GT(p, 4 * kBlock);
  EXPECT_EQ(Cached(a1), 0) << a1.dump();

  // Another tenant, the same prompt: nothing of tenant A's is reused.
  json b1 = completion("tenant-b");
  EXPECT_EQ(Cached(b1), 0) << "tenant-b reused tenant-a's blocks: " << b1["usage"].dump();
  // No salt at all is a tenant of its own too.
  json none = completion("");
  EXPECT_EQ(Cached(none), 0) << "an unsalted request reused salted blocks: " << none["usage"].dump();

  // Within a tenant the blocks are shared (all full blocks but a last one
  // that must be computed to get the first token's logits).
  json a2 = completion("tenant-a");
  EXPECT_GE(Cached(a2), (p - 1) / kBlock * kBlock) << a2["usage"].dump();
  json b2 = completion("tenant-b");
  EXPECT_GE(Cached(b2), (p - 1) / kBlock * kBlock) << b2["usage"].dump();
  // Same text for the same prompt whoever asks (greedy), cache or not.
  EXPECT_EQ(a2["choices"][0]["text"], a1["choices"][0]["text"]);
  EXPECT_EQ(b1["choices"][0]["text"], a1["choices"][0]["text"]);
}

TEST_F(CacheTest, SaltedChatsAlsoStaySeparate) {
  json messages = json::array({{{"role", "user"},
                                {"content", "Once upon a time there was a big tree in the garden of a little boy."}}});
  json x = Chat(messages, 4);
  x["cache_salt"] = "chat-tenant-1";
  json first = Post("/v1/chat/completions", x);
  json y = x;
  y["cache_salt"] = "chat-tenant-2";
  json other = Post("/v1/chat/completions", y);
  EXPECT_EQ(Cached(other), 0) << other["usage"].dump();
  json again = Post("/v1/chat/completions", x);
  const int p = first["usage"]["prompt_tokens"].get<int>();
  EXPECT_GE(Cached(again), (p - 1) / kBlock * kBlock) << again["usage"].dump();
}

// The cache counters on /metrics move with what the responses reported.
TEST_F(CacheTest, MetricsCountPrefixCacheHitsInTokens) {
  const std::string before = testing::Metrics(server_->http_port());
  const double hits_before = testing::MetricSum(before, "strata_prefix_cache_hits_total");
  const double queries_before = testing::MetricSum(before, "strata_prefix_cache_queries_total");
  json j = {{"model", "tiny"},
            {"prompt", "A friend with a big happy tree said hello to the little girl in the park."},
            {"max_tokens", 2},
            {"temperature", 0}};
  Post("/v1/completions", j);
  json again = Post("/v1/completions", j);
  const int cached = Cached(again);
  ASSERT_GT(cached, 0) << again.dump();
  const std::string after = testing::Metrics(server_->http_port());
  EXPECT_TRUE(testing::HasMetric(after, "strata_prefix_cache_hits_total")) << after;
  EXPECT_GE(testing::MetricSum(after, "strata_prefix_cache_hits_total") - hits_before, cached) << after;
  EXPECT_GE(testing::MetricSum(after, "strata_prefix_cache_queries_total") - queries_before,
            2 * ((again["usage"]["prompt_tokens"].get<int>() - 1) / kBlock * kBlock))
      << after;
}

}  // namespace
}  // namespace strata
