// Normalizers of tokenizer.json: Unicode forms, Lowercase, StripAccents,
// BertNormalizer, Replace, Prepend, Strip, Precompiled, Sequence. Each keeps
// the per-byte alignment to the original text the way Hugging Face's
// NormalizedString does, because offsets are part of what must match.
#include <unicode/uchar.h>
#include <unicode/unorm2.h>
#include <utf8proc.h>

#include <algorithm>

#include "redco/core/error.hpp"
#include "redco/data/regex.hpp"
#include "redco/data/tokenizer_parts.hpp"

namespace redco::data::tok {

namespace {

// The Unicode version of the reference's normalization tables.
constexpr int kFormsVersion = 9;

// Rust's char::to_lowercase: the simple mapping, plus the one unconditional
// multi-character lowercase mapping (U+0130 -> "i\u0307").
void lowercase_into(char32_t c, std::string& out) {
  if (c < 0x80) {
    out += char(c >= 'A' && c <= 'Z' ? c + 32 : c);
  } else if (c == 0x130) {
    out += "i\xCC\x87";
  } else {
    append_utf8(out, char32_t(utf8proc_tolower(utf8proc_int32_t(c))));
  }
}

// NFD/NFKD: every character decomposed on its own (its pieces keep its
// alignment), then combining marks put in canonical order, alignments moving
// with them.
void decompose(Piece& p, bool compat) {
  std::vector<std::pair<char32_t, Span>> cs;
  cs.reserve(p.text.size());
  utf8proc_int32_t buf[32];
  const int opts = UTF8PROC_DECOMPOSE | (compat ? UTF8PROC_COMPAT : 0);
  for (size_t i = 0; i < p.text.size();) {
    const Span a = p.align[i];
    const char32_t c = next_char(p.text, i);
    if (c < 0xC0 || !unicode_age_at_most(c, kFormsVersion)) {  // nothing below U+00C0 decomposes
      cs.push_back({c, a});
      continue;
    }
    int last = 0;
    const auto n =
        utf8proc_decompose_char(utf8proc_int32_t(c), buf, 32, utf8proc_option_t(opts), &last);
    REDCO_CHECK(n > 0 && n <= 32, "tokenizer: cannot decompose U+{:04X}", uint32_t(c));
    for (int k = 0; k < n; ++k) cs.push_back({char32_t(buf[k]), a});
  }
  // Canonical ordering: stable sort of each run of non-starters by class.
  auto ccc = [](char32_t c) {
    return unicode_age_at_most(c, kFormsVersion)
               ? utf8proc_get_property(utf8proc_int32_t(c))->combining_class
               : 0;
  };
  for (size_t i = 0; i < cs.size();) {
    size_t j = i;
    while (j < cs.size() && ccc(cs[j].first) != 0) ++j;
    if (j - i > 1)
      std::stable_sort(cs.begin() + long(i), cs.begin() + long(j),
                       [&](const auto& x, const auto& y) { return ccc(x.first) < ccc(y.first); });
    i = j == i ? i + 1 : j;
  }
  p.text.clear();
  p.align.clear();
  for (const auto& [c, a] : cs) {
    const size_t before = p.text.size();
    append_utf8(p.text, c);
    p.align.insert(p.align.end(), p.text.size() - before, a);
  }
}

// NFC/NFKC, one run from a starter to the next at a time: an unchanged run
// keeps its alignments; in a changed one the k-th output character takes the
// k-th input character's alignment (the last one's past the end), which is
// how the reference aligns composed and expanded characters.
void compose(Piece& p, bool compat) {
  const int opts = UTF8PROC_STABLE | UTF8PROC_COMPOSE | (compat ? UTF8PROC_COMPAT : 0);
  std::string text;
  std::vector<Span> align;
  // A run ends before a character nothing before it can combine with: a
  // starter whose quick-check value is not "maybe" (Hangul vowels and
  // trailing consonants, some Indic vowel signs are starters that compose).
  const UProperty qc = compat ? UCHAR_NFKC_QUICK_CHECK : UCHAR_NFC_QUICK_CHECK;
  // Characters newer than the reference's tables stay as they are.
  auto newer = [](char32_t c) { return !unicode_age_at_most(c, kFormsVersion); };
  auto starter = [&](char32_t c) {
    return newer(c) || (utf8proc_get_property(utf8proc_int32_t(c))->combining_class == 0 &&
                        u_getIntPropertyValue(UChar32(c), qc) != UNORM_MAYBE);
  };
  for (size_t i = 0; i < p.text.size();) {
    const size_t b = i;
    std::vector<Span> in{p.align[i]};
    if (newer(next_char(p.text, i))) {
      text.append(p.text, b, i - b);
      align.insert(align.end(), p.align.begin() + long(b), p.align.begin() + long(i));
      continue;
    }
    while (i < p.text.size()) {
      size_t k = i;
      if (starter(next_char(p.text, k))) break;
      in.push_back(p.align[i]);
      i = k;
    }
    const std::string_view run(p.text.data() + b, i - b);
    utf8proc_uint8_t* out = nullptr;
    const auto n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(run.data()),
                                utf8proc_ssize_t(run.size()), &out, utf8proc_option_t(opts));
    REDCO_CHECK(n >= 0, "tokenizer: Unicode normalization failed: {}", utf8proc_errmsg(n));
    const std::string_view res(reinterpret_cast<const char*>(out), size_t(n));
    if (res == run) {
      align.insert(align.end(), p.align.begin() + long(b), p.align.begin() + long(i));
    } else {
      size_t k = 0, idx = 0;
      while (k < res.size()) {
        const size_t s = k;
        next_char(res, k);
        align.insert(align.end(), k - s, in[std::min(idx++, in.size() - 1)]);
      }
    }
    text += res;
    free(out);
  }
  p.text = std::move(text);
  p.align = std::move(align);
}

class UnicodeForm : public Normalizer {
 public:
  UnicodeForm(bool composed, bool compat) : composed_(composed), compat_(compat) {}
  void normalize(Piece& p) const override {
    if (composed_) {
      compose(p, compat_);
    } else {
      decompose(p, compat_);
    }
  }

 private:
  bool composed_, compat_;
};

class Lowercase : public Normalizer {
 public:
  void normalize(Piece& p) const override { map_chars(p, lowercase_into); }
};

class StripAccents : public Normalizer {
 public:
  // The reference drops every combining mark (Mn, Mc, Me) of Unicode 9.0.
  void normalize(Piece& p) const override {
    map_chars(p, [](char32_t c, std::string& out) {
      const auto k = utf8proc_category(utf8proc_int32_t(c));
      if ((k != UTF8PROC_CATEGORY_MN && k != UTF8PROC_CATEGORY_MC && k != UTF8PROC_CATEGORY_ME) ||
          !unicode_age_at_most(c, kFormsVersion))
        append_utf8(out, c);
    });
  }
};

class BertNormalizer : public Normalizer {
 public:
  explicit BertNormalizer(const Json& j) {
    check_keys(j, "normalizer BertNormalizer",
               {"clean_text", "handle_chinese_chars", "strip_accents", "lowercase"});
    clean_ = get_bool(j, "clean_text", true);
    chinese_ = get_bool(j, "handle_chinese_chars", true);
    lowercase_ = get_bool(j, "lowercase", true);
    strip_ = get_bool(j, "strip_accents", lowercase_);  // null: follows lowercase
  }
  void normalize(Piece& p) const override {
    if (std::all_of(p.text.begin(), p.text.end(), [](char c) { return uint8_t(c) < 0x80; }))
      return normalize_ascii(p);
    map_chars(p, [&](char32_t c, std::string& out) {
      if (clean_) {
        // Controls go first (form feed too, though it is whitespace); tab,
        // newline and carriage return become spaces.
        const bool tnr = c == '\t' || c == '\n' || c == '\r';
        if (c == 0 || c == 0xFFFD || (!tnr && is_control(c))) return;
        if (tnr || is_whitespace(c)) c = ' ';
      }
      if (chinese_ && is_chinese_char(c)) {
        out += ' ';
        append_utf8(out, c);
        out += ' ';
      } else {
        append_utf8(out, c);
      }
    });
    if (strip_) {
      decompose(p, false);
      map_chars(p, [](char32_t c, std::string& out) {
        if (!is_nonspacing_mark(c)) append_utf8(out, c);
      });
    }
    if (lowercase_) map_chars(p, lowercase_into);
  }

 private:
  // The same on ASCII text, in place: no accents, no CJK, one byte per character.
  void normalize_ascii(Piece& p) const {
    size_t o = 0;
    for (size_t i = 0; i < p.text.size(); ++i) {
      char c = p.text[i];
      if (clean_) {
        const bool tnr = c == '\t' || c == '\n' || c == '\r';
        if (!tnr && (uint8_t(c) < 0x20 || c == 0x7F)) continue;
        if (tnr) c = ' ';
      }
      if (lowercase_ && c >= 'A' && c <= 'Z') c = char(c + 32);
      p.text[o] = c;
      p.align[o++] = p.align[i];
    }
    p.text.resize(o);
    p.align.resize(o);
  }

  bool clean_, chinese_, lowercase_, strip_;
};

class Replace : public Normalizer {
 public:
  explicit Replace(const Json& j)
      : re_(make_pattern(j.at("pattern"), "normalizer Replace")),
        content_(j.at("content").as_string()) {
    check_keys(j, "normalizer Replace", {"pattern", "content"});
  }
  // The replacement takes the alignment of the match's last byte.
  void normalize(Piece& p) const override {
    std::string text;
    std::vector<Span> align;
    size_t last = 0;
    re_.for_each_match(p.text, [&](size_t b, size_t e) {
      text.append(p.text, last, b - last);
      align.insert(align.end(), p.align.begin() + long(last), p.align.begin() + long(b));
      const Span a = e > 0 ? p.align[e - 1] : Span{p.whole.begin, p.whole.begin};
      text += content_;
      align.insert(align.end(), content_.size(), a);
      last = e;
    });
    text.append(p.text, last);
    align.insert(align.end(), p.align.begin() + long(last), p.align.end());
    p.text = std::move(text);
    p.align = std::move(align);
  }

 private:
  Regex re_;
  std::string content_;
};

class Prepend : public Normalizer {
 public:
  explicit Prepend(const Json& j) : s_(j.at("prepend").as_string()) {
    check_keys(j, "normalizer Prepend", {"prepend"});
  }
  // Prepended bytes share the first character's alignment.
  void normalize(Piece& p) const override {
    if (p.text.empty()) return;
    p.text.insert(0, s_);
    p.align.insert(p.align.begin(), s_.size(), p.align[0]);
  }

 private:
  std::string s_;
};

class Strip : public Normalizer {
 public:
  explicit Strip(const Json& j) {
    check_keys(j, "normalizer Strip", {"strip_left", "strip_right"});
    left_ = get_bool(j, "strip_left", true);
    right_ = get_bool(j, "strip_right", true);
  }
  void normalize(Piece& p) const override {
    size_t b = 0, e = p.text.size();
    if (left_) {
      for (size_t i = 0; i < p.text.size();) {
        if (!is_whitespace(next_char(p.text, i))) break;
        b = i;
      }
    }
    if (right_) {
      while (e > b) {
        size_t s = e - 1;
        while (s > b && (uint8_t(p.text[s]) & 0xC0) == 0x80) --s;
        size_t k = s;
        if (!is_whitespace(next_char(p.text, k))) break;
        e = s;
      }
    }
    p.text = p.text.substr(b, e - b);
    p.align = std::vector<Span>(p.align.begin() + long(b), p.align.begin() + long(e));
  }

 private:
  bool left_, right_;
};

class Sequence : public Normalizer {
 public:
  explicit Sequence(const Json& j) {
    check_keys(j, "normalizer Sequence", {"normalizers"});
    for (const Json& n : j.at("normalizers").as_array())
      if (auto s = make_normalizer(n)) parts_.push_back(std::move(s));
  }
  void normalize(Piece& p) const override {
    for (const auto& n : parts_) n->normalize(p);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> parts_;
};

}  // namespace

std::unique_ptr<Normalizer> make_precompiled(const Json& j);  // tokenizer_precompiled.cpp

std::unique_ptr<Normalizer> make_normalizer(const Json& j) {
  if (j.is_null()) return nullptr;
  const std::string type = j.at("type").as_string();
  auto plain = [&](auto made) {
    check_keys(j, "normalizer " + type, {});
    return std::unique_ptr<Normalizer>(std::move(made));
  };
  if (type == "NFC") return plain(std::make_unique<UnicodeForm>(true, false));
  if (type == "NFKC") return plain(std::make_unique<UnicodeForm>(true, true));
  if (type == "NFD") return plain(std::make_unique<UnicodeForm>(false, false));
  if (type == "NFKD") return plain(std::make_unique<UnicodeForm>(false, true));
  if (type == "Lowercase") return plain(std::make_unique<Lowercase>());
  if (type == "StripAccents") return plain(std::make_unique<StripAccents>());
  if (type == "BertNormalizer") return std::make_unique<BertNormalizer>(j);
  if (type == "Replace") return std::make_unique<Replace>(j);
  if (type == "Prepend") return std::make_unique<Prepend>(j);
  if (type == "Strip") return std::make_unique<Strip>(j);
  if (type == "Sequence") return std::make_unique<Sequence>(j);
  if (type == "Precompiled") return make_precompiled(j);
  unsupported("normalizer", "type \"" + type + "\"");
}

}  // namespace redco::data::tok
