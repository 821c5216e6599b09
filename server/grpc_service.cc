#include "server/grpc_service.h"

#include <fmt/format.h>
#include <grpcpp/ext/proto_server_reflection_plugin.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <functional>
#include <memory>
#include <thread>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/logging.h"
#include "model/tokenizer/unicode.h"
#include "proto/strata.grpc.pb.h"
#include "proto/strata.pb.h"
#include "server/request_lanes.h"
#include "server/usage.h"

namespace strata::server {

namespace pb = ::strata::v1;

namespace {

// Length leaks; content does not.
bool SecretEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

// HTTP's Authorization check on gRPC metadata; nullopt when allowed.
std::optional<ApiError> CheckBearer(const grpc::ServerContextBase* ctx, const std::string& secret,
                                    bool admin) {
  if (secret.empty()) return std::nullopt;
  const auto& md = ctx->client_metadata();
  auto it = md.find("authorization");
  if (it == md.end())
    return ApiError::Unauthorized(
        admin ? "admin endpoints need 'Authorization: Bearer <admin token>'"
              : "missing API key: send the header 'Authorization: Bearer KEY'");
  constexpr std::string_view kBearer = "Bearer ";
  const std::string_view auth(it->second.data(), it->second.size());
  if (auth.size() <= kBearer.size() || auth.substr(0, kBearer.size()) != kBearer ||
      !SecretEquals(auth.substr(kBearer.size()), secret))
    return ApiError::Unauthorized(admin ? "wrong admin token" : "invalid API key");
  return std::nullopt;
}

// proto3 strings must be valid UTF-8 (clients refuse to parse them otherwise).
std::string ValidUtf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  tokenizer_internal::AppendUtf8Lossy(s, /*final=*/true, &out);
  return out;
}

void FromSampling(const pb::SamplingOptions& s, GenerationParams* p) {
  if (s.has_max_tokens()) p->max_tokens = s.max_tokens();
  SamplingParams& sp = p->sampling;
  if (s.has_temperature()) sp.temperature = s.temperature();
  if (s.has_top_p()) sp.top_p = s.top_p();
  if (s.has_top_k()) sp.top_k = s.top_k();
  sp.min_p = s.min_p();
  if (s.has_seed()) sp.seed = s.seed();
  sp.presence_penalty = s.presence_penalty();
  sp.frequency_penalty = s.frequency_penalty();
  if (s.has_repetition_penalty()) sp.repetition_penalty = s.repetition_penalty();
  // A proto map has no order; sort so that the request means one thing.
  sp.logit_bias.assign(s.logit_bias().begin(), s.logit_bias().end());
  std::sort(sp.logit_bias.begin(), sp.logit_bias.end());
  sp.logprobs = s.logprobs();
  sp.top_logprobs = s.top_logprobs();
  p->stop.assign(s.stop().begin(), s.stop().end());
  p->stop_token_ids.assign(s.stop_token_ids().begin(), s.stop_token_ids().end());
  p->ignore_eos = s.ignore_eos();
  if (s.has_n()) p->n = s.n();
}

std::vector<ChatMessage> FromMessages(
    const google::protobuf::RepeatedPtrField<pb::ChatMessage>& in) {
  std::vector<ChatMessage> out;
  out.reserve(in.size());
  for (const auto& m : in) out.push_back({m.role(), m.content()});
  return out;
}

// The fields GenerateRequest and ChatRequest share (same names in both).
template <typename Request>
void FromCommon(const Request& r, GenerationParams* p) {
  FromSampling(r.sampling(), p);
  p->cache_salt = r.cache_salt();
  p->cache_ttl_seconds = r.cache_ttl_seconds();
  p->priority = r.priority();
  if (r.has_add_special_tokens()) p->add_special_tokens = r.add_special_tokens();
  p->user = r.user();
  p->stream = true;
  p->include_usage = true;
}

GenerationParams FromRequest(const pb::GenerateRequest& r) {
  GenerationParams p;
  p.kind = ApiKind::kCompletion;
  p.model = r.model();
  if (r.prompt_case() == pb::GenerateRequest::kTokenIds) {
    p.prompt_is_ids = true;
    p.prompt_ids.assign(r.token_ids().ids().begin(), r.token_ids().ids().end());
  } else {
    p.prompt_text = r.text();
  }
  FromCommon(r, &p);
  return p;
}

GenerationParams FromRequest(const pb::ChatRequest& r) {
  GenerationParams p;
  p.kind = ApiKind::kChat;
  p.model = r.model();
  p.messages = FromMessages(r.messages());
  FromCommon(r, &p);
  return p;
}

// The message's fields are the kinds of kvcache/tier_kind.h, one each.
void AddTier(pb::CachedTokensByTier* t, kvcache::TierKind kind, int32_t tokens) {
  switch (kind) {
    case kvcache::TierKind::kDevice:
      t->set_device(t->device() + tokens);
      return;
    case kvcache::TierKind::kHost:
      t->set_host(t->host() + tokens);
      return;
    case kvcache::TierKind::kDisk:
      t->set_disk(t->disk() + tokens);
      return;
    case kvcache::TierKind::kRemote:
      t->set_remote(t->remote() + tokens);
      return;
  }
}

// One access log line per call, as HTTP writes one per request, and the
// request id: the client's "x-request-id" metadata, else a generated one,
// echoed back as initial metadata.
class CallLog {
 public:
  CallLog(grpc::ServerContextBase* ctx, const char* method, std::atomic<uint64_t>* next_id)
      : ctx_(ctx), method_(method), start_(std::chrono::steady_clock::now()) {
    const auto& md = ctx->client_metadata();
    auto it = md.find("x-request-id");
    id_ = it != md.end() && it->second.size() > 0 && it->second.size() <= 256
              ? std::string(it->second.data(), it->second.size())
              : "grpc-" + std::to_string(next_id->fetch_add(1));
    ctx->AddInitialMetadata("x-request-id", id_);
  }
  void Add(std::string_view key, const std::string& value) {
    fields_ += ' ';
    fields_ += key;
    fields_ += '=';
    fields_ += value;
  }
  grpc::Status Done(grpc::Status status, bool quiet = false) {
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start_)
            .count();
    const int code = static_cast<int>(status.error_code());
    if (quiet && status.ok())
      STRATA_LOG_DEBUG("access id={} grpc {} status={} ms={:.1f}{}", id_, method_, code, ms,
                       fields_);
    else
      STRATA_LOG_INFO("access id={} remote={} grpc {} status={} ms={:.1f}{}", id_, ctx_->peer(),
                      method_, code, ms, fields_);
    return status;
  }

 private:
  grpc::ServerContextBase* ctx_;
  const char* method_;
  std::chrono::steady_clock::time_point start_;
  std::string id_;
  std::string fields_;
};

// Translates an ApiError into a status with the trailing metadata of the
// header's contract.
grpc::Status ToGrpc(const ApiError& e, grpc::ServerContextBase* ctx, int retry_after_seconds) {
  ctx->AddTrailingMetadata("strata-error-type", e.type);
  if (!e.param.empty()) ctx->AddTrailingMetadata("strata-error-param", e.param);
  if (!e.code.empty()) ctx->AddTrailingMetadata("strata-error-code", e.code);
  if (e.http_status == 429 || e.http_status == 503)
    ctx->AddTrailingMetadata("retry-after", std::to_string(retry_after_seconds));
  return grpc::Status(static_cast<grpc::StatusCode>(e.grpc_code()), e.message);
}

ApiError LaneFull(const RequestLanes& lanes, Lane lane) {
  const LaneOptions& lo = lane == Lane::kSmall ? lanes.options().small : lanes.options().large;
  return ApiError::Unavailable("the server is busy: the " + std::string(LaneName(lane)) + "-request lane has " +
                               std::to_string(lo.max_queue) + " requests waiting; retry later");
}

// What the calls share: the front end, the lanes, the options.
struct ServiceDeps {
  Frontend* frontend = nullptr;
  RequestLanes* lanes = nullptr;
  const GrpcServerOptions* options = nullptr;
  std::atomic<int>* active = nullptr;        // Generate/Chat calls not yet done
  std::atomic<uint64_t>* next_id = nullptr;  // request ids
  // Registers a new stream's state with the write-timeout sweeper.
  std::function<void(std::weak_ptr<void>)> track;
};

// One Generate or Chat call on gRPC's callback API: it has no thread. Its
// request is prepared (chat template, tokenizer) on a request lane; engine
// events arrive on the engine thread, become messages and are queued; one
// message is in flight at a time (StartWrite → OnWriteDone → the next). When
// more than kHoldMessages are queued, the call's choices are held in the
// engine until the client has taken half of them. A client that cancels,
// whose deadline passes or whose stream breaks has its engine requests
// cancelled at once.
//
// Lifetime: gRPC owns the reactor until OnDone, which deletes it. The engine
// callback and the lane hold `st_`, which outlives it; nothing touches the
// reactor or its context once Finish was called (st_->finished).
class StreamReactor final : public grpc::ServerWriteReactor<pb::GenerateResponse> {
 public:
  // Shared by the reactor, the engine's event callback, the lane and the
  // write-timeout sweeper.
  struct State {
    State(grpc::CallbackServerContext* c, const char* method, const ServiceDeps& d)
        : ctx(c), deps(d), log(c, method, d.next_id) {}
    std::mutex mu;  // guards everything below
    StreamReactor* reactor;             // null after OnDone
    grpc::CallbackServerContext* ctx;   // null after OnDone
    const ServiceDeps deps;
    CallLog log;
    std::shared_ptr<Call> call;
    std::deque<pb::GenerateResponse> queue;
    pb::GenerateResponse out;           // the message in flight
    std::optional<grpc::Status> final;  // how the call ends, once the queue is written
    bool writing = false;               // a StartWrite awaits its OnWriteDone
    bool finished = false;              // Finish was called
    bool held = false;                  // the choices are held in the engine
    bool sweeping = false;              // the write-timeout sweeper is cancelling it: no Finish yet
    std::chrono::steady_clock::time_point write_started;  // of the write in flight
    int n = 0, unfinished = 0;
    std::unique_ptr<UsageTally> usage;
    bool sent_instances = false;  // the x-strata-*-instance initial metadata was added
  };
  StreamReactor(grpc::CallbackServerContext* ctx, const char* method, ServiceDeps deps)
      : deps_(deps), st_(std::make_shared<State>(ctx, method, deps)) {
    st_->reactor = this;
    deps_.active->fetch_add(1);
    if (deps_.track) deps_.track(st_);
  }

  // The sweeper: a stream whose write has made no progress for `timeout`
  // (the client stopped reading) is cancelled like a client cancel. True
  // when it cancelled this one.
  static bool SweepWriteTimeout(const std::shared_ptr<State>& st, std::chrono::steady_clock::time_point now,
                                std::chrono::steady_clock::duration timeout) {
    grpc::CallbackServerContext* ctx = nullptr;
    {
      std::lock_guard<std::mutex> lock(st->mu);
      if (!st->writing || st->finished || st->sweeping || (st->final && !st->final->ok()) || st->ctx == nullptr ||
          now - st->write_started < timeout)
        return false;
      // Also when every choice had finished: what is queued will never be read.
      st->final.reset();
      SetFinal(*st, grpc::Status(grpc::StatusCode::CANCELLED,
                                 "the client read nothing for the write timeout; the call was cancelled"));
      st->sweeping = true;  // Pump will not Finish (so ctx stays valid) until this is cleared
      ctx = st->ctx;
    }
    CancelCall(st);
    ctx->TryCancel();
    {
      std::lock_guard<std::mutex> lock(st->mu);
      st->sweeping = false;
    }
    Pump(st);
    return true;
  }

  // Checks and prepares `params` on a lane, then starts the choices.
  void Begin(GenerationParams params, size_t request_bytes) {
    if (auto err = CheckBearer(st_->ctx, deps_.options->api_key, false)) return Fail(st_, *err);
    const Lane lane = deps_.lanes->Classify(request_bytes);
    auto work = [st = st_, p = std::make_shared<GenerationParams>(std::move(params))] { Prepare(st, std::move(*p)); };
    if (!deps_.lanes->Post(lane, std::move(work))) Fail(st_, LaneFull(*deps_.lanes, lane));
  }

  // Ends the call with `e` before anything started.
  void Refuse(const ApiError& e) { Fail(st_, e); }

  void OnWriteDone(bool ok) override {
    {
      std::lock_guard<std::mutex> lock(st_->mu);
      st_->writing = false;
      if (!ok) EndBroken(*st_, "the stream to the client broke");
    }
    if (!ok) CancelCall(st_);
    Pump(st_);
  }

  void OnCancel() override {
    {
      std::lock_guard<std::mutex> lock(st_->mu);
      EndBroken(*st_, "the client cancelled the call");
    }
    CancelCall(st_);
    Pump(st_);
  }

  void OnDone() override {
    {
      std::lock_guard<std::mutex> lock(st_->mu);
      st_->reactor = nullptr;
      st_->ctx = nullptr;
    }
    deps_.active->fetch_sub(1);
    delete this;
  }

 private:
  static constexpr size_t kHoldMessages = 256;



  // mu held. The first ending wins; queued messages are dropped unless it
  // is OK (then they are written first).
  static void SetFinal(State& st, grpc::Status status) {
    if (st.final) return;
    if (!status.ok()) st.queue.clear();
    st.final = std::move(status);
  }

  // mu held. The client is gone: nothing queued will be read, even after an
  // OK ending.
  static void EndBroken(State& st, const char* why) {
    if (st.final && st.final->ok()) st.final.reset();
    SetFinal(st, grpc::Status(grpc::StatusCode::CANCELLED, why));
  }

  static void Fail(const std::shared_ptr<State>& st, const ApiError& e) {
    {
      std::lock_guard<std::mutex> lock(st->mu);
      if (st->final || st->ctx == nullptr) return;
      SetFinal(*st, ToGrpc(e, st->ctx, st->deps.options->retry_after_seconds));
    }
    Pump(st);
  }

  static void CancelCall(const std::shared_ptr<State>& st) {
    std::shared_ptr<Call> c;
    {
      std::lock_guard<std::mutex> lock(st->mu);
      c = st->call;
    }
    if (c) c->Cancel();
  }

  // On a lane worker; an exception becomes INTERNAL.
  static void Prepare(const std::shared_ptr<State>& st, GenerationParams params) {
    try {
      PrepareAndStart(st, std::move(params));
    } catch (const std::exception& e) {
      STRATA_LOG_ERROR("grpc: preparing a request failed: {}", e.what());
      CancelCall(st);
      Fail(st, ApiError::Internal(std::string("preparing the request failed: ") + e.what()));
    }
  }

  static void PrepareAndStart(const std::shared_ptr<State>& st, GenerationParams params) {
    {
      std::lock_guard<std::mutex> lock(st->mu);
      if (st->final || (st->ctx != nullptr && st->ctx->IsCancelled())) return;  // gone while it waited
    }
    Frontend& fe = *st->deps.frontend;
    PreparedRequest prepared;
    if (auto err = fe.Prepare(std::move(params), &prepared)) return Fail(st, *err);
    {
      std::lock_guard<std::mutex> lock(st->mu);
      st->n = prepared.params.n;
      st->unfinished = st->n;
      st->usage = std::make_unique<UsageTally>(st->n);
    }
    std::weak_ptr<State> weak = st;
    auto on_event = [weak](int choice, scheduler::RequestOutput&& event) {
      if (std::shared_ptr<State> s = weak.lock()) OnEvent(s, choice, std::move(event));
    };
    std::shared_ptr<Call> call;
    if (auto err = fe.Start(prepared, on_event, &call)) return Fail(st, *err);
    bool cancel;
    {
      std::lock_guard<std::mutex> lock(st->mu);
      st->call = call;
      cancel = st->final.has_value() && !st->final->ok();
      if (!cancel && st->held) call->SetHeld(true);  // events delivered inside Start filled the queue
    }
    if (cancel) call->Cancel();
  }

  // On the engine thread: the event as messages, queued.
  static void OnEvent(const std::shared_ptr<State>& st, int choice, scheduler::RequestOutput&& ev) {
    bool fail = false;
    {
      std::lock_guard<std::mutex> lock(st->mu);
      if (st->final || choice < 0 || choice >= st->n) return;
      st->usage->Add(choice, ev);
      if (!st->sent_instances && st->ctx != nullptr && !ev.prefill_instance.empty()) {
        // Before the first write sends the initial metadata.
        st->sent_instances = true;
        st->ctx->AddInitialMetadata("x-strata-prefill-instance", ev.prefill_instance);
        std::string d;
        for (const std::string& name : ev.decode_instances) d += (d.empty() ? "" : ",") + name;
        if (!d.empty()) st->ctx->AddInitialMetadata("x-strata-decode-instance", d);
      }
      if (!ev.token_ids.empty() || !ev.text.empty()) st->queue.push_back(DeltaMessage(choice, ev));
      if (ev.finished) {
        --st->unfinished;
        if (ev.finish_reason == FinishReason::kError) {
          const ApiError e = FinalEventError(ev);
          if (e.http_status >= 500) STRATA_LOG_ERROR("grpc: generation failed: {}", ev.status.ToString());
          SetFinal(*st, grpc::Status(static_cast<grpc::StatusCode>(e.grpc_code()), e.message));
          fail = true;
        } else {
          pb::GenerateResponse& msg = st->queue.emplace_back();
          msg.mutable_finished()->set_index(choice);
          msg.mutable_finished()->set_finish_reason(std::string(FinishReasonName(ev.finish_reason)));
          if (st->unfinished == 0) {
            st->queue.push_back(UsageMessage(*st));
            SetFinal(*st, grpc::Status::OK);
          }
        }
      }
      if (!st->held && !st->final && st->queue.size() > kHoldMessages) SetHeldLocked(*st, true);
    }
    if (fail) CancelCall(st);
    Pump(st);
  }

  // mu held: the engine sees holds and releases in the order `held`
  // changed (Engine::SetHeld takes only the engine's own lock).
  static void SetHeldLocked(State& st, bool held) {
    st.held = held;
    if (st.call) st.call->SetHeld(held);
  }

  // Any thread: starts the next write, or finishes once everything is
  // written. Calls into gRPC only without the lock, and only while the
  // reactor is alive (writing or not yet finished).
  static void Pump(const std::shared_ptr<State>& st) {
    StreamReactor* r = nullptr;
    bool finish = false;
    grpc::Status status;
    {
      std::lock_guard<std::mutex> lock(st->mu);
      if (st->writing || st->finished || st->sweeping || st->reactor == nullptr) return;
      if (!st->queue.empty()) {
        st->out = std::move(st->queue.front());
        st->queue.pop_front();
        st->writing = true;
        st->write_started = std::chrono::steady_clock::now();
        if (st->held && st->queue.size() <= kHoldMessages / 2) SetHeldLocked(*st, false);
      } else if (st->final) {
        st->finished = true;
        finish = true;
        status = *st->final;
        if (st->usage) {
          st->log.Add("prompt_tokens", std::to_string(st->usage->prompt_tokens()));
          st->log.Add("cached_tokens", std::to_string(st->usage->cached_tokens()));
          st->log.Add("completion_tokens", std::to_string(st->usage->completion_tokens()));
          if (st->usage->ttft_ms() >= 0) st->log.Add("ttft_ms", fmt::format("{:.1f}", st->usage->ttft_ms()));
        }
        st->log.Done(status);
      } else {
        return;
      }
      r = st->reactor;
    }
    if (finish) {
      r->Finish(status);
    } else {
      r->StartWrite(&st->out);
    }
  }

  static pb::GenerateResponse DeltaMessage(int choice, const scheduler::RequestOutput& ev) {
    pb::GenerateResponse msg;
    pb::Delta* d = msg.mutable_delta();
    d->set_index(choice);
    d->mutable_token_ids()->Assign(ev.token_ids.begin(), ev.token_ids.end());
    d->set_text(ValidUtf8(ev.text));
    for (const SampleResult& sr : ev.logprobs) {
      pb::TokenLogprob* lp = d->add_logprobs();
      lp->set_token(sr.token);
      lp->set_logprob(sr.logprob);
      for (const TokenLogprob& t : sr.top) {
        pb::TopLogprob* tp = lp->add_top();
        tp->set_token(t.id);
        tp->set_logprob(t.logprob);
      }
    }
    return msg;
  }

  // mu held.
  static pb::GenerateResponse UsageMessage(const State& st) {
    pb::GenerateResponse msg;
    pb::Usage* usage = msg.mutable_usage();
    const Usage u = st.usage->Make(st.deps.frontend->engine().tier_kinds());
    usage->set_prompt_tokens(static_cast<int32_t>(u.prompt_tokens));
    usage->set_completion_tokens(static_cast<int32_t>(u.completion_tokens));
    usage->set_total_tokens(static_cast<int32_t>(u.prompt_tokens + u.completion_tokens));
    usage->set_cached_tokens(static_cast<int32_t>(u.cached_tokens));
    pb::CachedTokensByTier* by_tier = usage->mutable_cached_tokens_by_tier();  // also when all 0
    for (size_t k = 0; k < kvcache::kNumTierKinds; ++k)
      AddTier(by_tier, static_cast<kvcache::TierKind>(k), static_cast<int32_t>(u.cached_by_kind[k]));
    if (!u.prefill_instance.empty() || !u.decode_instances.empty()) {
      pb::Instances* in = usage->mutable_instances();
      in->set_prefill(u.prefill_instance);
      for (const std::string& d : u.decode_instances) in->add_decode(d);
    }
    return msg;
  }

  const ServiceDeps deps_;
  std::shared_ptr<State> st_;
};

}  // namespace

class GrpcService final : public pb::Strata::CallbackService {
 public:
  GrpcService(Frontend& frontend, RequestLanes& lanes, const GrpcServerOptions& options)
      : frontend_(frontend), lanes_(lanes), options_(options) {
    if (options_.write_timeout_seconds > 0) sweeper_ = std::thread([this] { Sweep(); });
  }
  ~GrpcService() override {
    {
      std::lock_guard<std::mutex> lock(sweep_mu_);
      stop_sweep_ = true;
    }
    sweep_cv_.notify_all();
    if (sweeper_.joinable()) sweeper_.join();
  }

  grpc::ServerWriteReactor<pb::GenerateResponse>* Generate(grpc::CallbackServerContext* ctx,
                                                           const pb::GenerateRequest* req) override {
    auto* r = new StreamReactor(ctx, "Generate", Deps());
    if (auto err = CheckBearer(ctx, options_.api_key, false)) {
      r->Refuse(*err);
    } else if (req->prompt_case() == pb::GenerateRequest::PROMPT_NOT_SET) {
      r->Refuse(ApiError::BadRequest("'prompt' is required: set 'text' or 'token_ids'", "prompt"));
    } else {
      r->Begin(FromRequest(*req), req->ByteSizeLong());
    }
    return r;
  }

  grpc::ServerWriteReactor<pb::GenerateResponse>* Chat(grpc::CallbackServerContext* ctx,
                                                       const pb::ChatRequest* req) override {
    auto* r = new StreamReactor(ctx, "Chat", Deps());
    r->Begin(FromRequest(*req), req->ByteSizeLong());
    return r;
  }

  grpc::ServerUnaryReactor* Tokenize(grpc::CallbackServerContext* ctx, const pb::TokenizeRequest* req,
                                     pb::TokenizeResponse* resp) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    auto log = std::make_shared<CallLog>(ctx, "Tokenize", &next_id_);
    const Lane lane = lanes_.Classify(req->ByteSizeLong());
    // The call stays alive until Finish, so the lane may use ctx, req, resp.
    if (!lanes_.Post(lane, [this, ctx, req, resp, reactor, log] {
          grpc::Status st;
          try {
            st = TokenizeImpl(ctx, req, resp);
          } catch (const std::exception& e) {
            STRATA_LOG_ERROR("grpc: Tokenize failed: {}", e.what());
            st = grpc::Status(grpc::StatusCode::INTERNAL, std::string("tokenize failed: ") + e.what());
          }
          reactor->Finish(log->Done(std::move(st)));
        }))
      reactor->Finish(log->Done(ToGrpc(LaneFull(lanes_, lane), ctx, options_.retry_after_seconds)));
    return reactor;
  }

  grpc::ServerUnaryReactor* Health(grpc::CallbackServerContext* ctx, const pb::HealthRequest*,
                                   pb::HealthResponse* resp) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    CallLog log(ctx, "Health", &next_id_);
    const bool serving = !shutting_down_.load() && !frontend_.engine().Stats().draining;
    resp->set_status(serving ? pb::HealthResponse::SERVING : pb::HealthResponse::NOT_SERVING);
    resp->set_model(frontend_.model_name());
    reactor->Finish(log.Done(grpc::Status::OK, /*quiet=*/true));
    return reactor;
  }

  grpc::ServerUnaryReactor* CacheStats(grpc::CallbackServerContext* ctx, const pb::CacheStatsRequest*,
                                       pb::CacheStatsResponse* resp) override {
    grpc::ServerUnaryReactor* reactor = ctx->DefaultReactor();
    CallLog log(ctx, "CacheStats", &next_id_);
    if (auto err = CheckBearer(ctx, options_.admin_token, true)) {
      reactor->Finish(log.Done(ToGrpc(*err, ctx, options_.retry_after_seconds)));
      return reactor;
    }
    FillCacheStats(resp);
    reactor->Finish(log.Done(grpc::Status::OK, /*quiet=*/true));
    return reactor;
  }

  void BeginShutdown() { shutting_down_.store(true); }
  int active_streams() const { return active_streams_.load(); }

 private:
  ServiceDeps Deps() {
    ServiceDeps d{&frontend_, &lanes_, &options_, &active_streams_, &next_id_, nullptr};
    if (options_.write_timeout_seconds > 0)
      d.track = [this](std::weak_ptr<void> st) {
        std::lock_guard<std::mutex> lock(sweep_mu_);
        streams_.push_back(std::move(st));
      };
    return d;
  }

  // The write-timeout sweeper (its own thread, one per server): every
  // quarter of the timeout (at most 250 ms), cancels the streams whose
  // write has made no progress for the timeout.
  void Sweep() {
    using Clock = std::chrono::steady_clock;
    const auto timeout =
        std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(options_.write_timeout_seconds));
    const auto period = std::min<Clock::duration>(timeout / 4, std::chrono::milliseconds(250));
    std::unique_lock<std::mutex> lock(sweep_mu_);
    while (!sweep_cv_.wait_for(lock, period, [this] { return stop_sweep_; })) {
      std::vector<std::shared_ptr<StreamReactor::State>> live;
      std::erase_if(streams_, [&](const std::weak_ptr<void>& w) {
        std::shared_ptr<void> p = w.lock();
        if (!p) return true;
        live.push_back(std::static_pointer_cast<StreamReactor::State>(p));
        return false;
      });
      lock.unlock();
      const auto now = Clock::now();
      for (const auto& st : live)
        if (StreamReactor::SweepWriteTimeout(st, now, timeout)) {
          STRATA_LOG_INFO("grpc: a stream's client read nothing for {} s: cancelled", options_.write_timeout_seconds);
          if (options_.on_write_timeout) options_.on_write_timeout();
        }
      live.clear();
      lock.lock();
    }
  }

  grpc::Status TokenizeImpl(grpc::ServerContextBase* ctx, const pb::TokenizeRequest* req,
                            pb::TokenizeResponse* resp) {
    if (auto err = CheckBearer(ctx, options_.api_key, false)) return ToGrpc(*err, ctx, options_.retry_after_seconds);
    GenerationParams p;
    p.model = req->model().empty() ? frontend_.model_name() : req->model();
    switch (req->input_case()) {
      case pb::TokenizeRequest::kText:
        p.kind = ApiKind::kCompletion;
        p.prompt_text = req->text();
        break;
      case pb::TokenizeRequest::kMessages:
        p.kind = ApiKind::kChat;
        p.messages = FromMessages(req->messages().messages());
        break;
      default:
        return ToGrpc(ApiError::BadRequest("one of 'text' or 'messages' is required", "text"), ctx,
                      options_.retry_after_seconds);
    }
    if (req->has_add_special_tokens()) p.add_special_tokens = req->add_special_tokens();
    std::vector<int32_t> tokens;
    if (auto err = frontend_.Tokenize(p, &tokens)) return ToGrpc(*err, ctx, options_.retry_after_seconds);
    resp->mutable_tokens()->Assign(tokens.begin(), tokens.end());
    resp->set_count(static_cast<int32_t>(tokens.size()));
    resp->set_max_model_len(frontend_.context_length());
    return grpc::Status::OK;
  }

  void FillCacheStats(pb::CacheStatsResponse* resp) const {
    const scheduler::EngineStats s = frontend_.engine().Stats();
    for (const auto& t : s.tiers) {
      pb::TierStats* o = resp->add_tiers();
      o->set_name(t.name);
      o->set_kind(std::string(kvcache::TierKindName(t.kind)));
      o->set_capacity_bytes(t.capacity_bytes);
      o->set_used_bytes(t.used_bytes);
      o->set_usage_ratio(t.usage_ratio);
      if (t.kind == kvcache::TierKind::kDevice) {
        o->set_hit_tokens(s.kv.device.tokens);
      } else {
        for (const auto& lt : s.kv.tiers)
          if (lt.name == t.name) o->set_hit_tokens(lt.hits.tokens);
      }
    }
    resp->set_prefix_query_tokens(s.kv.query_tokens);
    resp->set_prefix_hit_tokens(s.kv.device.tokens + s.kv.lower.tokens);
    resp->set_num_running(s.num_running);
    resp->set_num_waiting(s.num_waiting);
    resp->set_device_blocks_in_use(s.device_blocks_in_use);
    resp->set_preemptions(s.preemptions);
  }

  Frontend& frontend_;
  RequestLanes& lanes_;
  const GrpcServerOptions options_;
  std::atomic<uint64_t> next_id_{1};
  std::atomic<bool> shutting_down_{false};
  std::atomic<int> active_streams_{0};
  std::mutex sweep_mu_;
  std::condition_variable sweep_cv_;
  bool stop_sweep_ = false;
  std::vector<std::weak_ptr<void>> streams_;  // every Generate/Chat state, pruned as they end
  std::thread sweeper_;
};

Result<std::unique_ptr<GrpcServer>> GrpcServer::Create(const GrpcServerOptions& options,
                                                       Frontend& frontend, RequestLanes& lanes) {
  if (options.port < 0 || options.port > 65535)
    return Status::InvalidArgument("gRPC port must be in [0, 65535], got " +
                                   std::to_string(options.port));
  // Both are process-wide switches read by ServerBuilder; setting them again is harmless.
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::EnableDefaultHealthCheckService(true);

  std::unique_ptr<GrpcServer> s(new GrpcServer());
  s->service_ = std::make_unique<GrpcService>(frontend, lanes, options);
  const bool ipv6 = options.host.find(':') != std::string::npos && options.host.front() != '[';
  const std::string address =
      (ipv6 ? "[" + options.host + "]" : options.host) + ":" + std::to_string(options.port);
  grpc::ServerBuilder builder;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &s->port_);
  builder.SetMaxReceiveMessageSize(options.max_message_bytes);
  builder.RegisterService(s->service_.get());
  s->server_ = builder.BuildAndStart();
  if (!s->server_ || s->port_ == 0)
    return Status::Unavailable("cannot serve gRPC on " + address +
                               " (address in use or not local?)");
  if (auto* health = s->server_->GetHealthCheckService()) health->SetServingStatus(true);
  STRATA_LOG_INFO("gRPC (strata.v1.Strata, reflection on) listening on {}:{}", options.host,
                  s->port_);
  return s;
}

GrpcServer::~GrpcServer() { Shutdown(0); }

int GrpcServer::active_streams() const { return service_ ? service_->active_streams() : 0; }

void GrpcServer::Shutdown(double deadline_seconds) {
  if (shut_down_ || !server_) return;
  shut_down_ = true;
  service_->BeginShutdown();
  if (auto* health = server_->GetHealthCheckService()) health->SetServingStatus(false);
  const auto deadline = std::chrono::system_clock::now() +
                        std::chrono::duration_cast<std::chrono::system_clock::duration>(
                            std::chrono::duration<double>(std::max(0.0, deadline_seconds)));
  // Cancels the calls still running at the deadline; their handlers see
  // IsCancelled() and cancel their engine requests.
  server_->Shutdown(deadline);
  server_->Wait();
}

}  // namespace strata::server
