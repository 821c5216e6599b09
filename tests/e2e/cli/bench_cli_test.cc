// `strata bench kernels` end to end in its short CI mode: a tiny synthetic
// model, small shapes; checks the JSON schema and that every figure is
// positive (never speed: this is a test, not a benchmark).

#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>

#include "tests/support/run_command.h"
#include "tests/support/test_env.h"

namespace strata {
namespace {

using testing::RunCommand;
using testing::ShellQuote;
using testing::StrataCli;

std::string Cli(const std::string& args) { return ShellQuote(StrataCli()) + " " + args; }

std::string TinyModel() {
  static const std::string path = [] {
    std::string p = testing::MakeTempDir("bench_cli") + "/tiny.gguf";
    auto r =
        RunCommand(Cli("model synth --preset tiny --out " + ShellQuote(p) + " --log-level warn"));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return p;
  }();
  return path;
}

// Positive and finite; no upper bound: the tiny model's weights sit in L2, so
// its decode beats the DRAM roofline by a factor that depends on the machine
// and its load (2x was seen), and a bound would make this a timed test.
bool IsShare(const nlohmann::json& v) {
  return v.is_number() && v.get<double>() > 0 && std::isfinite(v.get<double>());
}

TEST(BenchCli, KernelsJsonShortMode) {
  auto r = RunCommand(Cli("bench kernels --model " + ShellQuote(TinyModel()) +
                          " --threads 2 --context 64 --batches 1,4 --prefill 64 --iterations 2 "
                          "--json --log-level warn"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);  // exactly one object
  ASSERT_TRUE(j.is_object());
  const auto& l = j["limits"];
  EXPECT_GT(l["read_bandwidth_gbs"].get<double>(), 0);
  EXPECT_GT(l["fma_peak_gflops"].get<double>(), 0);
  EXPECT_EQ(l["threads"], 2);
  EXPECT_TRUE(j["model"].is_object());
  ASSERT_EQ(j["decode"].size(), 2u);
  const int batches[] = {1, 4};
  for (size_t i = 0; i < 2; ++i) {
    const auto& d = j["decode"][i];
    EXPECT_EQ(d["batch"], batches[i]);
    EXPECT_EQ(d["context"], 64);
    EXPECT_GT(d["tokens_per_s"].get<double>(), 0);
    EXPECT_GT(d["bytes_per_step"].get<double>(), 0);
    EXPECT_GT(d["flops_per_step"].get<double>(), 0);
    EXPECT_TRUE(IsShare(d["share_of_roofline"])) << d.dump();
  }
  const auto& p = j["prefill"];
  EXPECT_EQ(p["tokens"], 64);
  EXPECT_GT(p["tokens_per_s"].get<double>(), 0);
  EXPECT_GT(p["flops"].get<double>(), 0);
  EXPECT_TRUE(IsShare(p["share_of_fma_peak"])) << p.dump();
}

TEST(BenchCli, KernelsTableNamesEveryFigure) {
  auto r = RunCommand(
      Cli("bench kernels --model " + ShellQuote(TinyModel()) +
          " --threads 1 --context 16 --batches 2 --prefill 16 --iterations 1 --log-level warn"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* word : {"streaming read", "FMA peak", "decode", "prefill", "share"})
    EXPECT_NE(r.out.find(word), std::string::npos) << word << " missing in:\n" << r.out;
}

TEST(BenchCli, KernelsRejectsContextPastTheModel) {
  auto r =
      RunCommand(Cli("bench kernels --model " + ShellQuote(TinyModel()) +
                     " --context 4096 --batches 1 --prefill 16 --iterations 1 --log-level warn"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("context length"), std::string::npos) << r.err;
}

TEST(BenchCli, KernelsMissingModelIsAClearError) {
  auto r = RunCommand(Cli("bench kernels --model /nonexistent/model.gguf --log-level warn"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("/nonexistent/model.gguf"), std::string::npos) << r.err;
}

// `bench calibrate` writes a cost file a cluster file can name, and
// `bench simulate` runs a closed loop with it (the two halves of
// bench/sim_vs_live.sh).
TEST(BenchCli, CalibrateFeedsTheSimulator) {
  const std::string dir = testing::MakeTempDir("bench_cli_cal");
  auto r = RunCommand(Cli("bench calibrate --model " + ShellQuote(TinyModel()) +
                          " --threads 2 --prefill 8,32 --batches 1,2 --contexts 8,16 --iterations 1 --out " +
                          ShellQuote(dir + "/costs.json") + " --log-level warn"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  for (const char* k : {"a", "b", "c", "d", "e", "f"}) {
    ASSERT_TRUE(j[k].is_number()) << k;
    EXPECT_GE(j[k].get<double>(), 0) << k;
  }
  EXPECT_EQ(j["points"]["prefill"].size(), 2u);
  EXPECT_EQ(j["points"]["decode"].size(), 4u);
  {
    std::FILE* f = std::fopen((dir + "/cluster.yaml").c_str(), "w");
    ASSERT_NE(f, nullptr);
    std::fputs("instances: 1\ninstance:\n  model: bench-110m\n  cost:\n    calibrated: costs.json\n", f);
    std::fclose(f);
  }
  auto s = RunCommand(Cli("bench simulate --trace " + ShellQuote(testing::SharedDir() + "/traces/synthetic_trace.jsonl") +
                          " --cluster " + ShellQuote(dir + "/cluster.yaml") +
                          " --tokens-per-hash-id 16 --max-requests 30 --concurrency 2 --json"));
  ASSERT_EQ(s.exit_code, 0) << s.err;
  nlohmann::json sim = nlohmann::json::parse(s.out);
  EXPECT_EQ(sim["requests"], 30);
  EXPECT_EQ(sim["options"]["concurrency"], 2);
  EXPECT_GT(sim["busy_s"].get<double>(), 0);
  EXPECT_GT(sim["ttft_p50_s"].get<double>(), 0);

  // Bad input: a length past the model's context, --serial with --concurrency.
  auto bad = RunCommand(Cli("bench calibrate --model " + ShellQuote(TinyModel()) +
                            " --prefill 100000 --iterations 1 --log-level warn"));
  EXPECT_NE(bad.exit_code, 0);
  EXPECT_NE(bad.err.find("strata bench calibrate"), std::string::npos) << bad.err;
  auto both = RunCommand(Cli("bench simulate --trace " +
                             ShellQuote(testing::SharedDir() + "/traces/synthetic_trace.jsonl") +
                             " --serial --concurrency 2 --max-requests 5"));
  EXPECT_NE(both.exit_code, 0);
}

}  // namespace
}  // namespace strata
