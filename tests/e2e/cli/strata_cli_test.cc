// The `strata` executable end to end: generate on the real model, synthetic
// models through model synth / info, the default model, and clear errors.

#include <gtest/gtest.h>

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

TEST(StrataCli, GenerateGreedyMatchesGolden) {
  std::ifstream in(testing::SharedDir() + "/golden/stories260K_greedy.json");
  nlohmann::json golden = nlohmann::json::parse(in);
  const auto& c = golden["cases"][0];
  auto r = RunCommand(Cli("generate --model " + ShellQuote(testing::Stories260KPath()) + " --prompt " +
                          ShellQuote(c["prompt"].get<std::string>()) +
                          " --max-tokens 64 --temperature 0 --kv-dtype f32 --json --log-level warn"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["prompt_tokens"], c["prompt_token_ids"]);
  EXPECT_EQ(j["tokens"], c["generated_token_ids"]);
  EXPECT_EQ(j["text"], c["generated_text"]);
  EXPECT_EQ(j["finish_reason"], "length");
  EXPECT_EQ(j["model"], "stories260K");
  EXPECT_TRUE(j["timings"].contains("prefill_ms"));
}

TEST(StrataCli, SeedMakesSamplingReproducible) {
  std::string base = "generate --model " + ShellQuote(testing::Stories260KPath()) +
                     " --prompt 'The little dog' --max-tokens 24 --temperature 1.0 --json --log-level warn";
  auto a = RunCommand(Cli(base + " --seed 42"));
  auto b = RunCommand(Cli(base + " --seed 42"));
  auto c = RunCommand(Cli(base + " --seed 43"));
  ASSERT_EQ(a.exit_code, 0) << a.err;
  ASSERT_EQ(c.exit_code, 0) << c.err;
  EXPECT_EQ(nlohmann::json::parse(a.out)["tokens"], nlohmann::json::parse(b.out)["tokens"]);
  EXPECT_NE(nlohmann::json::parse(a.out)["tokens"], nlohmann::json::parse(c.out)["tokens"]);
}

TEST(StrataCli, StopStringEndsGeneration) {
  auto r = RunCommand(Cli("generate --model " + ShellQuote(testing::Stories260KPath()) +
                          " --prompt 'Once upon a time' --max-tokens 64 --temperature 0 --stop Lily --json "
                          "--log-level warn"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["finish_reason"], "stop");
  EXPECT_EQ(j["text"], ", there was a little girl named ");
}

TEST(StrataCli, PromptTokensUsedAsGiven) {
  auto r = RunCommand(Cli("generate --model " + ShellQuote(testing::Stories260KPath()) +
                          " --prompt-tokens 1,403,407,261,378 --max-tokens 4 --temperature 0 --json --log-level warn"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["prompt_tokens"], nlohmann::json({1, 403, 407, 261, 378}));
  EXPECT_EQ(j["tokens"], nlohmann::json({432, 383, 286, 261}));
}

TEST(StrataCli, PromptLongerThanContextIsAClearError) {
  std::string longp;
  for (int i = 0; i < 400; ++i) longp += "Once upon a time ";
  auto r = RunCommand(Cli("generate --model " + ShellQuote(testing::Stories260KPath()) + " --prompt " +
                          ShellQuote(longp) + " --max-tokens 4 --log-level warn"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("context of 512 tokens"), std::string::npos) << r.err;
}

TEST(StrataCli, MissingAndCorruptModelsAreClearErrors) {
  auto r = RunCommand(Cli("generate --model /nonexistent/model.gguf --prompt hi"));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("/nonexistent/model.gguf"), std::string::npos) << r.err;
  std::string dir = testing::MakeTempDir("strata-cli-");
  std::ofstream(dir + "/bad.gguf") << "GGUF but not really a model file";
  r = RunCommand(Cli("model info " + ShellQuote(dir + "/bad.gguf")));
  EXPECT_NE(r.exit_code, 0);
  EXPECT_NE(r.err.find("bad.gguf"), std::string::npos) << r.err;
}

TEST(StrataCli, SynthInfoAndGenerateOnSyntheticModels) {
  std::string dir = testing::MakeTempDir("strata-cli-");
  for (const char* dtype : {"f32", "q8_0"}) {
    std::string out = dir + "/tiny-" + dtype + ".gguf";
    auto s = RunCommand(Cli(std::string("model synth --preset tiny --dtype ") + dtype + " --out " + ShellQuote(out) +
                            " --vocab-from " + ShellQuote(testing::Stories260KPath())));
    ASSERT_EQ(s.exit_code, 0) << s.err;
    auto info = RunCommand(Cli("model info --json " + ShellQuote(out)));
    ASSERT_EQ(info.exit_code, 0) << info.err;
    nlohmann::json j = nlohmann::json::parse(info.out);
    EXPECT_TRUE(j["synthetic"].get<bool>());
    EXPECT_EQ(j["architecture"]["dim"], 64);
    EXPECT_EQ(j["tokenizer"]["vocab_size"], 512);
    EXPECT_TRUE(j["tensor_types"].contains(dtype)) << info.out;
    auto g = RunCommand(Cli("generate --model " + ShellQuote(out) +
                            " --prompt 'Once upon a time' --max-tokens 8 --temperature 0 --json --log-level warn"));
    ASSERT_EQ(g.exit_code, 0) << g.err;
    EXPECT_EQ(nlohmann::json::parse(g.out)["tokens"].size(), 8u);
  }
}

TEST(StrataCli, HfDirectoryComputesWhatTheGgufComputes) {
  // The same synthetic weights written as GGUF and as a Hugging Face
  // directory must generate the same greedy tokens.
  std::string dir = testing::MakeTempDir("strata-cli-");
  std::string gguf = dir + "/m.gguf", hf = dir + "/m-hf";
  std::string common = " --preset tiny --seed 5 --vocab-from " + ShellQuote(testing::Stories260KPath());
  ASSERT_EQ(RunCommand(Cli("model synth" + common + " --out " + ShellQuote(gguf))).exit_code, 0);
  auto s = RunCommand(Cli("model synth" + common + " --format hf --out " + ShellQuote(hf)));
  ASSERT_EQ(s.exit_code, 0) << s.err;
  std::string gen = " --prompt 'Once upon a time there was' --max-tokens 16 --temperature 0 --kv-dtype f32 --json "
                    "--log-level warn";
  auto a = RunCommand(Cli("generate --model " + ShellQuote(gguf) + gen));
  auto b = RunCommand(Cli("generate --model " + ShellQuote(hf) + gen));
  ASSERT_EQ(a.exit_code, 0) << a.err;
  ASSERT_EQ(b.exit_code, 0) << b.err;
  auto ja = nlohmann::json::parse(a.out), jb = nlohmann::json::parse(b.out);
  EXPECT_EQ(ja["prompt_tokens"], jb["prompt_tokens"]);
  EXPECT_EQ(ja["tokens"], jb["tokens"]);
}

TEST(StrataCli, DefaultModelIsSyntheticAndSaysSo) {
  std::string cache = testing::MakeTempDir("strata-cache-");
  auto r = RunCommand("STRATA_CACHE_DIR=" + ShellQuote(cache) + " " +
                      Cli("generate --prompt hello --max-tokens 4 --temperature 0 --json"));
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.err.find("RANDOM"), std::string::npos) << r.err;
  nlohmann::json j = nlohmann::json::parse(r.out);
  EXPECT_NE(j["model"].get<std::string>().find("random"), std::string::npos);
  // Written once, then reused.
  auto again = RunCommand("STRATA_CACHE_DIR=" + ShellQuote(cache) + " " +
                          Cli("generate --prompt hello --max-tokens 4 --temperature 0 --json"));
  ASSERT_EQ(again.exit_code, 0) << again.err;
  EXPECT_EQ(r.out.substr(0, r.out.find("timings")), again.out.substr(0, again.out.find("timings")));
  EXPECT_EQ(again.err.find("writing a small synthetic model"), std::string::npos);
}

}  // namespace
}  // namespace strata
