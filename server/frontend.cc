#include "server/frontend.h"

#include <algorithm>
#include <cstdint>
#include <limits>
#include <mutex>
#include <utility>

#include "common/logging.h"
#include "model/chat_template.h"
#include "model/generate.h"
#include "model/sampler.h"

namespace strata::server {

namespace {

// The field a sampler validation message is about: ValidateSamplingParams
// starts every message with the field name ("top_p must be ...",
// "logit_bias token id must be ...").
std::string SamplingParam(const std::string& message) {
  for (const char* f : {"temperature", "top_p", "top_k", "min_p", "presence_penalty",
                        "frequency_penalty", "repetition_penalty", "logit_bias", "top_logprobs"}) {
    if (message.starts_with(f)) return f;
  }
  return {};
}

// Token ids the model accepts: inside both the tokenizer's vocabulary and the
// embedding (they differ when the embedding is padded).
int32_t VocabLimit(const LoadedModel& m) {
  return std::min<int32_t>(m.tokenizer->vocab_size(), m.weights.config.vocab_size);
}

std::optional<ApiError> CheckIds(std::span<const int32_t> ids, int32_t vocab,
                                 const std::string& param) {
  for (int32_t id : ids) {
    if (id < 0 || id >= vocab)
      return ApiError::BadRequest("token id " + std::to_string(id) + " in '" + param +
                                      "' is outside the vocabulary [0, " + std::to_string(vocab) +
                                      ")",
                                  param);
  }
  return std::nullopt;
}

std::optional<ApiError> CheckModel(const std::string& given, const std::string& served) {
  // An absent model means the served one (as vLLM does with one model).
  if (!given.empty() && given != served)
    return ApiError::NotFound("The model `" + given + "` does not exist.", "model");
  return std::nullopt;
}

ApiError FromStatus(const Status& s, const std::string& param = {}) {
  switch (s.code()) {
    case StatusCode::kInvalidArgument:
    case StatusCode::kOutOfRange:
    case StatusCode::kUnsupported:
      return ApiError::BadRequest(s.message(), param);
    case StatusCode::kResourceExhausted:
      return ApiError::Overloaded(s.message());
    case StatusCode::kUnavailable:
      return ApiError::Unavailable(s.message());
    default:
      return ApiError::Internal(s.message());
  }
}

}  // namespace

Frontend::Frontend(const LoadedModel& model, scheduler::EngineClient& engine, FrontendOptions options)
    : model_(model), engine_(engine), options_(std::move(options)) {}

int Frontend::context_length() const { return model_.weights.config.context_length; }

std::optional<ApiError> Frontend::Prepare(GenerationParams params, PreparedRequest* out) const {
  if (auto e = CheckModel(params.model, options_.served_model_name)) return e;
  params.model = options_.served_model_name;
  if (params.n < 1 || params.n > options_.max_n)
    return ApiError::BadRequest("'n' must be in [1, " + std::to_string(options_.max_n) + "], got " +
                                    std::to_string(params.n),
                                "n");
  if (params.stop.size() > 4)
    return ApiError::BadRequest(
        "'stop' may have at most 4 strings, got " + std::to_string(params.stop.size()), "stop");
  if (Status s = ValidateSamplingParams(params.sampling, model_.weights.config.vocab_size); !s.ok())
    return ApiError::BadRequest(s.message(), SamplingParam(s.message()));
  // The HTTP parser checks it too; gRPC requests arrive here unchecked.
  if (!(params.cache_ttl_seconds >= 0) || params.cache_ttl_seconds > 604800)
    return ApiError::BadRequest("cache_ttl_seconds must be between 0 and 604800 (7 days), got " +
                                    std::to_string(params.cache_ttl_seconds),
                                "cache_ttl_seconds");
  const int32_t vocab = VocabLimit(model_);
  if (auto e = CheckIds(params.stop_token_ids, vocab, "stop_token_ids")) return e;

  const Tokenizer& tok = *model_.tokenizer;
  std::vector<int32_t> prompt;
  std::string prompt_text;
  std::string prompt_param;
  if (params.kind == ApiKind::kChat) {
    prompt_param = "messages";
    if (params.messages.empty())
      return ApiError::BadRequest("'messages' must not be empty", "messages");
    auto ids = TokenizeChat(model_, params.messages);
    if (!ids.ok()) return ApiError::BadRequest(ids.error().message(), "messages");
    prompt = std::move(ids).value();
    // The rendered text, for the gRPC/echo paths (TokenizeChat renders the
    // same way internally).
    ChatRenderOptions opt;
    if (tok.bos_id() >= 0) opt.bos_token = std::string(tok.Piece(tok.bos_id()));
    if (tok.eos_id() >= 0) opt.eos_token = std::string(tok.Piece(tok.eos_id()));
    if (auto text = RenderChat(model_.chat_family, params.messages, opt); text.ok())
      prompt_text = std::move(*text);
  } else if (params.prompt_is_ids) {
    prompt_param = "prompt";
    if (auto e = CheckIds(params.prompt_ids, vocab, "prompt")) return e;
    prompt = params.prompt_ids;
    prompt_text = tok.Decode(prompt, /*skip_special=*/false);
  } else {
    prompt_param = "prompt";
    prompt = params.add_special_tokens.value_or(true)
                 ? TokenizePrompt(model_, params.prompt_text)
                 : tok.Encode(params.prompt_text, /*add_special=*/false, /*parse_special=*/true);
    prompt_text = params.prompt_text;
  }
  if (prompt.empty()) return ApiError::BadRequest("the prompt is empty (no tokens)", prompt_param);

  const int ctx = context_length();
  const int64_t n_prompt = static_cast<int64_t>(prompt.size());
  // A max_tokens beyond the context is reported here so that the sum cannot
  // overflow int inside ResolveMaxTokens; the message matches its wording.
  if (params.max_tokens && n_prompt<ctx&& * params.max_tokens> ctx) {
    return ApiError::BadRequest(
        "the prompt has " + std::to_string(n_prompt) + " tokens and max_tokens is " +
            std::to_string(*params.max_tokens) + ": together " +
            std::to_string(n_prompt + *params.max_tokens) + " exceed the model's context of " +
            std::to_string(ctx) + " tokens",
        "max_tokens");
  }
  auto resolved = ResolveMaxTokens(
      static_cast<int>(std::min<int64_t>(n_prompt, std::numeric_limits<int>::max())),
      params.max_tokens.value_or(-1), ctx);
  if (!resolved.ok()) {
    // A prompt that fills the context is the prompt's fault; otherwise max_tokens'.
    const bool prompt_fault = n_prompt >= ctx || !params.max_tokens;
    return ApiError::BadRequest(resolved.error().message(),
                                prompt_fault ? prompt_param : "max_tokens");
  }

  out->params = std::move(params);
  out->prompt = std::move(prompt);
  out->prompt_text = std::move(prompt_text);
  out->max_tokens = *resolved;
  return std::nullopt;
}

namespace {

// Shared by the sinks of one Start() call. Events that arrive before Start
// has submitted every choice are held, so that a Start that fails has never
// called on_event; the mutex also keeps on_event calls from overlapping.
struct StartGate {
  std::mutex mu;
  enum class State { kStarting, kLive, kFailed } state = State::kStarting;
  std::vector<std::pair<int, scheduler::RequestOutput>> held;
  Frontend::EventFn on_event;
  RequestObserver* observer = nullptr;
};

}  // namespace

std::optional<ApiError> Frontend::Start(const PreparedRequest& request, EventFn on_event,
                                        std::shared_ptr<Call>* call) {
  const GenerationParams& p = request.params;
  auto gate = std::make_shared<StartGate>();
  gate->on_event = std::move(on_event);
  gate->observer = options_.observer;

  std::vector<RequestId> ids;
  ids.reserve(static_cast<size_t>(p.n));
  std::optional<ApiError> error;
  for (int i = 0; i < p.n; ++i) {
    scheduler::EngineRequest er;
    er.prompt = request.prompt;
    er.max_tokens = request.max_tokens;
    er.sampling = p.sampling;
    if (p.sampling.seed) er.sampling.seed = *p.sampling.seed + static_cast<uint64_t>(i);
    er.stop = p.stop;
    er.stop_token_ids = p.stop_token_ids;
    er.ignore_eos = p.ignore_eos;
    er.cache_salt = p.cache_salt;
    er.cache_ttl_seconds = p.cache_ttl_seconds;
    er.priority = p.priority;
    auto sink = [gate, i](scheduler::RequestOutput&& ev) {
      if (gate->observer != nullptr) gate->observer->OnEvent(ev);
      std::lock_guard<std::mutex> lock(gate->mu);
      switch (gate->state) {
        case StartGate::State::kStarting:
          gate->held.emplace_back(i, std::move(ev));
          break;
        case StartGate::State::kLive:
          gate->on_event(i, std::move(ev));
          break;
        case StartGate::State::kFailed:
          break;  // the caller got an error; the cancelled choices' events go nowhere
      }
    };
    auto id = engine_.Submit(std::move(er), std::move(sink));
    if (!id.ok()) {
      error = FromStatus(id.error());
      break;
    }
    ids.push_back(*id);
  }

  if (error) {
    {
      std::lock_guard<std::mutex> lock(gate->mu);
      gate->state = StartGate::State::kFailed;
      gate->held.clear();
    }
    for (RequestId id : ids) engine_.Cancel(id);
    if (!ids.empty())
      STRATA_LOG_DEBUG("frontend: choice {} of {} refused ({}); cancelled the {} submitted",
                       ids.size(), p.n, error->message, ids.size());
    return error;
  }

  *call = std::make_shared<Call>(&engine_, std::move(ids));
  std::lock_guard<std::mutex> lock(gate->mu);
  for (auto& [i, ev] : gate->held) gate->on_event(i, std::move(ev));
  gate->held.clear();
  gate->state = StartGate::State::kLive;
  return std::nullopt;
}

std::optional<ApiError> Frontend::Tokenize(const GenerationParams& params,
                                           std::vector<int32_t>* tokens) const {
  if (auto e = CheckModel(params.model, options_.served_model_name)) return e;
  if (params.kind == ApiKind::kChat) {
    if (params.messages.empty())
      return ApiError::BadRequest("'messages' must not be empty", "messages");
    auto ids = TokenizeChat(model_, params.messages);
    if (!ids.ok()) return ApiError::BadRequest(ids.error().message(), "messages");
    *tokens = std::move(ids).value();
    return std::nullopt;
  }
  if (params.prompt_is_ids) {
    if (auto e = CheckIds(params.prompt_ids, VocabLimit(model_), "prompt")) return e;
    *tokens = params.prompt_ids;
    return std::nullopt;
  }
  *tokens = params.add_special_tokens.value_or(true)
                ? TokenizePrompt(model_, params.prompt_text)
                : model_.tokenizer->Encode(params.prompt_text, /*add_special=*/false,
                                           /*parse_special=*/true);
  return std::nullopt;
}

std::optional<ApiError> Frontend::Detokenize(std::span<const int32_t> tokens,
                                             std::string* text) const {
  if (auto e = CheckIds(tokens, model_.tokenizer->vocab_size(), "tokens")) return e;
  *text = model_.tokenizer->Decode(tokens, /*skip_special=*/false);
  return std::nullopt;
}

ApiError FinalEventError(const scheduler::RequestOutput& ev) {
  if (ev.finish_reason == FinishReason::kError) {
    if (ev.status.code() == StatusCode::kResourceExhausted && ev.status.message().starts_with(scheduler::kSloUnattainable))
      return ApiError::SloUnattainable(ev.status.message());
    return ApiError::Internal("generation failed: " + ev.status.message());
  }
  return ApiError::Unavailable("the request was aborted: " +
                               (ev.status.ok() ? std::string("cancelled") : ev.status.message()));
}

}  // namespace strata::server
