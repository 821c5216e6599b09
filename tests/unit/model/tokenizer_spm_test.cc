// SentencePiece-style tokenization on a real GGUF vocabulary
// (stories260K.gguf, 512 pieces with scores and byte tokens) against ids and
// text from llama.cpp (golden/stories260K_greedy.json); byte fallback,
// streaming, and concurrent use.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "common/mapped_file.h"
#include "model/gguf.h"
#include "model/gguf_tokenizer.h"
#include "model/tokenizer/tokenizer.h"
#include "tests/support/test_env.h"

namespace strata {
namespace {

using nlohmann::json;

class TokenizerStories260KTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    auto file = GgufFile::Open(testing::Stories260KPath());
    ASSERT_TRUE(file.ok()) << file.error().ToString();
    auto spec = TokenizerSpecFromGguf(**file);
    ASSERT_TRUE(spec.ok()) << spec.error().ToString();
    auto tok = Tokenizer::Create(std::move(*spec));
    ASSERT_TRUE(tok.ok()) << tok.error().ToString();
    tok_ = std::move(*tok).release();
    auto golden = ReadFileToString(testing::SharedDir() + "/golden/stories260K_greedy.json");
    ASSERT_TRUE(golden.ok()) << golden.error().ToString();
    golden_ = new json(json::parse(*golden));
  }
  static void TearDownTestSuite() {
    delete tok_;
    delete golden_;
    tok_ = nullptr;
    golden_ = nullptr;
  }
  void SetUp() override {
    ASSERT_NE(tok_, nullptr);
    ASSERT_NE(golden_, nullptr);
  }
  static std::vector<int32_t> Bytes(std::string_view s) {
    std::vector<int32_t> ids;
    for (char c : s) ids.push_back(*tok_->TokenId(ByteName(static_cast<uint8_t>(c))));
    return ids;
  }
  static std::string ByteName(uint8_t b) {
    char buf[8];
    std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
    return buf;
  }

  static inline const Tokenizer* tok_ = nullptr;
  static inline const json* golden_ = nullptr;
};

TEST_F(TokenizerStories260KTest, VocabularyShape) {
  EXPECT_EQ(tok_->vocab_size(), 512);
  EXPECT_EQ(tok_->spec().model, "llama");
  EXPECT_EQ(tok_->bos_id(), 1);
  EXPECT_EQ(tok_->eos_id(), 2);
  EXPECT_TRUE(tok_->add_bos());
  EXPECT_TRUE(tok_->IsEog(2));
  EXPECT_FALSE(tok_->IsEog(1));
  EXPECT_TRUE(tok_->IsSpecial(0));  // <unk>
  EXPECT_TRUE(tok_->IsSpecial(1));
  EXPECT_FALSE(tok_->IsSpecial(3));  // <0x00>
  EXPECT_FALSE(tok_->IsSpecial(-1));
  EXPECT_FALSE(tok_->IsSpecial(512));
  EXPECT_EQ(tok_->Piece(1), "<s>");
  EXPECT_EQ(tok_->Piece(512), "");
  EXPECT_EQ(tok_->TokenId("\xE2\x96\x81the"), 265);
  EXPECT_FALSE(tok_->TokenId("not a piece").has_value());
}

TEST_F(TokenizerStories260KTest, PromptIdsMatchLlamaCpp) {
  ASSERT_GE((*golden_)["cases"].size(), 5u);
  for (const json& c : (*golden_)["cases"]) {
    const std::string prompt = c["prompt"].get<std::string>();
    const auto expected = c["prompt_token_ids"].get<std::vector<int32_t>>();
    EXPECT_EQ(tok_->Encode(prompt, /*add_special=*/true, /*parse_special=*/true), expected)
        << prompt;
    EXPECT_EQ(tok_->Decode(expected, /*skip_special=*/true), prompt);
  }
}

TEST_F(TokenizerStories260KTest, GeneratedTextMatchesLlamaCpp) {
  for (const json& c : (*golden_)["cases"]) {
    const auto ids = c["generated_token_ids"].get<std::vector<int32_t>>();
    const std::string text = c["generated_text"].get<std::string>();
    // Generated tokens continue the prompt: their leading space stays.
    EXPECT_EQ(tok_->Decode(ids, true, DecodeStart::kContinuation), text);
    StreamDecoder stream(*tok_);
    std::string streamed;
    for (int32_t id : ids) streamed += stream.Push(id);
    streamed += stream.Flush();
    EXPECT_EQ(streamed, text);
    // The prompt and its continuation decode to the concatenated text.
    auto all = c["prompt_token_ids"].get<std::vector<int32_t>>();
    all.insert(all.end(), ids.begin(), ids.end());
    EXPECT_EQ(tok_->Decode(all, true), c["prompt"].get<std::string>() + text);
  }
}

TEST_F(TokenizerStories260KTest, LeadingSpaceRule) {
  const auto hello = tok_->Encode("Hello", true, false);
  // The ▁ prefix is removed at the start of a sequence, kept in a continuation.
  EXPECT_EQ(tok_->Decode(hello, true), "Hello");
  EXPECT_EQ(tok_->Decode(hello, true, DecodeStart::kContinuation), " Hello");
  // Not skipped, BOS is written and the space after it is not the first byte.
  EXPECT_EQ(tok_->Decode(hello, false), "<s> Hello");
  // Text that itself starts with a space keeps it.
  EXPECT_EQ(tok_->Decode(tok_->Encode(" Hello", true, false), true), " Hello");
}

TEST_F(TokenizerStories260KTest, ByteFallback) {
  // '日' and '😀' are not in this 512-piece vocabulary.
  for (const std::string text : {"é", "日本", "naïve 😀"}) {
    const auto ids = tok_->Encode(text, false, false);
    EXPECT_EQ(tok_->Decode(ids, true), text);
  }
  ASSERT_FALSE(tok_->TokenId("日").has_value());
  std::vector<int32_t> expected = {*tok_->TokenId("\xE2\x96\x81")};
  for (int32_t id : Bytes("日")) expected.push_back(id);
  EXPECT_EQ(expected.size(), 4u);
  EXPECT_EQ(tok_->Encode("日", false, false), expected);
}

TEST_F(TokenizerStories260KTest, StreamDecoderHoldsBackPartialUtf8) {
  const std::string emoji = "\xF0\x9F\x98\x80";  // 😀
  const auto bytes = Bytes(emoji);
  ASSERT_EQ(bytes.size(), 4u);
  StreamDecoder stream(*tok_);
  EXPECT_EQ(stream.Push(bytes[0]), "");
  EXPECT_EQ(stream.Push(bytes[1]), "");
  EXPECT_EQ(stream.Push(bytes[2]), "");
  EXPECT_EQ(stream.Push(bytes[3]), emoji);
  EXPECT_EQ(stream.Push(*tok_->TokenId("\xE2\x96\x81the")), " the");
  EXPECT_EQ(stream.Flush(), "");

  // Cut short: the rest comes out of Flush() as one U+FFFD.
  StreamDecoder cut(*tok_);
  EXPECT_EQ(cut.Push(bytes[0]), "");
  EXPECT_EQ(cut.Push(bytes[1]), "");
  EXPECT_EQ(cut.Flush(), "\xEF\xBF\xBD");
  // Interrupted by a complete token: U+FFFD, then that token.
  StreamDecoder interrupted(*tok_);
  EXPECT_EQ(interrupted.Push(bytes[0]), "");
  EXPECT_EQ(interrupted.Push(*tok_->TokenId("a")),
            "\xEF\xBF\xBD"
            "a");
  // A byte that can never start a sequence is replaced at once.
  StreamDecoder stray(*tok_);
  EXPECT_EQ(stray.Push(bytes[3]), "\xEF\xBF\xBD");
  // Decode() follows the same rules.
  EXPECT_EQ(tok_->Decode(std::vector<int32_t>{bytes[0], bytes[1]}, true), "\xEF\xBF\xBD");
  EXPECT_EQ(tok_->Decode(std::vector<int32_t>{bytes[3], bytes[0]}, true),
            "\xEF\xBF\xBD\xEF\xBF\xBD");
}

TEST_F(TokenizerStories260KTest, SpecialTokensParsedOrNot) {
  EXPECT_EQ(tok_->Encode("<s>", false, true), std::vector<int32_t>{1});
  const auto as_text = tok_->Encode("<s>", false, false);
  EXPECT_EQ(std::count(as_text.begin(), as_text.end(), 1), 0);
  EXPECT_EQ(tok_->Decode(as_text, true), "<s>");
  // After a special token the text gets its own ▁ prefix (llama.cpp, HF legacy).
  const auto ids = tok_->Encode("a</s>b", false, true);
  std::vector<int32_t> expected = tok_->Encode("a", false, false);
  expected.push_back(2);
  for (int32_t id : tok_->Encode("b", false, false)) expected.push_back(id);
  EXPECT_EQ(ids, expected);
  EXPECT_EQ(tok_->Decode(ids, false), "a</s> b");
  EXPECT_EQ(tok_->Decode(ids, true), "a b");
}

TEST_F(TokenizerStories260KTest, EmptyAndOutOfRange) {
  EXPECT_TRUE(tok_->Encode("", false, true).empty());
  EXPECT_EQ(tok_->Encode("", true, true), std::vector<int32_t>{1});
  EXPECT_EQ(tok_->Decode(std::vector<int32_t>{}, true), "");
  // Ids outside the vocabulary decode to U+FFFD (never crash, never skipped
  // silently).
  EXPECT_EQ(tok_->Decode(std::vector<int32_t>{-1, 512, 100000}, true),
            "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  StreamDecoder stream(*tok_);
  EXPECT_EQ(stream.Push(9999), "\xEF\xBF\xBD");
}

TEST_F(TokenizerStories260KTest, InvalidUtf8InputRoundTripsThroughByteTokens) {
  const std::string text = "ab\xFF\xC3(\xE2\x82";
  const auto ids = tok_->Encode(text, false, false);
  for (int32_t id : ids) {
    const std::string_view p = tok_->Piece(id);
    EXPECT_FALSE(p.empty());
  }
  // Every byte survives as a byte token; Decode repairs the UTF-8.
  EXPECT_EQ(tok_->Decode(ids, true), "ab\xEF\xBF\xBD\xEF\xBF\xBD(\xEF\xBF\xBD");
}

TEST_F(TokenizerStories260KTest, ConcurrentEncodeIsConsistent) {
  std::vector<std::string> texts;
  std::vector<std::vector<int32_t>> expected;
  for (const json& c : (*golden_)["cases"]) {
    texts.push_back(c["prompt"].get<std::string>() + c["generated_text"].get<std::string>());
    expected.push_back(tok_->Encode(texts.back(), true, true));
  }
  std::vector<std::thread> threads;
  std::vector<int> mismatches(8, 0);
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 50; ++round) {
        for (size_t i = 0; i < texts.size(); ++i) {
          if (tok_->Encode(texts[i], true, true) != expected[i]) ++mismatches[t];
          if (tok_->Decode(expected[i], true) != texts[i]) ++mismatches[t];
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 8; ++t) EXPECT_EQ(mismatches[t], 0) << "thread " << t;
}

}  // namespace
}  // namespace strata
