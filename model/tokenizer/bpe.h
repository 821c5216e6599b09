#pragma once
// Merge-rank BPE (internal): the pair with the lowest merge rank is merged
// first, leftmost on ties, as Hugging Face tokenizers and llama.cpp do.

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "model/tokenizer/vocab.h"

namespace strata::tokenizer_internal {

class BpeModel {
 public:
  // `merges` are "a b" rules, highest priority first. Fails naming the rule
  // when a side or the merged piece is not in the vocabulary.
  static Result<std::unique_ptr<BpeModel>> Create(const std::vector<std::string>& merges,
                                                  const Vocab& vocab);

  // Merges adjacent symbols in place until no rule applies. Symbols with
  // id -1 never merge.
  void Merge(std::vector<Symbol>* symbols) const;

 private:
  struct Rule {
    int32_t rank;
    int32_t merged;
  };
  static uint64_t Key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }
  std::unordered_map<uint64_t, Rule> rules_;
};

}  // namespace strata::tokenizer_internal
