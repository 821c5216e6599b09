// Hugging Face tokenizer.json / tokenizer_config.json: reading (errors on bad
// or unsupported input) and writing (a spec written and read back tokenizes
// the same; the written stories260K directory, loaded by the independent
// @huggingface/tokenizers, gives llama.cpp's ids).

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "common/mapped_file.h"
#include "model/gguf.h"
#include "model/gguf_tokenizer.h"
#include "model/tokenizer/tokenizer.h"
#include "tests/support/run_command.h"
#include "tests/support/test_env.h"

namespace strata {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

bool RefsRequired() {
  const char* v = std::getenv("STRATA_REQUIRE_REFS");
  return v != nullptr && std::string(v) == "1";
}

TokenizerSpec Stories260KSpec() {
  auto file = GgufFile::Open(testing::Stories260KPath());
  EXPECT_TRUE(file.ok()) << file.error().ToString();
  if (!file.ok()) return {};
  auto spec = TokenizerSpecFromGguf(**file);
  EXPECT_TRUE(spec.ok()) << spec.error().ToString();
  return spec.ok() ? *spec : TokenizerSpec{};
}

std::vector<std::string> GoldenPrompts(std::vector<std::vector<int32_t>>* ids) {
  auto text = ReadFileToString(testing::SharedDir() + "/golden/stories260K_greedy.json");
  EXPECT_TRUE(text.ok());
  std::vector<std::string> prompts;
  if (!text.ok()) return prompts;
  const json golden = json::parse(*text);
  for (const json& c : golden["cases"]) {
    prompts.push_back(c["prompt"].get<std::string>());
    ids->push_back(c["prompt_token_ids"].get<std::vector<int32_t>>());
  }
  return prompts;
}

const char* kMinimalByteLevel = R"({
  "model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "ab": 2}, "merges": ["a b"]},
  "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false, "use_regex": true},
  "decoder": {"type": "ByteLevel"},
  "added_tokens": [{"id": 3, "content": "<|end|>", "special": true}]
})";

Status ReadError(const std::string& tokenizer_json, const std::string& config = "") {
  auto spec = TokenizerSpecFromHfJson(tokenizer_json, config);
  return spec.ok() ? Status::Ok() : spec.error();
}

TEST(TokenizerHfJsonRead, MinimalByteLevel) {
  auto spec = TokenizerSpecFromHfJson(kMinimalByteLevel, "");
  ASSERT_TRUE(spec.ok()) << spec.error().ToString();
  EXPECT_EQ(spec->model, "gpt2");
  EXPECT_EQ(spec->pre, "gpt2");
  ASSERT_EQ(spec->tokens.size(), 4u);
  EXPECT_EQ(spec->tokens[3], "<|end|>");
  EXPECT_EQ(spec->token_types[3], kTokenTypeControl);
  EXPECT_EQ(spec->merges, std::vector<std::string>{"a b"});
  EXPECT_EQ(spec->eog_ids, std::vector<int32_t>{3});  // by name, without an eos
  EXPECT_FALSE(spec->add_bos);
  auto tok = Tokenizer::Create(*spec);
  ASSERT_TRUE(tok.ok()) << tok.error().ToString();
  EXPECT_EQ((*tok)->Encode("ab<|end|>", false, true), (std::vector<int32_t>{2, 3}));
}

TEST(TokenizerHfJsonRead, ConfigGivesSpecialTokensAndTemplate) {
  const std::string config = R"({"bos_token": {"content": "a"}, "eos_token": "<|end|>",
      "add_bos_token": true, "chat_template": [{"name": "tool_use", "template": "T"},
                                               {"name": "default", "template": "D"}]})";
  auto spec = TokenizerSpecFromHfJson(kMinimalByteLevel, config);
  ASSERT_TRUE(spec.ok()) << spec.error().ToString();
  EXPECT_EQ(spec->bos_id, 0);
  EXPECT_EQ(spec->eos_id, 3);
  EXPECT_TRUE(spec->add_bos);
  EXPECT_EQ(spec->chat_template, "D");
}

TEST(TokenizerHfJsonRead, TemplateProcessingDecidesBosAndEos) {
  json j = json::parse(kMinimalByteLevel);
  j["post_processor"] = {
      {"type", "Sequence"},
      {"processors",
       {{{"type", "ByteLevel"}},
        {{"type", "TemplateProcessing"},
         {"single",
          {{{"SpecialToken", {{"id", "b"}, {"type_id", 0}}}},
           {{"Sequence", {{"id", "A"}, {"type_id", 0}}}},
           {{"SpecialToken", {{"id", "<|end|>"}, {"type_id", 0}}}}}},
         {"special_tokens", {{"b", {{"id", "b"}, {"ids", {1}}, {"tokens", {"b"}}}}}}}}}};
  // The post-processor wins over the config's add_bos_token.
  auto spec = TokenizerSpecFromHfJson(j.dump(), R"({"add_bos_token": false})");
  ASSERT_TRUE(spec.ok()) << spec.error().ToString();
  EXPECT_TRUE(spec->add_bos);
  EXPECT_TRUE(spec->add_eos);
  EXPECT_EQ(spec->bos_id, 1);
  EXPECT_EQ(spec->eos_id, 3);
}

TEST(TokenizerHfJsonRead, ErrorsNameTheProblem) {
  auto expect = [](const Status& s, StatusCode code, const std::string& needle) {
    EXPECT_EQ(s.code(), code) << s.ToString();
    EXPECT_NE(s.message().find(needle), std::string::npos) << s.ToString();
  };
  expect(ReadError("{not json"), StatusCode::kInvalidArgument, "tokenizer.json");
  expect(ReadError("[1, 2]"), StatusCode::kInvalidArgument, "model");
  expect(ReadError(kMinimalByteLevel, "{oops"), StatusCode::kInvalidArgument,
         "tokenizer_config.json");
  expect(ReadError(kMinimalByteLevel, "[]"), StatusCode::kInvalidArgument, "not an object");

  json j = json::parse(kMinimalByteLevel);
  j["model"]["type"] = "Unigram";
  expect(ReadError(j.dump()), StatusCode::kUnsupported, "Unigram");
  j = json::parse(kMinimalByteLevel);
  j["pre_tokenizer"] = {{"type", "Sequence"},
                        {"pretokenizers", {{{"type", "Digits"}}, {{"type", "ByteLevel"}}}}};
  expect(ReadError(j.dump()), StatusCode::kUnsupported, "Digits");
  j = json::parse(kMinimalByteLevel);
  j["normalizer"] = {{"type", "NFKC"}};
  expect(ReadError(j.dump()), StatusCode::kUnsupported, "NFKC");
  j = json::parse(kMinimalByteLevel);
  j["model"]["vocab"] = "not an object";
  expect(ReadError(j.dump()), StatusCode::kInvalidArgument, "unexpected structure");
  j = json::parse(kMinimalByteLevel);
  j["model"]["vocab"]["x"] = -5;
  expect(ReadError(j.dump()), StatusCode::kInvalidArgument, "out of range");
  j = json::parse(kMinimalByteLevel);
  j["pre_tokenizer"] = {
      {"type", "Split"}, {"pattern", {{"Regex", "\\s+"}}}, {"behavior", "MergedWithPrevious"}};
  j["decoder"] = {{"type", "ByteLevel"}};
  expect(ReadError(j.dump()), StatusCode::kUnsupported, "MergedWithPrevious");
  // Neither byte-level nor SentencePiece-style: nothing maps spaces.
  j = json::parse(kMinimalByteLevel);
  j.erase("pre_tokenizer");
  j.erase("decoder");
  expect(ReadError(j.dump()), StatusCode::kUnsupported, "Metaspace");
}

// A spec written as tokenizer.json + tokenizer_config.json and read back
// gives a tokenizer that encodes identically.
TEST(TokenizerHfJsonWrite, Stories260KRoundTrip) {
  const TokenizerSpec spec = Stories260KSpec();
  ASSERT_FALSE(spec.tokens.empty());
  auto tj = TokenizerSpecToHfTokenizerJson(spec);
  auto tc = TokenizerSpecToHfConfigJson(spec);
  ASSERT_TRUE(tj.ok()) << tj.error().ToString();
  ASSERT_TRUE(tc.ok()) << tc.error().ToString();
  auto back = TokenizerSpecFromHfJson(*tj, *tc);
  ASSERT_TRUE(back.ok()) << back.error().ToString();
  EXPECT_EQ(back->tokens, spec.tokens);
  EXPECT_EQ(back->bos_id, 1);
  EXPECT_EQ(back->eos_id, 2);
  EXPECT_EQ(back->unk_id, 0);
  EXPECT_TRUE(back->add_bos);
  EXPECT_FALSE(back->merges.empty());  // derived from the scores
  auto original = Tokenizer::Create(spec);
  auto reread = Tokenizer::Create(*back);
  ASSERT_TRUE(original.ok() && reread.ok());
  std::vector<std::vector<int32_t>> golden;
  const auto prompts = GoldenPrompts(&golden);
  ASSERT_FALSE(prompts.empty());
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ((*reread)->Encode(prompts[i], true, true), golden[i]) << prompts[i];
  }
  for (const std::string text :
       {"Hello world!", "  two  spaces ", "日本 😀", "Tom's ball\n\nwas red.", "<s>x</s>"}) {
    EXPECT_EQ((*reread)->Encode(text, true, true), (*original)->Encode(text, true, true)) << text;
    EXPECT_EQ((*reread)->Decode((*original)->Encode(text, true, false), true), text);
  }
}

TEST(TokenizerHfJsonWrite, ByteLevelRoundTrip) {
  auto spec = TokenizerSpecFromHfJson(kMinimalByteLevel, R"({"eos_token": "<|end|>"})");
  ASSERT_TRUE(spec.ok());
  spec->pre_regexes.clear();
  spec->pre = "qwen2";
  spec->chat_template = "{{ messages }}";
  auto tj = TokenizerSpecToHfTokenizerJson(*spec);
  auto tc = TokenizerSpecToHfConfigJson(*spec);
  ASSERT_TRUE(tj.ok() && tc.ok());
  auto back = TokenizerSpecFromHfJson(*tj, *tc);
  ASSERT_TRUE(back.ok()) << back.error().ToString();
  EXPECT_EQ(back->model, "gpt2");
  EXPECT_EQ(back->pre, "qwen2");
  EXPECT_EQ(back->tokens, spec->tokens);
  EXPECT_EQ(back->merges, spec->merges);
  EXPECT_EQ(back->eos_id, 3);
  EXPECT_EQ(back->chat_template, "{{ messages }}");
}

TEST(TokenizerHfJsonWrite, RejectsInvalidSpec) {
  TokenizerSpec s;
  s.model = "llama";
  auto r = TokenizerSpecToHfTokenizerJson(s);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.error().message().find("no tokens"), std::string::npos) << r.error().ToString();
}

// The written directory, tokenized by @huggingface/tokenizers, gives the ids
// of Strata's SentencePiece tokenizer on the GGUF vocabulary.
TEST(TokenizerHfJsonWrite, IndependentReferenceLoadsWrittenStories260K) {
  const std::string ref_dir = testing::ReferenceDir();
  if (!fs::exists(fs::path(ref_dir) / "node_modules" / "@huggingface" / "tokenizers") ||
      testing::RunCommand("node --version").exit_code != 0) {
    if (RefsRequired()) {
      FAIL() << "node or " << ref_dir << "/node_modules missing (STRATA_REQUIRE_REFS=1)";
    }
    GTEST_SKIP() << "node or " << ref_dir
                 << "/node_modules missing; run scripts/setup-test-refs.sh to enable";
  }
  const TokenizerSpec spec = Stories260KSpec();
  ASSERT_FALSE(spec.tokens.empty());
  auto tok = Tokenizer::Create(spec);
  ASSERT_TRUE(tok.ok());
  const fs::path dir = testing::MakeTempDir("strata-tok-");
  auto tj = TokenizerSpecToHfTokenizerJson(spec);
  auto tc = TokenizerSpecToHfConfigJson(spec);
  ASSERT_TRUE(tj.ok() && tc.ok());
  ASSERT_TRUE(WriteFileAtomic((dir / "tokenizer.json").string(), tj->data(), tj->size()).ok());
  ASSERT_TRUE(
      WriteFileAtomic((dir / "tokenizer_config.json").string(), tc->data(), tc->size()).ok());
  const testing::CommandResult run =
      testing::RunCommand("cd " + testing::ShellQuote(ref_dir) + " && node tokenize.mjs --dir " +
                          testing::ShellQuote(dir.string()) + " --name stories260K");
  ASSERT_EQ(run.exit_code, 0) << run.err.substr(0, 500);
  const std::string& out = run.out;
  const json refs = json::parse(out);
  const json& corpus = refs["corpus"];
  const json& hf = refs["vocabs"]["stories260K"]["hf"];
  ASSERT_GE(corpus.size(), 40u);
  for (size_t i = 0; i < corpus.size(); ++i) {
    const std::string text = corpus[i].get<std::string>();
    EXPECT_EQ((*tok)->Encode(text, true, true), hf["ids"][i].get<std::vector<int32_t>>())
        << json(text).dump();
    EXPECT_EQ((*tok)->Decode(hf["ids"][i].get<std::vector<int32_t>>(), true),
              hf["decoded"][i].get<std::string>())
        << json(text).dump();
  }
}

}  // namespace
}  // namespace strata
