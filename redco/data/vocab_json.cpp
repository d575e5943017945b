// The vocab.json reader (vocab_json.hpp).
#include "redco/data/vocab_json.hpp"

#include <fmt/format.h>

#include "redco/core/error.hpp"
#include "redco/data/utf8.hpp"

namespace redco::data {
namespace {

class VocabJson {
 public:
  VocabJson(std::string_view text, std::string file) : s_(text), file_(std::move(file)) {}

  std::vector<VocabEntry> parse() {
    std::vector<VocabEntry> out;
    expect('{');
    bool more = peek() != '}';
    while (more) {
      std::u32string key = string();
      const int line = line_;
      expect(':');
      out.push_back({std::move(key), integer(), line});
      more = peek() == ',';
      if (more) ++pos_;
    }
    expect('}');
    skip_space();
    if (pos_ != s_.size()) error("unexpected text after the closing '}'");
    return out;
  }

 private:
  [[noreturn]] void error(std::string_view what) const { fail("{}:{}: {}", file_, line_, what); }
  void skip_space() {
    while (pos_ < s_.size() && std::string_view(" \t\r\n").find(s_[pos_]) != std::string_view::npos)
      line_ += s_[pos_++] == '\n';
  }
  char peek() {
    skip_space();
    if (pos_ == s_.size()) error("unexpected end of file");
    return s_[pos_];
  }
  void expect(char c) {
    if (peek() != c) error(fmt::format("expected '{}', found '{}'", c, s_[pos_]));
    ++pos_;
  }
  int64_t integer() {
    peek();
    const size_t start = pos_;
    while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') ++pos_;
    if (pos_ == start || pos_ - start > 9) error("expected a token id (a non-negative integer)");
    return std::stoll(std::string(s_.substr(start, pos_ - start)));
  }
  char32_t hex4() {
    if (pos_ + 4 > s_.size()) error("truncated \\u escape");
    char32_t v = 0;
    for (int i = 0; i < 4; ++i) {
      const char c = s_[pos_++];
      const int lower = c | 0x20;
      const int d = c >= '0' && c <= '9'           ? c - '0'
                    : lower >= 'a' && lower <= 'f' ? lower - 'a' + 10
                                                   : -1;
      if (d < 0) error("bad \\u escape");
      v = v << 4 | char32_t(d);
    }
    return v;
  }
  char32_t escape() {
    if (pos_ == s_.size()) error("unterminated string");
    const char c = s_[pos_++];
    constexpr std::string_view kEscaped = "\"\\/bfnrt", kMeaning = "\"\\/\b\f\n\r\t";
    if (const size_t k = kEscaped.find(c); k != std::string_view::npos)
      return char32_t(kMeaning[k]);
    if (c != 'u') error(fmt::format("unknown escape '\\{}'", c));
    char32_t v = hex4();
    if (v >= 0xD800 && v < 0xDC00 && s_.substr(pos_, 2) == "\\u") {  // a surrogate pair
      pos_ += 2;
      v = 0x10000 + ((v - 0xD800) << 10) + (hex4() - 0xDC00);
    }
    return v;
  }
  std::u32string string() {
    expect('"');
    std::string raw;  // UTF-8 between escapes
    std::u32string out;
    while (true) {
      if (pos_ == s_.size() || s_[pos_] == '\n') error("unterminated string");
      const char c = s_[pos_++];
      if (c != '"' && c != '\\') {
        raw += c;
        continue;
      }
      if (!decode_utf8(raw, out)) error("invalid UTF-8 in a key");
      raw.clear();
      if (c == '"') return out;
      out += escape();
    }
  }

  std::string_view s_;
  std::string file_;
  size_t pos_ = 0;
  int line_ = 1;
};

}  // namespace

std::vector<VocabEntry> parse_vocab_json(std::string_view text, const std::string& file) {
  return VocabJson(text, file).parse();
}

}  // namespace redco::data
