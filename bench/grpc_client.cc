#include "bench/grpc_client.h"

#include <grpcpp/grpcpp.h>

#include <charconv>
#include <cstdlib>

#include "proto/strata.grpc.pb.h"
#include "proto/strata.pb.h"

namespace strata::bench {

namespace pb = ::strata::v1;

namespace {

using SteadyClock = std::chrono::steady_clock;

double Since(SteadyClock::time_point t0) { return std::chrono::duration<double>(SteadyClock::now() - t0).count(); }

std::chrono::system_clock::time_point DeadlineIn(double seconds) {
  return std::chrono::system_clock::now() +
         std::chrono::duration_cast<std::chrono::system_clock::duration>(std::chrono::duration<double>(seconds));
}

const char* CodeName(grpc::StatusCode c) {
  switch (c) {
    case grpc::StatusCode::OK: return "OK";
    case grpc::StatusCode::CANCELLED: return "CANCELLED";
    case grpc::StatusCode::UNKNOWN: return "UNKNOWN";
    case grpc::StatusCode::INVALID_ARGUMENT: return "INVALID_ARGUMENT";
    case grpc::StatusCode::DEADLINE_EXCEEDED: return "DEADLINE_EXCEEDED";
    case grpc::StatusCode::NOT_FOUND: return "NOT_FOUND";
    case grpc::StatusCode::ALREADY_EXISTS: return "ALREADY_EXISTS";
    case grpc::StatusCode::PERMISSION_DENIED: return "PERMISSION_DENIED";
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return "RESOURCE_EXHAUSTED";
    case grpc::StatusCode::FAILED_PRECONDITION: return "FAILED_PRECONDITION";
    case grpc::StatusCode::ABORTED: return "ABORTED";
    case grpc::StatusCode::OUT_OF_RANGE: return "OUT_OF_RANGE";
    case grpc::StatusCode::UNIMPLEMENTED: return "UNIMPLEMENTED";
    case grpc::StatusCode::INTERNAL: return "INTERNAL";
    case grpc::StatusCode::UNAVAILABLE: return "UNAVAILABLE";
    case grpc::StatusCode::DATA_LOSS: return "DATA_LOSS";
    case grpc::StatusCode::UNAUTHENTICATED: return "UNAUTHENTICATED";
    default: return "UNKNOWN";
  }
}

// The HTTP status the server's HTTP front end gives for the same condition
// (the usual gRPC ↔ HTTP mapping).
int HttpEquivalent(grpc::StatusCode c) {
  switch (c) {
    case grpc::StatusCode::OK: return 200;
    case grpc::StatusCode::INVALID_ARGUMENT:
    case grpc::StatusCode::OUT_OF_RANGE:
    case grpc::StatusCode::FAILED_PRECONDITION: return 400;
    case grpc::StatusCode::UNAUTHENTICATED: return 401;
    case grpc::StatusCode::PERMISSION_DENIED: return 403;
    case grpc::StatusCode::NOT_FOUND: return 404;
    case grpc::StatusCode::ALREADY_EXISTS:
    case grpc::StatusCode::ABORTED: return 409;
    case grpc::StatusCode::CANCELLED: return 499;
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return 429;
    case grpc::StatusCode::UNIMPLEMENTED: return 501;
    case grpc::StatusCode::UNAVAILABLE: return 503;
    case grpc::StatusCode::DEADLINE_EXCEEDED: return 504;
    default: return 500;
  }
}

Status FromGrpc(const grpc::Status& s, const std::string& what) {
  const std::string msg = what + ": " + CodeName(s.error_code()) + ": " + s.error_message();
  switch (s.error_code()) {
    case grpc::StatusCode::INVALID_ARGUMENT: return Status::InvalidArgument(msg);
    case grpc::StatusCode::NOT_FOUND: return Status::NotFound(msg);
    case grpc::StatusCode::RESOURCE_EXHAUSTED: return Status::ResourceExhausted(msg);
    default: return Status::Unavailable(msg);
  }
}

}  // namespace

struct GrpcClient::Impl {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<pb::Strata::Stub> stub;
};

bool IsGrpcUrl(std::string_view url) { return url.starts_with("grpc://"); }

Result<std::pair<std::string, int>> ParseGrpcUrl(std::string_view url) {
  if (!IsGrpcUrl(url)) return Status::InvalidArgument("'" + std::string(url) + "' is not a grpc://HOST:PORT URL");
  std::string_view rest = url.substr(7);
  if (rest.ends_with('/')) rest.remove_suffix(1);
  if (rest.find('/') != std::string_view::npos)
    return Status::InvalidArgument("'" + std::string(url) + "': a gRPC URL has no path (grpc://HOST:PORT)");
  std::string_view host;
  std::string_view port;
  if (rest.starts_with('[')) {
    const size_t close = rest.find(']');
    if (close == std::string_view::npos || close + 1 >= rest.size() || rest[close + 1] != ':')
      return Status::InvalidArgument("'" + std::string(url) + "': expected grpc://[IPv6]:PORT");
    host = rest.substr(0, close + 1);
    port = rest.substr(close + 2);
  } else {
    const size_t colon = rest.rfind(':');
    if (colon == std::string_view::npos)
      return Status::InvalidArgument("'" + std::string(url) + "': the port is missing (grpc://HOST:PORT)");
    host = rest.substr(0, colon);
    port = rest.substr(colon + 1);
  }
  if (host.empty()) return Status::InvalidArgument("'" + std::string(url) + "': the host is empty");
  int p = 0;
  auto [end, ec] = std::from_chars(port.data(), port.data() + port.size(), p);
  if (port.empty() || ec != std::errc() || end != port.data() + port.size() || p < 1 || p > 65535)
    return Status::InvalidArgument("'" + std::string(url) + "': the port must be a number in [1, 65535]");
  return std::make_pair(std::string(host), p);
}

GrpcClient::GrpcClient(std::unique_ptr<Impl> impl, std::string target)
    : impl_(std::move(impl)), target_(std::move(target)) {}
GrpcClient::~GrpcClient() = default;

Result<std::unique_ptr<GrpcClient>> GrpcClient::Connect(const std::string& host, int port,
                                                        double connect_timeout_s) {
  const std::string target = host + ":" + std::to_string(port);
  grpc::ChannelArguments args;
  // Long streams of small messages: no message size surprises.
  args.SetMaxReceiveMessageSize(64 << 20);
  auto impl = std::make_unique<Impl>();
  impl->channel = grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
  if (!impl->channel->WaitForConnected(DeadlineIn(connect_timeout_s)))
    return Status::Unavailable("cannot connect to the gRPC server at " + target + " (no connection within " +
                               std::to_string(static_cast<int>(connect_timeout_s)) + " s)");
  impl->stub = pb::Strata::NewStub(impl->channel);
  return std::unique_ptr<GrpcClient>(new GrpcClient(std::move(impl), target));
}

Result<ServedModel> GrpcClient::QueryModel() {
  ServedModel m;
  {
    grpc::ClientContext ctx;
    ctx.set_deadline(DeadlineIn(30));
    pb::HealthRequest req;
    pb::HealthResponse resp;
    grpc::Status s = impl_->stub->Health(&ctx, req, &resp);
    if (!s.ok()) return FromGrpc(s, "Health on " + target_);
    m.id = resp.model();
  }
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(30));
  pb::TokenizeRequest req;
  req.set_text("a");
  pb::TokenizeResponse resp;
  grpc::Status s = impl_->stub->Tokenize(&ctx, req, &resp);
  if (!s.ok()) return FromGrpc(s, "Tokenize on " + target_);
  m.max_model_len = resp.max_model_len();
  return m;
}

int GrpcClient::ProbeVocabSize(const std::string& model) {
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(30));
  pb::GenerateRequest req;
  req.set_model(model);
  req.mutable_token_ids()->add_ids(1 << 30);
  req.mutable_sampling()->set_max_tokens(1);
  auto reader = impl_->stub->Generate(&ctx, req);
  pb::GenerateResponse resp;
  while (reader->Read(&resp)) {
  }
  grpc::Status s = reader->Finish();
  if (s.error_code() != grpc::StatusCode::INVALID_ARGUMENT) return 0;
  const std::string& msg = s.error_message();
  const std::string key = "vocabulary [0, ";
  const size_t at = msg.find(key);
  if (at == std::string::npos) return 0;
  return std::atoi(msg.c_str() + at + key.size());
}

std::string GrpcClient::Send(const GrpcSend& q, SteadyClock::time_point t0, double timeout_s, RequestRecord* r) {
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(timeout_s));
  pb::SamplingOptions sampling;
  sampling.set_max_tokens(q.max_tokens);
  sampling.set_temperature(0);
  sampling.set_ignore_eos(true);
  r->max_tokens = q.max_tokens;

  std::string text;
  bool usage_seen = false;
  pb::GenerateResponse resp;
  r->start_s = Since(t0);
  std::unique_ptr<grpc::ClientReader<pb::GenerateResponse>> reader;
  if (q.chat) {
    pb::ChatRequest req;
    req.set_model(q.model);
    for (const auto& [role, content] : q.messages) {
      pb::ChatMessage* m = req.add_messages();
      m->set_role(role);
      m->set_content(content);
    }
    *req.mutable_sampling() = sampling;
    req.set_cache_salt(q.cache_salt);
    reader = impl_->stub->Chat(&ctx, req);
  } else {
    pb::GenerateRequest req;
    req.set_model(q.model);
    req.mutable_token_ids()->mutable_ids()->Add(q.prompt.begin(), q.prompt.end());
    *req.mutable_sampling() = sampling;
    req.set_cache_salt(q.cache_salt);
    r->sent_prompt_tokens = static_cast<int64_t>(q.prompt.size());
    reader = impl_->stub->Generate(&ctx, req);
  }
  while (reader->Read(&resp)) {
    if (resp.has_delta()) {
      const std::string& piece = resp.delta().text();
      if (!piece.empty()) {
        const double now = Since(t0);
        if (r->first_token_s < 0) r->first_token_s = now;
        r->token_s.push_back(now);
        text += piece;
      }
    } else if (resp.has_usage()) {
      const pb::Usage& u = resp.usage();
      usage_seen = true;
      r->prompt_tokens = u.prompt_tokens();
      r->completion_tokens = u.completion_tokens();
      r->cached_tokens = u.cached_tokens();
      const pb::CachedTokensByTier& t = u.cached_tokens_by_tier();
      r->cached_by_tier = {t.device(), t.host(), t.disk(), t.remote()};
    }
  }
  const grpc::Status s = reader->Finish();
  r->end_s = Since(t0);
  r->grpc_status = CodeName(s.error_code());
  if (s.ok()) {
    r->http_status = 200;
    if (!usage_seen) {
      r->error = "stream";
      r->error_message = "the stream ended without a usage message";
    }
    return text;
  }
  r->error_message = s.error_message();
  if (s.error_code() == grpc::StatusCode::UNAVAILABLE && r->first_token_s < 0 &&
      impl_->channel->GetState(false) != GRPC_CHANNEL_READY) {
    // The server could not be reached at all: the HTTP path's "transport".
    r->http_status = 0;
    r->error = "transport";
    return text;
  }
  r->http_status = HttpEquivalent(s.error_code());
  const bool context = s.error_code() == grpc::StatusCode::INVALID_ARGUMENT &&
                       r->error_message.find("context") != std::string::npos;
  r->error = context ? "context" : std::string("grpc_") + CodeName(s.error_code());
  return text;
}

bool GrpcClient::Scrape(MetricsSample* out) {
  grpc::ClientContext ctx;
  ctx.set_deadline(DeadlineIn(10));
  pb::CacheStatsRequest req;
  pb::CacheStatsResponse resp;
  if (!impl_->stub->CacheStats(&ctx, req, &resp).ok()) return false;
  MetricsSample m;
  m.queries = static_cast<double>(resp.prefix_query_tokens());
  for (const pb::TierStats& t : resp.tiers())
    for (size_t i = 0; i < kTierNames.size(); ++i)
      if (t.kind() == kTierNames[i]) m.hits[i] += static_cast<double>(t.hit_tokens());
  m.running = resp.num_running();
  m.waiting = resp.num_waiting();
  *out = m;
  return true;
}

}  // namespace strata::bench
