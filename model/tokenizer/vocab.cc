#include "model/tokenizer/vocab.h"

#include <cstdio>

#include "model/tokenizer/unicode.h"

namespace strata::tokenizer_internal {

int ParseByteToken(std::string_view piece) {
  if (piece.size() != 6 || piece.substr(0, 3) != "<0x" || piece[5] != '>') return -1;
  int v = 0;
  for (size_t i = 3; i < 5; ++i) {
    const char c = piece[i];
    int d;
    if (c >= '0' && c <= '9') {
      d = c - '0';
    } else if (c >= 'A' && c <= 'F') {
      d = c - 'A' + 10;
    } else if (c >= 'a' && c <= 'f') {
      d = c - 'a' + 10;
    } else {
      return -1;
    }
    v = v * 16 + d;
  }
  return v;
}

std::string ByteTokenPiece(uint8_t b) {
  char buf[8];
  std::snprintf(buf, sizeof(buf), "<0x%02X>", b);
  return buf;
}

namespace {

std::string DecodeLlamaPiece(std::string_view piece) {
  std::string out;
  size_t pos = 0;
  while (pos < piece.size()) {
    const size_t hit = piece.find(kSpaceMarker, pos);
    if (hit == std::string_view::npos) {
      out.append(piece.substr(pos));
      break;
    }
    out.append(piece.substr(pos, hit - pos));
    out.push_back(' ');
    pos = hit + kSpaceMarker.size();
  }
  return out;
}

std::string DecodeByteLevelPiece(std::string_view piece) {
  std::string out;
  size_t pos = 0;
  while (pos < piece.size()) {
    size_t len = 1;
    const uint32_t cp = DecodeCodePoint(piece, pos, &len);
    const int b = len > 1 || cp < 0x80 ? UnicodeToByte(cp) : -1;
    if (b >= 0) {
      out.push_back(static_cast<char>(b));
    } else {
      // Outside the byte alphabet (not produced by byte-level training):
      // written as it is.
      out.append(piece.substr(pos, len));
    }
    pos += len;
  }
  return out;
}

}  // namespace

Result<Vocab> Vocab::Build(const TokenizerSpec& spec) {
  Vocab v;
  v.tokens_ = &spec.tokens;
  const size_t n = spec.tokens.size();
  const bool llama = spec.model == "llama";
  v.types_.assign(n, kTokenTypeNormal);
  if (!spec.token_types.empty()) {
    for (size_t i = 0; i < n; ++i) {
      const int32_t t = spec.token_types[i];
      v.types_[i] = t == kTokenTypeUndefined ? kTokenTypeNormal : t;
    }
  } else {
    // No types given: byte tokens by their spelling, the named special ids
    // as control / unknown.
    if (llama) {
      for (size_t i = 0; i < n; ++i) {
        if (ParseByteToken(spec.tokens[i]) >= 0) v.types_[i] = kTokenTypeByte;
      }
    }
    for (int32_t id : {spec.bos_id, spec.eos_id, spec.pad_id}) {
      if (id >= 0) v.types_[id] = kTokenTypeControl;
    }
    for (int32_t id : spec.eog_ids) v.types_[id] = kTokenTypeControl;
    if (spec.unk_id >= 0) v.types_[spec.unk_id] = kTokenTypeUnknown;
  }

  v.byte_ids_.fill(-1);
  v.ids_.reserve(n);
  v.decoded_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const auto id = static_cast<int32_t>(i);
    const std::string& piece = spec.tokens[i];
    const int32_t type = v.types_[i];
    if (type != kTokenTypeUnused) v.ids_.emplace(piece, id);  // keeps the first
    if (llama && type == kTokenTypeByte) {
      const int b = ParseByteToken(piece);
      if (b < 0) {
        return Status::InvalidArgument("token " + std::to_string(i) + " '" + piece +
                                       "' has type byte but is not spelled <0xNN>");
      }
      if (v.byte_ids_[b] < 0) v.byte_ids_[b] = id;
      v.decoded_[i] = std::string(1, static_cast<char>(b));
    } else if (type == kTokenTypeControl || type == kTokenTypeUnknown || type == kTokenTypeUnused ||
               (!llama && type == kTokenTypeUserDefined)) {
      v.decoded_[i] = piece;
    } else {
      v.decoded_[i] = llama ? DecodeLlamaPiece(piece) : DecodeByteLevelPiece(piece);
    }
  }
  const auto& alphabet = ByteToUnicode();
  for (int b = 0; b < 256; ++b) v.byte_char_ids_[b] = llama ? -1 : v.Find(alphabet[b]);
  v.has_all_byte_tokens_ = true;
  for (int32_t id : v.byte_ids_) v.has_all_byte_tokens_ &= id >= 0;
  return v;
}

int32_t Vocab::Find(std::string_view piece) const {
  const auto it = ids_.find(piece);
  return it == ids_.end() ? -1 : it->second;
}

}  // namespace strata::tokenizer_internal
