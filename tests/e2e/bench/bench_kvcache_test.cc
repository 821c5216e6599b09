// `strata bench kvcache` end to end in its short mode: the tiny synthetic
// model, few blocks, small disk sizes and a short prompt. Checks the JSON
// schema, that every figure is positive and finite and that the TTFT tiers
// hit the whole cached prefix (never speed: this is a test, not a benchmark),
// that the files it made are gone, and the errors for bad flags.

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>

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
    std::string p = testing::MakeTempDir("bench_kvcache") + "/tiny.gguf";
    auto r = RunCommand(Cli("model synth --preset tiny --out " + ShellQuote(p) + " --log-level warn"));
    EXPECT_EQ(r.exit_code, 0) << r.err;
    return p;
  }();
  return path;
}

bool Positive(const nlohmann::json& v) {
  return v.is_number() && v.get<double>() > 0 && std::isfinite(v.get<double>());
}

TEST(BenchKvcache, JsonShortModeHasEveryFigure) {
  const std::string dir = testing::MakeTempDir("bench_kvcache_disk");
  auto r = RunCommand(Cli("bench kvcache --model " + ShellQuote(TinyModel()) + " --disk-path " + ShellQuote(dir) +
                          " --blocks 8 --disk-sizes 64K,256K --disk-total-bytes 1M --queue-depth 4"
                          " --prompt-tokens 128 --cached-tokens 96 --iterations 2 --threads 2 --json --log-level warn"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);  // exactly one object
  ASSERT_TRUE(j.is_object());

  const auto& m = j["moves"];
  EXPECT_EQ(m["block_bytes"], 4096);  // tiny: 2 layers x 2 x 16 tokens x 32 x f16
  EXPECT_EQ(m["blocks"], 8);
  EXPECT_EQ(m["bytes"], 8 * 4096);
  EXPECT_EQ(m["iterations"], 2);
  for (const char* k : {"memcpy_gbs", "device_to_host_gbs", "host_to_device_gbs", "device_to_host_ratio",
                        "host_to_device_ratio"})
    EXPECT_TRUE(Positive(m[k])) << k << ": " << m.dump();

  const auto& d = j["disk"];
  EXPECT_EQ(d["directory"], dir);
  EXPECT_EQ(d["queue_depth"], 4);
  EXPECT_EQ(d["total_bytes"], 1 << 20);
  ASSERT_EQ(d["sizes"].size(), 2u);
  const int sizes[] = {64 << 10, 256 << 10};
  for (size_t i = 0; i < 2; ++i) {
    const auto& s = d["sizes"][i];
    EXPECT_EQ(s["block_bytes"], sizes[i]);
    EXPECT_EQ(s["blocks"], (1 << 20) / sizes[i]);
    for (const char* k : {"raw_write_gbs", "raw_read_gbs", "store_write_gbs", "store_read_gbs", "write_ratio",
                          "read_ratio"})
      EXPECT_TRUE(Positive(s[k])) << k << ": " << s.dump();
  }

  const auto& t = j["ttft"];
  EXPECT_EQ(t["model"], "tiny");
  EXPECT_EQ(t["prompt_tokens"], 128);
  EXPECT_EQ(t["cached_tokens"], 96);
  EXPECT_EQ(t["iterations"], 2);
  EXPECT_TRUE(Positive(t["cache_off_s"])) << t.dump();
  EXPECT_EQ(t["cache_off_samples_s"].size(), 2u);
  ASSERT_EQ(t["tiers"].size(), 3u);
  const char* tiers[] = {"device", "host", "disk"};
  for (size_t i = 0; i < 3; ++i) {
    const auto& x = t["tiers"][i];
    EXPECT_EQ(x["tier"], tiers[i]);
    EXPECT_EQ(x["hit_tokens"], 96);
    EXPECT_TRUE(Positive(x["ttft_s"])) << x.dump();
    EXPECT_TRUE(Positive(x["ratio"])) << x.dump();
    ASSERT_EQ(x["samples_s"].size(), 2u);
    for (const auto& v : x["samples_s"]) EXPECT_TRUE(Positive(v)) << x.dump();
  }

  // Everything the bench wrote under --disk-path is gone.
  EXPECT_TRUE(std::filesystem::is_empty(dir)) << dir;
}

TEST(BenchKvcache, TableNamesEveryFigure) {
  auto r = RunCommand(Cli("bench kvcache --parts moves,disk --block-bytes 64K --blocks 4 --disk-sizes 64K"
                          " --disk-total-bytes 256K --iterations 1 --log-level warn"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  for (const char* word : {"device -> host", "host -> device", "memcpy", "write, blocks of 64 KiB",
                           "read, blocks of 64 KiB", "O_DIRECT", "ratio"})
    EXPECT_NE(r.out.find(word), std::string::npos) << word << " missing in:\n" << r.out;
}

TEST(BenchKvcache, BadFlagsAreNamed) {
  auto r = RunCommand(Cli("bench kvcache --parts ttft --log-level warn"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--model is required"), std::string::npos) << r.err;

  r = RunCommand(Cli("bench kvcache --parts moves,bogus --log-level warn"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("unknown part 'bogus'"), std::string::npos) << r.err;

  r = RunCommand(Cli("bench kvcache --parts disk --disk-sizes 5000 --disk-path /tmp --log-level warn"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("not a multiple of 4096"), std::string::npos) << r.err;

  r = RunCommand(Cli("bench kvcache --model " + ShellQuote(TinyModel()) +
                     " --parts ttft --prompt-tokens 128 --cached-tokens 100 --log-level warn"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("--cached-tokens 100"), std::string::npos) << r.err;

  r = RunCommand(Cli("bench kvcache --model " + ShellQuote(TinyModel()) +
                     " --parts ttft --prompt-tokens 600 --cached-tokens 96 --log-level warn"));
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_NE(r.err.find("exceed the model's context of 512"), std::string::npos) << r.err;
}

}  // namespace
}  // namespace strata
