#include "model/gguf_tokenizer.h"

#include <cstdio>
#include <string>

namespace strata {

namespace {

Result<int32_t> OptionalId(const GgufFile& f, const char* key, int32_t fallback, size_t vocab) {
  if (!f.Has(key)) return fallback;
  auto v = f.GetInt(key);
  if (!v) return v.error().WithContext(f.origin());
  // Some converters write -1 (or u32 max) for "no such token".
  if (*v < 0 || *v == 0xffffffffLL) return -1;
  if (static_cast<size_t>(*v) >= vocab)
    return Status::Corrupt(f.origin() + ": key '" + key + "' = " + std::to_string(*v) + " is outside the " +
                           std::to_string(vocab) + "-token vocabulary");
  return static_cast<int32_t>(*v);
}

Result<bool> OptionalBool(const GgufFile& f, const char* key, bool fallback) {
  if (!f.Has(key)) return fallback;
  auto v = f.GetBool(key);
  if (!v) return v.error().WithContext(f.origin());
  return *v;
}

}  // namespace

Result<TokenizerSpec> TokenizerSpecFromGguf(const GgufFile& f) {
  TokenizerSpec s;
  auto model = f.GetString("tokenizer.ggml.model");
  if (!model) return model.error().WithContext(f.origin() + ": no tokenizer");
  s.model = *model;
  if (s.model != "llama" && s.model != "gpt2")
    return Status::Unsupported(f.origin() + ": tokenizer model '" + s.model +
                               "' is not supported (llama and gpt2 are)");
  if (f.Has("tokenizer.ggml.pre")) {
    auto pre = f.GetString("tokenizer.ggml.pre");
    if (!pre) return pre.error().WithContext(f.origin());
    s.pre = *pre;
  }
  auto tokens = f.GetStringArray("tokenizer.ggml.tokens");
  if (!tokens) return tokens.error().WithContext(f.origin());
  s.tokens = **tokens;
  const size_t n = s.tokens.size();
  if (f.Has("tokenizer.ggml.scores")) {
    STRATA_ASSIGN_OR_RETURN(s.scores, f.GetFloatArray("tokenizer.ggml.scores"));
    if (s.scores.size() != n)
      return Status::Corrupt(f.origin() + ": tokenizer.ggml.scores has " + std::to_string(s.scores.size()) +
                             " entries for " + std::to_string(n) + " tokens");
  }
  if (f.Has("tokenizer.ggml.token_type")) {
    STRATA_ASSIGN_OR_RETURN(std::vector<int64_t> types, f.GetIntArray("tokenizer.ggml.token_type"));
    if (types.size() != n)
      return Status::Corrupt(f.origin() + ": tokenizer.ggml.token_type has " + std::to_string(types.size()) +
                             " entries for " + std::to_string(n) + " tokens");
    s.token_types.assign(types.begin(), types.end());
  }
  if (f.Has("tokenizer.ggml.merges")) {
    auto merges = f.GetStringArray("tokenizer.ggml.merges");
    if (!merges) return merges.error().WithContext(f.origin());
    s.merges = **merges;
  }
  STRATA_ASSIGN_OR_RETURN(s.bos_id, OptionalId(f, "tokenizer.ggml.bos_token_id", -1, n));
  STRATA_ASSIGN_OR_RETURN(s.eos_id, OptionalId(f, "tokenizer.ggml.eos_token_id", -1, n));
  STRATA_ASSIGN_OR_RETURN(s.unk_id, OptionalId(f, "tokenizer.ggml.unknown_token_id", -1, n));
  STRATA_ASSIGN_OR_RETURN(s.pad_id, OptionalId(f, "tokenizer.ggml.padding_token_id", -1, n));
  STRATA_ASSIGN_OR_RETURN(int32_t eot, OptionalId(f, "tokenizer.ggml.eot_token_id", -1, n));
  STRATA_ASSIGN_OR_RETURN(int32_t eom, OptionalId(f, "tokenizer.ggml.eom_token_id", -1, n));
  // SentencePiece vocabularies add BOS by default; byte-level BPE ones don't.
  STRATA_ASSIGN_OR_RETURN(s.add_bos, OptionalBool(f, "tokenizer.ggml.add_bos_token", s.model == "llama"));
  STRATA_ASSIGN_OR_RETURN(s.add_eos, OptionalBool(f, "tokenizer.ggml.add_eos_token", false));
  STRATA_ASSIGN_OR_RETURN(s.add_space_prefix, OptionalBool(f, "tokenizer.ggml.add_space_prefix", s.model == "llama"));
  if (s.eos_id >= 0) s.eog_ids.push_back(s.eos_id);
  for (int32_t id : {eot, eom})
    if (id >= 0 && id != s.eos_id) s.eog_ids.push_back(id);
  // Chat models often mark their turn-end token only by name.
  for (const char* name : {"<|eot_id|>", "<|im_end|>", "<|end_of_text|>", "<|endoftext|>", "<|eom_id|>"}) {
    for (size_t i = 0; i < n; ++i) {
      if (s.tokens[i] == name) {
        int32_t id = static_cast<int32_t>(i);
        bool have = false;
        for (int32_t e : s.eog_ids) have |= e == id;
        if (!have) s.eog_ids.push_back(id);
        break;
      }
    }
  }
  if (f.Has("tokenizer.chat_template")) {
    auto t = f.GetString("tokenizer.chat_template");
    if (!t) return t.error().WithContext(f.origin());
    s.chat_template = *t;
  }
  return s;
}

void AddTokenizerToGguf(const TokenizerSpec& s, GgufWriter* w) {
  w->SetString("tokenizer.ggml.model", s.model);
  if (!s.pre.empty()) w->SetString("tokenizer.ggml.pre", s.pre);
  w->SetStringArray("tokenizer.ggml.tokens", s.tokens);
  if (!s.scores.empty()) w->SetF32Array("tokenizer.ggml.scores", s.scores);
  if (!s.token_types.empty()) w->SetI32Array("tokenizer.ggml.token_type", s.token_types);
  if (!s.merges.empty()) w->SetStringArray("tokenizer.ggml.merges", s.merges);
  if (s.bos_id >= 0) w->SetU32("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(s.bos_id));
  if (s.eos_id >= 0) w->SetU32("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(s.eos_id));
  if (s.unk_id >= 0) w->SetU32("tokenizer.ggml.unknown_token_id", static_cast<uint32_t>(s.unk_id));
  if (s.pad_id >= 0) w->SetU32("tokenizer.ggml.padding_token_id", static_cast<uint32_t>(s.pad_id));
  w->SetBool("tokenizer.ggml.add_bos_token", s.add_bos);
  w->SetBool("tokenizer.ggml.add_eos_token", s.add_eos);
  if (s.model == "llama") w->SetBool("tokenizer.ggml.add_space_prefix", s.add_space_prefix);
  if (!s.chat_template.empty()) w->SetString("tokenizer.chat_template", s.chat_template);
}

TokenizerSpec SyntheticVocab(int vocab_size) {
  TokenizerSpec s;
  s.model = "llama";
  auto add = [&](std::string piece, float score, int32_t type) {
    s.tokens.push_back(std::move(piece));
    s.scores.push_back(score);
    s.token_types.push_back(type);
  };
  add("<unk>", 0, kTokenTypeUnknown);
  add("<s>", 0, kTokenTypeControl);
  add("</s>", 0, kTokenTypeControl);
  for (int b = 0; b < 256; ++b) {
    char buf[8];
    std::snprintf(buf, sizeof buf, "<0x%02X>", b);
    add(buf, 0, kTokenTypeByte);
  }
  const std::string space = "\xE2\x96\x81";  // ▁
  float score = -1;
  add(space, score--, kTokenTypeNormal);
  for (int ch = 33; ch < 127; ++ch) add(std::string(1, static_cast<char>(ch)), score--, kTokenTypeNormal);
  for (int ch = 33; ch < 127; ++ch) add(space + static_cast<char>(ch), score--, kTokenTypeNormal);
  static const char* kWords[] = {"the", "and", "was", "to", "a", "he", "she", "it", "of", "in", "said", "day",
                                 "they", "her", "his", "with", "on", "for", "you", "big", "little", "once",
                                 "upon", "time", "there", "happy", "play", "saw", "friend", "tree"};
  for (const char* word : kWords) {
    if (static_cast<int>(s.tokens.size()) >= vocab_size) break;
    add(space + word, score--, kTokenTypeNormal);
  }
  while (static_cast<int>(s.tokens.size()) < vocab_size) {
    add("<unused" + std::to_string(s.tokens.size()) + ">", -1e9f, kTokenTypeUnused);
  }
  s.tokens.resize(static_cast<size_t>(vocab_size));
  s.scores.resize(static_cast<size_t>(vocab_size));
  s.token_types.resize(static_cast<size_t>(vocab_size));
  s.unk_id = 0;
  s.bos_id = 1;
  s.eos_id = 2;
  s.eog_ids = {2};
  s.add_bos = true;
  s.add_space_prefix = true;
  return s;
}

}  // namespace strata
