#pragma once
// UTF-8 helpers for the tokenizers (internal).

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace strata::tokenizer_internal {

// SentencePiece's whitespace marker, U+2581 "▁".
inline constexpr std::string_view kSpaceMarker = "\xE2\x96\x81";
inline constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

// Length of the well-formed UTF-8 character starting at s[pos] (1..4); 1 for
// a byte that does not start one, so ill-formed input splits into bytes.
// REQUIRES: pos < s.size().
size_t Utf8CharLen(std::string_view s, size_t pos);

// Appends `in` to `out` with ill-formed UTF-8 replaced by U+FFFD, one per
// maximal subpart (the WHATWG / Unicode "best practice" rule, which
// JavaScript's TextDecoder follows). When `final` is false an incomplete but
// so-far valid sequence at the end is left unconsumed. Returns the number of
// bytes of `in` consumed.
size_t AppendUtf8Lossy(std::string_view in, bool final, std::string* out);

// Appends the UTF-8 encoding of code point `cp` (must be a scalar value).
void AppendCodePoint(uint32_t cp, std::string* out);

// GPT-2's bytes_to_unicode(): byte -> printable code point, as UTF-8.
const std::array<std::string, 256>& ByteToUnicode();
// Inverse of ByteToUnicode(): -1 when `cp` is not in the alphabet.
int UnicodeToByte(uint32_t cp);

// Decodes the code point at s[pos] (well-formed input); sets *len.
// Ill-formed input yields the byte's value with *len = 1.
uint32_t DecodeCodePoint(std::string_view s, size_t pos, size_t* len);

}  // namespace strata::tokenizer_internal
