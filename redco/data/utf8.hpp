#pragma once
// Appending a code point as UTF-8: shared by the BPE trainer and the
// tokenizer.json pipeline; checking, decoding and converting the encodings of
// text (the fortune reader, GPT-2's vocab.json and merges.txt).
#include <cstdint>
#include <string>
#include <string_view>

namespace redco::data {

inline void append_utf8(std::string& out, char32_t c) {
  if (c < 0x80) {
    out += char(c);
  } else if (c < 0x800) {
    out += char(0xC0 | (c >> 6));
    out += char(0x80 | (c & 0x3F));
  } else if (c < 0x10000) {
    out += char(0xE0 | (c >> 12));
    out += char(0x80 | ((c >> 6) & 0x3F));
    out += char(0x80 | (c & 0x3F));
  } else {
    out += char(0xF0 | (c >> 18));
    out += char(0x80 | ((c >> 12) & 0x3F));
    out += char(0x80 | ((c >> 6) & 0x3F));
    out += char(0x80 | (c & 0x3F));
  }
}

// Whether `s` is valid UTF-8: no stray continuation bytes, overlong forms,
// surrogates (U+D800..DFFF) or code points above U+10FFFF.
inline bool is_valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto b = uint8_t(s[i]);
    if (b < 0x80) {
      ++i;
      continue;
    }
    const int n = b >= 0xF0 ? 3 : b >= 0xE0 ? 2 : b >= 0xC0 ? 1 : 0;
    if (n == 0 || b > 0xF4 || i + size_t(n) >= s.size()) return false;
    char32_t c = b & (0x3F >> n);
    for (int k = 1; k <= n; ++k) {
      const auto t = uint8_t(s[i + size_t(k)]);
      if ((t & 0xC0) != 0x80) return false;
      c = (c << 6) | (t & 0x3F);
    }
    static constexpr char32_t kMin[4] = {0, 0x80, 0x800, 0x10000};
    if (c < kMin[n] || c > 0x10FFFF || (c >= 0xD800 && c <= 0xDFFF)) return false;
    i += size_t(n) + 1;
  }
  return true;
}

// Appends the code points of `s` to `out`; false (out unspecified) when `s` is
// not valid UTF-8 (is_valid_utf8).
inline bool decode_utf8(std::string_view s, std::u32string& out) {
  if (!is_valid_utf8(s)) return false;
  for (size_t i = 0; i < s.size();) {
    const auto b = uint8_t(s[i]);
    const int n = b < 0x80 ? 0 : b >= 0xF0 ? 3 : b >= 0xE0 ? 2 : 1;
    char32_t c = n == 0 ? b : b & (0x3F >> n);
    for (int k = 1; k <= n; ++k) c = (c << 6) | (uint8_t(s[i + size_t(k)]) & 0x3F);
    out += c;
    i += size_t(n) + 1;
  }
  return true;
}

// Latin-1 (ISO 8859-1) bytes as UTF-8: byte b is code point U+00bb.
inline std::string latin1_to_utf8(std::string_view latin1) {
  std::string out;
  out.reserve(latin1.size() + latin1.size() / 8);
  for (char c : latin1) append_utf8(out, char32_t(uint8_t(c)));
  return out;
}

}  // namespace redco::data
