// Workloads of `strata bench run` are deterministic from their seed; chat
// turns re-send the whole conversation (checked through the load driver
// against a fake OpenAI server); shared-prefix prompts share their document;
// trace prompts follow the hash ids; over-context requests are counted.

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <mutex>
#include <set>

#include <nlohmann/json.hpp>

#include "bench/load_driver.h"
#include "bench/trace.h"
#include "bench/workload.h"
#include "server/http_server.h"

namespace strata::bench {
namespace {

using json = nlohmann::json;

Workload Build(WorkloadOptions o) {
  auto w = BuildWorkload(o);
  EXPECT_TRUE(w.has_value()) << w.error().ToString();
  return w.has_value() ? std::move(*w) : Workload{};
}

std::vector<std::vector<int32_t>> Prompts(const Workload& w) {
  std::vector<std::vector<int32_t>> out;
  for (const auto& s : w.sessions)
    for (const auto& t : s.turns) out.push_back(t.prompt);
  return out;
}

TEST(WorkloadTest, SameSeedSameRequestsOtherSeedOthers) {
  for (const char* spec : {"random", "shared-prefix"}) {
    WorkloadOptions o;
    o.spec = spec;
    o.seed = 7;
    o.range_ratio = 0.5;
    const auto a = Prompts(Build(o));
    const auto b = Prompts(Build(o));
    EXPECT_EQ(a, b) << spec;
    o.seed = 8;
    EXPECT_NE(a, Prompts(Build(o))) << spec;
  }
  WorkloadOptions c;
  c.spec = "chat";
  Workload x = Build(c), y = Build(c);
  EXPECT_EQ(x.system_prompt, y.system_prompt);
  ASSERT_EQ(x.sessions.size(), y.sessions.size());
  for (size_t s = 0; s < x.sessions.size(); ++s)
    for (size_t t = 0; t < x.sessions[s].turns.size(); ++t)
      EXPECT_EQ(x.sessions[s].turns[t].user_message, y.sessions[s].turns[t].user_message);
}

TEST(WorkloadTest, RandomLengthsAndTokenRange) {
  WorkloadOptions o;
  o.spec = "random";
  o.requests = 50;
  o.input_tokens = 100;
  o.output_tokens = 20;
  o.range_ratio = 0.2;
  o.vocab_size = 300;
  o.first_token_id = 10;
  Workload w = Build(o);
  ASSERT_EQ(w.num_requests(), 50);
  std::set<size_t> lengths;
  for (const auto& s : w.sessions) {
    const Turn& t = s.turns.at(0);
    EXPECT_GE(t.prompt.size(), 80u);
    EXPECT_LE(t.prompt.size(), 120u);
    EXPECT_GE(t.max_tokens, 16);
    EXPECT_LE(t.max_tokens, 24);
    lengths.insert(t.prompt.size());
    for (int32_t id : t.prompt) {
      EXPECT_GE(id, 10);
      EXPECT_LT(id, 300);
    }
  }
  EXPECT_GT(lengths.size(), 1u) << "range_ratio 0.2 should vary the lengths";
}

TEST(WorkloadTest, SharedPrefixQuestionsShareTheirDocumentOnly) {
  WorkloadOptions o;
  o.spec = "shared-prefix";
  o.documents = 3;
  o.document_tokens = 40;
  o.questions = 4;
  o.question_tokens = 5;
  Workload w = Build(o);
  ASSERT_EQ(w.num_requests(), 12);
  const auto p = Prompts(w);
  // Round-robin: request i asks about document i % 3.
  for (size_t i = 0; i < p.size(); ++i) {
    ASSERT_EQ(p[i].size(), 45u);
    const auto& same = p[i % 3];
    EXPECT_TRUE(std::equal(p[i].begin(), p[i].begin() + 40, same.begin())) << i;
    if (i >= 3) {
      EXPECT_NE(std::vector<int32_t>(p[i].begin() + 40, p[i].end()), std::vector<int32_t>(same.begin() + 40, same.end()));
    }
  }
  EXPECT_NE(std::vector<int32_t>(p[0].begin(), p[0].begin() + 40), std::vector<int32_t>(p[1].begin(), p[1].begin() + 40));
}

TEST(WorkloadTest, ChatSessionsTurnsThinkTimeAndTruncation) {
  WorkloadOptions o;
  o.spec = "chat";
  o.sessions = 3;
  o.turns = 4;
  o.think_time_s = 0.25;
  Workload w = Build(o);
  EXPECT_TRUE(w.chat);
  EXPECT_FALSE(w.system_prompt.empty());
  ASSERT_EQ(w.sessions.size(), 3u);
  for (const auto& s : w.sessions) {
    ASSERT_EQ(s.turns.size(), 4u);
    EXPECT_EQ(s.turns[0].think_time_s, 0);
    EXPECT_EQ(s.turns[1].think_time_s, 0.25);
    EXPECT_NE(s.turns[0].user_message, s.turns[1].user_message);
  }
  o.max_requests = 6;  // the first session whole, then two turns of the second
  Workload cut = Build(o);
  ASSERT_EQ(cut.num_requests(), 6);
  ASSERT_EQ(cut.sessions.size(), 2u);
  EXPECT_EQ(cut.sessions[1].turns.size(), 2u);
  EXPECT_EQ(cut.sessions[1].turns[1].user_message, w.sessions[1].turns[1].user_message);
}

TEST(WorkloadTest, BadSpecAndKnobsAreInvalidArgument) {
  WorkloadOptions o;
  o.spec = "nope";
  EXPECT_EQ(BuildWorkload(o).error().code(), StatusCode::kInvalidArgument);
  o.spec = "chat";
  o.turns = 0;
  EXPECT_EQ(BuildWorkload(o).error().code(), StatusCode::kInvalidArgument);
  o.spec = "trace:";
  EXPECT_EQ(BuildWorkload(o).error().code(), StatusCode::kInvalidArgument);
}

std::string WriteTemp(const std::string& name, const std::string& text) {
  std::string path = ::testing::TempDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

TEST(WorkloadTest, TraceFollowsHashIdsScalesAndDropsOverContext) {
  const std::string path = WriteTemp("live_trace.jsonl",
                                     "{\"timestamp\": 0, \"input_length\": 1000, \"output_length\": 100, \"hash_ids\": [1, 2]}\n"
                                     "{\"timestamp\": 1500, \"input_length\": 1500, \"output_length\": 10, \"hash_ids\": [1, 2, 3]}\n"
                                     "{\"timestamp\": 2000, \"input_length\": 9000, \"output_length\": 10, \"hash_ids\": "
                                     "[4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21]}\n");
  WorkloadOptions o;
  o.spec = "trace:" + path;
  o.tokens_per_hash_id = 16;
  Workload w = Build(o);
  ASSERT_EQ(w.num_requests(), 3);
  const auto p = Prompts(w);
  EXPECT_EQ(p[0].size(), 32u);
  EXPECT_EQ(p[1].size(), 48u);
  EXPECT_TRUE(std::equal(p[0].begin(), p[0].end(), p[1].begin())) << "equal ids must give equal tokens";
  EXPECT_EQ(w.sessions[0].turns[0].max_tokens, 4);  // ceil(100 * 16 / 512)
  EXPECT_EQ(w.sessions[1].turns[0].max_tokens, 1);  // at least 1
  EXPECT_DOUBLE_EQ(w.sessions[1].turns[0].arrival_s, 1.5);
  // Same tokens as the shared trace helper gives for the same request.
  auto trace = LoadTrace(path);
  ASSERT_TRUE(trace.has_value());
  EXPECT_EQ(p[1], ScaleRequest((*trace)[1], 16, o.vocab_size, o.first_token_id).prompt);

  DropOverContext(100, &w);  // 18 ids x 16 = 288 tokens do not fit
  EXPECT_EQ(w.skipped_over_context, 1);
  EXPECT_EQ(w.num_requests(), 2);

  o.max_requests = 1;
  EXPECT_EQ(Build(o).num_requests(), 1);
}

TEST(WorkloadTest, TraceParseErrorNamesTheLine) {
  const std::string path = WriteTemp("live_bad_trace.jsonl",
                                     "{\"timestamp\": 0, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [1]}\n"
                                     "not json\n");
  WorkloadOptions o;
  o.spec = "trace:" + path;
  auto w = BuildWorkload(o);
  ASSERT_FALSE(w.has_value());
  EXPECT_EQ(w.error().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(w.error().message().find(":2"), std::string::npos) << w.error().message();
}

// A fake OpenAI server: records every request body and streams three tokens
// and a usage chunk whose prompt_tokens is the number of messages.
class FakeServer {
 public:
  FakeServer() {
    server::HttpServerOptions opts;
    opts.port = 0;
    auto s = server::HttpServer::Create(opts, [this](server::HttpRequest&& req,
                                                     std::shared_ptr<server::ResponseWriter> w) {
      if (req.path == "/metrics") {
        w->Send(200, "text/plain",
                "strata_prefix_cache_queries_total{model_name=\"m\"} 100\n"
                "strata_prefix_cache_hits_total{model_name=\"m\",tier=\"device\"} 30\n"
                "strata_prefix_cache_hits_total{model_name=\"m\",tier=\"host\"} 5\n");
        return;
      }
      json body = json::parse(req.body);
      {
        std::lock_guard lock(mu_);
        bodies_.push_back(body);
      }
      const int n = body.contains("messages") ? static_cast<int>(body["messages"].size())
                                              : static_cast<int>(body["prompt"].size());
      w->StartStream(200, "text/event-stream");
      for (const char* piece : {"A", "B", "C"})
        w->Write("data: " + json({{"choices", {{{"index", 0}, {"delta", {{"content", piece}}}, {"text", piece}}}}}).dump() +
                 "\n\n");
      json usage = {{"prompt_tokens", n},
                    {"completion_tokens", 3},
                    {"prompt_tokens_details",
                     {{"cached_tokens", n - 1}, {"cached_tokens_by_tier", {{"device", n - 1}, {"host", 0}}}}}};
      w->Write("data: " + json({{"choices", json::array()}, {"usage", usage}}).dump() + "\n\n");
      w->Write("data: [DONE]\n\n");
      w->End();
    });
    EXPECT_TRUE(s.has_value()) << s.error().ToString();
    server_ = std::move(*s);
    server_->Start();
  }
  ~FakeServer() { server_->Stop(); }
  int port() const { return server_->port(); }
  std::vector<json> bodies() {
    std::lock_guard lock(mu_);
    return bodies_;
  }

 private:
  std::unique_ptr<server::HttpServer> server_;
  std::mutex mu_;
  std::vector<json> bodies_;
};

TEST(WorkloadTest, ChatTurnsResendTheWholeHistoryWithTheReplies) {
  FakeServer fake;
  WorkloadOptions o;
  o.spec = "chat";
  o.sessions = 2;
  o.turns = 3;
  o.think_time_s = 0;
  Workload w = Build(o);
  LoadOptions lo;
  lo.host = "127.0.0.1";
  lo.port = fake.port();
  lo.model = "m";
  lo.concurrency = 2;
  lo.scrape_interval_s = 0;
  auto r = RunLoad(w, lo);
  ASSERT_TRUE(r.has_value()) << r.error().ToString();
  ASSERT_EQ(r->records.size(), 6u);
  for (const auto& rec : r->records) {
    EXPECT_TRUE(rec.ok()) << rec.error << " " << rec.error_message;
    EXPECT_EQ(rec.completion_tokens, 3);
    EXPECT_EQ(rec.token_s.size(), 3u);
    EXPECT_GE(rec.first_token_s, rec.start_s);
    EXPECT_EQ(rec.prompt_tokens, 2 + 2 * rec.turn);  // system + (user, assistant) per earlier turn + user
    EXPECT_EQ(rec.cached_by_tier[0], rec.prompt_tokens - 1);
  }
  // Each session's turn t sends: system, then user/assistant pairs, the
  // assistant content being the streamed reply "ABC".
  int checked = 0;
  for (const json& b : fake.bodies()) {
    ASSERT_TRUE(b.contains("messages"));
    const json& m = b["messages"];
    ASSERT_EQ(m.size() % 2, 0u);
    EXPECT_EQ(m[0]["role"], "system");
    EXPECT_EQ(m[0]["content"], w.system_prompt);
    const size_t turn = m.size() / 2 - 1;
    const std::string last_user = m.back()["content"];
    int session = -1;
    for (size_t s = 0; s < w.sessions.size(); ++s)
      if (w.sessions[s].turns[turn].user_message == last_user) session = static_cast<int>(s);
    ASSERT_GE(session, 0) << b.dump();
    for (size_t t = 0; t < turn; ++t) {
      EXPECT_EQ(m[1 + 2 * t]["content"], w.sessions[session].turns[t].user_message);
      EXPECT_EQ(m[2 + 2 * t]["role"], "assistant");
      EXPECT_EQ(m[2 + 2 * t]["content"], "ABC");
    }
    EXPECT_EQ(b["stream"], true);
    EXPECT_EQ(b["stream_options"]["include_usage"], true);
    ++checked;
  }
  EXPECT_EQ(checked, 6);
  ASSERT_GE(r->scrapes.size(), 2u);
  EXPECT_TRUE(r->metrics_available);
  EXPECT_EQ(r->scrapes.back().hits[1], 5);
}

TEST(WorkloadTest, TokenWorkloadsSendTheIdsToCompletions) {
  FakeServer fake;
  WorkloadOptions o;
  o.spec = "random";
  o.requests = 4;
  o.input_tokens = 7;
  Workload w = Build(o);
  LoadOptions lo;
  lo.host = "127.0.0.1";
  lo.port = fake.port();
  lo.model = "m";
  lo.rate = 1000;  // open loop
  lo.scrape_interval_s = 0;
  auto r = RunLoad(w, lo);
  ASSERT_TRUE(r.has_value()) << r.error().ToString();
  ASSERT_EQ(r->records.size(), 4u);
  std::multiset<std::vector<int32_t>> sent, built;
  for (const json& b : fake.bodies()) sent.insert(b["prompt"].get<std::vector<int32_t>>());
  for (const auto& p : Prompts(w)) built.insert(p);
  EXPECT_EQ(sent, built);
  for (const auto& rec : r->records) EXPECT_EQ(rec.sent_prompt_tokens, 7);
  for (const json& b : fake.bodies()) EXPECT_FALSE(b.contains("cache_salt"));
}

TEST(WorkloadTest, UniqueCacheSaltDiffersPerRequest) {
  FakeServer fake;
  WorkloadOptions o;
  o.spec = "random";
  o.requests = 5;
  o.input_tokens = 3;
  LoadOptions lo;
  lo.host = "127.0.0.1";
  lo.port = fake.port();
  lo.model = "m";
  lo.concurrency = 1;
  lo.scrape_interval_s = 0;
  lo.unique_cache_salt = true;
  ASSERT_TRUE(RunLoad(Build(o), lo).has_value());
  std::set<std::string> salts;
  for (const json& b : fake.bodies()) salts.insert(b.value("cache_salt", std::string()));
  EXPECT_EQ(salts.size(), 5u);
  EXPECT_FALSE(salts.contains(""));
}

TEST(WorkloadTest, TraceTimestampsTimesScaleAreTheSchedule) {
  FakeServer fake;
  const std::string path = WriteTemp("live_sched_trace.jsonl",
                                     "{\"timestamp\": 1000, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [1]}\n"
                                     "{\"timestamp\": 1200, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [2]}\n"
                                     "{\"timestamp\": 1500, \"input_length\": 10, \"output_length\": 1, \"hash_ids\": [3]}\n");
  WorkloadOptions o;
  o.spec = "trace:" + path;
  o.tokens_per_hash_id = 4;
  Workload w = Build(o);
  LoadOptions lo;
  lo.host = "127.0.0.1";
  lo.port = fake.port();
  lo.model = "m";
  lo.time_scale = 0.1;  // the first request's timestamp is time zero
  lo.scrape_interval_s = 0;
  auto r = RunLoad(w, lo);
  ASSERT_TRUE(r.has_value()) << r.error().ToString();
  ASSERT_EQ(r->records.size(), 3u);
  EXPECT_DOUBLE_EQ(r->records[0].scheduled_s, 0.0);
  EXPECT_NEAR(r->records[1].scheduled_s, 0.02, 1e-12);
  EXPECT_NEAR(r->records[2].scheduled_s, 0.05, 1e-12);
  for (const auto& rec : r->records) EXPECT_GE(rec.start_s, rec.scheduled_s);
}

TEST(WorkloadTest, NoTimestampsNeedsRateOrConcurrency) {
  WorkloadOptions o;
  o.spec = "random";
  Workload w = Build(o);
  LoadOptions lo;
  lo.host = "127.0.0.1";
  lo.port = 1;
  EXPECT_EQ(RunLoad(w, lo).error().code(), StatusCode::kInvalidArgument);
  lo.rate = 1;
  lo.concurrency = 1;
  EXPECT_EQ(RunLoad(w, lo).error().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace strata::bench
