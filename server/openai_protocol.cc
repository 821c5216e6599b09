#include "server/openai_protocol.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <limits>
#include <unordered_set>

#include "common/logging.h"

namespace strata::server {

namespace {

using json = nlohmann::json;

// Early returns for the many small checks below.
#define STRATA_RETURN_IF_API_ERROR(expr) \
  do {                                   \
    if (auto strata_api_err_ = (expr)) { \
      return strata_api_err_;            \
    }                                    \
  } while (0)

using MaybeError = std::optional<ApiError>;

// Nesting deeper than this is refused before parsing: nlohmann's dump and
// comparison recurse, and no valid request needs more.
constexpr int kMaxDepth = 64;
constexpr int kMaxStops = 4;
constexpr int kMaxChatTopLogprobs = 20;
constexpr int kMaxCompletionLogprobs = 5;
constexpr double kMaxCacheTtlSeconds = 604800;  // 7 days
// Logprobs of -inf (a token without probability mass) are sent as this, as
// vLLM does: JSON has no infinity.
constexpr float kMinLogprob = -9999.0f;

std::string Num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", v);
  return buf;
}

std::string TypeName(const json& v) {
  switch (v.type()) {
    case json::value_t::null:
      return "null";
    case json::value_t::boolean:
      return "boolean";
    case json::value_t::string:
      return "string";
    case json::value_t::array:
      return "array";
    case json::value_t::object:
      return "object";
    case json::value_t::number_integer:
    case json::value_t::number_unsigned:
      return "integer";
    case json::value_t::number_float:
      return "number";
    default:
      return "value";
  }
}

ApiError TypeError(const std::string& field, std::string_view expected, const json& got) {
  return ApiError::BadRequest(
      "'" + field + "' must be " + std::string(expected) + ", got " + TypeName(got), field);
}

ApiError RangeError(const std::string& field, std::string_view range, double got) {
  return ApiError::BadRequest("'" + field + "' must be " + std::string(range) + ", got " + Num(got),
                              field);
}

ApiError Unsupported(const std::string& field, std::string_view what = {}) {
  std::string msg = "'" + field + "' is not supported by this server";
  if (!what.empty()) msg += " (" + std::string(what) + ")";
  return ApiError::BadRequest(std::move(msg), field);
}

// The member, or nullptr when it is missing or null (null = absent).
const json* Get(const json& obj, const char* key) {
  auto it = obj.find(key);
  if (it == obj.end() || it->is_null()) return nullptr;
  return &*it;
}

MaybeError GetBool(const json& obj, const char* key, bool* out, bool* present = nullptr) {
  const json* v = Get(obj, key);
  if (present != nullptr) *present = v != nullptr;
  if (v == nullptr) return std::nullopt;
  if (!v->is_boolean()) return TypeError(key, "a boolean", *v);
  *out = v->get<bool>();
  return std::nullopt;
}

MaybeError GetString(const json& obj, const char* key, std::string* out, bool* present = nullptr) {
  const json* v = Get(obj, key);
  if (present != nullptr) *present = v != nullptr;
  if (v == nullptr) return std::nullopt;
  if (!v->is_string()) return TypeError(key, "a string", *v);
  *out = v->get<std::string>();
  return std::nullopt;
}

// An integer value (integral floats such as 2.0 are accepted, as Pydantic
// does in vLLM). `field` names it in errors.
MaybeError AsInt(const json& v, const std::string& field, int64_t* out) {
  if (v.is_number_integer() && !v.is_number_unsigned()) {
    *out = v.get<int64_t>();
    return std::nullopt;
  }
  if (v.is_number_unsigned()) {
    uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      return ApiError::BadRequest("'" + field + "' is too large", field);
    *out = static_cast<int64_t>(u);
    return std::nullopt;
  }
  if (v.is_number_float()) {
    double d = v.get<double>();
    if (std::isfinite(d) && d == std::floor(d) && std::fabs(d) < 9.0e18) {
      *out = static_cast<int64_t>(d);
      return std::nullopt;
    }
  }
  return TypeError(field, "an integer", v);
}

MaybeError GetInt(const json& obj, const char* key, int64_t* out, bool* present) {
  const json* v = Get(obj, key);
  *present = v != nullptr;
  if (v == nullptr) return std::nullopt;
  return AsInt(*v, key, out);
}

MaybeError GetNumber(const json& obj, const char* key, double* out, bool* present) {
  const json* v = Get(obj, key);
  *present = v != nullptr;
  if (v == nullptr) return std::nullopt;
  if (!v->is_number()) return TypeError(key, "a number", *v);
  *out = v->get<double>();
  return std::nullopt;
}

// A float field checked against [lo, hi] (open at lo when lo_open).
MaybeError GetRangedFloat(const json& obj, const char* key, double lo, double hi, bool lo_open,
                          std::string_view range, float* out) {
  double d = 0;
  bool present = false;
  STRATA_RETURN_IF_API_ERROR(GetNumber(obj, key, &d, &present));
  if (!present) return std::nullopt;
  bool ok = std::isfinite(d) && (lo_open ? d > lo : d >= lo) && d <= hi;
  if (!ok) return RangeError(key, range, d);
  *out = static_cast<float>(d);
  return std::nullopt;
}

// Depth of the deepest array/object nesting, skipping strings. Stops
// counting past `limit`.
int NestingDepth(std::string_view s, int limit) {
  int depth = 0, max_depth = 0;
  bool in_string = false, escaped = false;
  for (char c : s) {
    if (in_string) {
      if (escaped) {
        escaped = false;
      } else if (c == '\\') {
        escaped = true;
      } else if (c == '"') {
        in_string = false;
      }
      continue;
    }
    if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth) max_depth = depth;
      if (max_depth > limit) return max_depth;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return max_depth;
}

MaybeError ParseBody(std::string_view body, json* out) {
  if (NestingDepth(body, kMaxDepth) > kMaxDepth)
    return ApiError::BadRequest("Invalid JSON body: nested more than " + std::to_string(kMaxDepth) +
                                " levels deep");
  try {
    *out = json::parse(body.begin(), body.end());
  } catch (const json::parse_error& e) {
    std::string what = e.what();
    // Drop nlohmann's "[json.exception.parse_error.101] " prefix.
    if (auto p = what.find("] "); what.starts_with("[json.exception") && p != std::string::npos)
      what.erase(0, p + 2);
    // "; last read: '...'" quotes body bytes, which may be ill-formed UTF-8;
    // the byte position says where the problem is.
    if (auto p = what.find("; last read:"); p != std::string::npos) what.erase(p);
    return ApiError::BadRequest("Invalid JSON body at byte " + std::to_string(e.byte) + ": " +
                                what);
  }
  if (!out->is_object())
    return ApiError::BadRequest("The request body must be a JSON object, got " + TypeName(*out));
  return std::nullopt;
}

void LogUnknownFields(const json& obj, const std::unordered_set<std::string_view>& known,
                      std::string_view api) {
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    if (!known.contains(it.key()))
      STRATA_LOG_DEBUG("{}: ignoring unknown request field '{}'", api, it.key());
  }
}

// Fields OpenAI defines that Strata does not implement. Silently ignoring
// them would give answers the client did not ask for, so they are a 400.
MaybeError CheckUnsupported(const json& j, ApiKind kind) {
  auto non_empty = [](const json* v) { return v != nullptr && !(v->is_array() && v->empty()); };
  if (non_empty(Get(j, "tools"))) return Unsupported("tools", "tool calling");
  if (const json* v = Get(j, "tool_choice"); v != nullptr && !(v->is_string() && *v == "none"))
    return Unsupported("tool_choice", "tool calling; only \"none\" is accepted");
  if (non_empty(Get(j, "functions"))) return Unsupported("functions", "function calling");
  if (const json* v = Get(j, "function_call"); v != nullptr && !(v->is_string() && *v == "none"))
    return Unsupported("function_call", "function calling; only \"none\" is accepted");
  if (Get(j, "parallel_tool_calls") != nullptr)
    return Unsupported("parallel_tool_calls", "tool calling");
  if (const json* v = Get(j, "response_format")) {
    const json* type = v->is_object() ? Get(*v, "type") : nullptr;
    if (type == nullptr || !type->is_string() || *type != "text")
      return Unsupported("response_format", "only {\"type\": \"text\"} is accepted");
  }
  if (Get(j, "audio") != nullptr) return Unsupported("audio");
  if (const json* v = Get(j, "modalities"); v != nullptr && !(*v == json::array({"text"})))
    return Unsupported("modalities", "only [\"text\"] is accepted");
  if (Get(j, "prediction") != nullptr) return Unsupported("prediction", "predicted outputs");
  if (Get(j, "web_search_options") != nullptr) return Unsupported("web_search_options");
  if (const json* v = Get(j, "store"); v != nullptr && !(v->is_boolean() && !v->get<bool>()))
    return Unsupported("store", "stored completions; only false is accepted");
  if (const json* v = Get(j, "service_tier");
      v != nullptr && !(v->is_string() && (*v == "auto" || *v == "default")))
    return Unsupported("service_tier", "only \"auto\" and \"default\" are accepted");
  if (Get(j, "reasoning_effort") != nullptr) return Unsupported("reasoning_effort");
  if (Get(j, "verbosity") != nullptr) return Unsupported("verbosity");
  if (kind == ApiKind::kCompletion) {
    if (const json* v = Get(j, "suffix");
        v != nullptr && !(v->is_string() && v->get<std::string>().empty()))
      return Unsupported("suffix", "insertion");
  }
  return std::nullopt;
}

MaybeError ParseStop(const json& j, GenerationParams* p) {
  const json* v = Get(j, "stop");
  if (v == nullptr) return std::nullopt;
  if (v->is_string()) {
    p->stop.push_back(v->get<std::string>());
  } else if (v->is_array()) {
    for (const json& s : *v) {
      if (!s.is_string()) return TypeError("stop", "a string or an array of strings", s);
      p->stop.push_back(s.get<std::string>());
    }
  } else {
    return TypeError("stop", "a string or an array of strings", *v);
  }
  if (p->stop.size() > kMaxStops)
    return ApiError::BadRequest(
        "'stop' may have at most 4 strings, got " + std::to_string(p->stop.size()), "stop");
  for (const std::string& s : p->stop) {
    if (s.empty()) return ApiError::BadRequest("'stop' strings must not be empty", "stop");
  }
  return std::nullopt;
}

MaybeError ParseLogitBias(const json& j, SamplingParams* s) {
  const json* v = Get(j, "logit_bias");
  if (v == nullptr) return std::nullopt;
  if (!v->is_object()) return TypeError("logit_bias", "an object of token id → bias", *v);
  for (auto it = v->begin(); it != v->end(); ++it) {
    const std::string& key = it.key();
    int32_t id = -1;
    auto [ptr, ec] = std::from_chars(key.data(), key.data() + key.size(), id);
    if (ec != std::errc() || ptr != key.data() + key.size() || key.empty() || id < 0)
      return ApiError::BadRequest(
          "'logit_bias' keys must be token ids (non-negative integers), got \"" + key + "\"",
          "logit_bias");
    if (!it->is_number()) return TypeError("logit_bias", "an object whose values are numbers", *it);
    double b = it->get<double>();
    if (!(std::isfinite(b) && b >= -100 && b <= 100))
      return ApiError::BadRequest(
          "'logit_bias' values must be in [-100, 100], got " + Num(b) + " for token " + key,
          "logit_bias");
    s->logit_bias.emplace_back(id, static_cast<float>(b));
  }
  return std::nullopt;
}

MaybeError ParseTokenIds(const json& arr, const std::string& field, std::vector<int32_t>* out) {
  out->clear();
  for (const json& t : arr) {
    int64_t id = 0;
    if (!t.is_number()) return TypeError(field, "an array of token ids (integers)", t);
    STRATA_RETURN_IF_API_ERROR(AsInt(t, field, &id));
    if (id < 0 || id > std::numeric_limits<int32_t>::max())
      return ApiError::BadRequest(
          "'" + field + "' has token id " + std::to_string(id) + ", which is out of range", field);
    out->push_back(static_cast<int32_t>(id));
  }
  return std::nullopt;
}

// Fields shared by chat and completions.
MaybeError ParseCommon(const json& j, ApiKind kind, GenerationParams* p) {
  STRATA_RETURN_IF_API_ERROR(CheckUnsupported(j, kind));
  STRATA_RETURN_IF_API_ERROR(GetString(j, "model", &p->model));

  int64_t v = 0;
  bool has_max = false, has_mct = false;
  int64_t max_tokens = 0, mct = 0;
  STRATA_RETURN_IF_API_ERROR(GetInt(j, "max_tokens", &max_tokens, &has_max));
  if (has_max && max_tokens < 1)
    return RangeError("max_tokens", "at least 1", static_cast<double>(max_tokens));
  STRATA_RETURN_IF_API_ERROR(GetInt(j, "max_completion_tokens", &mct, &has_mct));
  if (has_mct && mct < 1)
    return RangeError("max_completion_tokens", "at least 1", static_cast<double>(mct));
  if (has_max && has_mct && max_tokens != mct)
    return ApiError::BadRequest("'max_tokens' (" + std::to_string(max_tokens) +
                                    ") and 'max_completion_tokens' (" + std::to_string(mct) +
                                    ") disagree; give one of them",
                                "max_completion_tokens");
  if (has_max || has_mct) {
    // Anything above INT_MAX exceeds every context; the Frontend reports it
    // with the context length.
    int64_t m = has_mct ? mct : max_tokens;
    p->max_tokens = static_cast<int>(std::min<int64_t>(m, std::numeric_limits<int>::max()));
  }

  STRATA_RETURN_IF_API_ERROR(ParseStop(j, p));

  bool present = false;
  STRATA_RETURN_IF_API_ERROR(GetInt(j, "n", &v, &present));
  if (present) {
    if (v < 1) return RangeError("n", "at least 1", static_cast<double>(v));
    p->n = static_cast<int>(std::min<int64_t>(v, std::numeric_limits<int>::max()));
  }

  SamplingParams& s = p->sampling;
  STRATA_RETURN_IF_API_ERROR(
      GetRangedFloat(j, "temperature", 0, 2, false, "in [0, 2]", &s.temperature));
  STRATA_RETURN_IF_API_ERROR(GetRangedFloat(j, "top_p", 0, 1, true, "in (0, 1]", &s.top_p));
  STRATA_RETURN_IF_API_ERROR(GetRangedFloat(j, "min_p", 0, 1, false, "in [0, 1]", &s.min_p));
  STRATA_RETURN_IF_API_ERROR(
      GetRangedFloat(j, "presence_penalty", -2, 2, false, "in [-2, 2]", &s.presence_penalty));
  STRATA_RETURN_IF_API_ERROR(
      GetRangedFloat(j, "frequency_penalty", -2, 2, false, "in [-2, 2]", &s.frequency_penalty));
  STRATA_RETURN_IF_API_ERROR(GetRangedFloat(j, "repetition_penalty", 0,
                                            std::numeric_limits<double>::max(), true,
                                            "greater than 0", &s.repetition_penalty));
  STRATA_RETURN_IF_API_ERROR(GetInt(j, "top_k", &v, &present));
  if (present) {
    // 0 is accepted as "off" like -1 (some clients send 0 for "unset").
    if (v < -1 || v > std::numeric_limits<int>::max())
      return RangeError("top_k", "-1 or 0 (off), or at least 1", static_cast<double>(v));
    s.top_k = static_cast<int>(v);
  }
  STRATA_RETURN_IF_API_ERROR(GetInt(j, "seed", &v, &present));
  if (present) s.seed = static_cast<uint64_t>(v);  // negative seeds are valid seeds too
  STRATA_RETURN_IF_API_ERROR(ParseLogitBias(j, &s));

  STRATA_RETURN_IF_API_ERROR(GetBool(j, "stream", &p->stream));
  if (const json* so = Get(j, "stream_options")) {
    if (!p->stream)
      return ApiError::BadRequest("'stream_options' is only allowed when 'stream' is true",
                                  "stream_options");
    if (!so->is_object()) return TypeError("stream_options", "an object", *so);
    bool include = false;
    if (const json* iu = Get(*so, "include_usage")) {
      if (!iu->is_boolean()) return TypeError("stream_options.include_usage", "a boolean", *iu);
      include = iu->get<bool>();
    }
    p->include_usage = include;
  }

  STRATA_RETURN_IF_API_ERROR(GetString(j, "user", &p->user));
  STRATA_RETURN_IF_API_ERROR(GetString(j, "cache_salt", &p->cache_salt, &present));
  if (present && p->cache_salt.empty())
    return ApiError::BadRequest("'cache_salt' must not be empty (leave it out for no salt)",
                                "cache_salt");
  {
    double ttl = 0;
    STRATA_RETURN_IF_API_ERROR(GetNumber(j, "cache_ttl_seconds", &ttl, &present));
    if (present) {
      if (!(ttl >= 0) || ttl > kMaxCacheTtlSeconds)
        return RangeError("cache_ttl_seconds", "between 0 and 604800 (7 days)", ttl);
      p->cache_ttl_seconds = ttl;
    }
  }
  STRATA_RETURN_IF_API_ERROR(GetInt(j, "priority", &v, &present));
  if (present) {
    if (v < std::numeric_limits<int32_t>::min() || v > std::numeric_limits<int32_t>::max())
      return RangeError("priority", "a 32-bit integer", static_cast<double>(v));
    p->priority = static_cast<int>(v);
  }
  STRATA_RETURN_IF_API_ERROR(GetBool(j, "ignore_eos", &p->ignore_eos));
  if (const json* ids = Get(j, "stop_token_ids")) {
    if (!ids->is_array()) return TypeError("stop_token_ids", "an array of token ids", *ids);
    STRATA_RETURN_IF_API_ERROR(ParseTokenIds(*ids, "stop_token_ids", &p->stop_token_ids));
  }
  bool ast = false;
  STRATA_RETURN_IF_API_ERROR(GetBool(j, "add_special_tokens", &ast, &present));
  if (present) p->add_special_tokens = ast;
  return std::nullopt;
}

MaybeError ParseMessages(const json& j, std::vector<ChatMessage>* out) {
  const json* msgs = Get(j, "messages");
  if (msgs == nullptr) return ApiError::BadRequest("'messages' is required", "messages");
  if (!msgs->is_array()) return TypeError("messages", "an array", *msgs);
  if (msgs->empty()) return ApiError::BadRequest("'messages' must not be empty", "messages");
  out->clear();
  for (size_t i = 0; i < msgs->size(); ++i) {
    const json& m = (*msgs)[i];
    const std::string at = "messages[" + std::to_string(i) + "]";
    if (!m.is_object()) return TypeError(at, "an object", m);
    ChatMessage cm;
    const json* role = Get(m, "role");
    if (role == nullptr) return ApiError::BadRequest("'" + at + ".role' is required", at + ".role");
    if (!role->is_string()) return TypeError(at + ".role", "a string", *role);
    cm.role = role->get<std::string>();
    if (cm.role == "developer") cm.role = "system";  // OpenAI's newer name for system
    if (cm.role == "tool" || cm.role == "function")
      return ApiError::BadRequest(
          "'" + at + ".role' \"" + cm.role + "\" is not supported (tool calling)", at + ".role");
    if (cm.role != "system" && cm.role != "user" && cm.role != "assistant")
      return ApiError::BadRequest(
          "'" + at + ".role' must be one of system, developer, user, assistant; got \"" + cm.role +
              "\"",
          at + ".role");
    if (const json* tc = Get(m, "tool_calls"); tc != nullptr && !(tc->is_array() && tc->empty()))
      return Unsupported(at + ".tool_calls", "tool calling");
    if (const json* fc = Get(m, "function_call"); fc != nullptr)
      return Unsupported(at + ".function_call", "function calling");
    if (Get(m, "audio") != nullptr) return Unsupported(at + ".audio");
    if (const json* name = Get(m, "name"); name != nullptr && !name->is_string())
      return TypeError(at + ".name", "a string", *name);
    const json* content = Get(m, "content");
    if (content == nullptr) {
      // An assistant turn may have null content (OpenAI allows it when it
      // carried tool calls; here it is simply empty).
      if (cm.role != "assistant")
        return ApiError::BadRequest("'" + at + ".content' is required", at + ".content");
    } else if (content->is_string()) {
      cm.content = content->get<std::string>();
    } else if (content->is_array()) {
      // Text parts are joined with newlines, as vLLM does.
      bool first = true;
      for (size_t k = 0; k < content->size(); ++k) {
        const json& part = (*content)[k];
        const std::string pat = at + ".content[" + std::to_string(k) + "]";
        if (!part.is_object()) return TypeError(pat, "an object", part);
        const json* type = Get(part, "type");
        if (type == nullptr)
          return ApiError::BadRequest("'" + pat + ".type' is required", pat + ".type");
        if (!type->is_string()) return TypeError(pat + ".type", "a string", *type);
        if (*type != "text")
          return ApiError::BadRequest("'" + pat + ".type' \"" + type->get<std::string>() +
                                          "\" is not supported; only \"text\" parts are",
                                      pat + ".type");
        const json* text = Get(part, "text");
        if (text == nullptr)
          return ApiError::BadRequest("'" + pat + ".text' is required", pat + ".text");
        if (!text->is_string()) return TypeError(pat + ".text", "a string", *text);
        if (!first) cm.content += '\n';
        cm.content += text->get<std::string>();
        first = false;
      }
    } else {
      return TypeError(at + ".content", "a string or an array of content parts", *content);
    }
    out->push_back(std::move(cm));
  }
  return std::nullopt;
}

MaybeError ParsePrompt(const json& j, GenerationParams* p) {
  const json* v = Get(j, "prompt");
  if (v == nullptr) return ApiError::BadRequest("'prompt' is required", "prompt");
  if (v->is_string()) {
    p->prompt_text = v->get<std::string>();
    return std::nullopt;
  }
  constexpr std::string_view kShape = "a string, an array of one string, or an array of token ids";
  if (!v->is_array()) return TypeError("prompt", kShape, *v);
  if (v->empty()) return ApiError::BadRequest("'prompt' must not be an empty array", "prompt");
  const json& first = v->front();
  if (first.is_string() || first.is_array()) {
    // A batch of prompts; only a batch of one is accepted.
    if (v->size() > 1)
      return ApiError::BadRequest("batched prompts are not supported; send one prompt", "prompt");
    if (first.is_string()) {
      p->prompt_text = first.get<std::string>();
      return std::nullopt;
    }
    if (first.empty()) return ApiError::BadRequest("'prompt' must not be an empty array", "prompt");
    p->prompt_is_ids = true;
    return ParseTokenIds(first, "prompt", &p->prompt_ids);
  }
  if (!first.is_number()) return TypeError("prompt", kShape, first);
  p->prompt_is_ids = true;
  return ParseTokenIds(*v, "prompt", &p->prompt_ids);
}

const std::unordered_set<std::string_view>& CommonKnown() {
  static const std::unordered_set<std::string_view> k = {"model",
                                                         "max_tokens",
                                                         "max_completion_tokens",
                                                         "stop",
                                                         "n",
                                                         "temperature",
                                                         "top_p",
                                                         "min_p",
                                                         "presence_penalty",
                                                         "frequency_penalty",
                                                         "repetition_penalty",
                                                         "top_k",
                                                         "seed",
                                                         "logit_bias",
                                                         "stream",
                                                         "stream_options",
                                                         "user",
                                                         "cache_salt",
                                                         "cache_ttl_seconds",
                                                         "priority",
                                                         "ignore_eos",
                                                         "stop_token_ids",
                                                         "add_special_tokens",
                                                         "logprobs",
                                                         "top_logprobs",
                                                         "metadata",
                                                         "store",
                                                         "service_tier",
                                                         "tools",
                                                         "tool_choice",
                                                         "functions",
                                                         "function_call",
                                                         "parallel_tool_calls",
                                                         "response_format",
                                                         "audio",
                                                         "modalities",
                                                         "prediction",
                                                         "web_search_options",
                                                         "reasoning_effort",
                                                         "verbosity"};
  return k;
}

void ResetParams(GenerationParams* out, ApiKind kind) {
  *out = GenerationParams();
  out->kind = kind;
}

}  // namespace

std::optional<ApiError> ParseChatRequest(std::string_view body, GenerationParams* out) {
  ResetParams(out, ApiKind::kChat);
  json j;
  STRATA_RETURN_IF_API_ERROR(ParseBody(body, &j));
  STRATA_RETURN_IF_API_ERROR(ParseCommon(j, ApiKind::kChat, out));
  STRATA_RETURN_IF_API_ERROR(ParseMessages(j, &out->messages));
  SamplingParams& s = out->sampling;
  STRATA_RETURN_IF_API_ERROR(GetBool(j, "logprobs", &s.logprobs));
  int64_t top = 0;
  bool has_top = false;
  STRATA_RETURN_IF_API_ERROR(GetInt(j, "top_logprobs", &top, &has_top));
  if (has_top) {
    if (top < 0 || top > kMaxChatTopLogprobs)
      return RangeError("top_logprobs", "in [0, 20]", static_cast<double>(top));
    if (top > 0 && !s.logprobs)
      return ApiError::BadRequest("'top_logprobs' requires 'logprobs' to be true", "top_logprobs");
    s.top_logprobs = static_cast<int>(top);
  }
  LogUnknownFields(j, CommonKnown(), "chat");
  return std::nullopt;
}

std::optional<ApiError> ParseCompletionRequest(std::string_view body, GenerationParams* out) {
  ResetParams(out, ApiKind::kCompletion);
  json j;
  STRATA_RETURN_IF_API_ERROR(ParseBody(body, &j));
  STRATA_RETURN_IF_API_ERROR(ParseCommon(j, ApiKind::kCompletion, out));
  STRATA_RETURN_IF_API_ERROR(ParsePrompt(j, out));
  int64_t lp = 0;
  bool has_lp = false;
  STRATA_RETURN_IF_API_ERROR(GetInt(j, "logprobs", &lp, &has_lp));
  if (has_lp) {
    // The legacy API: logprobs = how many alternatives; 0 = the chosen token's only.
    if (lp < 0 || lp > kMaxCompletionLogprobs)
      return RangeError("logprobs", "in [0, 5]", static_cast<double>(lp));
    out->sampling.logprobs = true;
    out->sampling.top_logprobs = static_cast<int>(lp);
  }
  STRATA_RETURN_IF_API_ERROR(GetBool(j, "echo", &out->echo));
  if (out->echo && has_lp)
    return ApiError::BadRequest(
        "'echo' together with 'logprobs' is not supported (no prompt logprobs)", "echo");
  int64_t best_of = 0;
  bool has_best_of = false;
  STRATA_RETURN_IF_API_ERROR(GetInt(j, "best_of", &best_of, &has_best_of));
  if (has_best_of && best_of != out->n)
    return ApiError::BadRequest("'best_of' other than n is not supported (got best_of " +
                                    std::to_string(best_of) + ", n " + std::to_string(out->n) + ")",
                                "best_of");
  static const std::unordered_set<std::string_view> known = [] {
    auto k = CommonKnown();
    k.insert({"prompt", "echo", "best_of", "suffix"});
    return k;
  }();
  LogUnknownFields(j, known, "completions");
  return std::nullopt;
}

std::optional<ApiError> ParseTokenizeRequest(std::string_view body, GenerationParams* out) {
  ResetParams(out, ApiKind::kCompletion);
  json j;
  STRATA_RETURN_IF_API_ERROR(ParseBody(body, &j));
  STRATA_RETURN_IF_API_ERROR(GetString(j, "model", &out->model));
  const bool has_prompt = Get(j, "prompt") != nullptr;
  const bool has_messages = Get(j, "messages") != nullptr;
  if (has_prompt == has_messages)
    return ApiError::BadRequest("give exactly one of 'prompt' or 'messages'",
                                has_prompt ? "messages" : "prompt");
  if (has_prompt) {
    STRATA_RETURN_IF_API_ERROR(GetString(j, "prompt", &out->prompt_text));
  } else {
    out->kind = ApiKind::kChat;
    STRATA_RETURN_IF_API_ERROR(ParseMessages(j, &out->messages));
  }
  bool ast = false, present = false;
  STRATA_RETURN_IF_API_ERROR(GetBool(j, "add_special_tokens", &ast, &present));
  if (present) out->add_special_tokens = ast;
  return std::nullopt;
}

std::optional<ApiError> ParseDetokenizeRequest(std::string_view body, std::string* model,
                                               std::vector<int32_t>* tokens) {
  model->clear();
  tokens->clear();
  json j;
  STRATA_RETURN_IF_API_ERROR(ParseBody(body, &j));
  STRATA_RETURN_IF_API_ERROR(GetString(j, "model", model));
  const json* t = Get(j, "tokens");
  if (t == nullptr) return ApiError::BadRequest("'tokens' is required", "tokens");
  if (!t->is_array()) return TypeError("tokens", "an array of token ids", *t);
  return ParseTokenIds(*t, "tokens", tokens);
}

// ---- Responses ----

std::string Dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

json UsageJson(const Usage& u) {
  json by_tier = json::object();
  for (kvcache::TierKind k : kvcache::kAllTierKinds)
    by_tier[std::string(kvcache::TierKindName(k))] = u.cached_by_kind[kvcache::TierKindIndex(k)];
  json j{{"prompt_tokens", u.prompt_tokens},
         {"completion_tokens", u.completion_tokens},
         {"total_tokens", u.prompt_tokens + u.completion_tokens},
         {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}, {"cached_tokens_by_tier", by_tier}}}};
  if (!u.prefill_instance.empty() || !u.decode_instances.empty())
    j["strata"] = {{"instances", {{"prefill", u.prefill_instance}, {"decode", u.decode_instances}}}};
  return j;
}

void AddCachedByTier(std::span<const int32_t> by_tier, std::span<const kvcache::TierKind> tier_kinds, Usage* u) {
  for (size_t i = 0; i < by_tier.size() && i < tier_kinds.size(); ++i) u->cached(tier_kinds[i]) += by_tier[i];
}

std::vector<LogprobEntry> RenderLogprobs(const Tokenizer& tokenizer, std::span<const int32_t> ids,
                                         std::span<const SampleResult> samples) {
  auto text = [&](int32_t id) {
    const int32_t one[1] = {id};
    return tokenizer.Decode(one, /*skip_special=*/false, DecodeStart::kContinuation);
  };
  auto clamp = [](float lp) { return std::isfinite(lp) ? lp : kMinLogprob; };
  std::vector<LogprobEntry> out;
  out.reserve(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    LogprobEntry e;
    e.token = text(ids[i]);
    if (i < samples.size()) {
      e.logprob = clamp(samples[i].logprob);
      for (const TokenLogprob& t : samples[i].top) e.top.emplace_back(text(t.id), clamp(t.logprob));
    }
    out.push_back(std::move(e));
  }
  return out;
}

namespace {
json Bytes(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}
}  // namespace

json ChatLogprobsJson(std::span<const LogprobEntry> entries) {
  json content = json::array();
  for (const LogprobEntry& e : entries) {
    json top = json::array();
    for (const auto& [tok, lp] : e.top)
      top.push_back({{"token", tok}, {"logprob", lp}, {"bytes", Bytes(tok)}});
    content.push_back({{"token", e.token},
                       {"logprob", e.logprob},
                       {"bytes", Bytes(e.token)},
                       {"top_logprobs", top}});
  }
  return json{{"content", content}};
}

json CompletionLogprobsJson(std::span<const LogprobEntry> entries, int64_t text_offset) {
  json tokens = json::array(), lps = json::array(), tops = json::array(), offsets = json::array();
  for (const LogprobEntry& e : entries) {
    tokens.push_back(e.token);
    lps.push_back(e.logprob);
    json top = json::object();
    for (const auto& [tok, lp] : e.top) top[tok] = lp;
    tops.push_back(std::move(top));
    offsets.push_back(text_offset);
    text_offset += static_cast<int64_t>(e.token.size());
  }
  return json{{"tokens", tokens},
              {"token_logprobs", lps},
              {"top_logprobs", tops},
              {"text_offset", offsets}};
}

namespace {
// The one place a finish reason becomes OpenAI's JSON (null while unfinished).
json FinishReasonJson(FinishReason r) {
  return r == FinishReason::kNone ? json(nullptr) : json(std::string(FinishReasonName(r)));
}

json Envelope(const std::string& id, const char* object, int64_t created,
              const std::string& model) {
  return json{{"id", id}, {"object", object}, {"created", created}, {"model", model}};
}
}  // namespace

std::string ChatCompletionBody(const std::string& id, int64_t created, const std::string& model,
                               std::span<const ChoiceOutput> choices, const Usage& usage) {
  json j = Envelope(id, "chat.completion", created, model);
  json cs = json::array();
  for (const ChoiceOutput& c : choices) {
    cs.push_back({{"index", c.index},
                  {"message", {{"role", "assistant"}, {"content", c.text}}},
                  {"logprobs", c.logprobs},
                  {"finish_reason", FinishReasonJson(c.finish_reason)}});
  }
  j["choices"] = std::move(cs);
  j["usage"] = UsageJson(usage);
  return Dump(j);
}

std::string CompletionBody(const std::string& id, int64_t created, const std::string& model,
                           std::span<const ChoiceOutput> choices, const Usage& usage) {
  json j = Envelope(id, "text_completion", created, model);
  json cs = json::array();
  for (const ChoiceOutput& c : choices) {
    cs.push_back({{"index", c.index},
                  {"text", c.text},
                  {"logprobs", c.logprobs},
                  {"finish_reason", FinishReasonJson(c.finish_reason)}});
  }
  j["choices"] = std::move(cs);
  j["usage"] = UsageJson(usage);
  return Dump(j);
}

std::string SseData(const json& j) { return "data: " + Dump(j) + "\n\n"; }

std::string ChatChunk(const std::string& id, int64_t created, const std::string& model, int index,
                      const std::optional<std::string>& role,
                      const std::optional<std::string>& content, const json& logprobs,
                      FinishReason finish_reason, bool with_usage_null) {
  json j = Envelope(id, "chat.completion.chunk", created, model);
  json delta = json::object();
  if (role) delta["role"] = *role;
  if (content) delta["content"] = *content;
  j["choices"] = json::array({{{"index", index},
                               {"delta", delta},
                               {"logprobs", logprobs},
                               {"finish_reason", FinishReasonJson(finish_reason)}}});
  if (with_usage_null) j["usage"] = nullptr;
  return SseData(j);
}

std::string CompletionChunk(const std::string& id, int64_t created, const std::string& model,
                            int index, const std::string& text, const json& logprobs,
                            FinishReason finish_reason, bool with_usage_null) {
  json j = Envelope(id, "text_completion", created, model);
  j["choices"] = json::array({{{"index", index},
                               {"text", text},
                               {"logprobs", logprobs},
                               {"finish_reason", FinishReasonJson(finish_reason)}}});
  if (with_usage_null) j["usage"] = nullptr;
  return SseData(j);
}

std::string UsageChunk(ApiKind kind, const std::string& id, int64_t created,
                       const std::string& model, const Usage& usage) {
  json j = Envelope(id, kind == ApiKind::kChat ? "chat.completion.chunk" : "text_completion",
                    created, model);
  j["choices"] = json::array();
  j["usage"] = UsageJson(usage);
  return SseData(j);
}

std::string ErrorChunk(const ApiError& error) { return SseData(error.ToJson()); }

}  // namespace strata::server

#undef STRATA_RETURN_IF_API_ERROR
