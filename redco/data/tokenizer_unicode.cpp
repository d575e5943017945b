// Character-level helpers of the tokenizer stages: UTF-8, Unicode
// properties (through utf8proc's tables), pieces with alignments, and the
// option readers shared by the stage factories.
#include <unicode/uchar.h>
#include <utf8proc.h>

#include "redco/core/error.hpp"
#include "redco/data/tokenizer_parts.hpp"

namespace redco::data::tok {

Span Piece::original(size_t b, size_t e) const {
  if (b >= e || align.empty()) {
    // A point: just before byte b (or the piece's end).
    if (b < align.size()) return {align[b].begin, align[b].begin};
    if (!align.empty()) return {align.back().end, align.back().end};
    return {whole.begin, whole.begin};
  }
  return {align[b].begin, align[e - 1].end};
}

Piece Piece::slice(size_t b, size_t e) const {
  Piece s;
  s.text.assign(text, b, e - b);
  s.align.assign(align.begin() + b, align.begin() + e);
  s.whole = original(b, e);
  return s;
}

char32_t next_char(std::string_view s, size_t& i) {
  const auto* p = reinterpret_cast<const uint8_t*>(s.data());
  const uint8_t c = p[i];
  if (c < 0x80) {
    ++i;
    return c;
  }
  const int n = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : 2;
  char32_t cp = c & (0x3F >> (n - 1));
  for (int k = 1; k < n; ++k) cp = (cp << 6) | (p[i + k] & 0x3F);
  i += n;
  return cp;
}

void check_utf8(std::string_view s, std::string_view what) {
  const auto* p = reinterpret_cast<const utf8proc_uint8_t*>(s.data());
  size_t i = 0;
  while (i < s.size()) {
    if (uint8_t(s[i]) < 0x80) {
      ++i;
      continue;
    }
    utf8proc_int32_t cp = 0;
    const auto n = utf8proc_iterate(p + i, utf8proc_ssize_t(s.size() - i), &cp);
    REDCO_CHECK(n > 0,
                "{}: invalid UTF-8 at byte {} (the tokenizer works on Unicode text; "
                "decode or clean the input first)",
                what, i);
    i += size_t(n);
  }
}

bool is_whitespace(char32_t c) {
  switch (c) {
    case 0x09:
    case 0x0A:
    case 0x0B:
    case 0x0C:
    case 0x0D:
    case 0x20:
    case 0x85:
    case 0xA0:
    case 0x1680:
    case 0x2028:
    case 0x2029:
    case 0x202F:
    case 0x205F:
    case 0x3000:
      return true;
    default:
      return c >= 0x2000 && c <= 0x200A;
  }
}

namespace {
utf8proc_category_t category(char32_t c) { return utf8proc_category(utf8proc_int32_t(c)); }
}  // namespace

bool unicode_age_at_most(char32_t c, int major) {
  if (c < 0x80) return true;
  UVersionInfo v;
  u_charAge(UChar32(c), v);  // 0.0 for unassigned characters
  return v[0] <= major;
}

bool is_punctuation(char32_t c) {
  const auto k = category(c);
  return k >= UTF8PROC_CATEGORY_PC && k <= UTF8PROC_CATEGORY_PO && unicode_age_at_most(c, 8);
}

bool is_control(char32_t c) {
  const auto k = category(c);
  return (k == UTF8PROC_CATEGORY_CC || k == UTF8PROC_CATEGORY_CF || k == UTF8PROC_CATEGORY_CO) &&
         unicode_age_at_most(c, 8);
}

bool is_nonspacing_mark(char32_t c) {
  // U+1885 and U+1886 were letters (Lo) until Unicode 9.0 made them marks.
  if (c == 0x1885 || c == 0x1886) return false;
  return category(c) == UTF8PROC_CATEGORY_MN && unicode_age_at_most(c, 8);
}

bool is_chinese_char(char32_t c) {
  return (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0x3400 && c <= 0x4DBF) ||
         (c >= 0x20000 && c <= 0x2A6DF) || (c >= 0x2A700 && c <= 0x2B73F) ||
         (c >= 0x2B740 && c <= 0x2B81F) || (c >= 0x2B920 && c <= 0x2CEAF) ||
         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x2F800 && c <= 0x2FA1F);
}

void check_keys(const Json& j, std::string_view stage,
                std::initializer_list<std::string_view> known) {
  for (const auto& [k, v] : j.as_object()) {
    if (k == "type") continue;
    bool ok = false;
    for (auto n : known) ok = ok || n == k;
    if (!ok) unsupported(stage, "option \"" + k + "\"");
  }
}

bool get_bool(const Json& j, std::string_view key, bool fallback) {
  if (!j.contains(key) || j.at(key).is_null()) return fallback;
  return j.at(key).as_bool();
}

std::string get_string(const Json& j, std::string_view key, std::string_view fallback) {
  if (!j.contains(key) || j.at(key).is_null()) return std::string(fallback);
  return j.at(key).as_string();
}

void unsupported(std::string_view stage, std::string_view what) {
  fail(
      "tokenizer.json: {} {} is not supported by redco's tokenizer; the file needs a feature "
      "redco does not implement, so it cannot give the reference's ids",
      stage, what);
}

}  // namespace redco::data::tok
