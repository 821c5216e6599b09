#pragma once
// The OpenAI wire format of `strata serve`: request JSON → GenerationParams
// (with OpenAI's types and ranges checked here, so a bad request is a 400 that
// names the field before anything is tokenized), and the response, SSE chunk
// and logprobs JSON built from engine results. docs/api.md describes every
// field.
//
// Parsing checks only what the request alone decides (types, ranges, fields
// Strata does not implement). What needs the model (model name, vocabulary,
// context length, max n) is checked by Frontend::Prepare.
//
// Output text may be ill-formed UTF-8 (a token cut inside a character): every
// builder dumps with error_handler_t::replace (U+FFFD) and never throws.
//
// Thread-safety: pure functions.

#include <array>
#include <cstdint>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kvcache/tier_kind.h"
#include "model/finish_reason.h"
#include "model/sampler.h"
#include "model/tokenizer/tokenizer.h"
#include "server/api_types.h"

namespace strata::server {

// Each returns nullopt and fills *out, or the 400 to send. `out` is reset
// first. Malformed JSON: the message has the parser's byte position.
std::optional<ApiError> ParseChatRequest(std::string_view body, GenerationParams* out);
std::optional<ApiError> ParseCompletionRequest(std::string_view body, GenerationParams* out);
// POST /tokenize: {"model"?, "prompt": "..."} (kind kCompletion) or
// {"model"?, "messages": [...]} (kind kChat), "add_special_tokens"?.
std::optional<ApiError> ParseTokenizeRequest(std::string_view body, GenerationParams* out);
// POST /detokenize: {"model"?, "tokens": [ids]}.
std::optional<ApiError> ParseDetokenizeRequest(std::string_view body, std::string* model,
                                               std::vector<int32_t>* tokens);

// ---- Responses ----

// Prompt tokens counted once per API request (as OpenAI does for n > 1).
struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;  // all choices
  int64_t cached_tokens = 0;
  // prompt_tokens_details.cached_tokens_by_tier, indexed by
  // kvcache::TierKindIndex (every tier of a kind adds to its entry).
  std::array<int64_t, kvcache::kNumTierKinds> cached_by_kind{};
  int64_t& cached(kvcache::TierKind k) { return cached_by_kind[kvcache::TierKindIndex(k)]; }
  // Behind a router (RequestOutput::prefill_instance): which instances
  // served it, as "strata": {"instances": {"prefill", "decode": [...]}}.
  std::string prefill_instance;
  std::vector<std::string> decode_instances;
};
// {"prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details":
//  {"cached_tokens", "cached_tokens_by_tier": {"device","host","disk","remote"}}}
// (every field present, also when 0), and "strata": {"instances": {"prefill",
// "decode"}} when a router served it.
nlohmann::json UsageJson(const Usage& usage);
// Adds engine cached-token counts by tier (index 0 device, then lower tiers,
// of the kinds in `tier_kinds`, Engine::tier_kinds()) into `usage`'s entry
// for each kind. REQUIRES: tier_kinds.size() >= by_tier.size().
void AddCachedByTier(std::span<const int32_t> by_tier, std::span<const kvcache::TierKind> tier_kinds,
                     Usage* usage);

// One generated token with its logprob and the top alternatives, as text.
struct LogprobEntry {
  std::string token;  // the token's text (may be ill-formed UTF-8)
  float logprob = 0;
  std::vector<std::pair<std::string, float>> top;
};
// Renders the engine's per-token samples: each token decoded on its own
// (special tokens as their text, continuation spacing). `samples` has one
// entry per id; extra ids without a sample get logprob 0.
std::vector<LogprobEntry> RenderLogprobs(const Tokenizer& tokenizer, std::span<const int32_t> ids,
                                         std::span<const SampleResult> samples);
// Chat: {"content": [{"token","logprob","bytes","top_logprobs":[{"token","logprob","bytes"}]}]}.
nlohmann::json ChatLogprobsJson(std::span<const LogprobEntry> entries);
// Completions: {"tokens", "token_logprobs", "top_logprobs": [{token: logprob}],
// "text_offset"}; offsets count bytes from `text_offset` (the length of text
// already returned for this choice, echoed prompt included).
nlohmann::json CompletionLogprobsJson(std::span<const LogprobEntry> entries, int64_t text_offset);

struct ChoiceOutput {
  int index = 0;
  std::string text;           // chat: message content; completions: text (echo already prepended)
  FinishReason finish_reason = FinishReason::kNone;  // rendered as OpenAI's string (null for kNone)
  nlohmann::json logprobs;    // null when not asked
};

// Non-streaming bodies. `id` is the whole id ("chatcmpl-..."/"cmpl-...").
std::string ChatCompletionBody(const std::string& id, int64_t created, const std::string& model,
                               std::span<const ChoiceOutput> choices, const Usage& usage);
std::string CompletionBody(const std::string& id, int64_t created, const std::string& model,
                           std::span<const ChoiceOutput> choices, const Usage& usage);

// One SSE event: "data: <json>\n\n".
std::string SseData(const nlohmann::json& j);
inline constexpr std::string_view kSseDone = "data: [DONE]\n\n";

// Streaming chunks (already framed as SSE). `role`: set on a choice's first
// chunk ("assistant"); `content` absent leaves it out of the delta;
// `finish_reason` kNone = null. `with_usage_null` adds "usage": null (what
// OpenAI sends on every chunk when include_usage is set).
std::string ChatChunk(const std::string& id, int64_t created, const std::string& model, int index,
                      const std::optional<std::string>& role,
                      const std::optional<std::string>& content, const nlohmann::json& logprobs,
                      FinishReason finish_reason, bool with_usage_null);
std::string CompletionChunk(const std::string& id, int64_t created, const std::string& model,
                            int index, const std::string& text, const nlohmann::json& logprobs,
                            FinishReason finish_reason, bool with_usage_null);
// The last chunk when include_usage: "choices": [] and the usage.
std::string UsageChunk(ApiKind kind, const std::string& id, int64_t created,
                       const std::string& model, const Usage& usage);
// An error in the middle of a stream: data: {"error": {...}}.
std::string ErrorChunk(const ApiError& error);

// JSON dump that never throws on ill-formed UTF-8 (replaced by U+FFFD).
std::string Dump(const nlohmann::json& j);

}  // namespace strata::server
