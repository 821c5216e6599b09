#pragma once
// Finds added tokens (special or user-defined) in raw text (internal):
// leftmost match, longest at that position, as HF tokenizers does.

#include <array>
#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

namespace strata::tokenizer_internal {

class AddedTokenMatcher {
 public:
  // `piece` must outlive the matcher. Empty pieces are ignored.
  void Add(std::string_view piece, int32_t id);
  // Call once after the last Add().
  void Finish();
  bool empty() const { return count_ == 0; }

  struct Match {
    size_t pos, len;
    int32_t id;
  };
  // The first match starting at or after `from`; false when there is none.
  bool FindNext(std::string_view text, size_t from, Match* match) const;

 private:
  // Candidates by first byte, longest first.
  std::array<std::vector<std::pair<std::string_view, int32_t>>, 256> by_first_;
  size_t count_ = 0;
};

}  // namespace strata::tokenizer_internal
