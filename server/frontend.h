#pragma once
// The protocol-neutral front end shared by HTTP (OpenAI) and gRPC: checks a
// GenerationParams against the served model (name, prompt, context, value
// ranges), turns it into token ids (chat template for chats), and runs its n
// choices on the engine.
//
// Thread-safety: all methods may be called from any thread (the tokenizer
// and model are read-only; EngineClient's methods are thread-safe).

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "model/model_loader.h"
#include "scheduler/engine_client.h"
#include "server/api_types.h"

namespace strata::server {

// Sees every engine event of every request (metrics). Called on the engine
// thread before the event goes to the protocol; must not block.
class RequestObserver {
 public:
  virtual ~RequestObserver() = default;
  virtual void OnEvent(const scheduler::RequestOutput& event) = 0;
  // Front-end time of one request: received (first byte read) until its
  // choices were submitted to the engine (read, parse, validate, tokenize).
  virtual void OnFrontendTime(double seconds) {}
};

// The API error for a final event that failed (kError or kAbort): 429
// slo_unattainable for a request no instance could serve within its SLO
// (scheduler::kSloUnattainable), 500 for other errors, 503 for an abort.
ApiError FinalEventError(const scheduler::RequestOutput& ev);

struct FrontendOptions {
  std::string served_model_name;  // the only accepted `model` value
  int max_n = 16;                 // largest n accepted
  RequestObserver* observer = nullptr;  // not owned; may be null
};

struct PreparedRequest {
  GenerationParams params;
  std::vector<int32_t> prompt;  // token ids the model is fed
  std::string prompt_text;      // text form (for echo): rendered chat, given text, or decoded ids
  int max_tokens = 0;           // resolved: given, or the rest of the context
};

// The engine requests of one API request (one per choice).
class Call {
 public:
  Call(scheduler::EngineClient* engine, std::vector<RequestId> ids) : engine_(engine), ids_(std::move(ids)) {}
  // Cancels every choice still running (their sinks get "abort").
  void Cancel() {
    for (RequestId id : ids_) engine_->Cancel(id);
  }
  // Holds (or releases) every choice: see EngineClient::SetHeld.
  void SetHeld(bool held) {
    for (RequestId id : ids_) engine_->SetHeld(id, held);
  }
  const std::vector<RequestId>& ids() const { return ids_; }

 private:
  scheduler::EngineClient* engine_;
  std::vector<RequestId> ids_;
};

class Frontend {
 public:
  // `model` and `engine` must outlive the front end.
  Frontend(const LoadedModel& model, scheduler::EngineClient& engine, FrontendOptions options);

  const std::string& model_name() const { return options_.served_model_name; }
  int context_length() const;
  const LoadedModel& model() const { return model_; }
  // Reports a request's front-end time to the observer (if any).
  void ObserveFrontendTime(double seconds) const {
    if (options_.observer != nullptr) options_.observer->OnFrontendTime(seconds);
  }
  scheduler::EngineClient& engine() const { return engine_; }

  // An empty model name means the served model. 404 for another model
  // name; 400 for a prompt of no tokens (an empty string still gets BOS
  // when the tokenizer adds one, as in vLLM), token ids outside the vocabulary, a
  // prompt that fills the context or prompt + max_tokens beyond it (the
  // message says both numbers), n outside [1, max_n], more than 4 stop
  // strings, and sampling values out of range (the message names the field,
  // `param` is set).
  std::optional<ApiError> Prepare(GenerationParams params, PreparedRequest* out) const;

  // Runs choice i with seed + i (when a seed is given). `on_event` gets
  // (choice index, event) on the engine thread; events that arrive while
  // Start is still submitting are held and delivered, in order, on the
  // caller's thread just before Start returns. Calls never overlap. The
  // observer sees every event first (also those of a failed Start).
  // Errors: 429 when the engine's waiting queue is full, 503 while draining,
  // 400 for what the engine refuses (e.g. more KV blocks than the pool has);
  // then the choices already submitted are cancelled, nothing is left
  // queued, *call is untouched and on_event is never called.
  using EventFn = std::function<void(int choice, scheduler::RequestOutput&& event)>;
  std::optional<ApiError> Start(const PreparedRequest& request, EventFn on_event, std::shared_ptr<Call>* call);

  // POST /tokenize: a prompt, or messages with the chat template applied
  // (404 for another model name).
  // add_special_tokens (default true for prompts) adds BOS as TokenizePrompt does.
  std::optional<ApiError> Tokenize(const GenerationParams& params, std::vector<int32_t>* tokens) const;
  // POST /detokenize: 400 for ids outside the vocabulary.
  std::optional<ApiError> Detokenize(std::span<const int32_t> tokens, std::string* text) const;

 private:
  const LoadedModel& model_;
  scheduler::EngineClient& engine_;
  FrontendOptions options_;
};

}  // namespace strata::server
