// `strata bench vs-llamacpp`'s orchestration: llama.cpp is not on a CI
// machine, so stand-in llama-bench and llama-batched-bench scripts print
// llama.cpp's output formats with fixed figures; Strata's side is the real
// `strata bench kernels` on a tiny model. Checks the rounds alternate, the
// ratios are Strata's figure over llama.cpp's, and a missing build is a clear
// error. The real comparison is a benchmark (docs/PERFORMANCE.md).

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "tests/support/run_command.h"
#include "tests/support/test_env.h"

namespace strata {
namespace {

using testing::RunCommand;
using testing::ShellQuote;
using testing::StrataCli;

std::string Cli(const std::string& args) { return ShellQuote(StrataCli()) + " " + args; }

void WriteScript(const std::string& path, const std::string& body) {
  std::ofstream(path) << "#!/bin/sh\n" << body;
  std::filesystem::permissions(path, std::filesystem::perms::owner_all);
}

TEST(BenchVsLlamacpp, RatiosOverStandInLlamacppOutputs) {
  const std::string dir = testing::MakeTempDir("strata-vs-");
  const std::string model = dir + "/tiny.gguf";
  ASSERT_EQ(RunCommand(Cli("model synth --preset tiny --log-level warn --out " + ShellQuote(model))).exit_code, 0);
  std::filesystem::create_directories(dir + "/llama/build/bin");
  // (The tiny model's context is 512 tokens: the batched figure uses 256.)
  // llama-bench -o json: one entry per test; the log records the arguments.
  WriteScript(dir + "/llama/build/bin/llama-bench",
              "echo \"$@\" >> " + dir + "/calls.log\n"
              "echo '[{\"n_prompt\": 512, \"n_gen\": 0, \"avg_ts\": 100.0},"
              " {\"n_prompt\": 0, \"n_gen\": 128, \"avg_ts\": 50.0}]'\n");
  WriteScript(dir + "/llama/build/bin/llama-batched-bench",
              "echo \"batched $@\" >> " + dir + "/calls.log\n"
              "echo 'main: n_kv_max = 17408'\n"
              "echo '|    PP |     TG |    B |   N_KV |   T_PP s | S_PP t/s |   T_TG s | S_TG t/s |      T s |    S t/s |'\n"
              "echo '|-------|--------|------|--------|----------|----------|----------|----------|----------|----------|'\n"
              "echo '|   512 |     32 |   32 |  17408 |   10.000 |  1638.40 |    4.000 |   256.00 |   14.000 |  1243.43 |'\n");
  auto r = RunCommand(Cli("bench vs-llamacpp --json --rounds 2 --threads 1 --batched-context 256 --llamacpp-dir " + ShellQuote(dir + "/llama") +
                          " --model " + ShellQuote(model)));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  auto j = nlohmann::json::parse(r.out);
  ASSERT_EQ(j["rounds"].size(), 2u);
  EXPECT_EQ(j["rounds"][0]["first"], "strata");
  EXPECT_EQ(j["rounds"][1]["first"], "llama.cpp");
  EXPECT_EQ(j["activations"], "auto");
  for (const auto& round : j["rounds"]) {
    const std::pair<const char*, double> want[] = {{"decode_b1", 50.0}, {"prefill_512", 100.0},
                                                   {"batched_32x256", 256.0}};
    for (const auto& [name, llama] : want) {
      const auto& f = round[name];
      EXPECT_EQ(f["llamacpp_tokens_per_s"].get<double>(), llama) << name;
      const double s = f["strata_tokens_per_s"].get<double>();
      EXPECT_GT(s, 0) << name;
      EXPECT_DOUBLE_EQ(f["ratio"].get<double>(), s / llama) << name;
    }
    // Each engine's batch-1 read rate as a share of the streaming read that
    // Strata's run measured: tokens/s x bytes per token / bandwidth.
    const auto& d = round["decode_b1"];
    const double bytes = d["bytes_per_token"].get<double>(), gbs = d["read_bandwidth_gbs"].get<double>();
    EXPECT_GT(bytes, 0);
    EXPECT_GT(gbs, 0);
    EXPECT_DOUBLE_EQ(d["llamacpp_read_share"].get<double>(), 50.0 * bytes / 1e9 / gbs);
    EXPECT_DOUBLE_EQ(d["strata_read_share"].get<double>(),
                     d["strata_tokens_per_s"].get<double>() * bytes / 1e9 / gbs);
  }
  EXPECT_TRUE(j["summary"]["decode_b1"].contains("llamacpp_median_read_share"));
  EXPECT_TRUE(j["summary"]["decode_b1"].contains("median_ratio"));
  std::ifstream calls(dir + "/calls.log");
  std::string all((std::istreambuf_iterator<char>(calls)), {});
  EXPECT_NE(all.find("-p 512 -n 128 -t 1 -o json"), std::string::npos) << all;
  EXPECT_NE(all.find("batched -m"), std::string::npos) << all;
  EXPECT_NE(all.find("-c 9216 -npp 256 -ntg 32 -npl 32"), std::string::npos) << all;
}

TEST(BenchVsLlamacpp, MissingBuildIsAClearError) {
  const std::string dir = testing::MakeTempDir("strata-vs-");
  const std::string model = dir + "/m.gguf";
  std::ofstream(model) << "x";
  auto r = RunCommand(Cli("bench vs-llamacpp --llamacpp-dir " + ShellQuote(dir) + " --model " + ShellQuote(model)));
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_NE(r.err.find("llama-bench not found under " + dir), std::string::npos) << r.err;
}

}  // namespace
}  // namespace strata
