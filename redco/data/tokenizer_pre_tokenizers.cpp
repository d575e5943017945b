// Pre-tokenizers of tokenizer.json: ByteLevel, Split, Metaspace, Whitespace,
// WhitespaceSplit, BertPreTokenizer, Digits, Punctuation, Sequence. Splitting
// follows Hugging Face's SplitDelimiterBehavior exactly, and empty pieces are
// dropped as the reference drops them.
#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <cctype>

#include "redco/core/error.hpp"
#include "redco/data/tokenizer_parts.hpp"

namespace redco::data::tok {

Regex make_regex(std::string_view pat) {
  static const std::string_view kSpace = "\\s\\x{85}",
                                kWord = "\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\x{200C}\\x{200D}";
  std::string out;
  bool in_class = false;
  for (size_t i = 0; i < pat.size(); ++i) {
    const char c = pat[i];
    if (c == '\\' && i + 1 < pat.size()) {
      const char e = pat[++i];
      const bool neg = e == 'S' || e == 'W';
      if (e == 's' || e == 'S' || e == 'w' || e == 'W') {
        const std::string_view set = (e == 's' || e == 'S') ? kSpace : kWord;
        if (in_class && !neg) {
          out += set;
        } else if (in_class) {
          out += "\\";  // a negated class inside a class: PCRE2's own meaning
          out += e;
        } else {
          out += neg ? "[^" : "[";
          out += set;
          out += "]";
        }
      } else {
        out += c;
        out += e;
      }
      continue;
    }
    if (c == '[' && !in_class) {
      in_class = true;
      out += c;
      if (i + 1 < pat.size() && pat[i + 1] == '^') out += pat[++i];
      if (i + 1 < pat.size() && pat[i + 1] == ']') out += pat[++i];  // literal ] first
      continue;
    }
    if (c == ']' && in_class) in_class = false;
    out += c;
  }
  return Regex(out);
}

Regex make_pattern(const Json& pattern, std::string_view stage) {
  if (pattern.contains("String")) {
    std::string lit;
    for (char c : pattern.at("String").as_string()) {
      if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) lit += '\\';
      lit += c;
    }
    return Regex(lit);
  }
  if (pattern.contains("Regex")) return make_regex(pattern.at("Regex").as_string());
  unsupported(stage, "pattern " + pattern.dump());
}

namespace {

enum class Behavior { removed, isolated, merged_with_previous, merged_with_next, contiguous };

Behavior parse_behavior(const Json& j, std::string_view stage) {
  const std::string b = get_string(j, "behavior", "Isolated");
  if (b == "Removed") return Behavior::removed;
  if (b == "Isolated") return Behavior::isolated;
  if (b == "MergedWithPrevious") return Behavior::merged_with_previous;
  if (b == "MergedWithNext") return Behavior::merged_with_next;
  if (b == "Contiguous") return Behavior::contiguous;
  unsupported(stage, "behavior \"" + b + "\"");
}

struct Part {
  size_t b, e;
  bool match;
};

// Applies `behavior` to parts that tile the piece; appends non-empty results.
void emit(const Piece& p, std::vector<Part>& parts, Behavior behavior, std::vector<Piece>& out) {
  std::vector<Part> r;
  bool prev = false;
  switch (behavior) {
    case Behavior::isolated:
    case Behavior::removed:
      r = parts;
      break;
    case Behavior::contiguous:
      for (const Part& x : parts) {
        if (x.match == prev && !r.empty()) {
          r.back().e = x.e;
        } else {
          r.push_back(x);
        }
        prev = x.match;
      }
      for (Part& x : r) x.match = false;
      break;
    case Behavior::merged_with_previous:
      for (const Part& x : parts) {
        if (x.match && !prev && !r.empty()) {
          r.back().e = x.e;
        } else {
          r.push_back({x.b, x.e, false});
        }
        prev = x.match;
      }
      break;
    case Behavior::merged_with_next:
      for (size_t k = parts.size(); k-- > 0;) {
        const Part& x = parts[k];
        if (x.match && !prev && !r.empty()) {
          r.back().b = x.b;
        } else {
          r.push_back({x.b, x.e, false});
        }
        prev = x.match;
      }
      std::reverse(r.begin(), r.end());
      break;
  }
  for (const Part& x : r) {
    if (behavior == Behavior::removed && x.match) continue;
    if (x.b == x.e) continue;
    out.push_back(p.slice(x.b, x.e));
  }
}

// Matches of a regex as parts tiling the text (the reference's find_matches).
void regex_parts(const Regex& re, std::string_view s, bool invert, std::vector<Part>& parts) {
  parts.clear();
  size_t prev = 0;
  re.for_each_match(s, [&](size_t b, size_t e) {
    if (prev != b) parts.push_back({prev, b, invert});
    parts.push_back({b, e, !invert});
    prev = e;
  });
  if (prev != s.size()) parts.push_back({prev, s.size(), invert});
}

// Each character for which pred holds is a match of its own.
template <typename Pred>
void char_parts(std::string_view s, Pred pred, std::vector<Part>& parts) {
  parts.clear();
  size_t last = 0;
  for (size_t i = 0; i < s.size();) {
    const size_t b = i;
    if (!pred(next_char(s, i))) continue;
    if (last < b) parts.push_back({last, b, false});
    parts.push_back({b, i, true});
    last = i;
  }
  if (last < s.size()) parts.push_back({last, s.size(), false});
}

// Runs split_one on every piece that is not an added token.
template <typename F>
void split_each(std::vector<Piece>& pieces, F&& split_one) {
  std::vector<Piece> out;
  out.reserve(pieces.size() * 4);
  for (Piece& p : pieces) {
    if (p.added_id >= 0) {
      out.push_back(std::move(p));
    } else {
      split_one(p, out);
    }
  }
  pieces = std::move(out);
}

// GPT-2's byte-to-unicode table: byte -> the UTF-8 of the character standing for it.
const std::array<std::string, 256>& byte_chars() {
  static const std::array<std::string, 256> table = [] {
    std::array<std::string, 256> t;
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      append_utf8(t[size_t(b)], char32_t(printable ? b : 256 + n++));
    }
    return t;
  }();
  return table;
}

const char* kGpt2Pattern =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

class ByteLevel : public PreTokenizer {
 public:
  explicit ByteLevel(const Json& j) : re_(make_regex(kGpt2Pattern)) {
    check_keys(j, "pre_tokenizer ByteLevel", {"add_prefix_space", "trim_offsets", "use_regex"});
    prefix_ = get_bool(j, "add_prefix_space", true);
    use_regex_ = get_bool(j, "use_regex", true);
  }
  void split(std::vector<Piece>& pieces) const override {
    std::vector<Part> parts;
    split_each(pieces, [&](Piece& p, std::vector<Piece>& out) {
      if (prefix_ && !p.text.empty() && p.text[0] != ' ') {
        p.text.insert(0, 1, ' ');
        p.align.insert(p.align.begin(), p.align[0]);
      }
      const size_t first = out.size();
      if (use_regex_) {
        regex_parts(re_, p.text, false, parts);
        emit(p, parts, Behavior::isolated, out);
      } else if (!p.text.empty()) {
        out.push_back(std::move(p));
      }
      for (size_t k = first; k < out.size(); ++k) to_byte_chars(out[k]);
    });
  }
  // Every byte becomes its stand-in character, aligned as the byte's character.
  static void to_byte_chars(Piece& p) {
    const auto& t = byte_chars();
    std::string text;
    std::vector<Span> align;
    text.reserve(p.text.size() * 2);
    align.reserve(p.text.size() * 2);
    for (size_t i = 0; i < p.text.size(); ++i) {
      const std::string& c = t[uint8_t(p.text[i])];
      text += c;
      align.insert(align.end(), c.size(), p.align[i]);
    }
    p.text = std::move(text);
    p.align = std::move(align);
  }

 private:
  Regex re_;
  bool prefix_ = true, use_regex_ = true;
};

class Split : public PreTokenizer {
 public:
  explicit Split(const Json& j)
      : re_(make_pattern(j.at("pattern"), "pre_tokenizer Split")),
        behavior_(parse_behavior(j, "pre_tokenizer Split")),
        invert_(get_bool(j, "invert", false)) {
    check_keys(j, "pre_tokenizer Split", {"pattern", "behavior", "invert"});
  }
  void split(std::vector<Piece>& pieces) const override {
    std::vector<Part> parts;
    split_each(pieces, [&](Piece& p, std::vector<Piece>& out) {
      regex_parts(re_, p.text, invert_, parts);
      emit(p, parts, behavior_, out);
    });
  }

 private:
  Regex re_;
  Behavior behavior_;
  bool invert_;
};

class Metaspace : public PreTokenizer {
 public:
  explicit Metaspace(const Json& j) {
    check_keys(j, "pre_tokenizer Metaspace",
               {"replacement", "prepend_scheme", "split", "add_prefix_space", "str_rep"});
    replacement_ = get_string(j, "replacement", "\xE2\x96\x81");
    scheme_ =
        get_string(j, "prepend_scheme", get_bool(j, "add_prefix_space", true) ? "always" : "never");
    REDCO_CHECK(scheme_ == "always" || scheme_ == "never" || scheme_ == "first",
                "tokenizer.json: Metaspace prepend_scheme \"{}\" is not always/never/first",
                scheme_);
    split_ = get_bool(j, "split", true);
  }
  void split(std::vector<Piece>& pieces) const override {
    std::vector<Part> parts;
    split_each(pieces, [&](Piece& p, std::vector<Piece>& out) {
      map_chars(p, [&](char32_t c, std::string& o) {
        if (c == ' ') {
          o += replacement_;
        } else {
          append_utf8(o, c);
        }
      });
      const bool starts = p.text.starts_with(replacement_);
      if (!p.text.empty() && !starts &&
          (scheme_ == "always" || (scheme_ == "first" && p.whole.begin == 0))) {
        p.text.insert(0, replacement_);
        p.align.insert(p.align.begin(), replacement_.size(), p.align[0]);
      }
      if (!split_) {
        if (!p.text.empty()) out.push_back(std::move(p));
        return;
      }
      parts.clear();
      size_t last = 0;
      for (size_t at = p.text.find(replacement_); at != std::string::npos;
           at = p.text.find(replacement_, at + replacement_.size())) {
        if (last < at) parts.push_back({last, at, false});
        parts.push_back({at, at + replacement_.size(), true});
        last = at + replacement_.size();
      }
      if (last < p.text.size()) parts.push_back({last, p.text.size(), false});
      emit(p, parts, Behavior::merged_with_next, out);
    });
  }

 private:
  std::string replacement_, scheme_;
  bool split_ = true;
};

bool is_numeric(char32_t c) {
  const auto k = utf8proc_category(utf8proc_int32_t(c));
  return k >= UTF8PROC_CATEGORY_ND && k <= UTF8PROC_CATEGORY_NO;
}
bool is_bert_punctuation(char32_t c) {
  return (c < 0x80 && std::ispunct(int(c))) || is_punctuation(c);
}

// Pre-tokenizers that split on a character class.
class CharSplit : public PreTokenizer {
 public:
  using Pred = bool (*)(char32_t);
  CharSplit(Pred pred, Behavior b, Pred then = nullptr, Behavior then_b = Behavior::isolated)
      : pred_(pred), b_(b), then_(then), then_b_(then_b) {}
  void split(std::vector<Piece>& pieces) const override {
    std::vector<Part> parts;
    split_each(pieces, [&](Piece& p, std::vector<Piece>& out) {
      char_parts(p.text, pred_, parts);
      if (!then_) return emit(p, parts, b_, out);
      std::vector<Piece> mid;
      emit(p, parts, b_, mid);
      for (Piece& m : mid) {
        char_parts(m.text, then_, parts);
        emit(m, parts, then_b_, out);
      }
    });
  }

 private:
  Pred pred_;
  Behavior b_;
  Pred then_;
  Behavior then_b_;
};

class Whitespace : public PreTokenizer {
 public:
  Whitespace() : re_(make_regex(R"(\w+|[^\w\s]+)")) {}
  void split(std::vector<Piece>& pieces) const override {
    std::vector<Part> parts;
    split_each(pieces, [&](Piece& p, std::vector<Piece>& out) {
      regex_parts(re_, p.text, true, parts);
      emit(p, parts, Behavior::removed, out);
    });
  }

 private:
  Regex re_;
};

class Sequence : public PreTokenizer {
 public:
  explicit Sequence(const Json& j) {
    check_keys(j, "pre_tokenizer Sequence", {"pretokenizers"});
    for (const Json& n : j.at("pretokenizers").as_array())
      if (auto s = make_pre_tokenizer(n)) parts_.push_back(std::move(s));
  }
  void split(std::vector<Piece>& pieces) const override {
    for (const auto& s : parts_) s->split(pieces);
  }

 private:
  std::vector<std::unique_ptr<PreTokenizer>> parts_;
};

}  // namespace

void to_byte_chars(Piece& p) { ByteLevel::to_byte_chars(p); }

std::unique_ptr<PreTokenizer> make_pre_tokenizer(const Json& j) {
  if (j.is_null()) return nullptr;
  const std::string type = j.at("type").as_string();
  const std::string stage = "pre_tokenizer " + type;
  if (type == "ByteLevel") return std::make_unique<ByteLevel>(j);
  if (type == "Split") return std::make_unique<Split>(j);
  if (type == "Metaspace") return std::make_unique<Metaspace>(j);
  if (type == "Sequence") return std::make_unique<Sequence>(j);
  if (type == "Whitespace") {
    check_keys(j, stage, {});
    return std::make_unique<Whitespace>();
  }
  if (type == "WhitespaceSplit") {
    check_keys(j, stage, {});
    return std::make_unique<CharSplit>(is_whitespace, Behavior::removed);
  }
  if (type == "BertPreTokenizer") {
    check_keys(j, stage, {});
    return std::make_unique<CharSplit>(is_whitespace, Behavior::removed, is_bert_punctuation,
                                       Behavior::isolated);
  }
  if (type == "Digits") {
    check_keys(j, stage, {"individual_digits"});
    return std::make_unique<CharSplit>(is_numeric, get_bool(j, "individual_digits", false)
                                                       ? Behavior::isolated
                                                       : Behavior::contiguous);
  }
  if (type == "Punctuation") {
    check_keys(j, stage, {"behavior"});
    return std::make_unique<CharSplit>(is_bert_punctuation, parse_behavior(j, stage));
  }
  unsupported("pre_tokenizer", "type \"" + type + "\"");
}

}  // namespace redco::data::tok
