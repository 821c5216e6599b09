// TokenizerSpecFromHfJson: Hugging Face tokenizer.json + tokenizer_config.json
// -> TokenizerSpec.

#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <unordered_map>

#include "model/tokenizer/pretokenizer.h"
#include "model/tokenizer/tokenizer_spec.h"
#include "model/tokenizer/unicode.h"
#include "model/tokenizer/vocab.h"

namespace strata {
namespace {

using nlohmann::json;
using tokenizer_internal::kSpaceMarker;

// Tokens that end generation when present as control tokens, beside eos
// (llama.cpp's list of the Llama-family ones).
constexpr const char* kEogPieces[] = {"</s>",       "<|eot_id|>",    "<|eom_id|>",
                                      "<|im_end|>", "<|endoftext|>", "<|end_of_text|>",
                                      "<|end|>",    "<end_of_turn>", "<|return|>"};

std::string TypeOf(const json& node) {
  if (!node.is_object()) return "";
  const auto it = node.find("type");
  return it != node.end() && it->is_string() ? it->get<std::string>() : "";
}

// The components of a node that may be a "Sequence" of them.
std::vector<const json*> Flatten(const json& node, const char* list_key) {
  std::vector<const json*> out;
  if (node.is_null()) return out;
  if (TypeOf(node) == "Sequence" && node.contains(list_key) && node[list_key].is_array()) {
    for (const json& child : node[list_key]) {
      for (const json* c : Flatten(child, list_key)) out.push_back(c);
    }
  } else {
    out.push_back(&node);
  }
  return out;
}

// A special token in tokenizer_config.json: a string, {"content": ...} or null.
std::string ConfigToken(const json& config, const char* key) {
  if (!config.is_object()) return "";
  const auto it = config.find(key);
  if (it == config.end()) return "";
  if (it->is_string()) return it->get<std::string>();
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    return (*it)["content"].get<std::string>();
  }
  return "";
}

std::string PatternOf(const json& node) {
  // {"String": s} or {"Regex": r}; a string becomes a literal regex.
  const json& p = node.at("pattern");
  if (p.contains("Regex")) return p.at("Regex").get<std::string>();
  const std::string s = p.at("String").get<std::string>();
  std::string out = "\\Q";
  size_t pos = 0;
  for (size_t hit; (hit = s.find("\\E", pos)) != std::string::npos; pos = hit + 2) {
    out += s.substr(pos, hit - pos) + "\\E\\\\E\\Q";
  }
  return out + s.substr(pos) + "\\E";
}

// The literal of a {"String": s} pattern; nullopt for a regex.
std::optional<std::string> StringPatternOf(const json& node) {
  const json& p = node.at("pattern");
  if (!p.contains("String")) return std::nullopt;
  return p.at("String").get<std::string>();
}

struct Parsed {
  TokenizerSpec spec;
  std::unordered_map<std::string, int32_t> ids;  // piece -> lowest id
};

Status ParseNormalizerAndPre(const json& j, Parsed* p) {
  TokenizerSpec& s = p->spec;
  const json null_json;
  const json& normalizer = j.contains("normalizer") ? j["normalizer"] : null_json;
  const json& pre = j.contains("pre_tokenizer") ? j["pre_tokenizer"] : null_json;
  bool prepend = false, replace = false;
  for (const json* n : Flatten(normalizer, "normalizers")) {
    const std::string type = TypeOf(*n);
    if (type == "NFC") continue;  // identity on NFC text; see tokenizer_spec.h
    if (s.model == "llama" && type == "Prepend" && n->value("prepend", "") == kSpaceMarker) {
      prepend = true;
    } else if (s.model == "llama" && type == "Replace" &&
               StringPatternOf(*n) == std::optional<std::string>(" ") &&
               n->value("content", "") == kSpaceMarker) {
      replace = true;
    } else {
      return Status::Unsupported("tokenizer.json normalizer '" + type + "' is not supported");
    }
  }
  bool metaspace = false;
  for (const json* t : Flatten(pre, "pretokenizers")) {
    const std::string type = TypeOf(*t);
    if (s.model == "llama" && type == "Metaspace") {
      if (t->value("replacement", std::string(kSpaceMarker)) != kSpaceMarker) {
        return Status::Unsupported("tokenizer.json Metaspace replacement other than U+2581");
      }
      if (t->value("split", false)) {
        return Status::Unsupported("tokenizer.json Metaspace with split=true");
      }
      std::string scheme = t->value("prepend_scheme", "");
      if (scheme.empty()) scheme = t->value("add_prefix_space", true) ? "always" : "never";
      if (scheme != "always" && scheme != "first" && scheme != "never") {
        return Status::Unsupported("tokenizer.json Metaspace prepend_scheme '" + scheme + "'");
      }
      metaspace = true;
      s.add_space_prefix = scheme != "never";
      s.space_prefix_scheme = scheme == "never" ? "always" : scheme;
    } else if (s.model == "gpt2" && type == "Split") {
      const std::string behavior = t->value("behavior", "Isolated");
      if (behavior != "Isolated" || t->value("invert", false)) {
        return Status::Unsupported("tokenizer.json Split pre-tokenizer with behavior '" + behavior +
                                   "'" + (t->value("invert", false) ? ", invert" : ""));
      }
      s.pre_regexes.push_back(PatternOf(*t));
    } else if (s.model == "gpt2" && type == "ByteLevel") {
      if (t->value("add_prefix_space", false)) {
        return Status::Unsupported("tokenizer.json ByteLevel pre-tokenizer with add_prefix_space");
      }
      if (t->value("use_regex", true)) s.pre_regexes.push_back(tokenizer_internal::kGpt2Regex);
    } else {
      return Status::Unsupported("tokenizer.json pre-tokenizer '" + type + "' is not supported");
    }
  }
  if (s.model == "llama") {
    if (metaspace && (prepend || replace)) {
      return Status::Unsupported("tokenizer.json has both a Metaspace pre-tokenizer and a " +
                                 std::string("Prepend/Replace normalizer"));
    }
    if (!metaspace && !replace) {
      return Status::Unsupported(
          "tokenizer.json BPE without ByteLevel, Metaspace or a ' '->'\u2581' Replace normalizer");
    }
    if (!metaspace) s.add_space_prefix = prepend;
  } else {
    if (s.pre_regexes == std::vector<std::string>{tokenizer_internal::kLlama3Regex}) {
      s.pre = "llama-bpe";
    } else if (s.pre_regexes == std::vector<std::string>{tokenizer_internal::kQwen2Regex}) {
      s.pre = "qwen2";
    } else if (s.pre_regexes == std::vector<std::string>{tokenizer_internal::kGpt2Regex}) {
      s.pre = "gpt2";
    } else {
      s.pre = "custom";
    }
  }
  return Status::Ok();
}

Status ParseModel(const json& j, Parsed* p) {
  TokenizerSpec& s = p->spec;
  const json& model = j.at("model");
  const std::string type = TypeOf(model);
  if (type != "BPE" && !(type.empty() && model.contains("merges"))) {
    return Status::Unsupported("tokenizer.json model type '" + type +
                               "' is not supported (only BPE)");
  }
  // Ids may leave gaps; they are filled with unused placeholders.
  std::map<int64_t, std::string> by_id;
  for (const auto& [piece, id] : model.at("vocab").items()) by_id[id.get<int64_t>()] = piece;
  struct Added {
    int64_t id;
    std::string content;
    bool special;
  };
  std::vector<Added> added;
  if (j.contains("added_tokens") && j["added_tokens"].is_array()) {
    for (const json& a : j["added_tokens"]) {
      added.push_back({a.at("id").get<int64_t>(), a.at("content").get<std::string>(),
                       a.value("special", false)});
    }
  }
  int64_t max_id = by_id.empty() ? -1 : by_id.rbegin()->first;
  for (const Added& a : added) max_id = std::max(max_id, a.id);
  if ((!by_id.empty() && by_id.begin()->first < 0) || max_id >= INT32_MAX) {
    return Status::InvalidArgument("tokenizer.json has a token id out of range");
  }
  if (max_id < 0) return Status::InvalidArgument("tokenizer.json has an empty vocabulary");
  const auto n = static_cast<size_t>(max_id + 1);
  s.tokens.assign(n, "");
  s.token_types.assign(n, kTokenTypeUnused);
  for (auto& [id, piece] : by_id) {
    s.tokens[id] = piece;
    s.token_types[id] = kTokenTypeNormal;
  }
  s.byte_fallback = model.value("byte_fallback", false);
  s.ignore_merges = model.value("ignore_merges", false);
  if (s.model == "llama" && s.byte_fallback) {
    for (size_t i = 0; i < n; ++i) {
      if (s.token_types[i] == kTokenTypeNormal &&
          tokenizer_internal::ParseByteToken(s.tokens[i]) >= 0) {
        s.token_types[i] = kTokenTypeByte;
      }
    }
  }
  for (const Added& a : added) {
    s.tokens[a.id] = a.content;
    s.token_types[a.id] = a.special ? kTokenTypeControl : kTokenTypeUserDefined;
  }
  for (size_t i = 0; i < n; ++i) {
    if (s.token_types[i] == kTokenTypeUnused) s.tokens[i] = "[PAD" + std::to_string(i) + "]";
    p->ids.emplace(s.tokens[i], static_cast<int32_t>(i));
  }
  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    const auto it = p->ids.find(model["unk_token"].get<std::string>());
    if (it != p->ids.end()) {
      s.unk_id = it->second;
      s.token_types[s.unk_id] = kTokenTypeUnknown;
    }
  }
  if (model.contains("merges")) {
    for (const json& m : model["merges"]) {
      if (m.is_string()) {
        s.merges.push_back(m.get<std::string>());
      } else {
        const std::string a = m.at(0).get<std::string>(), b = m.at(1).get<std::string>();
        if (a.find(' ') != std::string::npos || b.find(' ') != std::string::npos) {
          return Status::Unsupported("tokenizer.json merge of pieces containing a space: '" + a +
                                     "' '" + b + "'");
        }
        s.merges.push_back(a + " " + b);
      }
    }
  }
  return Status::Ok();
}

// Scores for SentencePiece-style merging that agree with the merge ranks: a
// piece scores minus the rank of the first rule producing it; pieces no rule
// produces score below all of those.
void DeriveScores(Parsed* p) {
  TokenizerSpec& s = p->spec;
  const auto n = static_cast<float>(s.merges.size());
  s.scores.assign(s.tokens.size(), 0.0f);
  for (size_t i = 0; i < s.tokens.size(); ++i) s.scores[i] = -n - static_cast<float>(i) - 1.0f;
  std::vector<bool> seen(s.tokens.size(), false);
  for (size_t r = 0; r < s.merges.size(); ++r) {
    std::string joined = s.merges[r];
    const size_t space = joined.find(' ');
    if (space == std::string::npos) continue;
    joined.erase(space, 1);
    const auto it = p->ids.find(joined);
    if (it == p->ids.end() || seen[it->second]) continue;
    seen[it->second] = true;
    s.scores[it->second] = -static_cast<float>(r);
  }
}

Status ParseSpecialTokens(const json& j, const json& config, Parsed* p) {
  TokenizerSpec& s = p->spec;
  auto id_of = [&](const std::string& piece) -> int32_t {
    if (piece.empty()) return -1;
    const auto it = p->ids.find(piece);
    return it == p->ids.end() ? -1 : it->second;
  };
  s.bos_id = id_of(ConfigToken(config, "bos_token"));
  s.eos_id = id_of(ConfigToken(config, "eos_token"));
  s.pad_id = id_of(ConfigToken(config, "pad_token"));
  const int32_t config_unk = id_of(ConfigToken(config, "unk_token"));
  if (config_unk >= 0) s.unk_id = config_unk;

  // What the reference encoders execute is the post-processor; the config's
  // add_bos_token/add_eos_token only count without a TemplateProcessing.
  const json* tmpl = nullptr;
  if (j.contains("post_processor")) {
    for (const json* pp : Flatten(j["post_processor"], "processors")) {
      if (TypeOf(*pp) == "TemplateProcessing") tmpl = pp;
    }
  }
  if (tmpl != nullptr) {
    const json& single = tmpl->at("single");
    auto special_id = [&](const json& item) -> Result<int32_t> {
      const std::string name = item.at("SpecialToken").at("id").get<std::string>();
      const json& table = tmpl->contains("special_tokens") ? (*tmpl)["special_tokens"] : json();
      if (table.is_object() && table.contains(name)) {
        const json& ids = table[name].at("ids");
        if (ids.size() != 1) {
          return Status::Unsupported("post_processor special token '" + name + "' of " +
                                     std::to_string(ids.size()) + " ids");
        }
        return ids[0].get<int32_t>();
      }
      const int32_t id = id_of(name);
      if (id < 0) return Status::InvalidArgument("post_processor names unknown token " + name);
      return id;
    };
    int sequences = 0;
    for (size_t i = 0; i < single.size(); ++i) {
      const json& item = single[i];
      if (item.contains("Sequence")) {
        ++sequences;
        continue;
      }
      STRATA_ASSIGN_OR_RETURN(int32_t id, special_id(item));
      if (sequences == 0 && i == 0) {
        s.add_bos = true;
        s.bos_id = id;
      } else if (sequences == 1 && i + 1 == single.size()) {
        s.add_eos = true;
        s.eos_id = id;
      } else {
        return Status::Unsupported("post_processor template with special tokens other than " +
                                   std::string("one leading and one trailing"));
      }
    }
  } else if (config.is_object()) {
    s.add_bos = config.value("add_bos_token", false) && s.bos_id >= 0;
    s.add_eos = config.value("add_eos_token", false) && s.eos_id >= 0;
  }
  if (s.eos_id >= 0) s.eog_ids.push_back(s.eos_id);
  for (const char* piece : kEogPieces) {
    const int32_t id = id_of(piece);
    if (id >= 0 && s.token_types[id] == kTokenTypeControl &&
        std::find(s.eog_ids.begin(), s.eog_ids.end(), id) == s.eog_ids.end()) {
      s.eog_ids.push_back(id);
    }
  }
  if (config.is_object() && config.contains("chat_template")) {
    const json& t = config["chat_template"];
    if (t.is_string()) {
      s.chat_template = t.get<std::string>();
    } else if (t.is_array()) {
      for (const json& named : t) {
        if (named.value("name", "") == "default" || s.chat_template.empty()) {
          s.chat_template = named.value("template", "");
        }
      }
    }
  }
  return Status::Ok();
}

Result<TokenizerSpec> FromJson(const json& j, const json& config) {
  Parsed p;
  // Byte-level when a ByteLevel component is present anywhere.
  bool byte_level = false;
  for (const auto& [key, list_key] :
       {std::pair{"pre_tokenizer", "pretokenizers"}, std::pair{"decoder", "decoders"}}) {
    if (!j.contains(key)) continue;
    for (const json* c : Flatten(j[key], list_key)) byte_level |= TypeOf(*c) == "ByteLevel";
  }
  p.spec.model = byte_level ? "gpt2" : "llama";
  STRATA_RETURN_IF_ERROR(ParseModel(j, &p));
  STRATA_RETURN_IF_ERROR(ParseNormalizerAndPre(j, &p));
  if (byte_level) {
    p.spec.add_space_prefix = false;
    p.spec.byte_fallback = false;
  } else {
    DeriveScores(&p);
  }
  STRATA_RETURN_IF_ERROR(ParseSpecialTokens(j, config, &p));
  return std::move(p.spec);
}

}  // namespace

Result<TokenizerSpec> TokenizerSpecFromHfJson(std::string_view tokenizer_json,
                                              std::string_view tokenizer_config_json) {
  json j, config;
  try {
    j = json::parse(tokenizer_json);
  } catch (const json::exception& e) {
    return Status::InvalidArgument(std::string("tokenizer.json: ") + e.what());
  }
  if (!j.is_object() || !j.contains("model")) {
    return Status::InvalidArgument("tokenizer.json: not an object with a \"model\"");
  }
  if (!tokenizer_config_json.empty()) {
    try {
      config = json::parse(tokenizer_config_json);
    } catch (const json::exception& e) {
      return Status::InvalidArgument(std::string("tokenizer_config.json: ") + e.what());
    }
    if (!config.is_object()) return Status::InvalidArgument("tokenizer_config.json: not an object");
  }
  try {
    return FromJson(j, config);
  } catch (const json::exception& e) {
    return Status::InvalidArgument(std::string("tokenizer.json: unexpected structure: ") +
                                   e.what());
  }
}

}  // namespace strata
