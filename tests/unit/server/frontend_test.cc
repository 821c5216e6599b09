// The protocol-neutral Frontend on a real (synthetic, tiny) model: model name,
// context and range checks with the field named; prompts tokenized as
// TokenizeChat/TokenizePrompt; and Start() running choices on a real Engine,
// whose tokens equal strata::Generate's for the same prompt and seed. Then
// OpenAiRoutes over a fake ResponseWriter on the same stack: bodies, SSE
// chunk sequences, usage, hang-ups and error statuses.

#include "server/frontend.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <climits>
#include <condition_variable>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <thread>

#include "kvcache/block_hash.h"
#include "model/gguf_export.h"
#include "model/gguf_tokenizer.h"
#include "model/synth.h"
#include "server/openai_routes.h"
#include "tests/support/test_env.h"
#include "common/thread_pool.h"
#include "model/forward.h"
#include "model/generate.h"
#include "scheduler/engine.h"
#include "kvcache/kv_manager.h"

namespace strata::server {
namespace {

constexpr int kBlockSize = 16;
constexpr const char* kServed = "tiny-test";

// The model is written and loaded once for the whole file.
const LoadedModel& Model() {
  static std::unique_ptr<LoadedModel> model = [] {
    ModelConfig c = *SynthPresetConfig("tiny", 0);
    std::string path = strata::testing::MakeTempDir("strata-frontend-") + "/tiny.gguf";
    Status s = WriteSyntheticGguf(c, SyntheticVocab(c.vocab_size), SynthOptions{}, path);
    EXPECT_TRUE(s.ok()) << s.ToString();
    auto m = LoadModel(path);
    EXPECT_TRUE(m.ok()) << m.error().ToString();
    return std::move(m).value();
  }();
  return *model;
}

// Events of one Start() call, by choice.
struct Collector {
  std::mutex mu;
  std::condition_variable cv;
  std::map<int, std::vector<int32_t>> tokens;
  std::map<int, std::string> text;
  std::map<int, std::string> reason;
  int events = 0;
  int finished = 0;

  Frontend::EventFn Fn() {
    return [this](int choice, scheduler::RequestOutput&& ev) {
      std::lock_guard<std::mutex> lock(mu);
      ++events;
      auto& t = tokens[choice];
      t.insert(t.end(), ev.token_ids.begin(), ev.token_ids.end());
      text[choice] += ev.text;
      if (ev.finished) {
        reason[choice] = std::string(FinishReasonName(ev.finish_reason));
        ++finished;
        cv.notify_all();
      }
    };
  }
  bool WaitFinished(int n) {
    std::unique_lock<std::mutex> lock(mu);
    return cv.wait_for(lock, std::chrono::seconds(60), [&] { return finished >= n; });
  }
};

class CountingObserver : public RequestObserver {
 public:
  void OnEvent(const scheduler::RequestOutput& ev) override {
    std::lock_guard<std::mutex> lock(mu_);
    ++events_;
    if (ev.finished) ++finished_;
  }
  int events() {
    std::lock_guard<std::mutex> lock(mu_);
    return events_;
  }
  int finished() {
    std::lock_guard<std::mutex> lock(mu_);
    return finished_;
  }

 private:
  std::mutex mu_;
  int events_ = 0, finished_ = 0;
};

// The model's forward pass, failing from the (fail_after + 1)-th call on
// when fail_after >= 0 (a device error, as the engine sees one).
class FlakyRunner final : public scheduler::StepRunner {
 public:
  explicit FlakyRunner(ForwardEngine* engine) : inner_(engine) {}
  Status Forward(std::span<const ForwardSeq> batch, std::vector<float>* logits) override {
    const int limit = fail_after.load();
    if (limit >= 0 && calls_.fetch_add(1) >= limit)
      return Status::Internal("injected forward failure");
    return inner_.Forward(batch, logits);
  }
  int vocab_size() const override { return inner_.vocab_size(); }
  int context_length() const override { return inner_.context_length(); }
  void FailAfter(int calls) {
    calls_ = 0;
    fail_after = calls;
  }

  std::atomic<int> fail_after{-1};

 private:
  scheduler::ForwardEngineRunner inner_;
  std::atomic<int> calls_{0};
};

class FrontendTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_NE(Model().tokenizer, nullptr);
    threads_ = std::make_unique<ThreadPool>(1);
  }
  void TearDown() override {
    if (engine_) engine_->Stop(0);
  }

  void Build(scheduler::EngineOptions eo = {}) {
    const LoadedModel& m = Model();
    KvOptions kv;
    kv.block_size = kBlockSize;
    kv.dtype = DType::kF32;
    kv.num_blocks = 2 * m.weights.config.context_length / kBlockSize;
    fwd_ = std::move(ForwardEngine::Create(m.weights, kv, threads_.get())).value();
    kvcache::KvManagerOptions o;
    o.block_size = kBlockSize;
    o.num_device_blocks = kv.num_blocks;
    o.block_bytes = fwd_->kv_layout().block_bytes();
    o.ns = kvcache::NamespaceDigest(m.weights.digest, m.weights.config.arch, "f32", kBlockSize);
    auto mem = [e = fwd_.get()](BlockId id) {
      return e->block_data(static_cast<int32_t>(id.value()));
    };
    kv_ = std::move(kvcache::KvManager::Create(o, mem, std::vector<kvcache::LowerTier>{}, &clock_))
              .value();
    runner_ = std::make_unique<FlakyRunner>(fwd_.get());
    engine_ = std::move(scheduler::Engine::Create(eo, runner_.get(), kv_.get(), m.tokenizer.get(),
                                                  &clock_))
                  .value();
    FrontendOptions fo;
    fo.served_model_name = kServed;
    fo.max_n = 4;
    fo.observer = &observer_;
    frontend_ = std::make_unique<Frontend>(m, *engine_, fo);
  }

  // strata::Generate on its own ForwardEngine (ignore_eos, as the requests here).
  GenerateOutput Reference(const std::vector<int32_t>& prompt, int max_tokens,
                           const SamplingParams& sampling) {
    const LoadedModel& m = Model();
    KvOptions kv;
    kv.block_size = kBlockSize;
    kv.dtype = DType::kF32;
    kv.num_blocks = m.weights.config.context_length / kBlockSize;
    auto eng = std::move(ForwardEngine::Create(m.weights, kv, threads_.get())).value();
    GenerateOptions go;
    go.sampling = sampling;
    go.max_tokens = max_tokens;
    go.ignore_eos = true;
    auto out = Generate(*eng, *m.tokenizer, prompt, go);
    EXPECT_TRUE(out.ok()) << out.error().ToString();
    return out.ok() ? *out : GenerateOutput{};
  }

  // Steps the engine (no loop thread) until `c` saw n finished choices.
  void StepUntil(Collector& c, int n) {
    for (int i = 0; i < 10000; ++i) {
      {
        std::lock_guard<std::mutex> lock(c.mu);
        if (c.finished >= n) return;
      }
      ASSERT_TRUE(engine_->Step().ok());
    }
    FAIL() << "choices did not finish";
  }

  static GenerationParams Completion(std::string prompt) {
    GenerationParams p;
    p.kind = ApiKind::kCompletion;
    p.model = kServed;
    p.prompt_text = std::move(prompt);
    return p;
  }

  static GenerationParams Chat() {
    GenerationParams p;
    p.kind = ApiKind::kChat;
    p.model = kServed;
    p.messages = {{"system", "be kind"}, {"user", "once upon a time"}};
    return p;
  }

  std::optional<ApiError> Prepare(GenerationParams p, PreparedRequest* out = nullptr) {
    PreparedRequest local;
    return frontend_->Prepare(std::move(p), out != nullptr ? out : &local);
  }

  kvcache::ManualClock clock_{1000000000};  // not 0: a time of 0 means "not yet"
  CountingObserver observer_;
  std::unique_ptr<ThreadPool> threads_;
  std::unique_ptr<ForwardEngine> fwd_;
  std::unique_ptr<kvcache::KvManager> kv_;
  std::unique_ptr<FlakyRunner> runner_;
  std::unique_ptr<scheduler::Engine> engine_;
  std::unique_ptr<Frontend> frontend_;
};

TEST_F(FrontendTest, WrongModelIs404) {
  Build();
  GenerationParams p = Completion("the day");
  p.model = "gpt-4o";
  auto err = Prepare(p);
  ASSERT_TRUE(err);
  EXPECT_EQ(err->http_status, 404);
  EXPECT_EQ(err->type, "not_found_error");
  EXPECT_EQ(err->param, "model");
  EXPECT_EQ(err->message, "The model `gpt-4o` does not exist.");

  // Absent means the served model.
  p.model.clear();
  PreparedRequest out;
  ASSERT_FALSE(Prepare(p, &out));
  EXPECT_EQ(out.params.model, kServed);
}

TEST_F(FrontendTest, ContextOverflowSaysBothNumbers) {
  Build();
  const int ctx = frontend_->context_length();
  ASSERT_EQ(ctx, 512);
  GenerationParams p = Completion("");
  p.prompt_is_ids = true;
  p.prompt_ids.assign(ctx, 300);  // fills the context
  auto err = Prepare(p);
  ASSERT_TRUE(err);
  EXPECT_EQ(err->http_status, 400);
  EXPECT_EQ(err->param, "prompt");
  EXPECT_NE(err->message.find("512 tokens"), std::string::npos) << err->message;

  p.prompt_ids.assign(500, 300);
  p.max_tokens = 20;
  err = Prepare(p);
  ASSERT_TRUE(err);
  EXPECT_EQ(err->param, "max_tokens");
  EXPECT_NE(err->message.find("500 tokens and max_tokens is 20"), std::string::npos)
      << err->message;
  EXPECT_NE(err->message.find("512"), std::string::npos) << err->message;

  // A huge max_tokens does not overflow into acceptance.
  p.max_tokens = INT_MAX;
  err = Prepare(p);
  ASSERT_TRUE(err);
  EXPECT_NE(err->message.find("2147483647"), std::string::npos) << err->message;

  // Without max_tokens: the rest of the context.
  p.max_tokens.reset();
  PreparedRequest out;
  ASSERT_FALSE(Prepare(p, &out));
  EXPECT_EQ(out.max_tokens, 12);
  p.max_tokens = 12;
  ASSERT_FALSE(Prepare(p, &out));
}

TEST_F(FrontendTest, BadValuesName400Params) {
  Build();
  struct Case {
    const char* param;
    std::function<void(GenerationParams&)> set;
  };
  const std::vector<Case> cases = {
      {"temperature", [](GenerationParams& p) { p.sampling.temperature = 2.5f; }},
      {"top_p", [](GenerationParams& p) { p.sampling.top_p = 0.0f; }},
      {"top_k", [](GenerationParams& p) { p.sampling.top_k = -5; }},
      {"min_p", [](GenerationParams& p) { p.sampling.min_p = 1.5f; }},
      {"presence_penalty", [](GenerationParams& p) { p.sampling.presence_penalty = 3; }},
      {"frequency_penalty", [](GenerationParams& p) { p.sampling.frequency_penalty = -3; }},
      {"repetition_penalty", [](GenerationParams& p) { p.sampling.repetition_penalty = 0; }},
      {"logit_bias",
       [](GenerationParams& p) {
         p.sampling.logit_bias = {{100000, 1.0f}};
       }},
      {"top_logprobs", [](GenerationParams& p) { p.sampling.top_logprobs = 21; }},
      {"n", [](GenerationParams& p) { p.n = 5; }},
      {"n", [](GenerationParams& p) { p.n = 0; }},
      {"stop",
       [](GenerationParams& p) {
         p.stop = {"a", "b", "c", "d", "e"};
       }},
      {"stop_token_ids", [](GenerationParams& p) { p.stop_token_ids = {512}; }},
      {"prompt",
       [](GenerationParams& p) {
         p.prompt_is_ids = true;
         p.prompt_ids = {1, 512};
       }},
      {"prompt",
       [](GenerationParams& p) {
         p.prompt_is_ids = true;
         p.prompt_ids = {};
       }},
      {"max_tokens", [](GenerationParams& p) { p.max_tokens = 0; }},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.param);
    GenerationParams p = Completion("the day");
    c.set(p);
    auto err = Prepare(p);
    ASSERT_TRUE(err);
    EXPECT_EQ(err->http_status, 400);
    EXPECT_EQ(err->type, "invalid_request_error");
    EXPECT_EQ(err->param, c.param);
    EXPECT_FALSE(err->message.empty());
  }
  // The chat prompt is named "messages".
  GenerationParams p = Chat();
  p.messages.clear();
  auto err = Prepare(p);
  ASSERT_TRUE(err);
  EXPECT_EQ(err->param, "messages");
}

TEST_F(FrontendTest, PromptsTokenizeAsTheModelLoaderDoes) {
  Build();
  const LoadedModel& m = Model();
  PreparedRequest out;
  ASSERT_FALSE(Prepare(Chat(), &out));
  auto chat_ids = TokenizeChat(m, Chat().messages);
  ASSERT_TRUE(chat_ids.ok());
  EXPECT_EQ(out.prompt, *chat_ids);
  EXPECT_NE(out.prompt_text.find("once upon a time"), std::string::npos);
  EXPECT_EQ(out.max_tokens, frontend_->context_length() - static_cast<int>(out.prompt.size()));

  ASSERT_FALSE(Prepare(Completion("once upon a time there was a tree"), &out));
  EXPECT_EQ(out.prompt, TokenizePrompt(m, "once upon a time there was a tree"));
  EXPECT_EQ(out.prompt_text, "once upon a time there was a tree");

  GenerationParams no_bos = Completion("once upon a time");
  no_bos.add_special_tokens = false;
  ASSERT_FALSE(Prepare(no_bos, &out));
  EXPECT_EQ(out.prompt, m.tokenizer->Encode("once upon a time", false, true));
  if (m.tokenizer->add_bos()) {
    ASSERT_FALSE(out.prompt.empty());
    EXPECT_NE(out.prompt[0], m.tokenizer->bos_id());
  }

  GenerationParams ids = Completion("");
  ids.prompt_is_ids = true;
  ids.prompt_ids = {1, 300, 301};
  ASSERT_FALSE(Prepare(ids, &out));
  EXPECT_EQ(out.prompt, ids.prompt_ids);

  // /tokenize and /detokenize.
  std::vector<int32_t> toks;
  ASSERT_FALSE(frontend_->Tokenize(Completion("the day"), &toks));
  EXPECT_EQ(toks, TokenizePrompt(m, "the day"));
  std::string text;
  ASSERT_FALSE(frontend_->Detokenize(toks, &text));
  EXPECT_EQ(text, m.tokenizer->Decode(toks, false));
  const int32_t bad[] = {5, 100000};
  auto err = frontend_->Detokenize(bad, &text);
  ASSERT_TRUE(err);
  EXPECT_EQ(err->param, "tokens");
  GenerationParams other = Completion("x");
  other.model = "nope";
  err = frontend_->Tokenize(other, &toks);
  ASSERT_TRUE(err);
  EXPECT_EQ(err->http_status, 404);
}

TEST_F(FrontendTest, GreedyCompletionThroughTheEngineLoopEqualsGenerate) {
  Build();
  GenerationParams p = Completion("once upon a time there was a little tree");
  p.sampling.temperature = 0;
  p.max_tokens = 24;
  p.ignore_eos = true;
  PreparedRequest req;
  ASSERT_FALSE(Prepare(p, &req));
  GenerateOutput ref = Reference(req.prompt, 24, p.sampling);
  ASSERT_EQ(ref.tokens.size(), 24u);

  engine_->Start();
  Collector c;
  std::shared_ptr<Call> call;
  auto err = frontend_->Start(req, c.Fn(), &call);
  ASSERT_FALSE(err) << err->message;
  ASSERT_NE(call, nullptr);
  EXPECT_EQ(call->ids().size(), 1u);
  ASSERT_TRUE(c.WaitFinished(1));
  std::lock_guard<std::mutex> lock(c.mu);
  EXPECT_EQ(c.tokens[0], ref.tokens);
  EXPECT_EQ(c.text[0], ref.text);
  EXPECT_EQ(c.reason[0], "length");
  // The observer saw every event before the protocol did.
  EXPECT_EQ(observer_.events(), c.events);
  EXPECT_EQ(observer_.finished(), 1);
}

TEST_F(FrontendTest, SeededChoicesUseSeedPlusIndex) {
  Build();
  GenerationParams p = Completion("the little friend said");
  p.sampling.temperature = 1.0f;
  p.sampling.seed = 1234;
  p.max_tokens = 12;
  p.n = 3;
  p.ignore_eos = true;
  PreparedRequest req;
  ASSERT_FALSE(Prepare(p, &req));
  Collector c;
  std::shared_ptr<Call> call;
  ASSERT_FALSE(frontend_->Start(req, c.Fn(), &call));
  EXPECT_EQ(call->ids().size(), 3u);
  StepUntil(c, 3);
  for (int i = 0; i < 3; ++i) {
    SamplingParams s = p.sampling;
    s.seed = 1234 + i;
    GenerateOutput ref = Reference(req.prompt, 12, s);
    EXPECT_EQ(c.tokens[i], ref.tokens) << "choice " << i;
  }
  // Different seeds gave different samples (not three copies of one).
  EXPECT_FALSE(c.tokens[0] == c.tokens[1] && c.tokens[1] == c.tokens[2]);
}

TEST_F(FrontendTest, QueueFullIs429AndCancelsTheChoicesAlreadySubmitted) {
  scheduler::EngineOptions eo;
  eo.max_waiting = 2;
  Build(eo);
  GenerationParams p = Completion("the day");
  p.max_tokens = 4;
  p.n = 3;
  PreparedRequest req;
  ASSERT_FALSE(Prepare(p, &req));
  Collector c;
  std::shared_ptr<Call> call;
  auto err = frontend_->Start(req, c.Fn(), &call);
  ASSERT_TRUE(err);
  EXPECT_EQ(err->http_status, 429);
  EXPECT_EQ(err->type, "rate_limit_error");
  EXPECT_EQ(call, nullptr);
  // The two submitted choices are cancelled: the engine ends them ("abort",
  // seen by the observer) but the failed request's callback never runs.
  for (int i = 0; i < 20 && engine_->num_unfinished() > 0; ++i) ASSERT_TRUE(engine_->Step().ok());
  EXPECT_EQ(engine_->num_unfinished(), 0);
  EXPECT_EQ(observer_.finished(), 2);
  std::lock_guard<std::mutex> lock(c.mu);
  EXPECT_EQ(c.events, 0);
}

TEST_F(FrontendTest, DrainingIs503AndCancelAborts) {
  Build();
  GenerationParams p = Completion("the day");
  p.max_tokens = 200;
  p.ignore_eos = true;
  PreparedRequest req;
  ASSERT_FALSE(Prepare(p, &req));

  Collector c;
  std::shared_ptr<Call> call;
  ASSERT_FALSE(frontend_->Start(req, c.Fn(), &call));
  ASSERT_TRUE(engine_->Step().ok());
  call->Cancel();
  StepUntil(c, 1);
  {
    std::lock_guard<std::mutex> lock(c.mu);
    EXPECT_EQ(c.reason[0], "abort");
    EXPECT_LT(c.tokens[0].size(), 200u);
  }

  engine_->BeginDrain();
  Collector d;
  auto err = frontend_->Start(req, d.Fn(), &call);
  ASSERT_TRUE(err);
  EXPECT_EQ(err->http_status, 503);
  EXPECT_EQ(err->type, "service_unavailable_error");
}

// ---- OpenAiRoutes over a fake ResponseWriter ----

class FakeWriter : public ResponseWriter {
 public:
  void Send(int status, std::string content_type, std::string body, HeaderList headers) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (complete_) return;
    status_ = status;
    content_type_ = std::move(content_type);
    body_ = std::move(body);
    headers_ = std::move(headers);
    complete_ = true;
    cv_.notify_all();
  }
  void StartStream(int status, std::string content_type, HeaderList headers) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (complete_ || streaming_) return;
    status_ = status;
    content_type_ = std::move(content_type);
    headers_ = std::move(headers);
    streaming_ = true;
  }
  bool Write(std::string data) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (closed_ || complete_) return false;
    writes_.push_back(std::move(data));
    cv_.notify_all();
    return true;
  }
  uint64_t buffered_bytes() const override { return 0; }
  bool over_buffer_limit() const override { return false; }
  void OnDrained(std::function<void()> f) override { f(); }
  void End() override {
    std::lock_guard<std::mutex> lock(mu_);
    complete_ = true;
    cv_.notify_all();
  }
  void OnClose(std::function<void()> f) override {
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!closed_) {
        on_close_.push_back(std::move(f));
        return;
      }
    }
    f();
  }
  bool closed() const override {
    std::lock_guard<std::mutex> lock(mu_);
    return closed_;
  }
  void AddLogField(std::string key, std::string value) override {
    std::lock_guard<std::mutex> lock(mu_);
    fields_[key] = value;
  }

  // The client hangs up.
  void Close() {
    std::vector<std::function<void()>> fs;
    {
      std::lock_guard<std::mutex> lock(mu_);
      closed_ = true;
      fs.swap(on_close_);
    }
    for (auto& f : fs) f();
  }
  bool WaitComplete() {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(60), [&] { return complete_; });
  }
  bool WaitWrites(size_t n) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::seconds(60),
                        [&] { return writes_.size() >= n || complete_; });
  }
  int status() const {
    std::lock_guard<std::mutex> lock(mu_);
    return status_;
  }
  nlohmann::json Json() const {
    std::lock_guard<std::mutex> lock(mu_);
    return nlohmann::json::parse(body_);
  }
  std::vector<std::string> writes() const {
    std::lock_guard<std::mutex> lock(mu_);
    return writes_;
  }
  std::string header(const std::string& name) const {
    std::lock_guard<std::mutex> lock(mu_);
    for (const auto& [k, v] : headers_)
      if (k == name) return v;
    return {};
  }
  std::string field(const std::string& key) const {
    std::lock_guard<std::mutex> lock(mu_);
    auto it = fields_.find(key);
    return it == fields_.end() ? std::string("<none>") : it->second;
  }
  std::string content_type() const {
    std::lock_guard<std::mutex> lock(mu_);
    return content_type_;
  }
  bool streaming() const {
    std::lock_guard<std::mutex> lock(mu_);
    return streaming_;
  }

 private:
  mutable std::mutex mu_;
  std::condition_variable cv_;
  int status_ = 0;
  std::string content_type_, body_;
  HeaderList headers_;
  bool streaming_ = false, complete_ = false, closed_ = false;
  std::vector<std::string> writes_;
  std::vector<std::function<void()>> on_close_;
  std::map<std::string, std::string> fields_;
};

class RoutesTest : public FrontendTest {
 protected:
  void SetUp() override {
    FrontendTest::SetUp();
    Build();
    engine_->Start();
    routes_ = std::make_unique<OpenAiRoutes>(*frontend_);
  }

  std::shared_ptr<FakeWriter> Call(const std::string& method, const std::string& path,
                                   const std::string& body, bool* handled = nullptr) {
    HttpRequest req;
    req.method = method;
    req.path = path;
    req.target = path;
    req.body = body;
    req.request_id = "req42";
    auto w = std::make_shared<FakeWriter>();
    bool h = routes_->Handle(req, w);
    if (handled != nullptr) *handled = h;
    return w;
  }

  // SSE events of a finished stream, parsed; "[DONE]" as a string.
  static std::vector<nlohmann::json> Events(const std::vector<std::string>& writes) {
    std::vector<nlohmann::json> out;
    for (const std::string& w : writes) {
      EXPECT_TRUE(w.starts_with("data: ") && w.ends_with("\n\n")) << w;
      std::string payload = w.substr(6, w.size() - 8);
      out.push_back(payload == "[DONE]" ? nlohmann::json("[DONE]")
                                        : nlohmann::json::parse(payload));
    }
    return out;
  }

  std::unique_ptr<OpenAiRoutes> routes_;
};

TEST_F(RoutesTest, NonStreamingCompletion) {
  const LoadedModel& m = Model();
  auto w =
      Call("POST", "/v1/completions",
           R"({"model":"tiny-test","prompt":"once upon a time","max_tokens":6,"temperature":0,)"
           R"("ignore_eos":true,"logprobs":2})");
  ASSERT_TRUE(w->WaitComplete());
  ASSERT_EQ(w->status(), 200);
  EXPECT_EQ(w->content_type(), "application/json");
  const std::vector<int32_t> prompt = TokenizePrompt(m, "once upon a time");
  SamplingParams greedy;
  greedy.temperature = 0;
  GenerateOutput ref = Reference(prompt, 6, greedy);
  nlohmann::json j = w->Json();
  EXPECT_EQ(j["id"], "cmpl-req42");
  EXPECT_EQ(j["object"], "text_completion");
  EXPECT_EQ(j["model"], kServed);
  ASSERT_EQ(j["choices"].size(), 1u);
  EXPECT_EQ(j["choices"][0]["text"], ref.text);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  const auto& lp = j["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), 6u);
  EXPECT_EQ(lp["text_offset"][0], 0);
  EXPECT_GE(lp["top_logprobs"][0].size(), 1u);
  EXPECT_LE(lp["token_logprobs"][0].get<double>(), 0.0);
  EXPECT_EQ(j["usage"]["prompt_tokens"], prompt.size());
  EXPECT_EQ(j["usage"]["completion_tokens"], 6);
  EXPECT_EQ(j["usage"]["total_tokens"], prompt.size() + 6);
  EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  EXPECT_EQ(j["usage"]["prompt_tokens_details"]["cached_tokens_by_tier"]["device"], 0);
  EXPECT_EQ(w->field("prompt_tokens"), std::to_string(prompt.size()));
  EXPECT_EQ(w->field("completion_tokens"), "6");
  EXPECT_EQ(w->field("cached_tokens"), "0");
  EXPECT_EQ(w->field("finish_reason"), "length");
  EXPECT_NE(w->field("ttft_ms"), "<none>");

  // echo prepends the prompt text to every choice.
  w = Call(
      "POST", "/v1/completions",
      R"({"prompt":"once upon a time","max_tokens":6,"temperature":0,"ignore_eos":true,"echo":true,"n":2})");
  ASSERT_TRUE(w->WaitComplete());
  ASSERT_EQ(w->status(), 200);
  j = w->Json();
  ASSERT_EQ(j["choices"].size(), 2u);
  for (int i : {0, 1}) {
    EXPECT_EQ(j["choices"][i]["index"], i);
    EXPECT_EQ(j["choices"][i]["text"], "once upon a time" + ref.text);
  }
  EXPECT_EQ(j["usage"]["prompt_tokens"], prompt.size());
  EXPECT_EQ(j["usage"]["completion_tokens"], 12);
}

TEST_F(RoutesTest, StreamingChatWithUsage) {
  const LoadedModel& m = Model();
  auto w =
      Call("POST", "/v1/chat/completions",
           R"({"messages":[{"role":"user","content":"the day"}],"max_tokens":8,"temperature":0,)"
           R"("ignore_eos":true,"stream":true,"stream_options":{"include_usage":true},"n":2,)"
           R"("logprobs":true,"top_logprobs":1})");
  ASSERT_TRUE(w->WaitComplete());
  EXPECT_EQ(w->status(), 200);
  EXPECT_TRUE(w->streaming());
  EXPECT_EQ(w->content_type(), "text/event-stream");
  EXPECT_EQ(w->header("cache-control"), "no-cache");
  auto prompt = TokenizeChat(m, {{"user", "the day"}});
  ASSERT_TRUE(prompt.ok());
  SamplingParams greedy;
  greedy.temperature = 0;
  GenerateOutput ref = Reference(*prompt, 8, greedy);

  auto events = Events(w->writes());
  ASSERT_GE(events.size(), 4u);
  EXPECT_EQ(events.back(), "[DONE]");
  const nlohmann::json& usage = events[events.size() - 2];
  EXPECT_EQ(usage["choices"], nlohmann::json::array());
  EXPECT_EQ(usage["usage"]["prompt_tokens"], prompt->size());
  EXPECT_EQ(usage["usage"]["completion_tokens"], 16);
  EXPECT_TRUE(usage["usage"]["prompt_tokens_details"].contains("cached_tokens"));
  EXPECT_TRUE(usage["usage"]["prompt_tokens_details"]["cached_tokens_by_tier"].contains("remote"));
  std::map<int, std::string> content;
  std::map<int, int> role_chunks, logprob_tokens;
  std::map<int, std::string> finish;
  for (size_t i = 0; i + 2 < events.size(); ++i) {
    const auto& e = events[i];
    EXPECT_EQ(e["id"], "chatcmpl-req42");
    EXPECT_EQ(e["object"], "chat.completion.chunk");
    EXPECT_TRUE(e.contains("usage") && e["usage"].is_null());
    ASSERT_EQ(e["choices"].size(), 1u);
    const auto& c = e["choices"][0];
    int idx = c["index"];
    if (c["delta"].contains("role")) {
      EXPECT_EQ(c["delta"]["role"], "assistant");
      EXPECT_TRUE(content[idx].empty()) << "role chunk comes first";
      ++role_chunks[idx];
    }
    if (c["delta"].contains("content")) content[idx] += c["delta"]["content"].get<std::string>();
    if (!c["logprobs"].is_null())
      logprob_tokens[idx] += static_cast<int>(c["logprobs"]["content"].size());
    if (!c["finish_reason"].is_null()) finish[idx] = c["finish_reason"];
  }
  for (int idx : {0, 1}) {
    EXPECT_EQ(role_chunks[idx], 1);
    EXPECT_EQ(content[idx], ref.text);
    EXPECT_EQ(logprob_tokens[idx], 8);
    EXPECT_EQ(finish[idx], "length");
  }
}

TEST_F(RoutesTest, ClientHangUpCancelsTheStream) {
  auto w = Call("POST", "/v1/completions",
                R"({"prompt":"the day","max_tokens":400,"ignore_eos":true,"stream":true})");
  ASSERT_TRUE(w->WaitWrites(2));
  w->Close();
  for (int i = 0; i < 6000 && engine_->num_unfinished() > 0; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  EXPECT_EQ(engine_->num_unfinished(), 0);
  auto stats = engine_->Stats();
  EXPECT_EQ(stats.finished_by_reason["abort"], 1u);
  EXPECT_LT(stats.generation_tokens, 400u);
}

TEST_F(RoutesTest, ErrorsAndSmallRoutes) {
  bool handled = true;
  auto w = Call("GET", "/health", "", &handled);
  EXPECT_FALSE(handled);
  EXPECT_EQ(w->status(), 0);

  w = Call("GET", "/v1/completions", "", &handled);
  EXPECT_TRUE(handled);
  EXPECT_EQ(w->status(), 405);
  EXPECT_EQ(w->header("allow"), "POST");
  EXPECT_EQ(w->Json()["error"]["type"], "invalid_request_error");

  w = Call("POST", "/v1/chat/completions", "{not json");
  EXPECT_EQ(w->status(), 400);
  EXPECT_NE(w->Json()["error"]["message"].get<std::string>().find("Invalid JSON"),
            std::string::npos);

  w = Call("POST", "/v1/chat/completions",
           R"({"model":"gpt-4","messages":[{"role":"user","content":"x"}]})");
  EXPECT_EQ(w->status(), 404);
  EXPECT_EQ(w->Json()["error"]["param"], "model");

  w = Call("POST", "/v1/completions", R"({"prompt":[1,2,3],"max_tokens":100000})");
  EXPECT_EQ(w->status(), 400);
  EXPECT_EQ(w->Json()["error"]["param"], "max_tokens");

  w = Call("GET", "/v1/models", "");
  ASSERT_EQ(w->status(), 200);
  auto models = w->Json();
  EXPECT_EQ(models["object"], "list");
  ASSERT_EQ(models["data"].size(), 1u);
  EXPECT_EQ(models["data"][0]["id"], kServed);
  EXPECT_EQ(models["data"][0]["object"], "model");
  EXPECT_EQ(models["data"][0]["owned_by"], "strata");
  EXPECT_EQ(models["data"][0]["max_model_len"], 512);
  w = Call("GET", std::string("/v1/models/") + kServed, "");
  EXPECT_EQ(w->status(), 200);
  EXPECT_EQ(w->Json()["id"], kServed);
  w = Call("GET", "/v1/models/other", "");
  EXPECT_EQ(w->status(), 404);

  w = Call("POST", "/tokenize", R"({"prompt":"the day"})");
  ASSERT_EQ(w->status(), 200);
  auto tok = w->Json();
  const auto expect = TokenizePrompt(Model(), "the day");
  EXPECT_EQ(tok["tokens"].get<std::vector<int32_t>>(), expect);
  EXPECT_EQ(tok["count"], expect.size());
  EXPECT_EQ(tok["max_model_len"], 512);

  w = Call("POST", "/detokenize", nlohmann::json{{"tokens", expect}}.dump());
  ASSERT_EQ(w->status(), 200);
  EXPECT_EQ(w->Json()["prompt"], Model().tokenizer->Decode(expect, false));
  w = Call("POST", "/detokenize", R"({"tokens":[99999]})");
  EXPECT_EQ(w->status(), 400);

  // After all that, a good request still works.
  w = Call("POST", "/v1/chat/completions",
           R"({"messages":[{"role":"user","content":"x"}],"max_tokens":2})");
  ASSERT_TRUE(w->WaitComplete());
  EXPECT_EQ(w->status(), 200);
  EXPECT_EQ(w->Json()["choices"][0]["message"]["role"], "assistant");
}

TEST_F(RoutesTest, ForwardErrorBeforeAnyOutputIs500) {
  runner_->FailAfter(0);
  auto w = Call("POST", "/v1/completions", R"({"prompt":"the day","max_tokens":5})");
  ASSERT_TRUE(w->WaitComplete());
  EXPECT_EQ(w->status(), 500);
  EXPECT_EQ(w->Json()["error"]["type"], "server_error");
  EXPECT_NE(w->Json()["error"]["message"].get<std::string>().find("injected forward failure"),
            std::string::npos);

  // Streaming had not started: a plain 500 too.
  w = Call("POST", "/v1/chat/completions",
           R"({"messages":[{"role":"user","content":"x"}],"max_tokens":5,"stream":true})");
  ASSERT_TRUE(w->WaitComplete());
  EXPECT_EQ(w->status(), 500);
  EXPECT_FALSE(w->streaming());
  EXPECT_EQ(w->Json()["error"]["type"], "server_error");

  runner_->FailAfter(-1);
  w = Call("POST", "/v1/completions", R"({"prompt":"the day","max_tokens":5})");
  ASSERT_TRUE(w->WaitComplete());
  EXPECT_EQ(w->status(), 200);
}

TEST_F(RoutesTest, ForwardErrorMidStreamSendsAnErrorChunk) {
  runner_->FailAfter(3);  // prefill and two decode steps succeed
  auto w = Call(
      "POST", "/v1/completions",
      R"({"prompt":"the day","max_tokens":50,"ignore_eos":true,"temperature":0,"stream":true})");
  ASSERT_TRUE(w->WaitComplete());
  EXPECT_EQ(w->status(), 200);
  EXPECT_TRUE(w->streaming());
  auto events = Events(w->writes());
  ASSERT_GE(events.size(), 2u);
  EXPECT_EQ(events.back(), "[DONE]");
  const auto& err = events[events.size() - 2];
  ASSERT_TRUE(err.contains("error")) << err.dump();
  EXPECT_EQ(err["error"]["type"], "server_error");
  // Text came before the error.
  std::string text;
  for (size_t i = 0; i + 2 < events.size(); ++i)
    text += events[i]["choices"][0]["text"].get<std::string>();
  EXPECT_FALSE(text.empty());
  runner_->FailAfter(-1);
}

}  // namespace
}  // namespace strata::server
