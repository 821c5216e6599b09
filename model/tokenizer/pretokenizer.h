#pragma once
// Regex pre-tokenizer for byte-level BPE (internal), on PCRE2 in UTF mode
// with Unicode properties (\p{L}, \s, case folding) and JIT when available.

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace strata::tokenizer_internal {

// The split regexes of a GGUF tokenizer.ggml.pre id ("default", "gpt2",
// "llama-bpe", "qwen2", ...). Unsupported for ids Strata does not know.
Result<std::vector<std::string>> PreTokenizerRegexes(std::string_view pre);

// Well-known patterns, spelled as in the Hugging Face tokenizer.json files.
extern const char* const kGpt2Regex;
extern const char* const kLlama3Regex;
extern const char* const kQwen2Regex;

class RegexSplitter {
 public:
  // Compiles every pattern; fails naming the pattern and the error offset.
  static Result<std::unique_ptr<RegexSplitter>> Create(const std::vector<std::string>& patterns);
  ~RegexSplitter();
  RegexSplitter(const RegexSplitter&) = delete;
  RegexSplitter& operator=(const RegexSplitter&) = delete;

  // Splits `text` with each pattern in turn: every piece so far is cut into
  // its matches and the gaps between them (HF Split, behaviour "Isolated").
  // Invalid UTF-8 never matches and so ends up in gaps. Thread-safe.
  std::vector<std::string_view> Split(std::string_view text) const;

 private:
  RegexSplitter() = default;
  std::vector<void*> codes_;  // pcre2_code_8*, owned
};

}  // namespace strata::tokenizer_internal
