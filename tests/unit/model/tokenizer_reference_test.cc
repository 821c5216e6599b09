// Strata's tokenizers against two independent JavaScript implementations
// (tests/reference/tokenize.mjs: @lenml/tokenizer-* and
// @huggingface/tokenizers) on a varied corpus, for the Llama-2 (SentencePiece
// style BPE, legacy and Metaspace variants), Llama-3 and Qwen3 vocabularies.
//
// Needs node and tests/reference/node_modules (scripts/setup-test-refs.sh).
// Without them the tests skip, or fail when STRATA_REQUIRE_REFS=1 (CI).

#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "common/mapped_file.h"
#include "model/tokenizer/tokenizer.h"
#include "model/tokenizer/unicode.h"
#include "tests/support/run_command.h"
#include "tests/support/test_env.h"

namespace strata {
namespace {

using nlohmann::json;

bool RefsRequired() {
  const char* v = std::getenv("STRATA_REQUIRE_REFS");
  return v != nullptr && std::string(v) == "1";
}

#define SKIP_OR_FAIL(msg)                                                    \
  do {                                                                       \
    if (RefsRequired()) {                                                    \
      FAIL() << (msg) << " (STRATA_REQUIRE_REFS=1)";                         \
    } else {                                                                 \
      GTEST_SKIP() << (msg) << "; run scripts/setup-test-refs.sh to enable"; \
    }                                                                        \
  } while (0)

struct References {
  json root;
  std::string unavailable;  // why there are none
};

// tokenize.mjs runs once per process (a few seconds).
const References& LoadReferences() {
  static const References refs = [] {
    References r;
    const std::string dir = testing::ReferenceDir();
    namespace fs = std::filesystem;
    if (!fs::exists(fs::path(dir) / "node_modules" / "@huggingface" / "tokenizers") ||
        !fs::exists(fs::path(dir) / "node_modules" / "@lenml" / "tokenizer-llama3")) {
      r.unavailable = "reference packages missing in " + dir + "/node_modules";
      return r;
    }
    if (testing::RunCommand("node --version").exit_code != 0) {
      r.unavailable = "node is not on PATH";
      return r;
    }
    // ctest runs each test in its own process: the output is cached, under
    // a name that changes with the script and the installed packages.
    std::string key = dir;
    for (const char* input :
         {"tokenize.mjs", "package-lock.json", "node_modules/.package-lock.json"}) {
      if (auto text = ReadFileToString((fs::path(dir) / input).string()); text.ok()) key += *text;
    }
    const char* b = std::getenv("STRATA_BINARY_DIR");
    const fs::path cache =
        (b != nullptr ? fs::path(b) : fs::temp_directory_path()) /
        ("strata_tokenizer_refs_" + std::to_string(std::hash<std::string>()(key)) + ".json");
    if (auto text = ReadFileToString(cache.string()); text.ok()) {
      r.root = json::parse(*text, nullptr, /*allow_exceptions=*/false);
      if (!r.root.is_discarded()) return r;  // else a broken cache: run again
    }
    const testing::CommandResult run =
        testing::RunCommand("cd " + testing::ShellQuote(dir) + " && node tokenize.mjs");
    if (run.exit_code != 0) {
      r.unavailable = "tokenize.mjs failed: " + run.err.substr(0, 500);
      return r;
    }
    const std::string& out = run.out;
    r.root = json::parse(out, nullptr, /*allow_exceptions=*/false);
    if (r.root.is_discarded()) {
      r.unavailable = "tokenize.mjs printed no JSON: " + out.substr(0, 500);
    } else {
      (void)WriteFileAtomic(cache.string(), out.data(), out.size());
    }
    return r;
  }();
  return refs;
}

// The same edit tokenize.mjs makes for "llama2-metaspace".
std::string MetaspaceVariant(const std::string& tokenizer_json) {
  json j = json::parse(tokenizer_json);
  j["normalizer"] = nullptr;
  j["pre_tokenizer"] = {{"type", "Metaspace"},
                        {"replacement", "\u2581"},
                        {"prepend_scheme", "first"},
                        {"split", false},
                        {"add_prefix_space", true}};
  return j.dump();
}

// Tokenizer specs are costly to load (10 MB of JSON); cache per vocabulary.
const Tokenizer* LoadTokenizer(const json& files, std::string* error, bool drop_merges = false) {
  static std::map<std::string, std::unique_ptr<Tokenizer>> cache;
  const std::string key = files.dump() + (drop_merges ? "/spm" : "");
  if (auto it = cache.find(key); it != cache.end()) return it->second.get();
  auto tj = ReadFileToString(files.at("tokenizer_json").get<std::string>());
  auto tc = ReadFileToString(files.at("tokenizer_config_json").get<std::string>());
  if (!tj.ok() || !tc.ok()) {
    *error = "cannot read " + files.dump();
    return nullptr;
  }
  std::string text = *tj;
  if (files.value("edit", "") == "metaspace") text = MetaspaceVariant(text);
  auto spec = TokenizerSpecFromHfJson(text, *tc);
  if (!spec.ok()) {
    *error = spec.error().ToString();
    return nullptr;
  }
  if (drop_merges) spec->merges.clear();  // SentencePiece scoring instead
  auto tok = Tokenizer::Create(std::move(*spec));
  if (!tok.ok()) {
    *error = tok.error().ToString();
    return nullptr;
  }
  return (cache[key] = std::move(*tok)).get();
}

std::string Show(const std::string& s) { return json(s).dump(); }

bool IsValidUtf8(const std::string& s) {
  static const uint32_t kMin[] = {0, 0x80, 0x800, 0x10000};
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<unsigned char>(s[i]);
    int need;
    uint32_t cp;
    if (b < 0x80) {
      ++i;
      continue;
    } else if ((b & 0xE0) == 0xC0) {
      need = 1, cp = b & 0x1F;
    } else if ((b & 0xF0) == 0xE0) {
      need = 2, cp = b & 0x0F;
    } else if ((b & 0xF8) == 0xF0) {
      need = 3, cp = b & 0x07;
    } else {
      return false;
    }
    if (i + need >= s.size()) return false;
    for (int k = 1; k <= need; ++k) {
      const auto c = static_cast<unsigned char>(s[i + k]);
      if ((c & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (c & 0x3F);
    }
    if (cp < kMin[need] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += need + 1;
  }
  return true;
}

class ReferenceTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    const References& refs = LoadReferences();
    if (!refs.unavailable.empty()) SKIP_OR_FAIL(refs.unavailable);
    ASSERT_TRUE(refs.root.contains("vocabs") && refs.root["vocabs"].contains(GetParam()))
        << "tokenize.mjs output lacks vocabulary " << GetParam();
    corpus_ = &refs.root["corpus"];
    ref_ = &refs.root["vocabs"][GetParam()];
    std::string error;
    tok_ = LoadTokenizer(ref_->at("files"), &error);
    ASSERT_NE(tok_, nullptr) << error;
  }
  std::string Text(size_t i) const { return (*corpus_)[i].get<std::string>(); }
  std::vector<int32_t> Ids(const char* impl, const char* field, size_t i) const {
    return (*ref_)[impl][field][i].get<std::vector<int32_t>>();
  }

  const json* corpus_ = nullptr;
  const json* ref_ = nullptr;
  const Tokenizer* tok_ = nullptr;
};

// One test per vocabulary (each ctest process reloads ~10 MB of JSON).
TEST_P(ReferenceTest, MatchesReferences) {
  // The brief: at least 40 strings, including the empty one.
  EXPECT_GE(corpus_->size(), 40u);
  bool has_empty = false;
  for (const auto& t : *corpus_) has_empty |= t.get<std::string>().empty();
  EXPECT_TRUE(has_empty);

  for (size_t i = 0; i < corpus_->size(); ++i) {
    const std::string text = Text(i);
    SCOPED_TRACE("text " + Show(text));
    // The two references agree with each other.
    EXPECT_EQ(Ids("lenml", "ids", i), Ids("hf", "ids", i));
    EXPECT_EQ(Ids("lenml", "ids_plain", i), Ids("hf", "ids_plain", i));
    EXPECT_EQ((*ref_)["lenml"]["decoded"][i], (*ref_)["hf"]["decoded"][i]);

    // Encode, with and without BOS/EOS; special-token text parsed.
    const std::vector<int32_t> ids = Ids("hf", "ids", i);
    EXPECT_EQ(tok_->Encode(text, /*add_special=*/true, /*parse_special=*/true), ids);
    EXPECT_EQ(tok_->Encode(text, /*add_special=*/false, /*parse_special=*/true),
              Ids("hf", "ids_plain", i));

    // Decode, special tokens skipped.
    EXPECT_EQ(tok_->Decode(ids, /*skip_special=*/true),
              (*ref_)["hf"]["decoded"][i].get<std::string>());

    // Streaming gives Decode's text in valid UTF-8 pieces.
    for (DecodeStart start : {DecodeStart::kSequenceStart, DecodeStart::kContinuation}) {
      StreamDecoder stream(*tok_, /*skip_special=*/true, start);
      std::string streamed;
      for (int32_t id : ids) {
        const std::string part = stream.Push(id);
        EXPECT_TRUE(IsValidUtf8(part)) << Show(part);
        streamed += part;
      }
      streamed += stream.Flush();
      EXPECT_EQ(streamed, tok_->Decode(ids, true, start));
    }

    // Round trip: special-token text not parsed, decoded back exactly (for
    // the Metaspace variant HF itself drops a leading space, so not there).
    if (GetParam() != "llama2-metaspace") {
      const std::vector<int32_t> plain = tok_->Encode(text, true, /*parse_special=*/false);
      EXPECT_EQ(tok_->Decode(plain, /*skip_special=*/true), text);
    }
  }
}

// Random bytes (valid and ill-formed UTF-8) through the real vocabularies:
// no crash, and the text comes back with ill-formed sequences repaired.
TEST_P(ReferenceTest, RandomBytesRoundTrip) {
  std::mt19937 rng(42);
  for (int round = 0; round < 300; ++round) {
    std::string text(rng() % 64, '\0');
    for (char& c : text) c = static_cast<char>(rng() % 3 == 0 ? 0x80 + rng() % 128 : rng() % 128);
    // HF's Metaspace adds no ▁ before a leading space, so decoding drops it.
    if (GetParam() == "llama2-metaspace" && !text.empty() && text[0] == ' ') text[0] = 'x';
    std::string repaired;
    tokenizer_internal::AppendUtf8Lossy(text, /*final=*/true, &repaired);
    const std::string decoded = tok_->Decode(tok_->Encode(text, true, false), true);
    EXPECT_TRUE(IsValidUtf8(decoded));
    EXPECT_EQ(decoded, repaired) << Show(repaired);
  }
}

INSTANTIATE_TEST_SUITE_P(TokenizerVocabularies, ReferenceTest,
                         ::testing::Values("llama2", "llama2-metaspace", "llama3", "qwen3"),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& c : name) {
                             if (c == '-') c = '_';
                           }
                           return name;
                         });

// The Llama-2 tokenizer.json loaded without its merges: SentencePiece
// score-based merging over the scores TokenizerSpecFromHfJson derives from
// the merge ranks gives the same ids as the rank-based BPE.
TEST(TokenizerSpmFromDerivedScores, MatchesReferenceOnLlama2) {
  const References& refs = LoadReferences();
  if (!refs.unavailable.empty()) SKIP_OR_FAIL(refs.unavailable);
  for (const char* vocab : {"llama2", "llama2-metaspace"}) {
    const json& ref = refs.root["vocabs"][vocab];
    std::string error;
    const Tokenizer* tok = LoadTokenizer(ref["files"], &error, /*drop_merges=*/true);
    ASSERT_NE(tok, nullptr) << error;
    ASSERT_TRUE(tok->spec().merges.empty());
    for (size_t i = 0; i < refs.root["corpus"].size(); ++i) {
      const std::string text = refs.root["corpus"][i].get<std::string>();
      EXPECT_EQ(tok->Encode(text, true, true), ref["hf"]["ids"][i].get<std::vector<int32_t>>())
          << vocab << " text " << Show(text);
    }
  }
}

// Control-token text stays text without parse_special; user-defined added
// tokens (Qwen3's <think>) are matched either way, as in HF and llama.cpp.
TEST(TokenizerSpecialTokens, ParsedOrNotOnQwen3) {
  const References& refs = LoadReferences();
  if (!refs.unavailable.empty()) SKIP_OR_FAIL(refs.unavailable);
  std::string error;
  const Tokenizer* tok = LoadTokenizer(refs.root["vocabs"]["qwen3"]["files"], &error);
  ASSERT_NE(tok, nullptr) << error;
  const int32_t im_start = tok->TokenId("<|im_start|>").value_or(-1);
  const int32_t think = tok->TokenId("<think>").value_or(-1);
  ASSERT_EQ(im_start, 151644);
  ASSERT_EQ(think, 151667);
  EXPECT_TRUE(tok->IsSpecial(im_start));
  EXPECT_FALSE(tok->IsSpecial(think));
  EXPECT_TRUE(tok->IsEog(tok->TokenId("<|im_end|>").value()));
  EXPECT_TRUE(tok->IsEog(tok->TokenId("<|endoftext|>").value()));
  EXPECT_FALSE(tok->IsEog(im_start));
  EXPECT_EQ(tok->bos_id(), -1);
  EXPECT_FALSE(tok->add_bos());

  const std::string text = "<|im_start|>user <think>x</think>";
  const auto parsed = tok->Encode(text, false, true);
  const auto plain = tok->Encode(text, false, false);
  EXPECT_EQ(parsed.front(), im_start);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), im_start), 0);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), think), 1);
  EXPECT_EQ(tok->Decode(plain, false), text);
  EXPECT_EQ(tok->Decode(parsed, false), text);
  EXPECT_EQ(tok->Decode(parsed, true), "user <think>x</think>");
  // Not parsed, the control token's text is tokenized like other text; the
  // user-defined tokens still split the text into segments.
  std::vector<int32_t> expected = tok->Encode("<|im_start|>user ", false, false);
  expected.push_back(think);
  for (int32_t id : tok->Encode("x", false, false)) expected.push_back(id);
  expected.push_back(tok->TokenId("</think>").value());
  EXPECT_EQ(plain, expected);
}

TEST(TokenizerSpecialTokens, BosAndEosRules) {
  const References& refs = LoadReferences();
  if (!refs.unavailable.empty()) SKIP_OR_FAIL(refs.unavailable);
  std::string error;
  const Tokenizer* llama2 = LoadTokenizer(refs.root["vocabs"]["llama2"]["files"], &error);
  ASSERT_NE(llama2, nullptr) << error;
  EXPECT_TRUE(llama2->add_bos());
  EXPECT_FALSE(llama2->add_eos());
  EXPECT_EQ(llama2->bos_id(), 1);
  EXPECT_EQ(llama2->eos_id(), 2);
  EXPECT_EQ(llama2->Encode("", true, true), std::vector<int32_t>{1});
  EXPECT_TRUE(llama2->Encode("", false, true).empty());
  // "<s>" written in the text: the BOS token when parsed, text otherwise.
  EXPECT_EQ(llama2->Encode("<s>", false, true), std::vector<int32_t>{1});
  EXPECT_NE(llama2->Encode("<s>", false, false), std::vector<int32_t>{1});

  // This Llama-3 tokenizer.json has a ByteLevel post-processor and no
  // add_bos_token: both references add no <|begin_of_text|>, so neither do we.
  const Tokenizer* llama3 = LoadTokenizer(refs.root["vocabs"]["llama3"]["files"], &error);
  ASSERT_NE(llama3, nullptr) << error;
  EXPECT_EQ(llama3->bos_id(), 128000);
  EXPECT_FALSE(llama3->add_bos());
  EXPECT_TRUE(llama3->spec().ignore_merges);
  EXPECT_EQ(llama3->spec().pre, "llama-bpe");
  EXPECT_TRUE(llama3->IsEog(llama3->TokenId("<|eot_id|>").value()));
  EXPECT_TRUE(llama3->IsEog(llama3->TokenId("<|end_of_text|>").value()));
  EXPECT_FALSE(llama3->spec().chat_template.empty());
}

}  // namespace
}  // namespace strata
