#pragma once
// TokenizerSpec: everything needed to build a Tokenizer, as GGUF's
// tokenizer.* keys or a Hugging Face tokenizer.json + tokenizer_config.json
// carry it. A plain value type; Tokenizer::Create() validates it.

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace strata {

// GGUF tokenizer.ggml.token_type values (llama.cpp's llama_token_type).
enum TokenType : int32_t {
  kTokenTypeUndefined = 0,  // treated as normal
  kTokenTypeNormal = 1,
  kTokenTypeUnknown = 2,      // <unk>; special
  kTokenTypeControl = 3,      // <s>, <|im_start|>, ...; special
  kTokenTypeUserDefined = 4,  // added, not special: always matched in text, decoded verbatim
  kTokenTypeUnused = 5,       // never produced by Encode
  kTokenTypeByte = 6,         // <0xNN> byte-fallback token (model "llama")
};

// pre_regexes, space_prefix_scheme and ignore_merges come from tokenizer.json
// only: GGUF has no keys for them (a GGUF "gpt2" model names its regexes
// through `pre`).
struct TokenizerSpec {
  // "llama": SentencePiece style (▁ for spaces, byte fallback).
  // "gpt2":  byte-level BPE with a regex pre-tokenizer.
  std::string model = "llama";
  // Pre-tokenizer id (GGUF tokenizer.ggml.pre) for "gpt2": "default"/"gpt2",
  // "llama-bpe" (Llama-3), "qwen2", ... Used only when pre_regexes is empty.
  std::string pre;
  // Split regexes (PCRE2 syntax, applied in order, matches and the gaps
  // between them both kept: HF's "Isolated" behaviour). Filled from
  // tokenizer.json; empty means "derive from pre".
  std::vector<std::string> pre_regexes;

  std::vector<std::string> tokens;   // id -> piece; dense
  std::vector<float> scores;         // SPM scores; empty or tokens.size()
  std::vector<int32_t> token_types;  // TokenType per id; empty or tokens.size()
  // "a b" merge rules, highest priority first. For "gpt2" required. For
  // "llama", when present, merge-rank BPE is used (Hugging Face semantics);
  // when empty, SentencePiece score-based merging is used.
  std::vector<std::string> merges;

  int32_t bos_id = -1, eos_id = -1, unk_id = -1, pad_id = -1;
  std::vector<int32_t> eog_ids;  // end-of-generation tokens (includes eos)

  bool add_bos = false, add_eos = false;
  // "llama" only: prepend ▁ to text (SentencePiece's add_dummy_prefix).
  bool add_space_prefix = true;
  // "llama" only: how the ▁ prefix is added.
  //   ""       every text segment (start of input and after each special
  //            token), unconditionally: SentencePiece, llama.cpp, HF's
  //            Prepend normalizer (Llama-2 "legacy").
  //   "always" HF Metaspace: every segment that does not already start with ▁.
  //   "first"  HF Metaspace: only the segment at the start of the input, and
  //            only when it does not already start with ▁.
  std::string space_prefix_scheme;
  bool byte_fallback = true;  // pieces not in the vocabulary -> <0xNN> tokens
  // "gpt2": a pre-token found whole in the vocabulary skips BPE. GGUF has no
  // key for it; Tokenizer::Create() sets it for pre "llama-bpe", as llama.cpp.
  bool ignore_merges = false;
  std::string chat_template;  // raw Jinja text, if any
};

// Builds a spec from a Hugging Face tokenizer.json (required) and
// tokenizer_config.json (may be empty). Supports model type BPE in the
// SentencePiece style (Prepend/Replace normalizer or Metaspace pre-tokenizer,
// byte fallback) and in the byte-level style (Split regexes + ByteLevel). An
// NFC normalizer is accepted and treated as identity (Strata does not
// normalise; text that is already NFC, as almost all text is, is unaffected).
// Returns InvalidArgument for malformed JSON, Unsupported for components
// Strata does not implement (naming them).
Result<TokenizerSpec> TokenizerSpecFromHfJson(std::string_view tokenizer_json,
                                              std::string_view tokenizer_config_json);

// The texts of tokenizer.json and tokenizer_config.json describing `spec`, so
// a synthetic model's directory loads in Hugging Face tools with the same
// tokenization. A "llama" spec without merges gets merges derived from its
// scores (every split of a piece into two pieces, ordered by the piece's
// score), which reproduces SentencePiece merging for vocabularies whose
// scores are distinct. Fails for a spec Tokenizer::Create() would reject.
Result<std::string> TokenizerSpecToHfTokenizerJson(const TokenizerSpec& spec);
Result<std::string> TokenizerSpecToHfConfigJson(const TokenizerSpec& spec);

}  // namespace strata
