// TokenizerSpec -> Hugging Face tokenizer.json / tokenizer_config.json texts.

#include <algorithm>
#include <nlohmann/json.hpp>
#include <tuple>
#include <unordered_map>

#include "model/tokenizer/pretokenizer.h"
#include "model/tokenizer/tokenizer.h"
#include "model/tokenizer/unicode.h"

namespace strata {
namespace {

using nlohmann::json;
using tokenizer_internal::kSpaceMarker;

bool IsAdded(int32_t type) {
  return type == kTokenTypeControl || type == kTokenTypeUnknown || type == kTokenTypeUserDefined;
}

json AddedTokenJson(const Tokenizer& tok, int32_t id) {
  return json{{"id", id},
              {"content", std::string(tok.Piece(id))},
              {"single_word", false},
              {"lstrip", false},
              {"rstrip", false},
              {"normalized", false},
              {"special", tok.token_type(id) != kTokenTypeUserDefined}};
}

// Merges that make HF's rank-based BPE reproduce score-based merging: every
// split of a mergeable piece into two mergeable pieces, ordered by the
// piece's score (highest first), then by the ids of the halves (as
// transformers' SentencePieceExtractor orders them).
std::vector<std::string> MergesFromScores(const Tokenizer& tok) {
  const TokenizerSpec& s = tok.spec();
  auto mergeable = [&](int32_t id) {
    const int32_t t = tok.token_type(id);
    return t == kTokenTypeNormal || t == kTokenTypeUserDefined;
  };
  struct Rule {
    float score;
    int32_t merged, left, right;
  };
  std::vector<Rule> rules;
  for (int32_t id = 0; id < tok.vocab_size(); ++id) {
    if (!mergeable(id)) continue;
    const std::string_view piece = tok.Piece(id);
    for (size_t cut = tokenizer_internal::Utf8CharLen(piece, 0); cut < piece.size();
         cut += tokenizer_internal::Utf8CharLen(piece, cut)) {
      const auto l = tok.TokenId(piece.substr(0, cut));
      const auto r = tok.TokenId(piece.substr(cut));
      if (l && r && mergeable(*l) && mergeable(*r) && *tok.TokenId(piece) == id) {
        rules.push_back({s.scores[id], id, *l, *r});
      }
    }
  }
  std::stable_sort(rules.begin(), rules.end(), [](const Rule& a, const Rule& b) {
    return std::tie(b.score, a.merged, a.left, a.right) <
           std::tie(a.score, b.merged, b.left, b.right);
  });
  std::vector<std::string> merges;
  merges.reserve(rules.size());
  for (const Rule& r : rules) {
    merges.push_back(std::string(tok.Piece(r.left)) + " " + std::string(tok.Piece(r.right)));
  }
  return merges;
}

json TemplateProcessor(const Tokenizer& tok) {
  const TokenizerSpec& s = tok.spec();
  json single = json::array(), pair = json::array(), specials = json::object();
  auto special = [&](int32_t id, int type_id) {
    const std::string piece(tok.Piece(id));
    specials[piece] = json{{"id", piece}, {"ids", {id}}, {"tokens", {piece}}};
    return json{{"SpecialToken", {{"id", piece}, {"type_id", type_id}}}};
  };
  for (int half = 0; half < 2; ++half) {
    json& out = half == 0 ? single : pair;
    for (int part = 0; part < (half == 0 ? 1 : 2); ++part) {
      if (s.add_bos) out.push_back(special(s.bos_id, part));
      out.push_back(json{{"Sequence", {{"id", part == 0 ? "A" : "B"}, {"type_id", part}}}});
      if (s.add_eos) out.push_back(special(s.eos_id, part));
    }
  }
  return json{{"type", "TemplateProcessing"},
              {"single", single},
              {"pair", pair},
              {"special_tokens", specials}};
}

Result<std::unique_ptr<Tokenizer>> Validated(const TokenizerSpec& spec) {
  auto tok = Tokenizer::Create(spec);
  if (!tok.ok()) return tok.error().WithContext("cannot write tokenizer");
  return tok;
}

}  // namespace

Result<std::string> TokenizerSpecToHfTokenizerJson(const TokenizerSpec& spec) {
  STRATA_ASSIGN_OR_RETURN(auto tok, Validated(spec));
  const TokenizerSpec& s = tok->spec();  // with the defaults Create() applied
  const bool llama = s.model == "llama";

  json vocab = json::object();
  json added = json::array();
  for (int32_t id = 0; id < tok->vocab_size(); ++id) {
    const std::string piece(tok->Piece(id));
    // A repeated piece cannot be a second key; the first id keeps it.
    if (!vocab.contains(piece)) vocab[piece] = id;
    if (IsAdded(tok->token_type(id))) added.push_back(AddedTokenJson(*tok, id));
  }
  const std::vector<std::string> merges =
      llama && s.merges.empty() ? MergesFromScores(*tok) : s.merges;

  json j;
  j["version"] = "1.0";
  j["truncation"] = nullptr;
  j["padding"] = nullptr;
  j["added_tokens"] = added;
  const json post = s.add_bos || s.add_eos ? TemplateProcessor(*tok) : json();
  if (llama) {
    const bool metaspace = !s.space_prefix_scheme.empty();
    json normalizers = json::array();
    if (!metaspace) {
      if (s.add_space_prefix)
        normalizers.push_back({{"type", "Prepend"}, {"prepend", kSpaceMarker}});
      normalizers.push_back(
          {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", kSpaceMarker}});
      j["normalizer"] = {{"type", "Sequence"}, {"normalizers", normalizers}};
      j["pre_tokenizer"] = nullptr;
    } else {
      j["normalizer"] = nullptr;
      j["pre_tokenizer"] = {
          {"type", "Metaspace"},
          {"replacement", kSpaceMarker},
          {"prepend_scheme", s.add_space_prefix ? s.space_prefix_scheme : "never"},
          {"split", false}};
    }
    j["post_processor"] = post;
    json decoders = json::array();
    decoders.push_back(
        {{"type", "Replace"}, {"pattern", {{"String", kSpaceMarker}}}, {"content", " "}});
    decoders.push_back({{"type", "ByteFallback"}});
    decoders.push_back({{"type", "Fuse"}});
    if (s.add_space_prefix) {
      decoders.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
    }
    j["decoder"] = {{"type", "Sequence"}, {"decoders", decoders}};
  } else {
    std::vector<std::string> regexes = s.pre_regexes;
    if (regexes.empty()) {
      STRATA_ASSIGN_OR_RETURN(regexes, tokenizer_internal::PreTokenizerRegexes(s.pre));
    }
    json pre = json::array();
    for (const std::string& r : regexes) {
      pre.push_back({{"type", "Split"},
                     {"pattern", {{"Regex", r}}},
                     {"behavior", "Isolated"},
                     {"invert", false}});
    }
    pre.push_back({{"type", "ByteLevel"},
                   {"add_prefix_space", false},
                   {"trim_offsets", true},
                   {"use_regex", false}});
    j["normalizer"] = nullptr;
    j["pre_tokenizer"] = {{"type", "Sequence"}, {"pretokenizers", pre}};
    j["post_processor"] = post.is_null() ? json{{"type", "ByteLevel"},
                                                {"add_prefix_space", true},
                                                {"trim_offsets", false},
                                                {"use_regex", true}}
                                         : post;
    j["decoder"] = {{"type", "ByteLevel"},
                    {"add_prefix_space", true},
                    {"trim_offsets", true},
                    {"use_regex", true}};
  }
  j["model"] = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", s.unk_id >= 0 ? json(std::string(tok->Piece(s.unk_id))) : json()},
                {"continuing_subword_prefix", nullptr},
                {"end_of_word_suffix", nullptr},
                {"fuse_unk", llama},
                {"byte_fallback", llama && s.byte_fallback},
                {"ignore_merges", s.ignore_merges},
                {"vocab", vocab},
                {"merges", merges}};
  try {
    return j.dump(1, ' ', /*ensure_ascii=*/false, json::error_handler_t::replace);
  } catch (const json::exception& e) {
    return Status::Internal(std::string("writing tokenizer.json: ") + e.what());
  }
}

Result<std::string> TokenizerSpecToHfConfigJson(const TokenizerSpec& spec) {
  STRATA_ASSIGN_OR_RETURN(auto tok, Validated(spec));
  const TokenizerSpec& s = tok->spec();
  auto piece_or_null = [&](int32_t id) {
    return id >= 0 ? json(std::string(tok->Piece(id))) : json();
  };
  json decoder = json::object();
  for (int32_t id = 0; id < tok->vocab_size(); ++id) {
    if (!IsAdded(tok->token_type(id))) continue;
    json a = AddedTokenJson(*tok, id);
    a.erase("id");
    decoder[std::to_string(id)] = a;
  }
  json c;
  c["add_bos_token"] = s.add_bos;
  c["add_eos_token"] = s.add_eos;
  c["bos_token"] = piece_or_null(s.bos_id);
  c["eos_token"] = piece_or_null(s.eos_id);
  c["unk_token"] = piece_or_null(s.unk_id);
  c["pad_token"] = piece_or_null(s.pad_id);
  c["added_tokens_decoder"] = decoder;
  c["clean_up_tokenization_spaces"] = false;
  c["tokenizer_class"] = "PreTrainedTokenizerFast";
  if (!s.chat_template.empty()) c["chat_template"] = s.chat_template;
  try {
    return c.dump(1, ' ', /*ensure_ascii=*/false, json::error_handler_t::replace);
  } catch (const json::exception& e) {
    return Status::Internal(std::string("writing tokenizer_config.json: ") + e.what());
  }
}

}  // namespace strata
