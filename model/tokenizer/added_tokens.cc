#include "model/tokenizer/added_tokens.h"

#include <algorithm>

namespace strata::tokenizer_internal {

void AddedTokenMatcher::Add(std::string_view piece, int32_t id) {
  if (piece.empty()) return;
  by_first_[static_cast<uint8_t>(piece[0])].emplace_back(piece, id);
  ++count_;
}

void AddedTokenMatcher::Finish() {
  for (auto& list : by_first_) {
    // Longest first; on equal text the lowest id (stable).
    std::stable_sort(list.begin(), list.end(),
                     [](const auto& a, const auto& b) { return a.first.size() > b.first.size(); });
  }
}

bool AddedTokenMatcher::FindNext(std::string_view text, size_t from, Match* match) const {
  if (count_ == 0) return false;
  for (size_t i = from; i < text.size(); ++i) {
    const auto& list = by_first_[static_cast<uint8_t>(text[i])];
    for (const auto& [piece, id] : list) {
      if (text.size() - i >= piece.size() && text.compare(i, piece.size(), piece) == 0) {
        *match = {i, piece.size(), id};
        return true;
      }
    }
  }
  return false;
}

}  // namespace strata::tokenizer_internal
