// `strata serve` driven by a client nobody here wrote: the official `openai`
// npm package (tests/reference/openai_client.mjs runs it). Chat and
// completions, streaming and not, usage with prompt_tokens_details.cached_tokens,
// n = 2, stop strings, /v1/models, errors as the client sees them, an API key.
//
// Needs node and tests/reference/node_modules/openai (scripts/setup-test-refs.sh);
// without them the tests skip, or fail when STRATA_REQUIRE_REFS=1 (CI).

#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>

#include "tests/e2e/server/openai_driver.h"
#include "tests/e2e/server/serve_test_util.h"
#include "tests/support/run_command.h"
#include "tests/support/test_env.h"

namespace strata {
namespace {

using testing::json;
using testing::ServerProcess;

// usage as the client read it: the counts add up and cached_tokens is there.
void ExpectUsage(const json& usage, int max_completion) {
  ASSERT_TRUE(usage.is_object()) << usage.dump();
  const int prompt = usage.value("prompt_tokens", -1);
  const int completion = usage.value("completion_tokens", -1);
  EXPECT_GT(prompt, 0) << usage.dump();
  EXPECT_GT(completion, 0) << usage.dump();
  EXPECT_LE(completion, max_completion) << usage.dump();
  EXPECT_EQ(usage.value("total_tokens", -1), prompt + completion) << usage.dump();
  ASSERT_TRUE(usage.contains("prompt_tokens_details") && usage["prompt_tokens_details"].is_object()) << usage.dump();
  const json& details = usage["prompt_tokens_details"];
  ASSERT_TRUE(details.contains("cached_tokens") && details["cached_tokens"].is_number_integer()) << usage.dump();
  EXPECT_GE(details["cached_tokens"].get<int>(), 0);
  EXPECT_LE(details["cached_tokens"].get<int>(), prompt);
  ASSERT_TRUE(details.contains("cached_tokens_by_tier")) << usage.dump();
  int by_tier = 0;
  for (const char* tier : {"device", "host", "disk", "remote"}) {
    ASSERT_TRUE(details["cached_tokens_by_tier"].contains(tier)) << usage.dump();
    by_tier += details["cached_tokens_by_tier"][tier].get<int>();
  }
  EXPECT_EQ(by_tier, details["cached_tokens"].get<int>()) << usage.dump();
}

class OpenAiClientTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!WhyNoOpenAi().empty()) return;
    server_ = testing::StartTinyServer({"--kv-block-size", "4", "--max-n", "4"}).release();
  }
  static void TearDownTestSuite() {
    if (server_ != nullptr) testing::StopCleanly(server_);
    delete server_;
    server_ = nullptr;
  }
  void SetUp() override {
    STRATA_NEED_OPENAI();
    ASSERT_NE(server_, nullptr) << "the server did not start (see the first failure)";
  }
  static ServerProcess* server_;
};
ServerProcess* OpenAiClientTest::server_ = nullptr;

json ChatParams(const std::string& user, int max_tokens) {
  return {{"model", "tiny"},
          {"messages", json::array({{{"role", "system"}, {"content", "You tell short stories."}},
                                    {{"role", "user"}, {"content", user}}})},
          {"max_tokens", max_tokens},
          {"temperature", 0}};
}

json CompletionParams(const std::string& prompt, int max_tokens) {
  return {{"model", "tiny"}, {"prompt", prompt}, {"max_tokens", max_tokens}, {"temperature", 0}};
}

TEST_F(OpenAiClientTest, ChatStreamingAndNotAgreeAndReportUsage) {
  json stream_params = ChatParams("Once upon a time there was a tree.", 12);
  stream_params["stream_options"] = {{"include_usage", true}};
  json results = RunClient(*server_, json::array({
                                         {{"api", "chat"}, {"stream", false}, {"params", ChatParams("Once upon a time there was a tree.", 12)}},
                                         {{"api", "chat"}, {"stream", true}, {"params", stream_params}},
                                     }));
  ASSERT_EQ(results.size(), 2u);
  const json& plain = results[0];
  const json& streamed = results[1];
  ASSERT_TRUE(plain["ok"].get<bool>()) << plain.dump();
  ASSERT_TRUE(streamed["ok"].get<bool>()) << streamed.dump();

  EXPECT_EQ(plain["object"], "chat.completion");
  EXPECT_EQ(plain["model"], "tiny");
  ASSERT_EQ(plain["choices"].size(), 1u);
  const std::string finish = plain["choices"][0]["finish_reason"].get<std::string>();
  EXPECT_TRUE(finish == "length" || finish == "stop") << finish;
  ExpectUsage(plain["usage"], 12);

  EXPECT_EQ(streamed["object"], "chat.completion.chunk");
  EXPECT_EQ(streamed["model"], "tiny");
  EXPECT_GE(streamed["chunks"].get<int>(), 2);
  ASSERT_EQ(streamed["choices"].size(), 1u);
  // Greedy: the same prompt gives the same text whether streamed or not.
  EXPECT_EQ(streamed["choices"][0]["text"], plain["choices"][0]["text"]);
  EXPECT_EQ(streamed["choices"][0]["finish_reason"], plain["choices"][0]["finish_reason"]);
  ExpectUsage(streamed["usage"], 12);  // from the last chunk (include_usage)
  EXPECT_EQ(streamed["usage"]["prompt_tokens"], plain["usage"]["prompt_tokens"]);
  EXPECT_EQ(streamed["usage"]["completion_tokens"], plain["usage"]["completion_tokens"]);
  // The same prompt again: its full blocks (4 tokens each) come from the cache.
  const int prompt = plain["usage"]["prompt_tokens"].get<int>();
  EXPECT_GE(streamed["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), (prompt - 1) / 4 * 4)
      << streamed["usage"].dump();
}

TEST_F(OpenAiClientTest, CompletionsStreamingAndNotAgreeAndReportUsage) {
  json stream_params = CompletionParams("The little girl saw a big", 10);
  stream_params["stream_options"] = {{"include_usage", true}};
  json results = RunClient(*server_, json::array({
                                         {{"api", "completions"}, {"stream", false}, {"params", CompletionParams("The little girl saw a big", 10)}},
                                         {{"api", "completions"}, {"stream", true}, {"params", stream_params}},
                                     }));
  ASSERT_EQ(results.size(), 2u);
  ASSERT_TRUE(results[0]["ok"].get<bool>()) << results[0].dump();
  ASSERT_TRUE(results[1]["ok"].get<bool>()) << results[1].dump();
  EXPECT_EQ(results[0]["object"], "text_completion");
  EXPECT_EQ(results[0]["model"], "tiny");
  ExpectUsage(results[0]["usage"], 10);
  ExpectUsage(results[1]["usage"], 10);
  EXPECT_EQ(results[1]["choices"][0]["text"], results[0]["choices"][0]["text"]);
  EXPECT_EQ(results[1]["usage"]["completion_tokens"], results[0]["usage"]["completion_tokens"]);
}

TEST_F(OpenAiClientTest, StreamWithoutIncludeUsageHasNoUsageButText) {
  json results = RunClient(*server_, json::array({{{"api", "completions"},
                                                   {"stream", true},
                                                   {"params", CompletionParams("Once upon a time", 6)}}}));
  ASSERT_EQ(results.size(), 1u);
  ASSERT_TRUE(results[0]["ok"].get<bool>()) << results[0].dump();
  EXPECT_TRUE(results[0]["usage"].is_null()) << results[0].dump();
  EXPECT_FALSE(results[0]["choices"][0]["finish_reason"].is_null()) << results[0].dump();
}

TEST_F(OpenAiClientTest, TwoChoicesStreamingAndNot) {
  json params = ChatParams("Tell me about a happy day.", 8);
  params["n"] = 2;
  params["temperature"] = 1.0;
  params["seed"] = 7;
  json stream_params = params;
  stream_params["stream_options"] = {{"include_usage", true}};
  json completion = CompletionParams("She said", 8);
  completion["n"] = 2;
  completion["temperature"] = 1.0;
  json results = RunClient(*server_, json::array({
                                         {{"api", "chat"}, {"stream", false}, {"params", params}},
                                         {{"api", "chat"}, {"stream", true}, {"params", stream_params}},
                                         {{"api", "completions"}, {"stream", false}, {"params", completion}},
                                     }));
  ASSERT_EQ(results.size(), 3u);
  for (const json& r : results) {
    ASSERT_TRUE(r["ok"].get<bool>()) << r.dump();
    ASSERT_EQ(r["choices"].size(), 2u) << r.dump();
    EXPECT_EQ(r["choices"][0]["index"], 0);
    EXPECT_EQ(r["choices"][1]["index"], 1);
    for (const json& c : r["choices"]) EXPECT_FALSE(c["finish_reason"].is_null()) << r.dump();
  }
  // Completion tokens count both choices; the prompt is counted once.
  ExpectUsage(results[0]["usage"], 16);
  ExpectUsage(results[1]["usage"], 16);
  EXPECT_GT(results[0]["usage"]["completion_tokens"].get<int>(), 8 / 2);
  EXPECT_EQ(results[1]["usage"]["prompt_tokens"], results[0]["usage"]["prompt_tokens"]);
  // Same seed: choice i uses seed + i, so streaming and not agree.
  EXPECT_EQ(results[1]["choices"][0]["text"], results[0]["choices"][0]["text"]);
  EXPECT_EQ(results[1]["choices"][1]["text"], results[0]["choices"][1]["text"]);
}

// A stop string cuts the text before its first occurrence (not included) and
// finishes with "stop". The stop string is taken from the greedy text itself,
// so it is known to occur.
TEST_F(OpenAiClientTest, StopStringsEndTheTextStreamingAndNot) {
  const std::string prompt = "Once upon a time, there was a little";
  json results = RunClient(*server_, json::array({{{"api", "completions"},
                                                   {"stream", false},
                                                   {"params", CompletionParams(prompt, 24)}}}));
  ASSERT_EQ(results.size(), 1u);
  ASSERT_TRUE(results[0]["ok"].get<bool>()) << results[0].dump();
  const std::string full = results[0]["choices"][0]["text"].get<std::string>();
  ASSERT_GE(full.size(), 6u) << "greedy text too short to cut: '" << full << "'";
  // Two bytes from the middle, ASCII so the cut is on a character boundary.
  std::string stop;
  size_t at = std::string::npos;
  for (size_t i = full.size() / 2; i + 2 <= full.size() && stop.empty(); ++i) {
    if (static_cast<unsigned char>(full[i]) < 0x80 && static_cast<unsigned char>(full[i + 1]) < 0x80 &&
        full[i] != ' ' && full[i + 1] != ' ') {
      stop = full.substr(i, 2);
    }
  }
  if (stop.empty()) stop = full.substr(full.size() / 2, 1);
  at = full.find(stop);
  const std::string want = full.substr(0, at);

  json with_stop = CompletionParams(prompt, 24);
  with_stop["stop"] = json::array({"@@never@@", stop});
  json chat_stop = ChatParams("x", 4);  // a chat with a stop list the client passes through
  chat_stop["stop"] = "@@never@@";
  json again = RunClient(*server_, json::array({
                                       {{"api", "completions"}, {"stream", false}, {"params", with_stop}},
                                       {{"api", "completions"}, {"stream", true}, {"params", with_stop}},
                                       {{"api", "chat"}, {"stream", false}, {"params", chat_stop}},
                                   }));
  ASSERT_EQ(again.size(), 3u);
  for (int i = 0; i < 2; ++i) {
    ASSERT_TRUE(again[i]["ok"].get<bool>()) << again[i].dump();
    EXPECT_EQ(again[i]["choices"][0]["text"], want) << "stop '" << stop << "' in '" << full << "'";
    EXPECT_EQ(again[i]["choices"][0]["finish_reason"], "stop");
  }
  ASSERT_TRUE(again[2]["ok"].get<bool>()) << again[2].dump();
}

TEST_F(OpenAiClientTest, MultiTurnConversationHitsTheCache) {
  json params = {{"model", "tiny"}, {"max_tokens", 8}, {"temperature", 0}};
  const std::string first =
      "Once upon a time, there was a little girl named Lily who loved to play in the big tree with her friend.";
  json results = RunClient(*server_, json::array({{{"api", "conversation"},
                                                   {"turns", json::array({first, "What happened next?"})},
                                                   {"params", params}}}));
  ASSERT_EQ(results.size(), 1u);
  ASSERT_TRUE(results[0]["ok"].get<bool>()) << results[0].dump();
  const json& turns = results[0]["turns"];
  ASSERT_EQ(turns.size(), 2u);
  for (const json& t : turns) ASSERT_TRUE(t["ok"].get<bool>()) << t.dump();
  const int p1 = turns[0]["usage"]["prompt_tokens"].get<int>();
  const int cached2 = turns[1]["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>();
  EXPECT_GT(turns[1]["usage"]["prompt_tokens"].get<int>(), p1);
  EXPECT_GE(cached2, p1 / 4 * 4) << "turn 1: " << turns[0]["usage"].dump() << "\nturn 2: " << turns[1]["usage"].dump();
}

TEST_F(OpenAiClientTest, ModelsAndErrorsAsTheClientSeesThem) {
  json bad_model = CompletionParams("hi", 4);
  bad_model["model"] = "gpt-4o";
  json bad_range = CompletionParams("hi", 4);
  bad_range["temperature"] = 5;
  json tools = ChatParams("hi", 4);
  tools["tools"] = json::array({{{"type", "function"}, {"function", {{"name", "f"}, {"parameters", json::object()}}}}});
  json results = RunClient(*server_, json::array({
                                         {{"api", "models"}},
                                         {{"api", "completions"}, {"stream", false}, {"params", bad_model}},
                                         {{"api", "completions"}, {"stream", true}, {"params", bad_range}},
                                         {{"api", "chat"}, {"stream", false}, {"params", tools}},
                                     }));
  ASSERT_EQ(results.size(), 4u);
  ASSERT_TRUE(results[0]["ok"].get<bool>()) << results[0].dump();
  ASSERT_EQ(results[0]["data"].size(), 1u) << results[0].dump();
  EXPECT_EQ(results[0]["data"][0]["id"], "tiny");
  EXPECT_EQ(results[0]["data"][0]["object"], "model");

  EXPECT_FALSE(results[1]["ok"].get<bool>());
  EXPECT_EQ(results[1]["status"], 404) << results[1].dump();
  EXPECT_FALSE(results[2]["ok"].get<bool>());
  EXPECT_EQ(results[2]["status"], 400) << results[2].dump();
  EXPECT_EQ(results[2]["error"]["param"], "temperature") << results[2].dump();
  EXPECT_FALSE(results[3]["ok"].get<bool>());
  EXPECT_EQ(results[3]["status"], 400) << results[3].dump();
  EXPECT_EQ(results[3]["error"]["param"], "tools") << results[3].dump();
}

// With --api-key the client's Authorization header is checked.
TEST(OpenAiClientApiKey, RightKeyWorksWrongKeyIs401) {
  STRATA_NEED_OPENAI();
  auto server = testing::StartTinyServer({"--api-key", "sk-strata-test", "--served-model-name", "story"});
  ASSERT_NE(server, nullptr);
  json params = CompletionParams("Once", 4);
  params["model"] = "story";
  json good = RunClient(*server, json::array({{{"api", "completions"}, {"stream", false}, {"params", params}},
                                              {{"api", "models"}}}),
                        "sk-strata-test");
  ASSERT_EQ(good.size(), 2u);
  EXPECT_TRUE(good[0]["ok"].get<bool>()) << good[0].dump();
  EXPECT_EQ(good[0]["model"], "story");
  ASSERT_TRUE(good[1]["ok"].get<bool>()) << good[1].dump();
  EXPECT_EQ(good[1]["data"][0]["id"], "story");
  json bad = RunClient(*server, json::array({{{"api", "completions"}, {"stream", false}, {"params", params}}}), "sk-wrong");
  ASSERT_EQ(bad.size(), 1u);
  EXPECT_FALSE(bad[0]["ok"].get<bool>());
  EXPECT_EQ(bad[0]["status"], 401) << bad[0].dump();
  testing::StopCleanly(server.get());
}

}  // namespace
}  // namespace strata
