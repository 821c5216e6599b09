// The OpenAI request parser: a table of bad bodies, each a 400 with the
// field named in `param` and the message; good bodies parse to the expected
// GenerationParams; the response builders produce the documented JSON.

#include "server/openai_protocol.h"

#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace strata::server {
namespace {

using json = nlohmann::json;

enum class Api { kChat, kCompletion, kTokenize };

struct BadCase {
  const char* name;
  Api api;
  std::string body;
  std::string param;    // expected `param` ("" = null)
  std::string message;  // a substring the message must contain
};

constexpr const char* kMsgs = R"("messages":[{"role":"user","content":"hi"}])";

std::string Chat(const std::string& extra) {
  return std::string("{") + kMsgs + (extra.empty() ? "" : ",") + extra + "}";
}
std::string Comp(const std::string& extra) {
  return std::string(R"({"prompt":"hi")") + (extra.empty() ? "" : ",") + extra + "}";
}

std::optional<ApiError> Parse(Api api, const std::string& body, GenerationParams* p) {
  switch (api) {
    case Api::kChat:
      return ParseChatRequest(body, p);
    case Api::kCompletion:
      return ParseCompletionRequest(body, p);
    case Api::kTokenize:
      return ParseTokenizeRequest(body, p);
  }
  return std::nullopt;
}

std::vector<BadCase> BadCases() {
  const std::string deep(100, '[');
  return {
      {"malformed json", Api::kChat, R"({"messages": [)", "", "Invalid JSON body at byte"},
      {"trailing garbage", Api::kCompletion, R"({"prompt":"a"} x)", "",
       "Invalid JSON body at byte 16"},
      {"empty body", Api::kChat, "", "", "Invalid JSON body"},
      {"body is an array", Api::kChat, "[1,2]", "", "must be a JSON object, got array"},
      {"body is a string", Api::kCompletion, R"("hi")", "", "must be a JSON object, got string"},
      {"too deeply nested", Api::kChat, deep, "", "nested more than 64"},
      {"invalid utf-8 in json", Api::kCompletion, "{\"prompt\":\"\xff\"}", "", "Invalid JSON body"},
      {"model not a string", Api::kChat, Chat(R"("model":7)"), "model",
       "'model' must be a string, got integer"},
      {"temperature string", Api::kChat, Chat(R"("temperature":"hot")"), "temperature",
       "must be a number, got string"},
      {"temperature above 2", Api::kChat, Chat(R"("temperature":2.01)"), "temperature",
       "in [0, 2], got 2.01"},
      {"temperature negative", Api::kCompletion, Comp(R"("temperature":-0.1)"), "temperature",
       "in [0, 2]"},
      {"top_p zero", Api::kChat, Chat(R"("top_p":0)"), "top_p", "in (0, 1], got 0"},
      {"top_p above one", Api::kChat, Chat(R"("top_p":1.5)"), "top_p", "in (0, 1]"},
      {"top_k -2", Api::kCompletion, Comp(R"("top_k":-2)"), "top_k",
       "-1 or 0 (off), or at least 1"},
      {"top_k fractional", Api::kCompletion, Comp(R"("top_k":1.5)"), "top_k",
       "must be an integer, got number"},
      {"min_p above one", Api::kChat, Chat(R"("min_p":1.1)"), "min_p", "in [0, 1]"},
      {"presence_penalty below -2", Api::kChat, Chat(R"("presence_penalty":-2.5)"),
       "presence_penalty", "in [-2, 2]"},
      {"frequency_penalty above 2", Api::kChat, Chat(R"("frequency_penalty":2.1)"),
       "frequency_penalty", "in [-2, 2]"},
      {"repetition_penalty zero", Api::kChat, Chat(R"("repetition_penalty":0)"),
       "repetition_penalty", "greater than 0"},
      {"seed string", Api::kChat, Chat(R"("seed":"42")"), "seed", "must be an integer, got string"},
      {"max_tokens zero", Api::kChat, Chat(R"("max_tokens":0)"), "max_tokens", "at least 1, got 0"},
      {"max_tokens string", Api::kCompletion, Comp(R"("max_tokens":"10")"), "max_tokens",
       "must be an integer"},
      {"max_completion_tokens negative", Api::kChat, Chat(R"("max_completion_tokens":-1)"),
       "max_completion_tokens", "at least 1"},
      {"max_tokens disagree", Api::kChat, Chat(R"("max_tokens":5,"max_completion_tokens":6)"),
       "max_completion_tokens", "disagree"},
      {"five stop strings", Api::kChat, Chat(R"("stop":["a","b","c","d","e"])"), "stop",
       "at most 4 strings, got 5"},
      {"stop not a string", Api::kCompletion, Comp(R"("stop":5)"), "stop",
       "a string or an array of strings"},
      {"stop array of numbers", Api::kCompletion, Comp(R"("stop":["a",1])"), "stop",
       "a string or an array"},
      {"empty stop string", Api::kCompletion, Comp(R"("stop":"")"), "stop", "must not be empty"},
      {"n zero", Api::kChat, Chat(R"("n":0)"), "n", "at least 1, got 0"},
      {"stream not bool", Api::kChat, Chat(R"("stream":"yes")"), "stream",
       "must be a boolean, got string"},
      {"stream_options without stream", Api::kChat,
       Chat(R"("stream_options":{"include_usage":true})"), "stream_options",
       "only allowed when 'stream' is true"},
      {"include_usage not bool", Api::kChat,
       Chat(R"("stream":true,"stream_options":{"include_usage":1})"),
       "stream_options.include_usage", "must be a boolean"},
      {"logit_bias not object", Api::kChat, Chat(R"("logit_bias":[1])"), "logit_bias", "an object"},
      {"logit_bias bad key", Api::kChat, Chat(R"("logit_bias":{"abc":1})"), "logit_bias",
       "token ids"},
      {"logit_bias value too big", Api::kChat, Chat(R"("logit_bias":{"5":101})"), "logit_bias",
       "in [-100, 100], got 101 for token 5"},
      {"chat logprobs not bool", Api::kChat, Chat(R"("logprobs":1)"), "logprobs",
       "must be a boolean"},
      {"top_logprobs 21", Api::kChat, Chat(R"("logprobs":true,"top_logprobs":21)"), "top_logprobs",
       "in [0, 20], got 21"},
      {"top_logprobs without logprobs", Api::kChat, Chat(R"("top_logprobs":2)"), "top_logprobs",
       "requires 'logprobs'"},
      {"completion logprobs 6", Api::kCompletion, Comp(R"("logprobs":6)"), "logprobs",
       "in [0, 5], got 6"},
      {"completion logprobs bool", Api::kCompletion, Comp(R"("logprobs":true)"), "logprobs",
       "must be an integer"},
      {"tools", Api::kChat, Chat(R"("tools":[{"type":"function","function":{"name":"f"}}])"),
       "tools", "'tools' is not supported"},
      {"tool_choice auto", Api::kChat, Chat(R"("tool_choice":"auto")"), "tool_choice",
       "not supported"},
      {"functions", Api::kChat, Chat(R"("functions":[{"name":"f"}])"), "functions",
       "not supported"},
      {"function_call", Api::kChat, Chat(R"("function_call":{"name":"f"})"), "function_call",
       "not supported"},
      {"parallel_tool_calls", Api::kChat, Chat(R"("parallel_tool_calls":true)"),
       "parallel_tool_calls", "not supported"},
      {"response_format json", Api::kChat, Chat(R"("response_format":{"type":"json_object"})"),
       "response_format", "not supported"},
      {"audio", Api::kChat, Chat(R"("audio":{"voice":"alloy","format":"wav"})"), "audio",
       "not supported"},
      {"modalities audio", Api::kChat, Chat(R"("modalities":["text","audio"])"), "modalities",
       "not supported"},
      {"prediction", Api::kChat, Chat(R"("prediction":{"type":"content","content":"x"})"),
       "prediction", "not supported"},
      {"web_search_options", Api::kChat, Chat(R"("web_search_options":{})"), "web_search_options",
       "not supported"},
      {"store true", Api::kChat, Chat(R"("store":true)"), "store", "not supported"},
      {"service_tier flex", Api::kChat, Chat(R"("service_tier":"flex")"), "service_tier",
       "not supported"},
      {"reasoning_effort", Api::kChat, Chat(R"("reasoning_effort":"high")"), "reasoning_effort",
       "not supported"},
      {"suffix", Api::kCompletion, Comp(R"("suffix":"end")"), "suffix", "not supported"},
      {"best_of above n", Api::kCompletion, Comp(R"("best_of":3)"), "best_of", "best_of 3, n 1"},
      {"echo with logprobs", Api::kCompletion, Comp(R"("echo":true,"logprobs":1)"), "echo",
       "not supported"},
      {"messages missing", Api::kChat, "{}", "messages", "'messages' is required"},
      {"messages empty", Api::kChat, R"({"messages":[]})", "messages", "must not be empty"},
      {"messages not array", Api::kChat, R"({"messages":"hi"})", "messages",
       "must be an array, got string"},
      {"message not object", Api::kChat, R"({"messages":["hi"]})", "messages[0]",
       "must be an object"},
      {"message without role", Api::kChat, R"({"messages":[{"content":"hi"}]})", "messages[0].role",
       "required"},
      {"unknown role", Api::kChat, R"({"messages":[{"role":"robot","content":"hi"}]})",
       "messages[0].role", "got \"robot\""},
      {"tool role", Api::kChat,
       R"({"messages":[{"role":"tool","content":"x","tool_call_id":"a"}]})", "messages[0].role",
       "not supported"},
      {"content number", Api::kChat, R"({"messages":[{"role":"user","content":5}]})",
       "messages[0].content", "a string or an array of content parts"},
      {"user content null", Api::kChat, R"({"messages":[{"role":"user","content":null}]})",
       "messages[0].content", "required"},
      {"image part", Api::kChat,
       R"({"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"image_url","image_url":{"url":"x"}}]}]})",
       "messages[0].content[1].type", "\"image_url\" is not supported"},
      {"text part without text", Api::kChat,
       R"({"messages":[{"role":"user","content":[{"type":"text"}]}]})",
       "messages[0].content[0].text", "required"},
      {"assistant tool_calls", Api::kChat,
       R"({"messages":[{"role":"assistant","content":null,"tool_calls":[{"id":"1"}]}]})",
       "messages[0].tool_calls", "not supported"},
      {"name not string", Api::kChat, R"({"messages":[{"role":"user","content":"a","name":3}]})",
       "messages[0].name", "must be a string"},
      {"prompt missing", Api::kCompletion, "{}", "prompt", "'prompt' is required"},
      {"prompt number", Api::kCompletion, R"({"prompt":5})", "prompt", "got integer"},
      {"prompt empty array", Api::kCompletion, R"({"prompt":[]})", "prompt",
       "must not be an empty array"},
      {"batched string prompts", Api::kCompletion, R"({"prompt":["a","b"]})", "prompt",
       "batched prompts"},
      {"batched id prompts", Api::kCompletion, R"({"prompt":[[1,2],[3]]})", "prompt",
       "batched prompts"},
      {"negative token id", Api::kCompletion, R"({"prompt":[1,-2]})", "prompt", "token id -2"},
      {"mixed prompt array", Api::kCompletion, R"({"prompt":[1,"a"]})", "prompt",
       "array of token ids"},
      {"cache_salt number", Api::kChat, Chat(R"("cache_salt":1)"), "cache_salt",
       "must be a string"},
      {"cache_salt empty", Api::kChat, Chat(R"("cache_salt":"")"), "cache_salt",
       "must not be empty"},
      {"priority fractional", Api::kChat, Chat(R"("priority":0.5)"), "priority",
       "must be an integer"},
      {"priority too large", Api::kChat, Chat(R"("priority":5000000000)"), "priority",
       "32-bit integer"},
      {"ignore_eos string", Api::kCompletion, Comp(R"("ignore_eos":"true")"), "ignore_eos",
       "must be a boolean"},
      {"stop_token_ids not array", Api::kCompletion, Comp(R"("stop_token_ids":3)"),
       "stop_token_ids", "array"},
      {"user not string", Api::kChat, Chat(R"("user":1)"), "user", "must be a string"},
      {"tokenize both prompt and messages", Api::kTokenize, Chat(R"("prompt":"x")"), "messages",
       "exactly one"},
      {"tokenize neither", Api::kTokenize, "{}", "prompt", "exactly one"},
  };
}

TEST(OpenAiProtocol, BadRequestsAre400sThatNameTheProblem) {
  const auto cases = BadCases();
  ASSERT_GE(cases.size(), 35u);
  for (const BadCase& c : cases) {
    SCOPED_TRACE(c.name);
    GenerationParams p;
    auto err = Parse(c.api, c.body, &p);
    ASSERT_TRUE(err.has_value());
    EXPECT_EQ(err->http_status, 400);
    EXPECT_EQ(err->type, "invalid_request_error");
    EXPECT_EQ(err->param, c.param);
    EXPECT_NE(err->message.find(c.message), std::string::npos) << err->message;
    // The body is OpenAI's shape and names the same param.
    json body = json::parse(err->ToBody());
    EXPECT_EQ(body["error"]["message"], err->message);
    if (c.param.empty()) {
      EXPECT_TRUE(body["error"]["param"].is_null());
    } else {
      EXPECT_EQ(body["error"]["param"], c.param);
    }
  }
}

TEST(OpenAiProtocol, RangeBoundariesAreAccepted) {
  for (const std::string extra : {R"("temperature":0)",
                                  R"("temperature":2)",
                                  R"("top_p":1)",
                                  R"("top_p":0.0001)",
                                  R"("top_k":-1)",
                                  R"("top_k":0)",
                                  R"("top_k":1)",
                                  R"("min_p":0)",
                                  R"("min_p":1)",
                                  R"("presence_penalty":-2)",
                                  R"("frequency_penalty":2)",
                                  R"("repetition_penalty":0.01)",
                                  R"("logprobs":true,"top_logprobs":20)",
                                  R"("logprobs":true,"top_logprobs":0)",
                                  R"("max_tokens":1)",
                                  R"("stop":["a","b","c","d"])",
                                  R"("logit_bias":{"0":-100,"1":100})",
                                  R"("seed":-1)",
                                  R"("max_tokens":2.0)",
                                  R"("n":1,"best_of":null)"}) {
    SCOPED_TRACE(extra);
    GenerationParams p;
    auto err = ParseChatRequest(Chat(extra), &p);
    EXPECT_FALSE(err.has_value()) << err->message;
  }
  GenerationParams p;
  EXPECT_FALSE(ParseCompletionRequest(Comp(R"("logprobs":5)"), &p).has_value());
  EXPECT_FALSE(ParseCompletionRequest(Comp(R"("logprobs":0)"), &p).has_value());
  EXPECT_FALSE(ParseCompletionRequest(Comp(R"("best_of":1,"suffix":"")"), &p).has_value());
}

TEST(OpenAiProtocol, ChatRequestParsesEveryField) {
  const std::string body = R"({
    "model": "m", "messages": [
      {"role": "developer", "content": "be brief"},
      {"role": "user", "name": "bob", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
      {"role": "assistant", "content": null},
      {"role": "user", "content": "c"}],
    "max_completion_tokens": 7, "temperature": 0.5, "top_p": 0.9, "top_k": 40, "min_p": 0.1, "seed": 42,
    "stop": "END", "n": 2, "logprobs": true, "top_logprobs": 3, "presence_penalty": 0.5,
    "frequency_penalty": -0.5, "repetition_penalty": 1.1, "logit_bias": {"5": -100, "7": 2.5},
    "stream": true, "stream_options": {"include_usage": true}, "user": "u1", "cache_salt": "tenant",
    "priority": -3, "ignore_eos": true, "stop_token_ids": [2, 3], "tool_choice": "none", "tools": [],
    "response_format": {"type": "text"}, "store": false, "service_tier": "auto", "modalities": ["text"],
    "metadata": {"k": "v"}, "some_vendor_field": {"x": 1}, "suffix": "ignored in chat"})";
  GenerationParams p;
  auto err = ParseChatRequest(body, &p);
  ASSERT_FALSE(err.has_value()) << err->message;
  EXPECT_EQ(p.kind, ApiKind::kChat);
  EXPECT_EQ(p.model, "m");
  ASSERT_EQ(p.messages.size(), 4u);
  EXPECT_EQ(p.messages[0].role, "system");
  EXPECT_EQ(p.messages[0].content, "be brief");
  EXPECT_EQ(p.messages[1].role, "user");
  EXPECT_EQ(p.messages[1].content, "a\nb");
  EXPECT_EQ(p.messages[2].role, "assistant");
  EXPECT_EQ(p.messages[2].content, "");
  EXPECT_EQ(p.messages[3].content, "c");
  EXPECT_EQ(p.max_tokens, 7);
  EXPECT_FLOAT_EQ(p.sampling.temperature, 0.5f);
  EXPECT_FLOAT_EQ(p.sampling.top_p, 0.9f);
  EXPECT_EQ(p.sampling.top_k, 40);
  EXPECT_FLOAT_EQ(p.sampling.min_p, 0.1f);
  EXPECT_EQ(p.sampling.seed, 42u);
  EXPECT_EQ(p.stop, std::vector<std::string>{"END"});
  EXPECT_EQ(p.n, 2);
  EXPECT_TRUE(p.sampling.logprobs);
  EXPECT_EQ(p.sampling.top_logprobs, 3);
  EXPECT_FLOAT_EQ(p.sampling.presence_penalty, 0.5f);
  EXPECT_FLOAT_EQ(p.sampling.frequency_penalty, -0.5f);
  EXPECT_FLOAT_EQ(p.sampling.repetition_penalty, 1.1f);
  ASSERT_EQ(p.sampling.logit_bias.size(), 2u);
  EXPECT_EQ(p.sampling.logit_bias[0], (std::pair<int32_t, float>{5, -100.0f}));
  EXPECT_EQ(p.sampling.logit_bias[1], (std::pair<int32_t, float>{7, 2.5f}));
  EXPECT_TRUE(p.stream);
  EXPECT_TRUE(p.include_usage);
  EXPECT_EQ(p.user, "u1");
  EXPECT_EQ(p.cache_salt, "tenant");
  EXPECT_EQ(p.priority, -3);
  EXPECT_TRUE(p.ignore_eos);
  EXPECT_EQ(p.stop_token_ids, (std::vector<int32_t>{2, 3}));
}

TEST(OpenAiProtocol, NullMeansAbsent) {
  GenerationParams p;
  auto err = ParseChatRequest(
      Chat(
          R"("temperature":null,"max_tokens":null,"stop":null,"seed":null,"stream_options":null,"tools":null,)"
          R"("logit_bias":null,"n":null,"user":null)"),
      &p);
  ASSERT_FALSE(err.has_value()) << err->message;
  EXPECT_FLOAT_EQ(p.sampling.temperature, 1.0f);
  EXPECT_FALSE(p.max_tokens.has_value());
  EXPECT_TRUE(p.stop.empty());
  EXPECT_FALSE(p.sampling.seed.has_value());
  EXPECT_EQ(p.n, 1);
  EXPECT_FALSE(p.stream);
}

TEST(OpenAiProtocol, CompletionPromptShapes) {
  GenerationParams p;
  ASSERT_FALSE(ParseCompletionRequest(
      R"({"prompt":"hello","max_tokens":3,"echo":true,"logprobs":null})", &p));
  EXPECT_EQ(p.kind, ApiKind::kCompletion);
  EXPECT_EQ(p.prompt_text, "hello");
  EXPECT_FALSE(p.prompt_is_ids);
  EXPECT_TRUE(p.echo);
  EXPECT_EQ(p.max_tokens, 3);
  EXPECT_FALSE(p.add_special_tokens.has_value());

  ASSERT_FALSE(ParseCompletionRequest(R"({"prompt":["one"],"add_special_tokens":false})", &p));
  EXPECT_EQ(p.prompt_text, "one");
  EXPECT_EQ(p.add_special_tokens, false);

  ASSERT_FALSE(ParseCompletionRequest(R"({"prompt":[1,2,3],"logprobs":2})", &p));
  EXPECT_TRUE(p.prompt_is_ids);
  EXPECT_EQ(p.prompt_ids, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_TRUE(p.sampling.logprobs);
  EXPECT_EQ(p.sampling.top_logprobs, 2);

  ASSERT_FALSE(ParseCompletionRequest(R"({"prompt":[[4,5]]})", &p));
  EXPECT_TRUE(p.prompt_is_ids);
  EXPECT_EQ(p.prompt_ids, (std::vector<int32_t>{4, 5}));

  // A max_tokens beyond int is kept as INT_MAX: the Frontend reports it
  // against the context length.
  ASSERT_FALSE(ParseCompletionRequest(R"({"prompt":"x","max_tokens":99999999999})", &p));
  EXPECT_EQ(p.max_tokens, 2147483647);
}

TEST(OpenAiProtocol, TokenizeAndDetokenizeRequests) {
  GenerationParams p;
  ASSERT_FALSE(
      ParseTokenizeRequest(R"({"prompt":"hi","add_special_tokens":false,"model":"m"})", &p));
  EXPECT_EQ(p.kind, ApiKind::kCompletion);
  EXPECT_EQ(p.prompt_text, "hi");
  EXPECT_EQ(p.add_special_tokens, false);
  EXPECT_EQ(p.model, "m");
  ASSERT_FALSE(ParseTokenizeRequest(std::string("{") + kMsgs + "}", &p));
  EXPECT_EQ(p.kind, ApiKind::kChat);
  ASSERT_EQ(p.messages.size(), 1u);

  std::string model;
  std::vector<int32_t> ids;
  ASSERT_FALSE(ParseDetokenizeRequest(R"({"tokens":[1,2]})", &model, &ids));
  EXPECT_EQ(ids, (std::vector<int32_t>{1, 2}));
  auto err = ParseDetokenizeRequest(R"({"tokens":"12"})", &model, &ids);
  ASSERT_TRUE(err);
  EXPECT_EQ(err->param, "tokens");
  err = ParseDetokenizeRequest(R"({})", &model, &ids);
  ASSERT_TRUE(err);
  EXPECT_EQ(err->param, "tokens");
}

Usage SomeUsage() {
  Usage u;
  u.prompt_tokens = 10;
  u.completion_tokens = 4;
  u.cached_tokens = 8;
  u.cached(kvcache::TierKind::kDevice) = 4;
  u.cached(kvcache::TierKind::kHost) = 4;
  return u;
}

TEST(OpenAiProtocol, UsageAlwaysHasCachedTokensByTier) {
  json u = UsageJson(Usage{});
  EXPECT_EQ(u["prompt_tokens"], 0);
  EXPECT_EQ(u["total_tokens"], 0);
  EXPECT_EQ(u["prompt_tokens_details"]["cached_tokens"], 0);
  for (const char* tier : {"device", "host", "disk", "remote"})
    EXPECT_EQ(u["prompt_tokens_details"]["cached_tokens_by_tier"][tier], 0) << tier;

  u = UsageJson(SomeUsage());
  EXPECT_EQ(u["total_tokens"], 14);
  EXPECT_EQ(u["prompt_tokens_details"]["cached_tokens"], 8);
  EXPECT_EQ(u["prompt_tokens_details"]["cached_tokens_by_tier"]["host"], 4);

  // Tiers are counted by kind (the interface took names before, and mapped
  // any unknown name to remote); two tiers of one kind add up.
  using kvcache::TierKind;
  Usage t;
  const std::vector<int32_t> by_tier = {2, 3, 5, 7, 11};
  const std::vector<TierKind> kinds = {TierKind::kDevice, TierKind::kHost, TierKind::kDisk, TierKind::kRemote,
                                       TierKind::kHost};
  AddCachedByTier(by_tier, kinds, &t);
  EXPECT_EQ(t.cached(TierKind::kDevice), 2);
  EXPECT_EQ(t.cached(TierKind::kHost), 3 + 11);
  EXPECT_EQ(t.cached(TierKind::kDisk), 5);
  EXPECT_EQ(t.cached(TierKind::kRemote), 7);
  json j = UsageJson(t);
  for (TierKind k : kvcache::kAllTierKinds)
    EXPECT_EQ(j["prompt_tokens_details"]["cached_tokens_by_tier"][std::string(kvcache::TierKindName(k))],
              t.cached(k));
}

TEST(OpenAiProtocol, NonStreamingBodies) {
  std::vector<ChoiceOutput> choices(2);
  choices[0].text = "hello";
  choices[0].finish_reason = FinishReason::kStop;
  choices[1].index = 1;
  choices[1].text = "bad \xff utf8";  // must not throw
  choices[1].finish_reason = FinishReason::kLength;
  json chat = json::parse(ChatCompletionBody("chatcmpl-abc", 123, "m", choices, SomeUsage()));
  EXPECT_EQ(chat["id"], "chatcmpl-abc");
  EXPECT_EQ(chat["object"], "chat.completion");
  EXPECT_EQ(chat["created"], 123);
  EXPECT_EQ(chat["model"], "m");
  ASSERT_EQ(chat["choices"].size(), 2u);
  EXPECT_EQ(chat["choices"][0]["index"], 0);
  EXPECT_EQ(chat["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(chat["choices"][0]["message"]["content"], "hello");
  EXPECT_TRUE(chat["choices"][0]["logprobs"].is_null());
  EXPECT_EQ(chat["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(chat["choices"][1]["message"]["content"], "bad \xEF\xBF\xBD utf8");
  EXPECT_EQ(chat["choices"][1]["finish_reason"], "length");
  EXPECT_EQ(chat["usage"]["prompt_tokens_details"]["cached_tokens"], 8);

  json comp = json::parse(CompletionBody("cmpl-abc", 5, "m", choices, Usage{}));
  EXPECT_EQ(comp["object"], "text_completion");
  EXPECT_EQ(comp["choices"][0]["text"], "hello");
  EXPECT_EQ(comp["usage"]["prompt_tokens_details"]["cached_tokens_by_tier"]["disk"], 0);
}

json ParseSse(const std::string& event) {
  EXPECT_TRUE(event.starts_with("data: ")) << event;
  EXPECT_TRUE(event.ends_with("\n\n")) << event;
  return json::parse(event.substr(6, event.size() - 8));
}

TEST(OpenAiProtocol, StreamingChunks) {
  json first = ParseSse(
      ChatChunk("c1", 9, "m", 0, std::string("assistant"), std::string(), nullptr, FinishReason::kNone, false));
  EXPECT_EQ(first["object"], "chat.completion.chunk");
  EXPECT_EQ(first["choices"][0]["delta"], (json{{"role", "assistant"}, {"content", ""}}));
  EXPECT_TRUE(first["choices"][0]["finish_reason"].is_null());
  EXPECT_FALSE(first.contains("usage"));

  json mid =
      ParseSse(ChatChunk("c1", 9, "m", 1, std::nullopt, std::string("lo"), nullptr, FinishReason::kNone, true));
  EXPECT_EQ(mid["choices"][0]["index"], 1);
  EXPECT_EQ(mid["choices"][0]["delta"], (json{{"content", "lo"}}));
  EXPECT_TRUE(mid.contains("usage"));
  EXPECT_TRUE(mid["usage"].is_null());

  json last =
      ParseSse(ChatChunk("c1", 9, "m", 0, std::nullopt, std::nullopt, nullptr, FinishReason::kStop, false));
  EXPECT_EQ(last["choices"][0]["delta"], json::object());
  EXPECT_EQ(last["choices"][0]["finish_reason"], "stop");

  json comp = ParseSse(CompletionChunk("x", 9, "m", 0, "text", nullptr, FinishReason::kLength, false));
  EXPECT_EQ(comp["object"], "text_completion");
  EXPECT_EQ(comp["choices"][0]["text"], "text");
  EXPECT_EQ(comp["choices"][0]["finish_reason"], "length");

  json usage = ParseSse(UsageChunk(ApiKind::kChat, "c1", 9, "m", Usage{}));
  EXPECT_EQ(usage["object"], "chat.completion.chunk");
  EXPECT_EQ(usage["choices"], json::array());
  EXPECT_EQ(usage["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  EXPECT_EQ(usage["usage"]["prompt_tokens_details"]["cached_tokens_by_tier"]["remote"], 0);

  json err = ParseSse(ErrorChunk(ApiError::Internal("boom")));
  EXPECT_EQ(err["error"]["message"], "boom");
  EXPECT_EQ(err["error"]["type"], "server_error");
  EXPECT_EQ(kSseDone, "data: [DONE]\n\n");
}

TEST(OpenAiProtocol, LogprobsFormats) {
  std::vector<LogprobEntry> entries(2);
  entries[0].token = "He";
  entries[0].logprob = -0.5f;
  entries[0].top = {{"He", -0.5f}, {"She", -1.5f}};
  entries[1].token = "llo";
  entries[1].logprob = -0.25f;
  json chat = ChatLogprobsJson(entries);
  ASSERT_EQ(chat["content"].size(), 2u);
  EXPECT_EQ(chat["content"][0]["token"], "He");
  EXPECT_FLOAT_EQ(chat["content"][0]["logprob"].get<float>(), -0.5f);
  EXPECT_EQ(chat["content"][0]["bytes"], (json{72, 101}));
  ASSERT_EQ(chat["content"][0]["top_logprobs"].size(), 2u);
  EXPECT_EQ(chat["content"][0]["top_logprobs"][1]["token"], "She");
  EXPECT_EQ(chat["content"][0]["top_logprobs"][1]["bytes"], (json{83, 104, 101}));
  EXPECT_EQ(chat["content"][1]["top_logprobs"], json::array());

  json comp = CompletionLogprobsJson(entries, 10);
  EXPECT_EQ(comp["tokens"], (json{"He", "llo"}));
  EXPECT_FLOAT_EQ(comp["token_logprobs"][1].get<float>(), -0.25f);
  EXPECT_FLOAT_EQ(comp["top_logprobs"][0]["She"].get<float>(), -1.5f);
  EXPECT_EQ(comp["top_logprobs"][1], json::object());
  EXPECT_EQ(comp["text_offset"], (json{10, 12}));
}

}  // namespace
}  // namespace strata::server
