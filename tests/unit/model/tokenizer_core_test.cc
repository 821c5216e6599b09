// Tokenizer behaviour on small hand-made vocabularies: validation errors,
// merge order, byte-level BPE, special tokens, UTF-8 repair.

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "model/tokenizer/tokenizer.h"
#include "model/tokenizer/unicode.h"

namespace strata {
namespace {

const std::string kSp = "\xE2\x96\x81";  // ▁

// <unk> <s> </s>, the 256 byte tokens, then `pieces` with descending scores.
TokenizerSpec SpmSpec(const std::vector<std::string>& pieces) {
  TokenizerSpec s;
  s.model = "llama";
  s.tokens = {"<unk>", "<s>", "</s>"};
  s.token_types = {kTokenTypeUnknown, kTokenTypeControl, kTokenTypeControl};
  s.scores = {0, 0, 0};
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
    s.tokens.push_back(buf);
    s.token_types.push_back(kTokenTypeByte);
    s.scores.push_back(0);
  }
  float score = -1;
  for (const auto& p : pieces) {
    s.tokens.push_back(p);
    s.token_types.push_back(kTokenTypeNormal);
    s.scores.push_back(score--);
  }
  s.unk_id = 0;
  s.bos_id = 1;
  s.eos_id = 2;
  s.eog_ids = {2};
  s.add_bos = true;
  return s;
}

std::unique_ptr<Tokenizer> MustCreate(TokenizerSpec spec) {
  auto t = Tokenizer::Create(std::move(spec));
  EXPECT_TRUE(t.ok()) << t.error().ToString();
  return t.ok() ? std::move(*t) : nullptr;
}

int32_t Id(const Tokenizer& t, const std::string& piece) {
  auto id = t.TokenId(piece);
  EXPECT_TRUE(id.has_value()) << piece;
  return id.value_or(-1);
}

TEST(TokenizerCreate, RejectsInvalidSpecsWithClearMessages) {
  auto expect_error = [](TokenizerSpec s, StatusCode code, const std::string& needle) {
    auto t = Tokenizer::Create(std::move(s));
    ASSERT_FALSE(t.ok()) << "expected an error mentioning " << needle;
    EXPECT_EQ(t.error().code(), code) << t.error().ToString();
    EXPECT_NE(t.error().message().find(needle), std::string::npos) << t.error().ToString();
  };
  const TokenizerSpec good = SpmSpec({kSp, "a", "b"});
  ASSERT_TRUE(Tokenizer::Create(good).ok());

  TokenizerSpec s = good;
  s.model = "unigram";
  expect_error(s, StatusCode::kUnsupported, "unigram");
  s = good;
  s.tokens.clear();
  s.scores.clear();
  s.token_types.clear();
  expect_error(s, StatusCode::kInvalidArgument, "no tokens");
  s = good;
  s.scores.pop_back();
  expect_error(s, StatusCode::kInvalidArgument, "scores");
  s = good;
  s.token_types.push_back(1);
  expect_error(s, StatusCode::kInvalidArgument, "token types");
  s = good;
  s.token_types[5] = 9;
  expect_error(s, StatusCode::kInvalidArgument, "unknown type 9");
  s = good;
  s.bos_id = 100000;
  expect_error(s, StatusCode::kInvalidArgument, "bos id 100000");
  s = good;
  s.eog_ids = {-1};
  expect_error(s, StatusCode::kInvalidArgument, "end-of-generation");
  s = good;
  s.scores.clear();
  expect_error(s, StatusCode::kInvalidArgument, "needs scores or merges");
  s = good;
  s.merges = {"a c"};
  expect_error(s, StatusCode::kInvalidArgument, "'c' is not in the vocabulary");
  s = good;
  s.merges = {"a b"};
  expect_error(s, StatusCode::kInvalidArgument, "merged piece 'ab'");
  s = good;
  s.merges = {"ab"};
  expect_error(s, StatusCode::kInvalidArgument, "'a b'");
  s = good;
  s.token_types[10] = kTokenTypeByte;
  s.tokens[10] = "x";
  expect_error(s, StatusCode::kInvalidArgument, "not spelled <0xNN>");
  s = good;
  s.space_prefix_scheme = "sometimes";
  expect_error(s, StatusCode::kInvalidArgument, "space_prefix_scheme");

  TokenizerSpec b;
  b.model = "gpt2";
  b.tokens = {"a", "b"};
  b.pre = "falcon";
  expect_error(b, StatusCode::kUnsupported, "falcon");
  b.pre_regexes = {"(unclosed"};
  expect_error(b, StatusCode::kInvalidArgument, "(unclosed");
}

TEST(TokenizerSpmMerging, HighestScoreFirstLeftmostOnTies) {
  // "▁abc": "bc" outscores "ab", so ▁ + a + bc, and "▁a" loses to "bc".
  auto t = MustCreate(SpmSpec({"bc", "ab", kSp + "a", kSp, "a", "b", "c"}));
  EXPECT_EQ(t->Encode("abc", false, false),
            (std::vector<int32_t>{Id(*t, kSp + "a"), Id(*t, "bc")}));
  // Equal scores: the leftmost pair merges first.
  TokenizerSpec s = SpmSpec({"aa", kSp, "a"});
  s.add_space_prefix = false;
  auto u = MustCreate(s);
  EXPECT_EQ(u->Encode("aaa", false, false), (std::vector<int32_t>{Id(*u, "aa"), Id(*u, "a")}));
}

TEST(TokenizerSpmMerging, ControlAndBytePiecesAreNotMergedInto) {
  // "<s>" spelled in text must not be assembled from characters into the
  // control token, even when the pieces to reach it exist.
  auto t = MustCreate(SpmSpec({"<s", "<", "s", ">", kSp}));
  const auto ids = t->Encode("<s>", false, false);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), 1), 0);
  EXPECT_EQ(t->Decode(ids, true), "<s>");
}

TEST(TokenizerSpmMerging, UnknownWithoutByteTokensBecomesUnk) {
  TokenizerSpec s;
  s.model = "llama";
  s.tokens = {"<unk>", kSp, "a"};
  s.scores = {0, -1, -2};
  s.unk_id = 0;
  s.token_types = {kTokenTypeUnknown, kTokenTypeNormal, kTokenTypeNormal};
  auto t = MustCreate(s);
  EXPECT_EQ(t->Encode("a\xC3\xA9", false, false), (std::vector<int32_t>{1, 2, 0}));
  s.unk_id = -1;
  s.token_types[0] = kTokenTypeNormal;
  t = MustCreate(s);
  // No unk either: the character is dropped, as HF's BPE does.
  EXPECT_EQ(t->Encode("a\xC3\xA9", false, false), (std::vector<int32_t>{1, 2}));
}

TEST(TokenizerSpmMerging, TypesDerivedWhenAbsent) {
  TokenizerSpec s = SpmSpec({kSp, "a"});
  s.token_types.clear();
  auto t = MustCreate(s);
  EXPECT_TRUE(t->IsSpecial(0));
  EXPECT_TRUE(t->IsSpecial(1));
  EXPECT_EQ(t->token_type(3), kTokenTypeByte);
  EXPECT_EQ(t->token_type(259), kTokenTypeNormal);
  EXPECT_EQ(t->Decode(t->Encode("\xC3\xA9", true, true), true), "\xC3\xA9");
}

TEST(TokenizerMetaspacePrefix, FirstOnlyAndNotDoubled) {
  TokenizerSpec s = SpmSpec({kSp + "a", kSp, "a"});
  s.space_prefix_scheme = "first";
  auto t = MustCreate(s);
  const int32_t sp_a = Id(*t, kSp + "a"), a = Id(*t, "a"), sp = Id(*t, kSp);
  EXPECT_EQ(t->Encode("a", false, true), std::vector<int32_t>{sp_a});
  EXPECT_EQ(t->Encode(" a", false, true), std::vector<int32_t>{sp_a});  // not doubled
  EXPECT_EQ(t->Encode("a</s>a", false, true), (std::vector<int32_t>{sp_a, 2, a}));
  s.space_prefix_scheme = "always";
  t = MustCreate(s);
  EXPECT_EQ(t->Encode("a</s>a", false, true), (std::vector<int32_t>{sp_a, 2, sp_a}));
  s.space_prefix_scheme = "";  // legacy: every segment, unconditionally
  t = MustCreate(s);
  EXPECT_EQ(t->Encode(" a", false, true), (std::vector<int32_t>{sp, sp_a}));
}

// A byte-level vocabulary: the 256 alphabet characters plus a few merges.
TokenizerSpec ByteLevelSpec() {
  TokenizerSpec s;
  s.model = "gpt2";
  s.pre = "gpt2";
  for (const std::string& c : tokenizer_internal::ByteToUnicode()) s.tokens.push_back(c);
  const std::string g = "\xC4\xA0";  // Ġ, the byte-level space
  for (const std::string& p : std::vector<std::string>{"he", "ll", "hell", "hello", g + "w", "or",
                                                       g + "wor", g + "worl", g + "world"}) {
    s.tokens.push_back(p);
  }
  s.merges = {"h e", "l l",      "he ll",     "hell o",    g + " w",
              "o r", g + "w or", g + "wor l", g + "worl d"};
  s.tokens.push_back("<|endoftext|>");
  s.token_types.assign(s.tokens.size(), kTokenTypeNormal);
  s.token_types.back() = kTokenTypeControl;
  s.eos_id = static_cast<int32_t>(s.tokens.size()) - 1;
  s.eog_ids = {s.eos_id};
  s.add_space_prefix = true;  // ignored by byte-level BPE
  return s;
}

TEST(TokenizerByteLevelBpe, MergesByRankAndRoundTripsAnyBytes) {
  auto t = MustCreate(ByteLevelSpec());
  const auto ids = t->Encode("hello world", false, false);
  EXPECT_EQ(ids, (std::vector<int32_t>{Id(*t, "hello"), Id(*t, "\xC4\xA0world")}));
  EXPECT_EQ(t->Decode(ids, true), "hello world");
  // Every byte string encodes; well-formed text round-trips exactly.
  for (const std::string& text :
       {std::string(""), std::string(" "), std::string("  x\n\n"), std::string("\t\r\n"),
        std::string("日本語 😀!"), std::string("a\0b", 3)}) {
    EXPECT_EQ(t->Decode(t->Encode(text, true, true), true), text) << text;
  }
  // Ill-formed input is kept byte for byte; Decode repairs it.
  const auto bad = t->Encode("x\xFF\xC3y", false, false);
  EXPECT_EQ(bad.size(), 4u);
  EXPECT_EQ(t->Decode(bad, true), "x\xEF\xBF\xBD\xEF\xBF\xBDy");
}

TEST(TokenizerByteLevelBpe, SpecialTokenParsedOrNot) {
  auto t = MustCreate(ByteLevelSpec());
  const int32_t eot = t->eos_id();
  EXPECT_EQ(t->Encode("hello<|endoftext|>", false, true),
            (std::vector<int32_t>{Id(*t, "hello"), eot}));
  const auto plain = t->Encode("hello<|endoftext|>", false, false);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), eot), 0);
  EXPECT_EQ(t->Decode(plain, true), "hello<|endoftext|>");
  EXPECT_EQ(t->Decode(std::vector<int32_t>{Id(*t, "hello"), eot}, false), "hello<|endoftext|>");
  EXPECT_EQ(t->Decode(std::vector<int32_t>{Id(*t, "hello"), eot}, true), "hello");
  EXPECT_TRUE(t->IsEog(eot));
}

TEST(TokenizerByteLevelBpe, IgnoreMergesTakesWholeWords) {
  TokenizerSpec s = ByteLevelSpec();
  // "hello" reachable only through a merge that is now missing.
  s.merges.erase(std::find(s.merges.begin(), s.merges.end(), "hell o"));
  auto t = MustCreate(s);
  EXPECT_EQ(t->Encode("hello", false, false), (std::vector<int32_t>{Id(*t, "hell"), Id(*t, "o")}));
  s.ignore_merges = true;
  t = MustCreate(s);
  EXPECT_EQ(t->Encode("hello", false, false), std::vector<int32_t>{Id(*t, "hello")});
  // GGUF carries no such key: pre "llama-bpe" implies it, as in llama.cpp.
  s.ignore_merges = false;
  s.pre = "llama-bpe";
  t = MustCreate(s);
  EXPECT_TRUE(t->spec().ignore_merges);
}

TEST(TokenizerByteLevelBpe, PreTokenizerRegexesByName) {
  TokenizerSpec s = ByteLevelSpec();
  s.tokens.push_back("12");
  s.merges.push_back("1 2");
  s.token_types.push_back(kTokenTypeNormal);
  // "12121": GPT-2 keeps the digit run whole ([12][12][1]); Llama-3 splits
  // it in threes ("121" "21": [12][1][2][1]); Qwen2 digit by digit.
  for (const auto& [pre, count] :
       std::vector<std::pair<std::string, size_t>>{{"gpt2", 3}, {"llama-bpe", 4}, {"qwen2", 5}}) {
    s.pre = pre;
    auto t = MustCreate(s);
    EXPECT_EQ(t->Encode("12121", false, false).size(), count) << pre;
  }
}

// Any byte string encodes without crashing, and decodes back to itself with
// ill-formed UTF-8 repaired (byte tokens / the byte-level alphabet keep every
// byte). Several threads at once: the tokenizers are shared read-only.
TEST(TokenizerRobustness, RandomBytesRoundTripConcurrently) {
  std::vector<std::unique_ptr<Tokenizer>> toks;
  toks.push_back(MustCreate(ByteLevelSpec()));
  toks.push_back(MustCreate(SpmSpec({kSp, "a", "b", "ab", kSp + "a", "<", ">"})));
  TokenizerSpec merges = SpmSpec({kSp, "a", "b", "ab"});
  merges.merges = {"a b"};
  toks.push_back(MustCreate(merges));
  std::vector<std::thread> threads;
  std::vector<int> failures(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      std::mt19937 rng(1234 + t);
      for (int round = 0; round < 300; ++round) {
        std::string text(rng() % 40, '\0');
        // Mostly ASCII, some high bytes: valid and ill-formed UTF-8 mixed.
        for (char& c : text)
          c = static_cast<char>(rng() % 3 == 0 ? 0x80 + rng() % 128 : rng() % 128);
        std::string repaired;
        tokenizer_internal::AppendUtf8Lossy(text, true, &repaired);
        for (const auto& tok : toks) {
          for (bool parse : {false, true}) {
            if (tok->Decode(tok->Encode(text, true, parse), true) != repaired) ++failures[t];
          }
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int t = 0; t < 4; ++t) EXPECT_EQ(failures[t], 0) << "thread " << t;
}

TEST(TokenizerUtf8Repair, MaximalSubpartsBecomeOneReplacementEach) {
  using tokenizer_internal::AppendUtf8Lossy;
  auto repair = [](std::string_view in) {
    std::string out;
    AppendUtf8Lossy(in, true, &out);
    return out;
  };
  const std::string r = "\xEF\xBF\xBD";
  EXPECT_EQ(repair("ok"), "ok");
  EXPECT_EQ(repair("\xE2\x82"), r);  // truncated: one
  EXPECT_EQ(repair("\xE2\x82"
                   "a"),
            r + "a");                                    // interrupted: one, then 'a'
  EXPECT_EQ(repair("\xED\xA0\x80"), r + r + r);          // surrogate: three
  EXPECT_EQ(repair("\xC0\xAF"), r + r);                  // overlong: two
  EXPECT_EQ(repair("\xF4\x90\x80\x80"), r + r + r + r);  // > U+10FFFF
  EXPECT_EQ(repair("\xF0\x9F\x98\x80"), "\xF0\x9F\x98\x80");
  std::string out;
  EXPECT_EQ(AppendUtf8Lossy("a\xF0\x9F", false, &out), 1u);  // holds back the tail
  EXPECT_EQ(out, "a");
}

}  // namespace
}  // namespace strata
