#pragma once
// Lookup tables shared by the tokenizer models (internal).

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "common/status.h"
#include "model/tokenizer/tokenizer_spec.h"

namespace strata::tokenizer_internal {

// A run of the input being tokenized: a token id (-1: not in the
// vocabulary) covering bytes [begin, end) of the text it came from.
struct Symbol {
  int32_t id;
  uint32_t begin, end;
};

class Vocab {
 public:
  // `spec.tokens` must outlive the Vocab (pieces are viewed, not copied).
  // Fills in token types the spec leaves empty (see NormalizedTypes()).
  static Result<Vocab> Build(const TokenizerSpec& spec);

  int32_t size() const { return static_cast<int32_t>(tokens_->size()); }
  const std::string& piece(int32_t id) const { return (*tokens_)[id]; }
  int32_t type(int32_t id) const { return types_[id]; }
  // Id of the exact piece, -1 if absent. Unused tokens are never found; on
  // duplicate pieces the lowest id wins.
  int32_t Find(std::string_view piece) const;
  // The <0xNN> byte token for `b` ("llama" vocabularies), -1 if absent.
  int32_t byte_token(uint8_t b) const { return byte_ids_[b]; }
  // "gpt2": the token of byte b's byte-level character (ByteToUnicode()), -1
  // if absent.
  int32_t byte_char_token(uint8_t b) const { return byte_char_ids_[b]; }
  // True when every byte has a byte token.
  bool has_all_byte_tokens() const { return has_all_byte_tokens_; }
  // Control or unknown.
  bool IsSpecial(int32_t id) const {
    return types_[id] == kTokenTypeControl || types_[id] == kTokenTypeUnknown;
  }
  // Bytes Decode() writes for the token (byte tokens as their byte, ▁ as a
  // space, byte-level pieces mapped back to bytes; may be partial UTF-8).
  const std::string& decoded(int32_t id) const { return decoded_[id]; }

 private:
  const std::vector<std::string>* tokens_ = nullptr;
  std::vector<int32_t> types_;
  std::unordered_map<std::string_view, int32_t> ids_;
  std::array<int32_t, 256> byte_ids_{};
  std::array<int32_t, 256> byte_char_ids_{};
  bool has_all_byte_tokens_ = false;
  std::vector<std::string> decoded_;
};

// "<0xNN>" -> NN, or -1.
int ParseByteToken(std::string_view piece);
// "<0xNN>" for byte b.
std::string ByteTokenPiece(uint8_t b);

}  // namespace strata::tokenizer_internal
