// `strata bench run` and `strata bench compare` against a real `strata serve`
// on stories260K: a multi-turn chat run writes every request's record, later
// turns report cached prompt tokens; a trace run counts the requests that do
// not fit the model's context; comparing a run with itself gives ratios 1.00;
// the same runs over gRPC (--url grpc://...) record the same fields, and a
// gRPC address nobody serves fails with a message naming it.

#include <gtest/gtest.h>

#include <fstream>
#include <iterator>
#include <memory>
#include <string>

#include <nlohmann/json.hpp>

#include "tests/support/run_command.h"
#include "tests/support/server_process.h"
#include "tests/support/test_env.h"

namespace strata {
namespace {

using json = nlohmann::json;
using testing::RunCommand;
using testing::ShellQuote;
using testing::StrataCli;

class BenchRunTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto s = testing::ServerProcess::Start(
        {"--model", testing::Stories260KPath(), "--threads", "1", "--kv-block-size", "4"});
    if (!s) {
      start_error_ = new std::string(s.error().ToString());
      return;
    }
    server_ = s->release();
  }
  static void TearDownTestSuite() {
    if (server_ != nullptr) {
      auto code = server_->Stop(60);
      EXPECT_TRUE(code.has_value() && *code == 0) << server_->stderr_tail();
    }
    delete server_;
    server_ = nullptr;
    delete start_error_;
    start_error_ = nullptr;
  }
  void SetUp() override { ASSERT_NE(server_, nullptr) << (start_error_ ? *start_error_ : "no server"); }

  static std::string Dir() { return ::testing::TempDir(); }
  static json ReadJson(const std::string& path) {
    std::ifstream f(path);
    std::string text((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    return json::parse(text, nullptr, false);
  }
  static std::string Bench(const std::string& args) {
    return ShellQuote(StrataCli()) + " bench " + args;
  }

  static testing::ServerProcess* server_;
  static std::string* start_error_;
};
testing::ServerProcess* BenchRunTest::server_ = nullptr;
std::string* BenchRunTest::start_error_ = nullptr;

TEST_F(BenchRunTest, ChatRunRecordsEveryTurnAndLaterTurnsHitTheCache) {
  const std::string out = Dir() + "/live_chat_run.json";
  auto r = RunCommand(Bench("run --url " + server_->base_url() +
                            " --workload chat --sessions 2 --turns 3 --think-time 0 --output-tokens 6 "
                            "--max-requests 6 --slo ttft=30s,tpot=10s --out " + ShellQuote(out)));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  EXPECT_NE(r.out.find("TTFT"), std::string::npos) << r.out;
  json doc = ReadJson(out);
  ASSERT_TRUE(doc.is_object()) << "not JSON: " << out;
  EXPECT_EQ(doc["config"]["model"], "stories260K");
  EXPECT_EQ(doc["config"]["max_model_len"], 512);
  const json& records = doc["records"];
  ASSERT_EQ(records.size(), 6u) << doc["summary"].dump();
  int later_turns = 0;
  for (const json& rec : records) {
    EXPECT_EQ(rec["error"], "") << rec.dump();
    EXPECT_EQ(rec["http_status"], 200);
    EXPECT_EQ(rec["completion_tokens"], 6) << rec.dump();
    EXPECT_EQ(rec["token_s"].size(), rec["completion_tokens"].get<size_t>()) << rec.dump();
    EXPECT_GE(rec["first_token_s"].get<double>(), rec["start_s"].get<double>());
    EXPECT_GE(rec["end_s"].get<double>(), rec["first_token_s"].get<double>());
    EXPECT_GT(rec["prompt_tokens"].get<int>(), 0);
    if (rec["turn"].get<int>() > 0) {
      ++later_turns;
      // The turn re-sends the previous prompt and reply: at least that much
      // is in the server's device cache.
      EXPECT_GT(rec["cached_tokens"].get<int>(), 0) << rec.dump();
      EXPECT_EQ(rec["cached_tokens_by_tier"]["device"], rec["cached_tokens"]) << rec.dump();
    }
  }
  EXPECT_EQ(later_turns, 4);
  const json& s = doc["summary"];
  EXPECT_EQ(s["requests_ok"], 6);
  EXPECT_EQ(s["goodput_requests"], 6);
  EXPECT_GT(s["hit_ratio_responses"]["ratio"].get<double>(), 0);
  ASSERT_TRUE(s["metrics_available"].get<bool>());
  EXPECT_GT(s["hit_ratio_metrics"]["ratio"].get<double>(), 0);
  EXPECT_EQ(s["by_turn"].size(), 3u);
  EXPECT_GE(doc["metrics_scrapes"].size(), 2u);

  // Plots next to the JSON when gnuplot is there, a warning when not.
  if (RunCommand("command -v gnuplot").exit_code == 0) {
    EXPECT_NE(r.out.find("live_chat_run.ttft_cdf."), std::string::npos) << r.out << r.err;
  } else {
    EXPECT_NE(r.err.find("gnuplot"), std::string::npos) << r.err;
  }

  auto cmp = RunCommand(Bench("compare " + ShellQuote(out) + " " + ShellQuote(out)));
  ASSERT_EQ(cmp.exit_code, 0) << cmp.err;
  int ratio_rows = 0;
  size_t pos = 0;
  while ((pos = cmp.out.find('\n', pos)) != std::string::npos) {
    const size_t end = cmp.out.find('\n', pos + 1);
    const std::string line = cmp.out.substr(pos + 1, end == std::string::npos ? std::string::npos : end - pos - 1);
    pos = pos + 1;
    if (line.starts_with("ttft_s") || line.starts_with("e2e_s") || line.starts_with("request_throughput")) {
      ++ratio_rows;
      EXPECT_TRUE(line.ends_with(" 1.00")) << line;
    }
  }
  EXPECT_GE(ratio_rows, 5) << cmp.out;
}

TEST_F(BenchRunTest, UniqueCacheSaltIsACacheOffBaseline) {
  const std::string out = Dir() + "/live_chat_salted.json";
  auto r = RunCommand(Bench("run --url " + server_->base_url() +
                            " --workload chat --sessions 1 --turns 3 --think-time 0 --output-tokens 4 "
                            "--unique-cache-salt --no-plots --out " + ShellQuote(out)));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  json doc = ReadJson(out);
  ASSERT_TRUE(doc.is_object());
  EXPECT_EQ(doc["config"]["unique_cache_salt"], true);
  ASSERT_EQ(doc["records"].size(), 3u);
  for (const json& rec : doc["records"]) {
    EXPECT_EQ(rec["error"], "") << rec.dump();
    EXPECT_EQ(rec["cached_tokens"], 0) << rec.dump();
  }
}

TEST_F(BenchRunTest, TraceRunSkipsRequestsOverTheContext) {
  const std::string trace = Dir() + "/live_e2e_trace.jsonl";
  {
    std::ofstream f(trace);
    f << R"({"timestamp": 0, "input_length": 1024, "output_length": 64, "hash_ids": [1, 2]})" "\n";
    f << R"({"timestamp": 10, "input_length": 1536, "output_length": 64, "hash_ids": [1, 2, 3]})" "\n";
    // 40 ids x 16 tokens = 640 > 512: skipped.
    f << R"({"timestamp": 20, "input_length": 20480, "output_length": 64, "hash_ids": [)";
    for (int i = 0; i < 40; ++i) f << (i ? ", " : "") << 100 + i;
    f << "]}\n";
  }
  const std::string out = Dir() + "/live_trace_run.json";
  auto r = RunCommand(Bench("run --url " + server_->base_url() + " --workload trace:" + ShellQuote(trace) +
                            " --tokens-per-hash-id 16 --concurrency 1 --no-plots --out " + ShellQuote(out)));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  json doc = ReadJson(out);
  ASSERT_TRUE(doc.is_object());
  EXPECT_EQ(doc["summary"]["skipped_over_context"], 1);
  // One user: the second request starts after the first ended (no timing).
  EXPECT_EQ(doc["config"]["mode"], "closed-loop");
  const json& records = doc["records"];
  ASSERT_EQ(records.size(), 2u);
  EXPECT_EQ(records[0]["prompt_tokens"], 32);
  EXPECT_EQ(records[1]["prompt_tokens"], 48);
  EXPECT_EQ(records[0]["completion_tokens"], 2);  // 64 x 16 / 512
  // The second request repeats the first one's two ids: 32 tokens, 8 blocks of 4.
  EXPECT_EQ(records[1]["cached_tokens"], 32) << records[1].dump();
}

TEST_F(BenchRunTest, BadFlagsExitTwo) {
  auto r = RunCommand(Bench("run --url " + server_->base_url() +
                            " --workload random --rate 2 --concurrency 2 --out /dev/null"));
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  r = RunCommand(Bench("run --url " + server_->base_url() + " --workload random --slo ttft=fast --out /dev/null"));
  EXPECT_EQ(r.exit_code, 2) << r.err;
  EXPECT_NE(r.err.find("--slo"), std::string::npos) << r.err;
}

TEST_F(BenchRunTest, GrpcChatRunRecordsTtftAndCachedTokens) {
  const std::string url = "grpc://127.0.0.1:" + std::to_string(server_->grpc_port());
  const std::string out = Dir() + "/grpc_chat_run.json";
  auto r = RunCommand(Bench("run --url " + url +
                            " --workload chat --sessions 2 --turns 2 --think-time 0 --output-tokens 5 "
                            "--slo ttft=30s,tpot=10s --no-plots --out " + ShellQuote(out)));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  json doc = ReadJson(out);
  ASSERT_TRUE(doc.is_object()) << "not JSON: " << out;
  EXPECT_EQ(doc["config"]["url"], url);
  EXPECT_EQ(doc["config"]["model"], "stories260K");  // from Health
  EXPECT_EQ(doc["config"]["max_model_len"], 512);   // from Tokenize
  const json& records = doc["records"];
  ASSERT_EQ(records.size(), 4u) << doc["summary"].dump();
  int later_turns = 0;
  for (const json& rec : records) {
    EXPECT_EQ(rec["error"], "") << rec.dump();
    EXPECT_EQ(rec["http_status"], 200) << rec.dump();
    EXPECT_EQ(rec["completion_tokens"], 5) << rec.dump();
    EXPECT_GT(rec["prompt_tokens"].get<int>(), 0) << rec.dump();
    ASSERT_FALSE(rec["token_s"].empty()) << rec.dump();
    EXPECT_LE(rec["token_s"].size(), 5u) << rec.dump();
    EXPECT_GT(rec["first_token_s"].get<double>() - rec["start_s"].get<double>(), 0) << rec.dump();  // TTFT
    EXPECT_GE(rec["end_s"].get<double>(), rec["first_token_s"].get<double>());
    if (rec["turn"].get<int>() > 0) {
      ++later_turns;
      EXPECT_GT(rec["cached_tokens"].get<int>(), 0) << rec.dump();
      EXPECT_EQ(rec["cached_tokens_by_tier"]["device"], rec["cached_tokens"]) << rec.dump();
    }
  }
  EXPECT_EQ(later_turns, 2);
  const json& s = doc["summary"];
  EXPECT_EQ(s["requests_ok"], 4);
  EXPECT_TRUE(s["errors"].empty()) << s["errors"].dump();
  EXPECT_GT(s["hit_ratio_responses"]["ratio"].get<double>(), 0);
  // CacheStats stands in for /metrics.
  ASSERT_TRUE(s["metrics_available"].get<bool>());
  EXPECT_GT(s["hit_ratio_metrics"]["ratio"].get<double>(), 0);
}

TEST_F(BenchRunTest, GrpcTokenWorkloadUsesGenerate) {
  const std::string out = Dir() + "/grpc_random_run.json";
  auto r = RunCommand(Bench("run --url grpc://127.0.0.1:" + std::to_string(server_->grpc_port()) +
                            " --workload random --requests 3 --input-tokens 16 --range-ratio 0 --output-tokens 3 "
                            "--concurrency 1 --no-plots --out " + ShellQuote(out)));
  ASSERT_EQ(r.exit_code, 0) << r.out << r.err;
  json doc = ReadJson(out);
  ASSERT_TRUE(doc.is_object());
  const json& records = doc["records"];
  ASSERT_EQ(records.size(), 3u);
  for (const json& rec : records) {
    EXPECT_EQ(rec["error"], "") << rec.dump();
    EXPECT_EQ(rec["prompt_tokens"], 16) << rec.dump();  // the ids sent, as given
    EXPECT_EQ(rec["completion_tokens"], 3) << rec.dump();
    EXPECT_GT(rec["first_token_s"].get<double>(), rec["start_s"].get<double>()) << rec.dump();
  }
}

TEST_F(BenchRunTest, GrpcBadAddressFailsClearly) {
  // A port nobody listens on: exit 1, naming the address.
  auto r = RunCommand(Bench("run --url grpc://127.0.0.1:1 --workload random --requests 1 --out /dev/null"));
  EXPECT_EQ(r.exit_code, 1) << r.out << r.err;
  EXPECT_NE(r.err.find("127.0.0.1:1"), std::string::npos) << r.err;
  EXPECT_NE(r.err.find("cannot connect to the gRPC server"), std::string::npos) << r.err;
  // A malformed URL: a usage error (exit 2) saying what is wrong.
  r = RunCommand(Bench("run --url grpc://127.0.0.1 --workload random --out /dev/null"));
  EXPECT_EQ(r.exit_code, 2) << r.out << r.err;
  EXPECT_NE(r.err.find("port"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace strata
