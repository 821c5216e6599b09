#include "server/openai_routes.h"

#include <chrono>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "common/logging.h"
#include "server/openai_protocol.h"
#include "server/usage.h"

namespace strata::server {

namespace {

using json = nlohmann::json;

constexpr const char* kJson = "application/json";

int64_t NowUnixSeconds() {
  return std::chrono::duration_cast<std::chrono::seconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

void SendJson(ResponseWriter& w, int status, const json& body) {
  w.Send(status, kJson, Dump(body));
}

ApiError MethodNotAllowed(const std::string& method, const std::string& path) {
  ApiError e;
  e.http_status = 405;
  e.type = "invalid_request_error";
  e.code = "method_not_allowed";
  e.message = "Method " + method + " is not allowed for " + path;
  return e;
}

// x-strata-prefill-instance and x-strata-decode-instance (a comma-separated
// list after a failover), when a router served the request.
HeaderList InstanceHeaders(const std::string& prefill, const std::vector<std::string>& decode) {
  HeaderList h;
  if (!prefill.empty()) h.emplace_back("x-strata-prefill-instance", prefill);
  std::string d;
  for (const std::string& name : decode) d += (d.empty() ? "" : ",") + name;
  if (!d.empty()) h.emplace_back("x-strata-decode-instance", d);
  return h;
}

// One generation request (all its choices) from submission to the last byte.
// Events arrive on the engine thread (never two at once: the Frontend
// serializes them); OnClose on an I/O thread.
class Generation : public std::enable_shared_from_this<Generation> {
 public:
  Generation(const Frontend& fe, std::shared_ptr<ResponseWriter> w, PreparedRequest req,
             std::string id, int64_t created)
      : fe_(fe),
        w_(std::move(w)),
        req_(std::move(req)),
        id_(std::move(id)),
        created_(created),
        usage_(req_.params.n) {
    choices_.resize(static_cast<size_t>(req_.params.n));
    unfinished_ = req_.params.n;
    const bool chat = req_.params.kind == ApiKind::kChat;
    if (!chat && req_.params.echo) {
      for (Choice& c : choices_) c.text_offset = static_cast<int64_t>(req_.prompt_text.size());
    }
  }

  // After Frontend::Start succeeded.
  void SetCall(std::shared_ptr<Call> call) {
    bool cancel;
    {
      std::lock_guard<std::mutex> lock(call_mu_);
      call_ = std::move(call);
      cancel = cancel_requested_;
    }
    if (cancel) call_->Cancel();
  }

  // Client gone, or the response ended early: cancel every choice (now, or
  // as soon as the call is known). Never called with mu_ held by this thread
  // while the engine could block on it.
  void Cancel() {
    std::shared_ptr<Call> c;
    {
      std::lock_guard<std::mutex> lock(call_mu_);
      cancel_requested_ = true;
      c = call_;
    }
    if (c) c->Cancel();
  }

  void OnEvent(int index, scheduler::RequestOutput&& ev) {
    bool cancel = false;
    {
      std::lock_guard<std::mutex> lock(mu_);
      cancel = HandleEvent(index, std::move(ev));
    }
    if (cancel) return Cancel();
    if (req_.params.stream) HoldWhileBuffered();
  }

 private:
  struct Choice {
    std::string text;
    std::vector<int32_t> ids;
    std::vector<SampleResult> samples;
    FinishReason finish_reason = FinishReason::kNone;
    bool finished = false;
    bool sent_first = false;  // streaming: role (chat) / echo (completions) chunk written
    int64_t text_offset = 0;  // completions logprobs: bytes returned so far
  };

  // Backpressure for a client that reads slower than we generate: once the
  // connection holds more than its buffer limit, every choice is held in the
  // engine (keeping its place and blocks, generating nothing) until the
  // socket drains to half the limit. A client that reads nothing at all is
  // closed by the write timeout, which cancels the request like a hang-up.
  // Holds and releases are issued under call_mu_, so the engine sees them
  // in the order held_ changed (Engine::SetHeld takes only its own lock).
  void HoldWhileBuffered() {
    {
      std::lock_guard<std::mutex> lock(call_mu_);
      if (held_ || cancel_requested_ || call_ == nullptr || !w_->over_buffer_limit()) return;
      held_ = true;
      call_->SetHeld(true);
    }
    // Outside call_mu_: OnDrained may run the callback at once.
    w_->OnDrained([self = shared_from_this()] {
      std::lock_guard<std::mutex> lock(self->call_mu_);
      self->held_ = false;
      if (self->call_) self->call_->SetHeld(false);
    });
  }

  bool chat() const { return req_.params.kind == ApiKind::kChat; }
  bool want_logprobs() const {
    return req_.params.sampling.logprobs || req_.params.sampling.top_logprobs > 0;
  }

  // Returns true when the remaining choices must be cancelled. mu_ held.
  bool HandleEvent(int index, scheduler::RequestOutput&& ev) {
    if (index < 0 || index >= static_cast<int>(choices_.size())) return false;
    Choice& c = choices_[static_cast<size_t>(index)];
    if (c.finished) return false;
    usage_.Add(index, ev);
    if (!ev.prefill_instance.empty() || !ev.decode_instances.empty()) {
      // Behind a router: the streamed headers name the instances of the
      // first event; a whole response names every one (the usage too).
      const Usage u = usage_.Make({});
      instance_headers_ = InstanceHeaders(u.prefill_instance, u.decode_instances);
    }
    if (done_) {
      if (ev.finished) c.finished = true;
      return false;
    }
    if (ev.finished && (ev.finish_reason == FinishReason::kError || ev.finish_reason == FinishReason::kAbort)) {
      c.finished = true;
      Fail(ev);
      return true;
    }
    return req_.params.stream ? StreamEvent(index, c, std::move(ev))
                              : CollectEvent(c, std::move(ev));
  }

  // A choice ended with kError or kAbort: the whole response fails.
  void Fail(const scheduler::RequestOutput& ev) {
    done_ = true;
    finish_reason_ = ev.finish_reason;
    LogFields();
    if (w_->closed()) return;  // the client left (that is what cancelled it)
    const ApiError e = FinalEventError(ev);
    if (!stream_started_) {
      SendApiError(*w_, e);
      return;
    }
    w_->Write(ErrorChunk(e));
    w_->Write(std::string(kSseDone));
    w_->End();
  }

  bool CollectEvent(Choice& c, scheduler::RequestOutput&& ev) {
    c.text += ev.text;
    c.ids.insert(c.ids.end(), ev.token_ids.begin(), ev.token_ids.end());
    if (want_logprobs()) {
      for (auto& s : ev.logprobs) c.samples.push_back(std::move(s));
    }
    if (!ev.finished) return false;
    c.finished = true;
    c.finish_reason = ev.finish_reason;
    if (--unfinished_ > 0) return false;

    std::vector<ChoiceOutput> out;
    out.reserve(choices_.size());
    for (size_t i = 0; i < choices_.size(); ++i) {
      Choice& ch = choices_[i];
      ChoiceOutput o;
      o.index = static_cast<int>(i);
      o.finish_reason = ch.finish_reason;
      const bool echo = !chat() && req_.params.echo;
      o.text = echo ? req_.prompt_text + ch.text : std::move(ch.text);
      if (want_logprobs()) {
        auto entries = RenderLogprobs(*fe_.model().tokenizer, ch.ids, ch.samples);
        o.logprobs =
            chat() ? ChatLogprobsJson(entries) : CompletionLogprobsJson(entries, ch.text_offset);
      }
      out.push_back(std::move(o));
    }
    done_ = true;
    finish_reason_ = choices_[0].finish_reason;
    LogFields();
    const std::string& model = req_.params.model;
    w_->Send(200, kJson,
             chat() ? ChatCompletionBody(id_, created_, model, out, MakeUsage())
                    : CompletionBody(id_, created_, model, out, MakeUsage()),
             instance_headers_);
    return false;
  }

  bool StreamEvent(int index, Choice& c, scheduler::RequestOutput&& ev) {
    const bool usage_null = req_.params.include_usage;
    const std::string& model = req_.params.model;
    bool ok = true;
    auto write = [&](std::string data) {
      if (ok) ok = w_->Write(std::move(data));
    };
    if (!stream_started_) {
      HeaderList headers{{"cache-control", "no-cache"}};
      headers.insert(headers.end(), instance_headers_.begin(), instance_headers_.end());
      w_->StartStream(200, "text/event-stream", std::move(headers));
      stream_started_ = true;
    }
    if (!c.sent_first) {
      c.sent_first = true;
      if (chat()) {
        write(ChatChunk(id_, created_, model, index, std::string("assistant"), std::string(),
                        nullptr, FinishReason::kNone, usage_null));
      } else if (req_.params.echo) {
        write(CompletionChunk(id_, created_, model, index, req_.prompt_text, nullptr, FinishReason::kNone,
                              usage_null));
      }
    }
    const bool lp = want_logprobs() && !ev.token_ids.empty();
    if (!ev.text.empty() || lp) {
      json logprobs = nullptr;
      if (lp) {
        auto entries = RenderLogprobs(*fe_.model().tokenizer, ev.token_ids, ev.logprobs);
        if (chat()) {
          logprobs = ChatLogprobsJson(entries);
        } else {
          logprobs = CompletionLogprobsJson(entries, c.text_offset);
          for (const LogprobEntry& e : entries)
            c.text_offset += static_cast<int64_t>(e.token.size());
        }
      }
      write(chat()
                ? ChatChunk(id_, created_, model, index, std::nullopt, ev.text, logprobs, FinishReason::kNone,
                            usage_null)
                : CompletionChunk(id_, created_, model, index, ev.text, logprobs, FinishReason::kNone, usage_null));
    }
    if (ev.finished) {
      c.finished = true;
      c.finish_reason = ev.finish_reason;
      write(chat() ? ChatChunk(id_, created_, model, index, std::nullopt, std::nullopt, nullptr,
                               ev.finish_reason, usage_null)
                   : CompletionChunk(id_, created_, model, index, "", nullptr, ev.finish_reason,
                                     usage_null));
      if (--unfinished_ == 0) {
        done_ = true;
        finish_reason_ = choices_[0].finish_reason;
        LogFields();
        if (req_.params.include_usage)
          write(UsageChunk(req_.params.kind, id_, created_, model, MakeUsage()));
        write(std::string(kSseDone));
        w_->End();
        return false;
      }
    }
    if (!ok) {
      // The client is gone: stop generating for it.
      done_ = true;
      finish_reason_ = FinishReason::kAbort;
      LogFields();
      return true;
    }
    return false;
  }

  Usage MakeUsage() const { return usage_.Make(fe_.engine().tier_kinds()); }

  void LogFields() {
    w_->AddLogField("prompt_tokens", std::to_string(usage_.prompt_tokens()));
    w_->AddLogField("cached_tokens", std::to_string(usage_.cached_tokens()));
    w_->AddLogField("completion_tokens", std::to_string(usage_.completion_tokens()));
    if (usage_.ttft_ms() >= 0) {
      char buf[32];
      std::snprintf(buf, sizeof(buf), "%.1f", usage_.ttft_ms());
      w_->AddLogField("ttft_ms", buf);
    }
    w_->AddLogField("finish_reason", std::string(FinishReasonName(finish_reason_)));
  }

  const Frontend& fe_;
  const std::shared_ptr<ResponseWriter> w_;
  const PreparedRequest req_;
  const std::string id_;
  const int64_t created_;

  std::mutex mu_;  // the fields below
  std::vector<Choice> choices_;
  int unfinished_ = 0;
  bool stream_started_ = false;
  HeaderList instance_headers_;  // x-strata-{prefill,decode}-instance behind a router
  bool done_ = false;  // the response is complete (or failed, or the client left)
  UsageTally usage_;  // after req_ (its size)
  FinishReason finish_reason_ = FinishReason::kNone;

  // Separate from mu_ so that OnClose never waits for an event in progress.
  std::mutex call_mu_;
  std::shared_ptr<Call> call_;
  bool cancel_requested_ = false;
  bool held_ = false;  // every choice held in the engine until the connection drains
};

}  // namespace

void SendApiError(ResponseWriter& w, const ApiError& error) {
  HeaderList headers;
  if (error.http_status == 429 || error.http_status == 503)
    headers.emplace_back("retry-after", "1");
  w.AddLogField("error", error.type);
  w.Send(error.http_status, kJson, error.ToBody(), std::move(headers));
}

OpenAiRoutes::OpenAiRoutes(Frontend& frontend) : frontend_(frontend), created_(NowUnixSeconds()) {}

bool OpenAiRoutes::Handle(HttpRequest& req, const std::shared_ptr<ResponseWriter>& w) {
  const std::string& path = req.path;
  auto only = [&](const char* method) {
    if (req.method == method) return true;
    ApiError e = MethodNotAllowed(req.method, path);
    w->AddLogField("error", e.type);
    w->Send(405, kJson, e.ToBody(), {{"allow", method}});
    return false;
  };
  if (path == "/v1/chat/completions") {
    if (only("POST")) Generate(req, w, ApiKind::kChat);
  } else if (path == "/v1/completions") {
    if (only("POST")) Generate(req, w, ApiKind::kCompletion);
  } else if (path == "/v1/models" || path.starts_with("/v1/models/")) {
    if (only("GET")) Models(req, w);
  } else if (path == "/tokenize") {
    if (only("POST")) Tokenize(req, w);
  } else if (path == "/detokenize") {
    if (only("POST")) Detokenize(req, w);
  } else {
    return false;
  }
  return true;
}

void OpenAiRoutes::Generate(HttpRequest& req, const std::shared_ptr<ResponseWriter>& w,
                            ApiKind kind) {
  GenerationParams params;
  std::optional<ApiError> err = kind == ApiKind::kChat ? ParseChatRequest(req.body, &params)
                                                       : ParseCompletionRequest(req.body, &params);
  if (err) return SendApiError(*w, *err);
  PreparedRequest prepared;
  if ((err = frontend_.Prepare(std::move(params), &prepared))) return SendApiError(*w, *err);

  std::string id = (kind == ApiKind::kChat ? "chatcmpl-" : "cmpl-") + req.request_id;
  auto gen = std::make_shared<Generation>(frontend_, w, prepared, std::move(id), NowUnixSeconds());
  std::weak_ptr<Generation> weak = gen;
  w->OnClose([weak] {
    if (auto g = weak.lock()) g->Cancel();
  });
  std::shared_ptr<Call> call;
  err = frontend_.Start(
      prepared,
      [gen](int choice, scheduler::RequestOutput&& ev) { gen->OnEvent(choice, std::move(ev)); },
      &call);
  if (err) return SendApiError(*w, *err);
  gen->SetCall(std::move(call));
  if (req.received_nanos > 0) {
    const int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                            std::chrono::steady_clock::now().time_since_epoch())
                            .count();
    const double seconds = static_cast<double>(now - req.received_nanos) * 1e-9;
    frontend_.ObserveFrontendTime(seconds);
    char buf[32];
    std::snprintf(buf, sizeof(buf), "%.2f", seconds * 1e3);
    w->AddLogField("frontend_ms", buf);
  }
}

void OpenAiRoutes::Models(const HttpRequest& req, const std::shared_ptr<ResponseWriter>& w) {
  const std::string& name = frontend_.model_name();
  json card = {{"id", name},
               {"object", "model"},
               {"created", created_},
               {"owned_by", "strata"},
               {"max_model_len", frontend_.context_length()}};
  if (req.path == "/v1/models")
    return SendJson(*w, 200, json{{"object", "list"}, {"data", json::array({card})}});
  std::string id = req.path.substr(std::string_view("/v1/models/").size());
  if (id != name)
    return SendApiError(*w, ApiError::NotFound("The model `" + id + "` does not exist.", "model"));
  SendJson(*w, 200, card);
}

void OpenAiRoutes::Tokenize(const HttpRequest& req, const std::shared_ptr<ResponseWriter>& w) {
  GenerationParams params;
  if (auto err = ParseTokenizeRequest(req.body, &params)) return SendApiError(*w, *err);
  std::vector<int32_t> tokens;
  if (auto err = frontend_.Tokenize(params, &tokens)) return SendApiError(*w, *err);
  const size_t count = tokens.size();
  SendJson(*w, 200,
           json{{"tokens", std::move(tokens)},
                {"count", count},
                {"max_model_len", frontend_.context_length()}});
}

void OpenAiRoutes::Detokenize(const HttpRequest& req, const std::shared_ptr<ResponseWriter>& w) {
  std::string model;
  std::vector<int32_t> tokens;
  if (auto err = ParseDetokenizeRequest(req.body, &model, &tokens)) return SendApiError(*w, *err);
  if (!model.empty() && model != frontend_.model_name())
    return SendApiError(*w,
                        ApiError::NotFound("The model `" + model + "` does not exist.", "model"));
  std::string text;
  if (auto err = frontend_.Detokenize(tokens, &text)) return SendApiError(*w, *err);
  SendJson(*w, 200, json{{"prompt", text}});
}

}  // namespace strata::server
