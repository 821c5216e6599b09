// AdminRoutes (/admin/cache/*) and ServerMetrics on a real engine stack:
// stories260K, a device pool and a host tier. Requests go through the
// Frontend (so the metrics observer sees real engine events); the engine is
// stepped by the test, which runs the lookup and flush tasks the routes post.

#include "server/admin_routes.h"

#include <gtest/gtest.h>

#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>

#include "kvcache/host_store.h"
#include "model/model_loader.h"
#include "server/metrics.h"
#include "tests/support/test_env.h"
#include "common/thread_pool.h"
#include "model/forward.h"
#include "model/generate.h"
#include "scheduler/engine.h"
#include "kvcache/kv_manager.h"

namespace strata::server {
namespace {

using nlohmann::json;

constexpr int kBlockSize = 4;
constexpr int kDeviceBlocks = 64;
const char* kModelName = "stories260K";
const char* kToken = "s3cret";

// Captures the one response of a request.
class FakeWriter final : public ResponseWriter {
 public:
  void Send(int status, std::string content_type, std::string body, HeaderList) override {
    std::lock_guard<std::mutex> lock(mu_);
    if (done_) return;
    status_ = status;
    content_type_ = std::move(content_type);
    body_ = std::move(body);
    done_ = true;
  }
  void StartStream(int, std::string, HeaderList) override {
    ADD_FAILURE() << "admin routes never stream";
  }
  bool Write(std::string) override { return false; }
  void End() override {}
  void OnClose(std::function<void()>) override {}
  bool closed() const override { return false; }
  void AddLogField(std::string, std::string) override {}
  uint64_t buffered_bytes() const override { return 0; }
  bool over_buffer_limit() const override { return false; }
  void OnDrained(std::function<void()> f) override { f(); }

  bool done() const {
    std::lock_guard<std::mutex> lock(mu_);
    return done_;
  }
  int status() const { return status_; }
  const std::string& content_type() const { return content_type_; }
  const std::string& body() const { return body_; }

 private:
  mutable std::mutex mu_;
  bool done_ = false;
  int status_ = 0;
  std::string content_type_, body_;
};

struct Reply {
  bool handled = false;
  int status = 0;
  json body;
};

class AdminRoutesTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto m = LoadModel(testing::Stories260KPath());
    ASSERT_TRUE(m.ok()) << m.error().ToString();
    model_ = std::move(m).value();
    threads_ = std::make_unique<ThreadPool>(1);
    KvOptions kv;
    kv.block_size = kBlockSize;
    kv.dtype = DType::kF32;
    kv.num_blocks = kDeviceBlocks;
    fwd_ = std::move(ForwardEngine::Create(model_->weights, kv, threads_.get())).value();
    const uint64_t block_bytes = fwd_->kv_layout().block_bytes();
    host_ = std::move(kvcache::HostStore::Create({256 * block_bytes, block_bytes, false})).value();
    kvcache::KvManagerOptions o;
    o.block_size = kBlockSize;
    o.num_device_blocks = kDeviceBlocks;
    o.block_bytes = block_bytes;
    o.ns = kvcache::NamespaceDigest(model_->weights.digest, model_->weights.config.arch, "f32",
                                    kBlockSize);
    o.load_policy = kvcache::LoadPolicy::kAlways;
    auto mem = [e = fwd_.get()](BlockId id) {
      return e->block_data(static_cast<int32_t>(id.value()));
    };
    std::vector<kvcache::LowerTier> tiers = {
        {host_.get(), kvcache::WritePolicy::kWriteThrough, 0, 0}};
    kv_ = std::move(kvcache::KvManager::Create(o, mem, std::move(tiers), &clock_)).value();
    runner_ = std::make_unique<scheduler::ForwardEngineRunner>(fwd_.get());
    engine_ = std::move(scheduler::Engine::Create({}, runner_.get(), kv_.get(),
                                                  model_->tokenizer.get(), &clock_))
                  .value();
    metrics_ = std::make_unique<ServerMetrics>(kModelName, model_->weights.config.context_length);
    FrontendOptions fo;
    fo.served_model_name = kModelName;
    fo.observer = metrics_.get();
    frontend_ = std::make_unique<Frontend>(*model_, *engine_, fo);
    admin_ = std::make_unique<AdminRoutes>(*frontend_, kToken);
  }

  // Sends one admin request and steps the engine until it is answered.
  Reply Admin(const std::string& method, const std::string& path, const std::string& body = "",
              const std::string& token = kToken) {
    HttpRequest req;
    req.method = method;
    req.path = path;
    req.target = path;
    req.body = body;
    if (!token.empty()) req.headers["authorization"] = "Bearer " + token;
    auto w = std::make_shared<FakeWriter>();
    Reply r;
    r.handled = admin_->Handle(req, w);
    for (int i = 0; i < 100 && r.handled && !w->done(); ++i) {
      auto s = engine_->Step();
      EXPECT_TRUE(s.ok()) << s.error().ToString();
    }
    if (!r.handled) return r;
    EXPECT_TRUE(w->done()) << method << " " << path << " was never answered";
    EXPECT_EQ(w->content_type(), "application/json");
    r.status = w->status();
    r.body = json::parse(w->body(), nullptr, false);
    EXPECT_TRUE(r.body.is_object()) << w->body();
    return r;
  }

  // Runs a greedy completion of `text` to the end; returns its prompt size.
  size_t Complete(const std::string& text, int max_tokens, const std::string& salt = "") {
    GenerationParams p;
    p.kind = ApiKind::kCompletion;
    p.model = kModelName;
    p.prompt_text = text;
    p.max_tokens = max_tokens;
    p.sampling.temperature = 0;
    p.ignore_eos = true;
    p.cache_salt = salt;
    PreparedRequest prepared;
    auto e = frontend_->Prepare(p, &prepared);
    EXPECT_FALSE(e.has_value()) << (e ? e->message : "");
    std::shared_ptr<Call> call;
    bool finished = false;
    e = frontend_->Start(
        prepared,
        [&finished](int, scheduler::RequestOutput&& ev) { finished = finished || ev.finished; },
        &call);
    EXPECT_FALSE(e.has_value()) << (e ? e->message : "");
    for (int i = 0; i < 10000 && !finished; ++i) {
      clock_.Advance(1'000'000);  // 1 ms per step, so timings are not all zero
      auto s = engine_->Step();
      EXPECT_TRUE(s.ok()) << s.error().ToString();
    }
    EXPECT_TRUE(finished);
    return prepared.prompt.size();
  }

  static std::string LookupBody(const std::string& prompt, const std::string& salt = "") {
    json b = {{"prompt", prompt}};
    if (!salt.empty()) b["cache_salt"] = salt;
    return b.dump();
  }

  kvcache::ManualClock clock_;
  std::unique_ptr<LoadedModel> model_;
  std::unique_ptr<ThreadPool> threads_;
  std::unique_ptr<ForwardEngine> fwd_;
  std::unique_ptr<kvcache::HostStore> host_;
  std::unique_ptr<kvcache::KvManager> kv_;
  std::unique_ptr<scheduler::ForwardEngineRunner> runner_;
  std::unique_ptr<scheduler::Engine> engine_;
  std::unique_ptr<ServerMetrics> metrics_;
  std::unique_ptr<Frontend> frontend_;
  std::unique_ptr<AdminRoutes> admin_;
};

const std::string kPrompt =
    "Once upon a time, there was a little girl named Lily. She loved to play";

TEST_F(AdminRoutesTest, TokenIsRequiredAndOtherPathsAreNotOurs) {
  Reply r = Admin("GET", "/admin/cache/stats", "", "");
  ASSERT_TRUE(r.handled);
  EXPECT_EQ(r.status, 401);
  EXPECT_EQ(r.body["error"]["type"], "authentication_error");
  r = Admin("GET", "/admin/cache/stats", "", "wrong");
  EXPECT_EQ(r.status, 401);
  r = Admin("POST", "/admin/cache/flush", "{}", "s3cre");  // a prefix of the token is not the token
  EXPECT_EQ(r.status, 401);
  EXPECT_EQ(host_->stats().blocks, 0u);

  r = Admin("GET", "/v1/models");
  EXPECT_FALSE(r.handled);
  r = Admin("GET", "/administrator");
  EXPECT_FALSE(r.handled);

  r = Admin("GET", "/admin/cache/stats");
  EXPECT_EQ(r.status, 200);
}

TEST_F(AdminRoutesTest, NoTokenConfiguredMeansOpen) {
  AdminRoutes open(*frontend_, "");
  HttpRequest req;
  req.method = "GET";
  req.path = "/admin/cache/stats";
  auto w = std::make_shared<FakeWriter>();
  ASSERT_TRUE(open.Handle(req, w));
  EXPECT_EQ(w->status(), 200);
}

TEST_F(AdminRoutesTest, BadRequestsGetOpenAiErrors) {
  struct Case {
    const char* method;
    const char* path;
    const char* body;
    int status;
    const char* param;  // "" = none expected
  };
  const Case cases[] = {
      {"POST", "/admin/cache/stats", "", 405, ""},
      {"GET", "/admin/cache/lookup", "", 405, ""},
      {"GET", "/admin/cache/flush", "", 405, ""},
      {"GET", "/admin/nothing", "", 404, ""},
      {"POST", "/admin/cache/lookup", "{not json", 400, ""},
      {"POST", "/admin/cache/lookup", "[1,2]", 400, ""},
      {"POST", "/admin/cache/lookup", "{}", 400, "prompt"},
      {"POST", "/admin/cache/lookup", R"({"tokens": []})", 400, "tokens"},
      {"POST", "/admin/cache/lookup", R"({"tokens": [1, -2]})", 400, "tokens"},
      {"POST", "/admin/cache/lookup", R"({"tokens": "1,2"})", 400, "tokens"},
      {"POST", "/admin/cache/lookup", R"({"tokens": [1], "prompt": "x"})", 400, "tokens"},
      {"POST", "/admin/cache/lookup", R"({"prompt": 7})", 400, "prompt"},
      {"POST", "/admin/cache/lookup", R"({"prompt": "x", "cache_salt": 1})", 400, "cache_salt"},
      {"POST", "/admin/cache/flush", R"({"tiers": ["gpu"]})", 400, "tiers"},
      {"POST", "/admin/cache/flush", R"({"tiers": "device"})", 400, "tiers"},
      {"POST", "/admin/cache/flush", R"({"tiers": []})", 400, "tiers"},
      {"POST", "/admin/cache/flush", R"({"tiers": ["disk"]})", 400,
       "tiers"},  // not configured here
      {"POST", "/admin/cache/flush", R"({"all_namespaces": "yes"})", 400, "all_namespaces"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(std::string(c.method) + " " + c.path + " " + c.body);
    Reply r = Admin(c.method, c.path, c.body);
    ASSERT_TRUE(r.handled);
    EXPECT_EQ(r.status, c.status);
    ASSERT_TRUE(r.body.contains("error")) << r.body.dump();
    EXPECT_TRUE(r.body["error"]["message"].is_string());
    EXPECT_TRUE(r.body["error"]["type"].is_string());
    if (*c.param != '\0') {
      EXPECT_EQ(r.body["error"]["param"], c.param);
    }
  }
  // Still serving afterwards.
  EXPECT_EQ(Admin("GET", "/admin/cache/stats").status, 200);
}

TEST_F(AdminRoutesTest, LookupReportsWhatARequestWouldHitAndFlushRemovesIt) {
  Reply r = Admin("POST", "/admin/cache/lookup", LookupBody(kPrompt));
  ASSERT_EQ(r.status, 200) << r.body.dump();
  EXPECT_EQ(r.body["cached_tokens"], 0);

  const size_t n = Complete(kPrompt, 4);
  const int expect = static_cast<int>((n - 1) / kBlockSize) * kBlockSize;
  ASSERT_GT(expect, 0);
  r = Admin("POST", "/admin/cache/lookup", LookupBody(kPrompt));
  ASSERT_EQ(r.status, 200) << r.body.dump();
  EXPECT_EQ(r.body["prompt_tokens"], n);
  EXPECT_EQ(r.body["cached_tokens"], expect);
  EXPECT_EQ(r.body["blocks"], expect / kBlockSize);
  EXPECT_EQ(r.body["block_size"], kBlockSize);
  EXPECT_EQ(r.body["by_tier"]["device"], expect);
  EXPECT_EQ(r.body["by_tier"]["host"], 0);  // device first: nothing left for host
  EXPECT_EQ(r.body["by_tier"]["disk"], 0);

  // Token ids and chat messages are other ways to name a prompt.
  std::vector<int32_t> ids = TokenizePrompt(*model_, kPrompt);
  r = Admin("POST", "/admin/cache/lookup", json{{"tokens", ids}}.dump());
  EXPECT_EQ(r.body["cached_tokens"], expect);
  r = Admin("POST", "/admin/cache/lookup",
            json{{"messages", json::array({{{"role", "user"}, {"content", "Hello"}}})}}.dump());
  EXPECT_EQ(r.status, 200) << r.body.dump();
  // Another tenant shares nothing.
  r = Admin("POST", "/admin/cache/lookup", LookupBody(kPrompt, "tenant-b"));
  EXPECT_EQ(r.body["cached_tokens"], 0);

  // Flush device: the prefix is still in host (written through).
  r = Admin("POST", "/admin/cache/flush", R"({"tiers": ["device"]})");
  ASSERT_EQ(r.status, 200) << r.body.dump();
  EXPECT_GE(r.body["flushed_blocks"]["device"].get<int>(), expect / kBlockSize);
  EXPECT_FALSE(r.body["flushed_blocks"].contains("host"));
  r = Admin("POST", "/admin/cache/lookup", LookupBody(kPrompt));
  EXPECT_EQ(r.body["by_tier"]["device"], 0);
  EXPECT_EQ(r.body["by_tier"]["host"], expect);
  EXPECT_EQ(r.body["cached_tokens"], expect);

  // Flush everything (the default): nothing hits.
  r = Admin("POST", "/admin/cache/flush", "");
  ASSERT_EQ(r.status, 200) << r.body.dump();
  EXPECT_GE(r.body["flushed_blocks"]["host"].get<int>(), expect / kBlockSize);
  EXPECT_EQ(r.body["all_namespaces"], false);
  r = Admin("POST", "/admin/cache/lookup", LookupBody(kPrompt));
  EXPECT_EQ(r.body["cached_tokens"], 0);
  EXPECT_EQ(host_->stats().blocks, 0u);

  // And the next request computes it again, then hits as before.
  Complete(kPrompt, 4);
  r = Admin("POST", "/admin/cache/lookup", LookupBody(kPrompt));
  EXPECT_EQ(r.body["cached_tokens"], expect);
}

TEST_F(AdminRoutesTest, StatsAndMetricsDescribeTheSameEngine) {
  const size_t n = Complete(kPrompt, 5);
  Complete(kPrompt, 3);  // its prefix hits in device
  const int hit = static_cast<int>((n - 1) / kBlockSize) * kBlockSize;

  Reply r = Admin("GET", "/admin/cache/stats");
  ASSERT_EQ(r.status, 200) << r.body.dump();
  const json& s = r.body;
  EXPECT_EQ(s["model"], kModelName);
  EXPECT_EQ(s["requests"]["running"], 0);
  EXPECT_EQ(s["requests"]["waiting"], 0);
  EXPECT_EQ(s["requests"]["finished_by_reason"]["length"], 2);
  EXPECT_EQ(s["device_blocks"]["in_use"], 0);
  EXPECT_EQ(s["device_blocks"]["total"], kDeviceBlocks);
  EXPECT_EQ(s["prefix_cache"]["queries"], 2);
  EXPECT_EQ(s["prefix_cache"]["query_tokens"], 2 * n);
  EXPECT_EQ(s["prefix_cache"]["hit_tokens"], hit);
  ASSERT_EQ(s["tiers"].size(), 2u);
  EXPECT_EQ(s["tiers"][0]["name"], "device");
  EXPECT_EQ(s["tiers"][0]["hits"]["tokens"], hit);
  EXPECT_EQ(s["tiers"][1]["name"], "host");
  EXPECT_GT(s["tiers"][1]["bytes_written"].get<uint64_t>(), 0u);
  EXPECT_GT(s["tiers"][1]["used_bytes"].get<uint64_t>(), 0u);

  // The exposition agrees with the engine and the events. Per-tier series
  // carry the kind (`tier`) and the configured name (`tier_name`).
  std::map<std::string, double> m;
  std::istringstream in(metrics_->Render(engine_->Stats()));
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    m[line.substr(0, line.rfind(' '))] = std::stod(line.substr(line.rfind(' ') + 1));
  }
  const std::string l = std::string("{model_name=\"") + kModelName + "\"";
  EXPECT_EQ(m["strata_requests_total" + l + ",finish_reason=\"length\"}"], 2);
  EXPECT_EQ(m["strata_generation_tokens_total" + l + "}"], 8);
  EXPECT_EQ(m["strata_prompt_tokens_total" + l + "}"], 2.0 * static_cast<double>(n));
  EXPECT_EQ(m["strata_time_to_first_token_seconds_count" + l + "}"], 2);
  EXPECT_EQ(m["strata_inter_token_latency_seconds_count" + l + "}"], 4 + 2);
  EXPECT_EQ(m["strata_e2e_request_latency_seconds_count" + l + "}"], 2);
  EXPECT_EQ(m["strata_prefix_cache_queries_total" + l + "}"], 2.0 * static_cast<double>(n));
  EXPECT_EQ(m["strata_prefix_cache_hits_total" + l + ",tier=\"device\",tier_name=\"device\"}"], hit);
  EXPECT_EQ(m["strata_prefix_cache_hits_total" + l + ",tier=\"host\",tier_name=\"host\"}"], 0);
  EXPECT_EQ(m["strata_num_requests_running" + l + "}"], 0);
  EXPECT_EQ(m["strata_kv_device_blocks_in_use" + l + "}"], 0);
  EXPECT_GT(m["strata_kv_tier_bytes_written_total" + l + ",tier=\"host\",tier_name=\"host\"}"], 0);
  EXPECT_GT(m["strata_kv_cache_usage_ratio" + l + ",tier=\"host\",tier_name=\"host\"}"], 0);
  EXPECT_EQ(metrics_->tracked_requests(), 0u);
}

}  // namespace
}  // namespace strata::server
