// The gRPC API (strata.v1.Strata) on a real in-process stack: stories260K,
// ForwardEngine + device-only KvManager, scheduler::Engine on its loop
// thread, Frontend and GrpcServer on 127.0.0.1 port 0, driven by the C++
// stub generated from proto/strata.proto. Reflection is checked over the
// wire with a generic (ByteBuffer) client, the way grpcurl discovers a
// server.

#include <google/protobuf/descriptor.h>
#include <google/protobuf/descriptor.pb.h>
#include <google/protobuf/message.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <map>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "common/thread_pool.h"
#include "kvcache/block_hash.h"
#include "kvcache/kv_manager.h"
#include "model/generate.h"
#include "model/model_loader.h"
#include "proto/strata.grpc.pb.h"
#include "scheduler/engine.h"
#include "server/frontend.h"
#include "server/grpc_service.h"
#include "tests/support/test_env.h"

namespace strata::server {
namespace {

namespace pb = ::strata::v1;

constexpr int kBlockSize = 4;
constexpr char kModelName[] = "stories260K";
constexpr char kPrompt[] =
    "Once upon a time, there was a little girl named Lily. She loved to play";

struct Streamed {
  std::vector<std::vector<int32_t>> tokens;  // per choice
  std::vector<std::string> text;
  std::vector<std::string> finish_reason;
  std::vector<int> logprob_entries;
  std::vector<pb::GenerateResponse> messages;
  bool usage_last = false;
  pb::Usage usage;
  grpc::Status status;
};

class GrpcTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto m = LoadModel(testing::Stories260KPath());
    ASSERT_TRUE(m.ok()) << m.error().ToString();
    model_ = std::move(m).value();
    threads_ = std::make_unique<ThreadPool>(1);
    KvOptions kv;
    kv.block_size = kBlockSize;
    kv.dtype = DType::kF32;
    kv.num_blocks = 4 * model_->weights.config.context_length / kBlockSize;
    auto fe = ForwardEngine::Create(model_->weights, kv, threads_.get());
    ASSERT_TRUE(fe.ok()) << fe.error().ToString();
    forward_ = std::move(fe).value();

    kvcache::KvManagerOptions o;
    o.block_size = kBlockSize;
    o.num_device_blocks = forward_->num_blocks();
    o.block_bytes = forward_->kv_layout().block_bytes();
    o.ns = kvcache::NamespaceDigest(model_->weights.digest, model_->weights.config.arch, "f32",
                                    kBlockSize);
    auto mem = [e = forward_.get()](BlockId id) {
      return e->block_data(static_cast<int32_t>(id.value()));
    };
    auto mgr =
        kvcache::KvManager::Create(o, mem, std::vector<kvcache::LowerTier>{}, kvcache::RealClock());
    ASSERT_TRUE(mgr.ok()) << mgr.error().ToString();
    kv_ = std::move(mgr).value();

    runner_ = std::make_unique<scheduler::ForwardEngineRunner>(forward_.get());
    auto eng = scheduler::Engine::Create(engine_options_, runner_.get(), kv_.get(),
                                         model_->tokenizer.get(), kvcache::RealClock());
    ASSERT_TRUE(eng.ok()) << eng.error().ToString();
    engine_ = std::move(eng).value();
    engine_->Start();

    FrontendOptions fo;
    fo.served_model_name = kModelName;
    frontend_ = std::make_unique<Frontend>(*model_, *engine_, fo);

    GrpcServerOptions go = grpc_options_;
    go.host = "127.0.0.1";
    go.port = 0;
    lanes_ = std::make_unique<RequestLanes>(RequestLanesOptions{});
    auto srv = GrpcServer::Create(go, *frontend_, *lanes_);
    ASSERT_TRUE(srv.ok()) << srv.error().ToString();
    server_ = std::move(srv).value();
    ASSERT_GT(server_->port(), 0);
    channel_ = grpc::CreateChannel("127.0.0.1:" + std::to_string(server_->port()),
                                   grpc::InsecureChannelCredentials());
    stub_ = pb::Strata::NewStub(channel_);
  }

  void TearDown() override {
    if (server_) server_->Shutdown(5);
    if (engine_) engine_->Stop(5);
  }

  // Reads a whole Generate/Chat stream.
  static Streamed Read(grpc::ClientReader<pb::GenerateResponse>* reader) {
    Streamed s;
    pb::GenerateResponse r;
    auto grow = [&](int i) {
      if (static_cast<int>(s.tokens.size()) <= i) {
        s.tokens.resize(i + 1);
        s.text.resize(i + 1);
        s.finish_reason.resize(i + 1);
        s.logprob_entries.resize(i + 1);
      }
    };
    while (reader->Read(&r)) {
      s.messages.push_back(r);
      s.usage_last = false;
      if (r.has_delta()) {
        grow(r.delta().index());
        auto& t = s.tokens[r.delta().index()];
        t.insert(t.end(), r.delta().token_ids().begin(), r.delta().token_ids().end());
        s.text[r.delta().index()] += r.delta().text();
        s.logprob_entries[r.delta().index()] += r.delta().logprobs_size();
      } else if (r.has_finished()) {
        grow(r.finished().index());
        s.finish_reason[r.finished().index()] = r.finished().finish_reason();
      } else if (r.has_usage()) {
        s.usage = r.usage();
        s.usage_last = true;
      }
    }
    s.status = reader->Finish();
    return s;
  }

  Streamed Generate(const pb::GenerateRequest& req) {
    grpc::ClientContext ctx;
    auto reader = stub_->Generate(&ctx, req);
    return Read(reader.get());
  }

  Streamed Chat(const pb::ChatRequest& req) {
    grpc::ClientContext ctx;
    auto reader = stub_->Chat(&ctx, req);
    return Read(reader.get());
  }

  static pb::GenerateRequest Greedy(const std::string& text, int max_tokens) {
    pb::GenerateRequest r;
    r.set_model(kModelName);
    r.set_text(text);
    r.mutable_sampling()->set_temperature(0);
    r.mutable_sampling()->set_max_tokens(max_tokens);
    return r;
  }

  static pb::ChatRequest GreedyChat(int max_tokens) {
    pb::ChatRequest r;
    r.set_model(kModelName);
    auto* sys = r.add_messages();
    sys->set_role("system");
    sys->set_content("You tell short stories about animals.");
    auto* user = r.add_messages();
    user->set_role("user");
    user->set_content("Tell me a story about a cat and a dog who were friends.");
    r.mutable_sampling()->set_temperature(0);
    r.mutable_sampling()->set_max_tokens(max_tokens);
    return r;
  }

  // Waits (bounded) until the engine has nothing running or waiting.
  bool WaitEngineIdle() {
    for (int i = 0; i < 1000; ++i) {
      scheduler::EngineStats s = engine_->Stats();
      if (s.num_running == 0 && s.num_waiting == 0 && engine_->num_unfinished() == 0) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    return false;
  }

  scheduler::EngineOptions engine_options_;  // set before SetUp() to change
  GrpcServerOptions grpc_options_;           // host and port are set by SetUp()
  std::unique_ptr<LoadedModel> model_;
  std::unique_ptr<ThreadPool> threads_;
  std::unique_ptr<ForwardEngine> forward_;
  std::unique_ptr<kvcache::KvManager> kv_;
  std::unique_ptr<scheduler::ForwardEngineRunner> runner_;
  std::unique_ptr<scheduler::Engine> engine_;
  std::unique_ptr<Frontend> frontend_;
  std::unique_ptr<RequestLanes> lanes_;  // the front end's workers (tokenization)
  std::unique_ptr<GrpcServer> server_;
  std::shared_ptr<grpc::Channel> channel_;
  std::unique_ptr<pb::Strata::Stub> stub_;
};

TEST_F(GrpcTest, GenerateStreamsTheTokensOfGreedyGenerate) {
  const std::vector<int32_t> prompt = TokenizePrompt(*model_, kPrompt);
  // Reference: plain Generate() on a ForwardEngine of its own.
  ThreadPool pool(1);
  KvOptions kv;
  kv.block_size = kBlockSize;
  kv.dtype = DType::kF32;
  kv.num_blocks = model_->weights.config.context_length / kBlockSize;
  auto ref_engine = ForwardEngine::Create(model_->weights, kv, &pool);
  ASSERT_TRUE(ref_engine.ok());
  GenerateOptions opts;
  opts.sampling.temperature = 0;
  opts.max_tokens = 24;
  auto ref = strata::Generate(**ref_engine, *model_->tokenizer, prompt, opts);
  ASSERT_TRUE(ref.ok()) << ref.error().ToString();
  ASSERT_FALSE(ref->tokens.empty());

  Streamed s = Generate(Greedy(kPrompt, 24));
  ASSERT_TRUE(s.status.ok()) << s.status.error_message();
  ASSERT_EQ(s.tokens.size(), 1u);
  EXPECT_EQ(s.tokens[0], ref->tokens);
  EXPECT_EQ(s.text[0], ref->text);
  EXPECT_EQ(s.finish_reason[0], FinishReasonName(ref->finish_reason));
  EXPECT_GE(s.messages.size(), 3u);  // at least one delta, finished, usage
  ASSERT_TRUE(s.usage_last);
  EXPECT_EQ(s.usage.prompt_tokens(), static_cast<int32_t>(prompt.size()));
  EXPECT_EQ(s.usage.completion_tokens(), static_cast<int32_t>(ref->tokens.size()));
  EXPECT_EQ(s.usage.total_tokens(), s.usage.prompt_tokens() + s.usage.completion_tokens());
  EXPECT_TRUE(s.usage.has_cached_tokens_by_tier());

  // The same prompt as token ids gives the same tokens.
  pb::GenerateRequest ids = Greedy("", 24);
  ids.mutable_token_ids()->mutable_ids()->Assign(prompt.begin(), prompt.end());
  Streamed s2 = Generate(ids);
  ASSERT_TRUE(s2.status.ok()) << s2.status.error_message();
  EXPECT_EQ(s2.tokens.at(0), ref->tokens);
  EXPECT_EQ(s2.usage.prompt_tokens(), static_cast<int32_t>(prompt.size()));
}

TEST_F(GrpcTest, SeveralChoicesWithLogprobs) {
  pb::GenerateRequest r = Greedy(kPrompt, 8);
  r.mutable_sampling()->set_temperature(0.8f);
  r.mutable_sampling()->set_seed(7);
  r.mutable_sampling()->set_n(3);
  r.mutable_sampling()->set_logprobs(true);
  r.mutable_sampling()->set_top_logprobs(2);
  r.mutable_sampling()->set_ignore_eos(true);
  Streamed s = Generate(r);
  ASSERT_TRUE(s.status.ok()) << s.status.error_message();
  ASSERT_EQ(s.tokens.size(), 3u);
  int32_t total = 0;
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(s.tokens[i].size(), 8u) << "choice " << i;
    EXPECT_EQ(s.finish_reason[i], "length");
    EXPECT_EQ(s.logprob_entries[i], 8);
    total += static_cast<int32_t>(s.tokens[i].size());
  }
  for (const auto& m : s.messages)
    if (m.has_delta())
      for (const auto& lp : m.delta().logprobs()) {
        EXPECT_LE(lp.logprob(), 0.0f);
        EXPECT_EQ(lp.top_size(), 2);
      }
  ASSERT_TRUE(s.usage_last);
  EXPECT_EQ(s.usage.completion_tokens(), total);
}

TEST_F(GrpcTest, ChatStreamsEndsWithUsageAndARepeatHitsTheCache) {
  const pb::ChatRequest req = GreedyChat(6);
  Streamed first = Chat(req);
  ASSERT_TRUE(first.status.ok()) << first.status.error_message();
  ASSERT_EQ(first.tokens.size(), 1u);
  EXPECT_FALSE(first.tokens[0].empty());
  EXPECT_FALSE(first.finish_reason[0].empty());
  ASSERT_TRUE(first.usage_last);
  auto chat_ids =
      TokenizeChat(*model_, {{"system", "You tell short stories about animals."},
                             {"user", "Tell me a story about a cat and a dog who were friends."}});
  ASSERT_TRUE(chat_ids.ok());
  EXPECT_EQ(first.usage.prompt_tokens(), static_cast<int32_t>(chat_ids->size()));
  EXPECT_EQ(first.usage.cached_tokens(), 0);

  Streamed second = Chat(req);
  ASSERT_TRUE(second.status.ok()) << second.status.error_message();
  EXPECT_EQ(second.tokens, first.tokens);  // greedy: the cache changes nothing
  const int32_t prompt = second.usage.prompt_tokens();
  // Every whole block of the prompt but the last token's is reused.
  EXPECT_GE(second.usage.cached_tokens(), (prompt - 1) / kBlockSize * kBlockSize);
  EXPECT_GT(second.usage.cached_tokens(), 0);
  EXPECT_EQ(second.usage.cached_tokens_by_tier().device(), second.usage.cached_tokens());
  EXPECT_EQ(second.usage.cached_tokens_by_tier().host(), 0);
}

// Each bad request gets the status code HTTP's would map to and exactly the
// message the Frontend gives for the same parameters.
TEST_F(GrpcTest, BadRequestsMapToStatusCodesWithTheFrontendsMessage) {
  struct Case {
    std::string name;
    pb::GenerateRequest req;
    GenerationParams params;  // the same request, built by hand
    grpc::StatusCode code;
    std::string param;  // expected strata-error-param, "" = don't check
  };
  auto base_params = [] {
    GenerationParams p;
    p.model = kModelName;
    p.prompt_text = kPrompt;
    p.sampling.temperature = 0;
    p.max_tokens = 4;
    p.stream = true;
    p.include_usage = true;
    return p;
  };
  std::vector<Case> cases;
  {
    Case c{"unknown model", Greedy(kPrompt, 4), base_params(), grpc::StatusCode::NOT_FOUND, ""};
    c.req.set_model("gpt-4");
    c.params.model = "gpt-4";
    cases.push_back(c);
  }
  {
    Case c{"temperature 3", Greedy(kPrompt, 4), base_params(), grpc::StatusCode::INVALID_ARGUMENT,
           "temperature"};
    c.req.mutable_sampling()->set_temperature(3);
    c.params.sampling.temperature = 3;
    cases.push_back(c);
  }
  {
    Case c{"n 0", Greedy(kPrompt, 4), base_params(), grpc::StatusCode::INVALID_ARGUMENT, "n"};
    c.req.mutable_sampling()->set_n(0);
    c.params.n = 0;
    cases.push_back(c);
  }
  {
    Case c{"no prompt tokens", Greedy("", 4), base_params(), grpc::StatusCode::INVALID_ARGUMENT,
           "prompt"};
    c.req.mutable_token_ids();  // set, but empty
    c.params.prompt_text.clear();
    c.params.prompt_is_ids = true;
    cases.push_back(c);
  }
  {
    Case c{"token id outside the vocabulary", Greedy("", 4), base_params(),
           grpc::StatusCode::INVALID_ARGUMENT, ""};
    c.req.mutable_token_ids()->add_ids(1);
    c.req.mutable_token_ids()->add_ids(1 << 20);
    c.params.prompt_text.clear();
    c.params.prompt_is_ids = true;
    c.params.prompt_ids = {1, 1 << 20};
    cases.push_back(c);
  }
  {
    const int ctx = model_->weights.config.context_length;
    Case c{"max_tokens beyond the context", Greedy(kPrompt, ctx), base_params(),
           grpc::StatusCode::INVALID_ARGUMENT, ""};
    c.params.max_tokens = ctx;
    cases.push_back(c);
  }
  {
    Case c{"five stop strings", Greedy(kPrompt, 4), base_params(),
           grpc::StatusCode::INVALID_ARGUMENT, "stop"};
    for (const char* s : {"a", "b", "c", "d", "e"}) {
      c.req.mutable_sampling()->add_stop(s);
      c.params.stop.push_back(s);
    }
    cases.push_back(c);
  }
  {
    Case c{"top_p 0", Greedy(kPrompt, 4), base_params(), grpc::StatusCode::INVALID_ARGUMENT,
           "top_p"};
    c.req.mutable_sampling()->set_top_p(0);
    c.params.sampling.top_p = 0;
    cases.push_back(c);
  }
  {
    Case c{"max_tokens 0", Greedy(kPrompt, 0), base_params(), grpc::StatusCode::INVALID_ARGUMENT,
           "max_tokens"};
    c.params.max_tokens = 0;
    cases.push_back(c);
  }
  {
    Case c{"top_logprobs 21", Greedy(kPrompt, 4), base_params(), grpc::StatusCode::INVALID_ARGUMENT,
           "top_logprobs"};
    c.req.mutable_sampling()->set_logprobs(true);
    c.req.mutable_sampling()->set_top_logprobs(21);
    c.params.sampling.logprobs = true;
    c.params.sampling.top_logprobs = 21;
    cases.push_back(c);
  }
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    PreparedRequest unused;
    std::optional<ApiError> want = frontend_->Prepare(c.params, &unused);
    ASSERT_TRUE(want.has_value()) << "the frontend accepts this request";
    ASSERT_EQ(want->grpc_code(), static_cast<int>(c.code));
    grpc::ClientContext ctx;
    auto reader = stub_->Generate(&ctx, c.req);
    pb::GenerateResponse r;
    EXPECT_FALSE(reader->Read(&r));
    grpc::Status st = reader->Finish();
    EXPECT_EQ(st.error_code(), c.code);
    EXPECT_EQ(st.error_message(), want->message);
    EXPECT_FALSE(st.error_message().empty());
    const auto& trailers = ctx.GetServerTrailingMetadata();
    auto type = trailers.find("strata-error-type");
    ASSERT_NE(type, trailers.end());
    EXPECT_EQ(std::string(type->second.data(), type->second.size()), want->type);
    if (!c.param.empty()) {
      auto param = trailers.find("strata-error-param");
      ASSERT_NE(param, trailers.end());
      EXPECT_EQ(std::string(param->second.data(), param->second.size()), c.param);
    }
  }
  // No prompt at all (checked before the frontend, as HTTP's parser does).
  pb::GenerateRequest no_prompt = Greedy("", 4);
  no_prompt.clear_prompt();
  Streamed none = Generate(no_prompt);
  EXPECT_EQ(none.status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(none.status.error_message(), "'prompt' is required: set 'text' or 'token_ids'");

  // A chat for another model is NOT_FOUND too.
  pb::ChatRequest chat = GreedyChat(4);
  chat.set_model("nope");
  Streamed bad_chat = Chat(chat);
  EXPECT_EQ(bad_chat.status.error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_TRUE(bad_chat.messages.empty());

  // The server is still fine.
  Streamed good = Generate(Greedy(kPrompt, 4));
  ASSERT_TRUE(good.status.ok()) << good.status.error_message();
  EXPECT_EQ(good.tokens.at(0).size(), 4u);
}

TEST_F(GrpcTest, Tokenize) {
  pb::TokenizeRequest req;
  req.set_text(kPrompt);
  pb::TokenizeResponse resp;
  {
    grpc::ClientContext ctx;
    grpc::Status st = stub_->Tokenize(&ctx, req, &resp);
    ASSERT_TRUE(st.ok()) << st.error_message();
  }
  const std::vector<int32_t> want = TokenizePrompt(*model_, kPrompt);
  EXPECT_EQ(std::vector<int32_t>(resp.tokens().begin(), resp.tokens().end()), want);
  EXPECT_EQ(resp.count(), static_cast<int32_t>(want.size()));
  EXPECT_EQ(resp.max_model_len(), model_->weights.config.context_length);

  // Messages: the chat template applied.
  pb::TokenizeRequest chat;
  chat.set_model(kModelName);
  auto* m = chat.mutable_messages()->add_messages();
  m->set_role("user");
  m->set_content("Hello there");
  {
    grpc::ClientContext ctx;
    grpc::Status st = stub_->Tokenize(&ctx, chat, &resp);
    ASSERT_TRUE(st.ok()) << st.error_message();
  }
  auto chat_ids = TokenizeChat(*model_, {{"user", "Hello there"}});
  ASSERT_TRUE(chat_ids.ok());
  EXPECT_EQ(std::vector<int32_t>(resp.tokens().begin(), resp.tokens().end()), *chat_ids);

  // Another model, or no input at all.
  req.set_model("other");
  {
    grpc::ClientContext ctx;
    EXPECT_EQ(stub_->Tokenize(&ctx, req, &resp).error_code(), grpc::StatusCode::NOT_FOUND);
  }
  pb::TokenizeRequest empty;
  {
    grpc::ClientContext ctx;
    EXPECT_EQ(stub_->Tokenize(&ctx, empty, &resp).error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  }
}

TEST_F(GrpcTest, HealthAndCacheStats) {
  pb::HealthResponse h;
  {
    grpc::ClientContext ctx;
    ctx.AddMetadata("x-request-id", "req-42");
    ASSERT_TRUE(stub_->Health(&ctx, pb::HealthRequest(), &h).ok());
    // The client's request id comes back, as HTTP's x-request-id header does.
    auto id = ctx.GetServerInitialMetadata().find("x-request-id");
    ASSERT_NE(id, ctx.GetServerInitialMetadata().end());
    EXPECT_EQ(std::string(id->second.data(), id->second.size()), "req-42");
  }
  EXPECT_EQ(h.status(), pb::HealthResponse::SERVING);
  EXPECT_EQ(h.model(), kModelName);
  {
    grpc::ClientContext ctx;  // no id given: one is generated
    ASSERT_TRUE(stub_->Health(&ctx, pb::HealthRequest(), &h).ok());
    auto id = ctx.GetServerInitialMetadata().find("x-request-id");
    ASSERT_NE(id, ctx.GetServerInitialMetadata().end());
    EXPECT_FALSE(id->second.empty());
  }

  ASSERT_TRUE(Generate(Greedy(kPrompt, 4)).status.ok());
  ASSERT_TRUE(Generate(Greedy(kPrompt, 4)).status.ok());  // hits the first one's blocks
  ASSERT_TRUE(WaitEngineIdle());
  pb::CacheStatsResponse cs;
  {
    grpc::ClientContext ctx;
    ASSERT_TRUE(stub_->CacheStats(&ctx, pb::CacheStatsRequest(), &cs).ok());
  }
  ASSERT_GE(cs.tiers_size(), 1);
  EXPECT_EQ(cs.tiers(0).name(), "device");
  EXPECT_EQ(cs.tiers(0).capacity_bytes(),
            static_cast<uint64_t>(forward_->num_blocks()) * forward_->kv_layout().block_bytes());
  EXPECT_LE(cs.tiers(0).used_bytes(), cs.tiers(0).capacity_bytes());
  EXPECT_DOUBLE_EQ(cs.tiers(0).usage_ratio(),
                   static_cast<double>(cs.tiers(0).used_bytes()) / cs.tiers(0).capacity_bytes());
  EXPECT_GT(cs.tiers(0).hit_tokens(), 0u);
  const uint64_t prompt = TokenizePrompt(*model_, kPrompt).size();
  EXPECT_EQ(cs.prefix_query_tokens(), 2 * prompt);
  EXPECT_EQ(cs.prefix_hit_tokens(), cs.tiers(0).hit_tokens());
  EXPECT_EQ(cs.num_running(), 0);
  EXPECT_EQ(cs.num_waiting(), 0);
  EXPECT_EQ(cs.device_blocks_in_use(), 0);
}

// Holds the engine's stepping thread inside a posted task until released, so
// that what the gRPC layer does meanwhile cannot race with generation.
class EngineFreeze {
 public:
  // The closure owns what it touches: after `entered` is set the test may
  // leave the scope (and destroy this object) before the engine thread
  // reaches its wait, which used to read a destroyed promise.
  explicit EngineFreeze(scheduler::Engine& engine) {
    auto entered = std::make_shared<std::promise<void>>();
    std::future<void> entered_future = entered->get_future();
    std::shared_future<void> go = release_.get_future().share();
    engine.Post([entered, go](kvcache::KvManager&) {
      entered->set_value();
      go.wait();
    });
    entered_future.wait();
  }
  ~EngineFreeze() { Release(); }
  void Release() {
    if (!released_) release_.set_value();
    released_ = true;
  }

 private:
  std::promise<void> release_;
  bool released_ = false;
};

// A client hanging up mid-stream cancels its engine request: nothing is left
// running and no block stays referenced.
TEST_F(GrpcTest, ClientCancelMidStreamReleasesTheRequest) {
  const int max_tokens = 400;
  pb::GenerateRequest r = Greedy(kPrompt, max_tokens);
  r.mutable_sampling()->set_ignore_eos(true);
  grpc::ClientContext ctx;
  auto reader = stub_->Generate(&ctx, r);
  pb::GenerateResponse first;
  ASSERT_TRUE(reader->Read(&first));
  ASSERT_TRUE(first.has_delta());
  EXPECT_EQ(server_->active_streams(), 1);
  {
    EngineFreeze freeze(*engine_);
    ctx.TryCancel();
    // The handler notices, cancels its engine request and returns while the
    // engine cannot make progress.
    bool gone = false;
    for (int i = 0; i < 1000 && !gone; ++i) {
      gone = server_->active_streams() == 0;
      if (!gone) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
    ASSERT_TRUE(gone);
  }
  pb::GenerateResponse rest;
  while (reader->Read(&rest)) {
  }
  EXPECT_EQ(reader->Finish().error_code(), grpc::StatusCode::CANCELLED);
  ASSERT_TRUE(WaitEngineIdle());
  scheduler::EngineStats s = engine_->Stats();
  EXPECT_EQ(s.num_running, 0);
  EXPECT_EQ(s.device_blocks_in_use, 0);
  EXPECT_EQ(s.finished_by_reason["abort"], 1u);
  EXPECT_LT(s.generation_tokens, static_cast<uint64_t>(max_tokens));

  // The server still answers.
  ASSERT_TRUE(Generate(Greedy(kPrompt, 2)).status.ok());
}

TEST_F(GrpcTest, ShutdownEndsOpenStreams) {
  pb::GenerateRequest r = Greedy(kPrompt, 450);
  r.mutable_sampling()->set_ignore_eos(true);
  grpc::ClientContext ctx;
  auto reader = stub_->Generate(&ctx, r);
  pb::GenerateResponse msg;
  ASSERT_TRUE(reader->Read(&msg));
  {
    EngineFreeze freeze(*engine_);
    server_->Shutdown(0);  // returns once the handler has returned
    EXPECT_EQ(server_->active_streams(), 0);
  }
  while (reader->Read(&msg)) {
  }
  EXPECT_FALSE(reader->Finish().ok());
  ASSERT_TRUE(WaitEngineIdle());
  scheduler::EngineStats s = engine_->Stats();
  EXPECT_EQ(s.device_blocks_in_use, 0);
  EXPECT_EQ(s.finished_by_reason["abort"], 1u);
}

class GrpcOverloadTest : public GrpcTest {
 protected:
  void SetUp() override {
    engine_options_.max_waiting = 2;
    GrpcTest::SetUp();
  }
};

// A full waiting queue is RESOURCE_EXHAUSTED (HTTP 429) and draining is
// UNAVAILABLE (HTTP 503); the queued calls still complete.
TEST_F(GrpcOverloadTest, FullQueueAndDrainingMapToStatusCodes) {
  EngineFreeze freeze(*engine_);
  grpc::ClientContext ctx1, ctx2;
  auto r1 = stub_->Generate(&ctx1, Greedy(kPrompt, 3));
  auto r2 = stub_->Generate(&ctx2, Greedy(kPrompt, 3));
  bool queued = false;
  for (int i = 0; i < 1000 && !queued; ++i) {
    queued = engine_->num_unfinished() == 2;
    if (!queued) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  ASSERT_TRUE(queued);
  {
    grpc::ClientContext ctx;
    auto r = stub_->Generate(&ctx, Greedy(kPrompt, 3));
    pb::GenerateResponse msg;
    EXPECT_FALSE(r->Read(&msg));
    grpc::Status st = r->Finish();
    EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_FALSE(st.error_message().empty());
    auto type = ctx.GetServerTrailingMetadata().find("strata-error-type");
    ASSERT_NE(type, ctx.GetServerTrailingMetadata().end());
    EXPECT_EQ(std::string(type->second.data(), type->second.size()), "rate_limit_error");
    auto retry = ctx.GetServerTrailingMetadata().find("retry-after");
    ASSERT_NE(retry, ctx.GetServerTrailingMetadata().end());
    EXPECT_EQ(std::string(retry->second.data(), retry->second.size()), "1");
  }
  freeze.Release();
  Streamed s1 = Read(r1.get()), s2 = Read(r2.get());
  EXPECT_TRUE(s1.status.ok()) << s1.status.error_message();
  EXPECT_TRUE(s2.status.ok()) << s2.status.error_message();
  EXPECT_EQ(s1.tokens.at(0).size(), 3u);

  engine_->BeginDrain();
  Streamed refused = Generate(Greedy(kPrompt, 3));
  EXPECT_EQ(refused.status.error_code(), grpc::StatusCode::UNAVAILABLE);
  pb::HealthResponse h;
  grpc::ClientContext ctx;
  ASSERT_TRUE(stub_->Health(&ctx, pb::HealthRequest(), &h).ok());
  EXPECT_EQ(h.status(), pb::HealthResponse::NOT_SERVING);
}

class GrpcAuthTest : public GrpcTest {
 protected:
  void SetUp() override {
    grpc_options_.api_key = "sk-test";
    grpc_options_.admin_token = "admin-secret";
    GrpcTest::SetUp();
  }
};

// With an API key (and an admin token) set, the RPCs check the
// "authorization" metadata as HTTP checks the header.
TEST_F(GrpcAuthTest, ApiKeyAndAdminTokenAreRequired) {
  auto generate = [&](const char* auth) {
    grpc::ClientContext ctx;
    if (auth != nullptr) ctx.AddMetadata("authorization", auth);
    auto reader = stub_->Generate(&ctx, Greedy(kPrompt, 2));
    return Read(reader.get());
  };
  Streamed none = generate(nullptr);
  EXPECT_EQ(none.status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(none.status.error_message(),
            "missing API key: send the header 'Authorization: Bearer KEY'");
  EXPECT_TRUE(none.messages.empty());
  Streamed wrong = generate("Bearer sk-wrong");
  EXPECT_EQ(wrong.status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
  EXPECT_EQ(wrong.status.error_message(), "invalid API key");
  Streamed right = generate("Bearer sk-test");
  EXPECT_TRUE(right.status.ok()) << right.status.error_message();
  EXPECT_EQ(right.tokens.at(0).size(), 2u);

  pb::TokenizeRequest tr;
  tr.set_text("hi");
  pb::TokenizeResponse tresp;
  {
    grpc::ClientContext ctx;
    EXPECT_EQ(stub_->Tokenize(&ctx, tr, &tresp).error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  pb::CacheStatsResponse cs;
  {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer sk-test");  // the API key is not the admin token
    grpc::Status st = stub_->CacheStats(&ctx, pb::CacheStatsRequest(), &cs);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_EQ(st.error_message(), "wrong admin token");
  }
  {
    grpc::ClientContext ctx;
    ctx.AddMetadata("authorization", "Bearer admin-secret");
    EXPECT_TRUE(stub_->CacheStats(&ctx, pb::CacheStatsRequest(), &cs).ok());
  }
  pb::HealthResponse h;
  grpc::ClientContext ctx;
  EXPECT_TRUE(stub_->Health(&ctx, pb::HealthRequest(), &h).ok());  // open, like GET /health
  EXPECT_EQ(h.status(), pb::HealthResponse::SERVING);
}

class GrpcLimitsTest : public GrpcTest {
 protected:
  void SetUp() override {
    grpc_options_.max_message_bytes = 4096;
    GrpcTest::SetUp();
  }
};

// A request over max_message_bytes is refused by gRPC before it reaches the
// frontend; smaller ones still work.
TEST_F(GrpcLimitsTest, OversizedRequestIsRefused) {
  Streamed big = Generate(Greedy(std::string(8192, 'a'), 2));
  EXPECT_EQ(big.status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
  EXPECT_TRUE(big.messages.empty());
  EXPECT_EQ(engine_->Stats().prompt_tokens, 0u);
  Streamed small = Generate(Greedy(kPrompt, 2));
  EXPECT_TRUE(small.status.ok()) << small.status.error_message();
}

// Server reflection, over the wire: list the services, then fetch the file
// that defines strata.v1.Strata and check its RPCs. The reflection messages
// are built from the descriptors libgrpc++_reflection registers (its .proto
// headers are not installed), as a generic tool would.
class Reflection {
 public:
  explicit Reflection(std::shared_ptr<grpc::Channel> channel) : stub_(std::move(channel)) {
    pool_ = google::protobuf::DescriptorPool::generated_pool();
    req_desc_ = pool_->FindMessageTypeByName("grpc.reflection.v1alpha.ServerReflectionRequest");
    resp_desc_ = pool_->FindMessageTypeByName("grpc.reflection.v1alpha.ServerReflectionResponse");
  }
  bool ready() const { return req_desc_ != nullptr && resp_desc_ != nullptr; }

  // One request/response exchange; `field` is a string field of the request
  // (list_services, file_containing_symbol).
  std::unique_ptr<google::protobuf::Message> Ask(const std::string& field, const std::string& value,
                                                 grpc::Status* status) {
    auto* factory = google::protobuf::MessageFactory::generated_factory();
    std::unique_ptr<google::protobuf::Message> req(factory->GetPrototype(req_desc_)->New());
    req->GetReflection()->SetString(req.get(), req_desc_->FindFieldByName(field), value);
    std::string bytes = req->SerializeAsString();

    grpc::ClientContext ctx;
    grpc::CompletionQueue cq;
    auto call = stub_.PrepareCall(
        &ctx, "/grpc.reflection.v1alpha.ServerReflection/ServerReflectionInfo", &cq);
    auto step = [&cq](void* tag) {
      void* got = nullptr;
      bool ok = false;
      return cq.Next(&got, &ok) && got == tag && ok;
    };
    std::unique_ptr<google::protobuf::Message> resp;
    call->StartCall(reinterpret_cast<void*>(1));
    if (step(reinterpret_cast<void*>(1))) {
      grpc::Slice slice(bytes);
      grpc::ByteBuffer out(&slice, 1);
      call->Write(out, reinterpret_cast<void*>(2));
      if (step(reinterpret_cast<void*>(2))) {
        call->WritesDone(reinterpret_cast<void*>(3));
        step(reinterpret_cast<void*>(3));
        grpc::ByteBuffer in;
        call->Read(&in, reinterpret_cast<void*>(4));
        if (step(reinterpret_cast<void*>(4))) {
          std::vector<grpc::Slice> slices;
          (void)in.Dump(&slices);
          std::string data;
          for (const auto& s : slices)
            data.append(reinterpret_cast<const char*>(s.begin()), s.size());
          resp.reset(factory->GetPrototype(resp_desc_)->New());
          if (!resp->ParseFromString(data)) resp.reset();
        }
      }
    }
    call->Finish(status, reinterpret_cast<void*>(5));
    step(reinterpret_cast<void*>(5));
    cq.Shutdown();
    void* tag;
    bool ok;
    while (cq.Next(&tag, &ok)) {
    }
    return resp;
  }

 private:
  grpc::GenericStub stub_;
  const google::protobuf::DescriptorPool* pool_;
  const google::protobuf::Descriptor* req_desc_ = nullptr;
  const google::protobuf::Descriptor* resp_desc_ = nullptr;
};

TEST_F(GrpcTest, ReflectionListsAndDescribesTheService) {
  Reflection refl(channel_);
  ASSERT_TRUE(refl.ready()) << "grpc.reflection.v1alpha descriptors are not linked in";

  grpc::Status st;
  auto list = refl.Ask("list_services", "*", &st);
  ASSERT_TRUE(st.ok()) << st.error_message();
  ASSERT_NE(list, nullptr);
  const auto* ld = list->GetDescriptor();
  const auto& lr =
      list->GetReflection()->GetMessage(*list, ld->FindFieldByName("list_services_response"));
  const auto* services_field = lr.GetDescriptor()->FindFieldByName("service");
  std::set<std::string> services;
  for (int i = 0; i < lr.GetReflection()->FieldSize(lr, services_field); ++i) {
    const auto& svc = lr.GetReflection()->GetRepeatedMessage(lr, services_field, i);
    services.insert(
        svc.GetReflection()->GetString(svc, svc.GetDescriptor()->FindFieldByName("name")));
  }
  EXPECT_TRUE(services.count("strata.v1.Strata")) << "services listed: " << services.size();
  EXPECT_TRUE(services.count("grpc.reflection.v1alpha.ServerReflection"));

  auto file = refl.Ask("file_containing_symbol", "strata.v1.Strata", &st);
  ASSERT_TRUE(st.ok()) << st.error_message();
  ASSERT_NE(file, nullptr);
  const auto* fd = file->GetDescriptor();
  const auto* fdr_field = fd->FindFieldByName("file_descriptor_response");
  ASSERT_TRUE(file->GetReflection()->HasField(*file, fdr_field)) << file->DebugString();
  const auto& fdr = file->GetReflection()->GetMessage(*file, fdr_field);
  const auto* protos_field = fdr.GetDescriptor()->FindFieldByName("file_descriptor_proto");
  ASSERT_GE(fdr.GetReflection()->FieldSize(fdr, protos_field), 1);
  bool found = false;
  for (int i = 0; i < fdr.GetReflection()->FieldSize(fdr, protos_field); ++i) {
    google::protobuf::FileDescriptorProto proto;
    ASSERT_TRUE(
        proto.ParseFromString(fdr.GetReflection()->GetRepeatedString(fdr, protos_field, i)));
    if (proto.package() != "strata.v1") continue;
    for (const auto& svc : proto.service()) {
      if (svc.name() != "Strata") continue;
      found = true;
      std::map<std::string, bool> methods;  // name → server streaming
      for (const auto& m : svc.method()) methods[m.name()] = m.server_streaming();
      EXPECT_EQ(methods, (std::map<std::string, bool>{{"CacheStats", false},
                                                      {"Chat", true},
                                                      {"Generate", true},
                                                      {"Health", false},
                                                      {"Tokenize", false}}));
    }
  }
  EXPECT_TRUE(found);
}

}  // namespace
}  // namespace strata::server
