// `strata model quantize` and `strata eval kld` end to end on the real
// stories260K model: the census printed equals what `model info` lists,
// the quantized file generates, a file against itself has KLD 0 and full
// agreement, Q8_0 stays close to the f32 original, a Hugging Face Llama
// directory quantizes to the same function, and bad input is a clear error.

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>

#include "model/backend/cpu/matmul.h"
#include "tests/support/run_command.h"
#include "tests/support/test_env.h"

namespace strata {
namespace {

using testing::RunCommand;
using testing::ShellQuote;
using testing::StrataCli;

std::string Cli(const std::string& args) { return ShellQuote(StrataCli()) + " " + args; }

nlohmann::json Json(const testing::CommandResult& r) {
  EXPECT_EQ(r.exit_code, 0) << r.err;
  return nlohmann::json::parse(r.out, nullptr, false);
}

TEST(QuantizeCli, CensusEqualsModelInfoAndTheFileGenerates) {
  const std::string dir = testing::MakeTempDir("strata-quantize-cli-");
  const std::string f32 = ShellQuote(testing::Stories260KPath());
  for (const char* dtype : {"q8_0", "q4_k_m", "Q6_K"}) {
    SCOPED_TRACE(dtype);
    const std::string out = dir + "/s-" + dtype + ".gguf";
    auto q = Json(RunCommand(Cli(std::string("model quantize --log-level warn --json --dtype ") + dtype +
                                 " --model " + f32 + " --out " + ShellQuote(out))));
    ASSERT_TRUE(q.is_object());
    // stories260K: dim 64 (no K-quant block fits: q8_0), ffn 172 (no
    // 32-block either: f16), 5 layers.
    EXPECT_EQ(q["census"]["f16"], 5) << q["census"];
    EXPECT_EQ(q["census"]["q8_0"], 32);
    EXPECT_EQ(q["census"]["f32"], 11);
    auto info = Json(RunCommand(Cli("model info --json " + ShellQuote(out))));
    for (const auto& [type, n] : q["census"].items())
      EXPECT_EQ(info["tensor_types"][type]["tensors"], n) << type;
    auto g = Json(RunCommand(Cli("generate --model " + ShellQuote(out) +
                                 " --prompt 'Once upon a time' --max-tokens 8 --temperature 0 --json --log-level warn")));
    EXPECT_EQ(g["tokens"].size(), 8u);
  }
  auto text = RunCommand(Cli("model quantize --log-level warn --dtype q4_0 --model " + f32 + " --out " +
                             ShellQuote(dir + "/s-q4_0.gguf")));
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_NE(text.out.find("census (q4_0): f16 5 f32 11 q4_0 32; 5 fallbacks"), std::string::npos) << text.out;
  EXPECT_NE(text.out.find("blk.0.ffn_down.weight"), std::string::npos);
}

// A Hugging Face Llama directory (NeoX RoPE pairing as it loads) becomes a
// GGUF llama file (interleaved pairing: Q/K rows permuted while writing)
// that computes the same function: KLD against the directory itself ~0.
TEST(QuantizeCli, AHuggingFaceLlamaDirectoryQuantizesToTheSameFunction) {
  const std::string dir = testing::MakeTempDir("strata-quantize-hf-");
  const std::string hf = dir + "/hf";
  auto synth = RunCommand(Cli("model synth --preset tiny --format hf --log-level warn --out " + ShellQuote(hf)));
  ASSERT_EQ(synth.exit_code, 0) << synth.err;
  for (const char* dtype : {"f32", "q8_0"}) {
    SCOPED_TRACE(dtype);
    const std::string out = dir + "/" + dtype + ".gguf";
    auto q = RunCommand(Cli(std::string("model quantize --log-level warn --dtype ") + dtype + " --model " +
                            ShellQuote(hf) + " --out " + ShellQuote(out)));
    ASSERT_EQ(q.exit_code, 0) << q.err;
    auto k = Json(RunCommand(Cli("eval kld --json --log-level warn --model " + ShellQuote(out) + " --reference " +
                                 ShellQuote(hf))));
    ASSERT_TRUE(k.is_object());
    EXPECT_GE(k["positions"].get<int>(), 2000);
    if (std::string(dtype) == "f32") {
      EXPECT_LT(k["mean_kld"].get<double>(), 1e-9);
      EXPECT_GE(k["top1_agreement"].get<double>(), 0.999);
    } else {
      EXPECT_LT(k["mean_kld"].get<double>(), 1e-3);
      EXPECT_GE(k["top1_agreement"].get<double>(), 0.95);
    }
  }
}

TEST(QuantizeCli, BadInputIsAClearError) {
  const std::string dir = testing::MakeTempDir("strata-quantize-cli-");
  const std::string f32 = ShellQuote(testing::Stories260KPath());
  auto unknown = RunCommand(Cli("model quantize --dtype q3_k --model " + f32 + " --out " + ShellQuote(dir + "/x")));
  EXPECT_NE(unknown.exit_code, 0);
  EXPECT_NE(unknown.err.find("--dtype"), std::string::npos) << unknown.err;
  const std::string q8 = dir + "/q8.gguf";
  ASSERT_EQ(RunCommand(Cli("model quantize --log-level warn --dtype q8_0 --model " + f32 + " --out " + ShellQuote(q8)))
                .exit_code,
            0);
  auto again = RunCommand(Cli("model quantize --dtype q4_0 --model " + ShellQuote(q8) + " --out " +
                              ShellQuote(dir + "/q4.gguf")));
  EXPECT_EQ(again.exit_code, 2);
  EXPECT_NE(again.err.find("--allow-requantize"), std::string::npos) << again.err;
  auto missing = RunCommand(Cli("model quantize --dtype q8_0 --model /nonexistent.gguf --out " +
                                ShellQuote(dir + "/y.gguf")));
  EXPECT_NE(missing.exit_code, 0);
  EXPECT_NE(missing.err.find("/nonexistent.gguf"), std::string::npos) << missing.err;
  // Different vocabularies cannot be compared.
  const std::string other = dir + "/tiny.gguf";
  ASSERT_EQ(RunCommand(Cli("model synth --preset tiny --out " + ShellQuote(other))).exit_code, 0);
  auto vocab = RunCommand(Cli("eval kld --model " + ShellQuote(other) + " --reference " + f32));
  EXPECT_EQ(vocab.exit_code, 2);
  EXPECT_NE(vocab.err.find("tokenize the text differently"), std::string::npos) << vocab.err;
}

TEST(EvalKldCli, ItselfIsZeroAndQ8IsCloseToTheOriginal) {
  const std::string dir = testing::MakeTempDir("strata-kld-cli-");
  const std::string f32 = ShellQuote(testing::Stories260KPath());
  auto self = Json(RunCommand(Cli("eval kld --json --log-level warn --model " + f32 + " --reference " + f32)));
  EXPECT_GE(self["positions"].get<int>(), 2000);
  EXPECT_EQ(self["mean_kld"].get<double>(), 0.0);
  EXPECT_EQ(self["top1_agreement"].get<double>(), 1.0);
  const std::string q8 = dir + "/q8.gguf";
  ASSERT_EQ(RunCommand(Cli("model quantize --log-level warn --dtype q8_0 --model " + f32 + " --out " + ShellQuote(q8)))
                .exit_code,
            0);
  auto r = Json(RunCommand(Cli("eval kld --json --log-level warn --model " + ShellQuote(q8) + " --reference " + f32)));
  EXPECT_GE(r["positions"].get<int>(), 2000);
  EXPECT_GT(r["mean_kld"].get<double>(), 0.0);
  // Issue 21's accuracy bound for Q8_0 against f32.
  EXPECT_LE(r["mean_kld"].get<double>(), 0.001) << r;
  // Issue 21's bound, 0.99: measured 0.9924 (least-squares q8_0 scales, the
  // default; wide activations, the default with AVX2 or AVX-512 VNNI; f32
  // activations 0.9923). The default text has many near-ties (f16 weights
  // alone flip 0.1%, about 7 positions; the margin is 17).
  EXPECT_GE(r["top1_agreement"].get<double>(), 0.99) << r;
  // ggml's scales (llama-quantize's bytes) decode further from the original:
  // measured KLD 0.00037 against 0.00029, top-1 0.9895.
  const std::string q8g = dir + "/q8-ggml.gguf";
  ASSERT_EQ(RunCommand(Cli("model quantize --log-level warn --fit ggml --dtype q8_0 --model " + f32 + " --out " +
                           ShellQuote(q8g)))
                .exit_code,
            0);
  auto rg = Json(RunCommand(Cli("eval kld --json --log-level warn --model " + ShellQuote(q8g) + " --reference " + f32)));
  EXPECT_LT(r["mean_kld"].get<double>(), rg["mean_kld"].get<double>()) << r << rg;
  EXPECT_LE(rg["mean_kld"].get<double>(), 0.001) << rg;
  auto bad_fit = RunCommand(Cli("model quantize --fit best --dtype q8_0 --model " + f32 + " --out " +
                                ShellQuote(dir + "/x.gguf")));
  EXPECT_NE(bad_fit.exit_code, 0);
  EXPECT_NE(bad_fit.err.find("--fit"), std::string::npos) << bad_fit.err;
  // A text file of the user's.
  const std::string t = dir + "/text.txt";
  ASSERT_EQ(RunCommand("printf 'The cat sat on the mat. %.0s' $(seq 200) > " + ShellQuote(t)).exit_code, 0);
  auto ft = Json(RunCommand(Cli("eval kld --json --log-level warn --context 128 --model " + ShellQuote(q8) +
                                " --reference " + f32 + " --text " + ShellQuote(t))));
  EXPECT_EQ(ft["context"], 128);
  EXPECT_GT(ft["positions"].get<int>(), 0);
  EXPECT_EQ(ft["text"], t);
  // The default text, for other tools.
  auto text = RunCommand(Cli("eval text --words 300"));
  ASSERT_EQ(text.exit_code, 0) << text.err;
  EXPECT_EQ(text.out.rfind("Once upon a time", 0), 0u);
  EXPECT_GE(std::count(text.out.begin(), text.out.end(), ' '), 299);
}

// --int8-activations end to end: eval kld and generate take it, it changes
// the numbers (Q8_0 weights take the int8 path) within issue 21's bound, and
// conflicting or unknown settings are clear errors. The default takes wide
// activations for Q8_0 where a SIMD table has them: numbers of their own,
// closer to f32's than int8's.
TEST(EvalKldCli, Int8ActivationsOnQ8) {
  const std::string dir = testing::MakeTempDir("strata-int8-cli-");
  const std::string f32 = ShellQuote(testing::Stories260KPath());
  const std::string q8 = ShellQuote(dir + "/q8.gguf");
  ASSERT_EQ(RunCommand(Cli("model quantize --log-level warn --dtype q8_0 --model " + f32 + " --out " + q8)).exit_code,
            0);
  const std::string kld = "eval kld --json --log-level warn --chunks 4 --model " + q8 + " --reference " + f32;
  auto exact = Json(RunCommand(Cli(kld + " --exact-activations")));
  auto int8 = Json(RunCommand(Cli(kld + " --int8-activations")));
  auto dflt = Json(RunCommand(Cli(kld)));
  if (cpu::ActivationsFor(DType::kQ8_0, cpu::ActivationMode::kAuto) == cpu::ActivationKind::kWide) {
    EXPECT_NE(dflt["mean_kld"], exact["mean_kld"]) << "the wide path was not taken";
    EXPECT_NE(dflt["mean_kld"], int8["mean_kld"]) << "the int8 path was taken";
    EXPECT_LT(std::fabs(dflt["mean_kld"].get<double>() - exact["mean_kld"].get<double>()),
              std::fabs(int8["mean_kld"].get<double>() - exact["mean_kld"].get<double>()))
        << dflt << exact << int8;
  } else {
    EXPECT_EQ(dflt["mean_kld"], exact["mean_kld"]) << "without a wide kernel auto is exact on q8_0";
  }
  EXPECT_NE(int8["mean_kld"], exact["mean_kld"]) << "the int8 path was not taken";
  EXPECT_GT(int8["mean_kld"].get<double>(), 0.0);
  EXPECT_LE(int8["mean_kld"].get<double>(), 0.001) << int8;
  EXPECT_GE(int8["top1_agreement"].get<double>(), 0.97) << int8;
  // Both flags at once: a usage error (CLI11's "excludes").
  auto both = RunCommand(Cli(kld + " --int8-activations --exact-activations"));
  EXPECT_NE(both.exit_code, 0);
  EXPECT_NE(both.err.find("excludes"), std::string::npos) << both.err;
  // generate, by flag and by config.
  const std::string gen = "generate --model " + q8 + " --prompt 'Once upon a time' --max-tokens 8 --temperature 0 "
                          "--json --log-level warn";
  auto g = Json(RunCommand(Cli(gen + " --int8-activations")));
  EXPECT_EQ(g["tokens"].size(), 8u);
  const std::string cfg = dir + "/int8.yaml";
  ASSERT_EQ(RunCommand("printf 'engine:\n  activations: int8\n' > " + ShellQuote(cfg)).exit_code, 0);
  auto gc = Json(RunCommand(Cli(gen + " --config " + ShellQuote(cfg))));
  EXPECT_EQ(gc["tokens"], g["tokens"]);
  const std::string bad = dir + "/bad.yaml";
  ASSERT_EQ(RunCommand("printf 'engine:\n  activations: int4\n' > " + ShellQuote(bad)).exit_code, 0);
  auto b = RunCommand(Cli(gen + " --config " + ShellQuote(bad)));
  EXPECT_EQ(b.exit_code, 2) << b.err;
  EXPECT_NE(b.err.find("engine.activations must be auto, exact or int8"), std::string::npos) << b.err;
}

}  // namespace
}  // namespace strata
