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
#include "server/usage.h"

namespace strata::server {

namespace pb = ::strata::v1;

namespace {

// How often a streaming handler that has nothing to write checks whether its
// client is still there (cancellation or deadline).
constexpr auto kCancelPoll = std::chrono::milliseconds(50);

// Length leaks; content does not.
bool SecretEquals(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

// HTTP's Authorization check on gRPC metadata; nullopt when allowed.
std::optional<ApiError> CheckBearer(const grpc::ServerContext* ctx, const std::string& secret,
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

// Events of one call's choices, handed from the engine thread to the call's
// handler thread. Shared with the event callback, which may outlive the
// handler (a cancelled call's final "abort" events arrive later).
struct EventQueue {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<std::pair<int, scheduler::RequestOutput>> events;
};

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
  CallLog(grpc::ServerContext* ctx, const char* method, std::atomic<uint64_t>* next_id)
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
  grpc::ServerContext* ctx_;
  const char* method_;
  std::chrono::steady_clock::time_point start_;
  std::string id_;
  std::string fields_;
};

}  // namespace

class GrpcService final : public pb::Strata::Service {
 public:
  GrpcService(Frontend& frontend, const GrpcServerOptions& options)
      : frontend_(frontend), options_(options) {}

  grpc::Status Generate(grpc::ServerContext* ctx, const pb::GenerateRequest* req,
                        grpc::ServerWriter<pb::GenerateResponse>* writer) override {
    CallLog log(ctx, "Generate", &next_id_);
    if (auto err = CheckBearer(ctx, options_.api_key, false)) return log.Done(ToGrpc(*err, ctx));
    if (req->prompt_case() == pb::GenerateRequest::PROMPT_NOT_SET)
      return log.Done(ToGrpc(
          ApiError::BadRequest("'prompt' is required: set 'text' or 'token_ids'", "prompt"), ctx));
    return log.Done(Stream(ctx, FromRequest(*req), writer, &log));
  }

  grpc::Status Chat(grpc::ServerContext* ctx, const pb::ChatRequest* req,
                    grpc::ServerWriter<pb::GenerateResponse>* writer) override {
    CallLog log(ctx, "Chat", &next_id_);
    if (auto err = CheckBearer(ctx, options_.api_key, false)) return log.Done(ToGrpc(*err, ctx));
    return log.Done(Stream(ctx, FromRequest(*req), writer, &log));
  }

  grpc::Status Tokenize(grpc::ServerContext* ctx, const pb::TokenizeRequest* req,
                        pb::TokenizeResponse* resp) override {
    CallLog log(ctx, "Tokenize", &next_id_);
    return log.Done(TokenizeImpl(ctx, req, resp));
  }

  grpc::Status Health(grpc::ServerContext* ctx, const pb::HealthRequest*,
                      pb::HealthResponse* resp) override {
    CallLog log(ctx, "Health", &next_id_);
    const bool serving = !shutting_down_.load() && !frontend_.engine().Stats().draining;
    resp->set_status(serving ? pb::HealthResponse::SERVING : pb::HealthResponse::NOT_SERVING);
    resp->set_model(frontend_.model_name());
    return log.Done(grpc::Status::OK, /*quiet=*/true);
  }

  grpc::Status CacheStats(grpc::ServerContext* ctx, const pb::CacheStatsRequest*,
                          pb::CacheStatsResponse* resp) override {
    CallLog log(ctx, "CacheStats", &next_id_);
    if (auto err = CheckBearer(ctx, options_.admin_token, true)) return log.Done(ToGrpc(*err, ctx));
    FillCacheStats(resp);
    return log.Done(grpc::Status::OK, /*quiet=*/true);
  }

  void BeginShutdown() { shutting_down_.store(true); }
  int active_streams() const { return active_streams_.load(); }

 private:
  grpc::Status TokenizeImpl(grpc::ServerContext* ctx, const pb::TokenizeRequest* req,
                            pb::TokenizeResponse* resp) {
    if (auto err = CheckBearer(ctx, options_.api_key, false)) return ToGrpc(*err, ctx);
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
        return ToGrpc(ApiError::BadRequest("one of 'text' or 'messages' is required", "text"), ctx);
    }
    if (req->has_add_special_tokens()) p.add_special_tokens = req->add_special_tokens();
    std::vector<int32_t> tokens;
    if (auto err = frontend_.Tokenize(p, &tokens)) return ToGrpc(*err, ctx);
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

  // Generate and Chat: validate, start the choices, then forward their
  // events until every choice finished (then Usage) or the client is gone.
  grpc::Status Stream(grpc::ServerContext* ctx, GenerationParams params,
                      grpc::ServerWriter<pb::GenerateResponse>* writer, CallLog* log) {
    active_streams_.fetch_add(1);
    struct Leave {
      std::atomic<int>& n;
      ~Leave() { n.fetch_sub(1); }
    } leave{active_streams_};
    PreparedRequest prepared;
    if (auto err = frontend_.Prepare(std::move(params), &prepared)) return ToGrpc(*err, ctx);
    auto queue = std::make_shared<EventQueue>();
    std::shared_ptr<Call> call;
    auto on_event = [queue](int choice, scheduler::RequestOutput&& event) {
      {
        std::lock_guard<std::mutex> lock(queue->mu);
        queue->events.emplace_back(choice, std::move(event));
      }
      queue->cv.notify_one();
    };
    if (auto err = frontend_.Start(prepared, on_event, &call)) return ToGrpc(*err, ctx);

    // Usage as HTTP counts it (server/usage.h). Logged however the call ends.
    const int n = prepared.params.n;
    struct Totals {
      CallLog* log;
      UsageTally usage;
      ~Totals() {
        log->Add("prompt_tokens", std::to_string(usage.prompt_tokens()));
        log->Add("cached_tokens", std::to_string(usage.cached_tokens()));
        log->Add("completion_tokens", std::to_string(usage.completion_tokens()));
        if (usage.ttft_ms() >= 0) log->Add("ttft_ms", fmt::format("{:.1f}", usage.ttft_ms()));
      }
    } totals{log, UsageTally(n)};

    const auto broken = [&call] {
      call->Cancel();
      return grpc::Status(grpc::StatusCode::CANCELLED, "the stream to the client broke");
    };
    int unfinished = n;
    std::vector<std::pair<int, scheduler::RequestOutput>> batch;
    pb::GenerateResponse msg;
    while (unfinished > 0) {
      {
        std::unique_lock<std::mutex> lock(queue->mu);
        while (queue->events.empty() && !ctx->IsCancelled()) queue->cv.wait_for(lock, kCancelPoll);
        batch.assign(std::make_move_iterator(queue->events.begin()),
                     std::make_move_iterator(queue->events.end()));
        queue->events.clear();
      }
      if (ctx->IsCancelled()) {
        call->Cancel();
        return grpc::Status(grpc::StatusCode::CANCELLED, "the client cancelled the call");
      }
      for (auto& [choice, ev] : batch) {
        if (choice < 0 || choice >= n) continue;
        totals.usage.Add(choice, ev);
        if (!ev.token_ids.empty() || !ev.text.empty()) {
          msg.Clear();
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
          if (!writer->Write(msg)) return broken();
        }
        if (!ev.finished) continue;
        --unfinished;
        if (ev.finish_reason == FinishReason::kError) {
          call->Cancel();
          STRATA_LOG_ERROR("grpc: generation failed: {}", ev.status.ToString());
          return grpc::Status(grpc::StatusCode::INTERNAL,
                              "generation failed: " + ev.status.message());
        }
        msg.Clear();
        msg.mutable_finished()->set_index(choice);
        msg.mutable_finished()->set_finish_reason(std::string(FinishReasonName(ev.finish_reason)));
        if (!writer->Write(msg)) return broken();
      }
      batch.clear();
    }
    msg.Clear();
    pb::Usage* usage = msg.mutable_usage();
    const Usage u = totals.usage.Make(frontend_.engine().tier_kinds());
    usage->set_prompt_tokens(static_cast<int32_t>(u.prompt_tokens));
    usage->set_completion_tokens(static_cast<int32_t>(u.completion_tokens));
    usage->set_total_tokens(static_cast<int32_t>(u.prompt_tokens + u.completion_tokens));
    usage->set_cached_tokens(static_cast<int32_t>(u.cached_tokens));
    pb::CachedTokensByTier* by_tier = usage->mutable_cached_tokens_by_tier();  // also when all 0
    for (size_t k = 0; k < kvcache::kNumTierKinds; ++k)
      AddTier(by_tier, static_cast<kvcache::TierKind>(k), static_cast<int32_t>(u.cached_by_kind[k]));
    if (!writer->Write(msg)) return broken();
    return grpc::Status::OK;
  }

  grpc::Status ToGrpc(const ApiError& e, grpc::ServerContext* ctx) const {
    ctx->AddTrailingMetadata("strata-error-type", e.type);
    if (!e.param.empty()) ctx->AddTrailingMetadata("strata-error-param", e.param);
    if (!e.code.empty()) ctx->AddTrailingMetadata("strata-error-code", e.code);
    if (e.http_status == 429 || e.http_status == 503)
      ctx->AddTrailingMetadata("retry-after", std::to_string(options_.retry_after_seconds));
    return grpc::Status(static_cast<grpc::StatusCode>(e.grpc_code()), e.message);
  }

  Frontend& frontend_;
  const GrpcServerOptions options_;
  std::atomic<uint64_t> next_id_{1};
  std::atomic<bool> shutting_down_{false};
  std::atomic<int> active_streams_{0};
};

Result<std::unique_ptr<GrpcServer>> GrpcServer::Create(const GrpcServerOptions& options,
                                                       Frontend& frontend) {
  if (options.port < 0 || options.port > 65535)
    return Status::InvalidArgument("gRPC port must be in [0, 65535], got " +
                                   std::to_string(options.port));
  // Both are process-wide switches read by ServerBuilder; setting them again is harmless.
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  grpc::EnableDefaultHealthCheckService(true);

  std::unique_ptr<GrpcServer> s(new GrpcServer());
  s->service_ = std::make_unique<GrpcService>(frontend, options);
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
