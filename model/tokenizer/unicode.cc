#include "model/tokenizer/unicode.h"

namespace strata::tokenizer_internal {
namespace {

// For a lead byte: number of continuation bytes and the allowed range of the
// first one (which excludes overlongs, surrogates and code points > U+10FFFF).
struct LeadInfo {
  int need;  // -1: cannot start a sequence
  uint8_t lo, hi;
};

LeadInfo Lead(uint8_t b) {
  if (b < 0x80) return {0, 0, 0};
  if (b >= 0xC2 && b <= 0xDF) return {1, 0x80, 0xBF};
  if (b == 0xE0) return {2, 0xA0, 0xBF};
  if (b == 0xED) return {2, 0x80, 0x9F};
  if (b >= 0xE1 && b <= 0xEF) return {2, 0x80, 0xBF};
  if (b == 0xF0) return {3, 0x90, 0xBF};
  if (b == 0xF4) return {3, 0x80, 0x8F};
  if (b >= 0xF1 && b <= 0xF3) return {3, 0x80, 0xBF};
  return {-1, 0, 0};
}

}  // namespace

size_t Utf8CharLen(std::string_view s, size_t pos) {
  size_t len = 1;
  DecodeCodePoint(s, pos, &len);
  return len;
}

size_t AppendUtf8Lossy(std::string_view in, bool final, std::string* out) {
  size_t i = 0;
  const size_t n = in.size();
  while (i < n) {
    const auto b = static_cast<uint8_t>(in[i]);
    const LeadInfo li = Lead(b);
    if (li.need == 0) {
      out->push_back(static_cast<char>(b));
      ++i;
      continue;
    }
    if (li.need < 0) {
      out->append(kReplacementChar);
      ++i;
      continue;
    }
    int j = 1;
    bool bad = false;
    for (; j <= li.need; ++j) {
      if (i + j >= n) break;
      const auto c = static_cast<uint8_t>(in[i + j]);
      const uint8_t lo = j == 1 ? li.lo : 0x80;
      const uint8_t hi = j == 1 ? li.hi : 0xBF;
      if (c < lo || c > hi) {
        bad = true;
        break;
      }
    }
    if (bad) {
      // The maximal subpart in[i, i+j) is replaced; in[i+j] is looked at again.
      out->append(kReplacementChar);
      i += j;
      continue;
    }
    if (j <= li.need) {  // ran out of input inside a valid prefix
      if (!final) return i;
      out->append(kReplacementChar);
      return n;
    }
    out->append(in.substr(i, li.need + 1));
    i += li.need + 1;
  }
  return n;
}

void AppendCodePoint(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

namespace {

// bytes_to_unicode(): printable Latin-1 bytes map to themselves, the other
// 68 bytes to U+0100 onwards in byte order.
struct ByteTables {
  std::array<std::string, 256> to_unicode;
  std::array<int16_t, 0x200> from_unicode;
  ByteTables() {
    from_unicode.fill(-1);
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
      const uint32_t cp = printable ? static_cast<uint32_t>(b) : next++;
      AppendCodePoint(cp, &to_unicode[b]);
      from_unicode[cp] = static_cast<int16_t>(b);
    }
  }
};

const ByteTables& Tables() {
  static const ByteTables tables;
  return tables;
}

}  // namespace

const std::array<std::string, 256>& ByteToUnicode() { return Tables().to_unicode; }

int UnicodeToByte(uint32_t cp) {
  const auto& t = Tables().from_unicode;
  return cp < t.size() ? t[cp] : -1;
}

uint32_t DecodeCodePoint(std::string_view s, size_t pos, size_t* len) {
  const auto b = static_cast<uint8_t>(s[pos]);
  const LeadInfo li = Lead(b);
  if (li.need <= 0 || pos + li.need >= s.size()) {
    *len = 1;
    return b;
  }
  uint32_t cp = b & (0x3F >> li.need);
  for (int j = 1; j <= li.need; ++j) {
    const auto c = static_cast<uint8_t>(s[pos + j]);
    const uint8_t lo = j == 1 ? li.lo : 0x80;
    const uint8_t hi = j == 1 ? li.hi : 0xBF;
    if (c < lo || c > hi) {
      *len = 1;
      return b;
    }
    cp = (cp << 6) | (c & 0x3F);
  }
  *len = li.need + 1;
  return cp;
}

}  // namespace strata::tokenizer_internal
