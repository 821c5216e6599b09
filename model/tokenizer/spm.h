#pragma once
// SentencePiece-style merging by score (internal): among adjacent symbols
// whose concatenation is a vocabulary piece, the one with the highest score
// merges first, leftmost on ties (llama.cpp's llm_tokenizer_spm).

#include <vector>

#include "model/tokenizer/vocab.h"

namespace strata::tokenizer_internal {

class SpmModel {
 public:
  // `vocab` and `scores` (one per token) must outlive the model.
  SpmModel(const Vocab& vocab, const std::vector<float>& scores) : vocab_(vocab), scores_(scores) {}

  // Splits `text` (already ▁-normalized) into UTF-8 characters and merges
  // them. Appends the result; characters not in the vocabulary get id -1.
  void Encode(std::string_view text, std::vector<Symbol>* out) const;

 private:
  const Vocab& vocab_;
  const std::vector<float>& scores_;
};

}  // namespace strata::tokenizer_internal
