// The chat template's lexer: jinja2 3.1's tokens with its whitespace rules
// as transformers configures them (trim_blocks, lstrip_blocks, '-' and '+' on
// tags), so the text between tags is already what jinja2 would output.
#include <algorithm>
#include <cstdlib>

#include "redco/data/chat_template_ast.hpp"
#include "redco/data/utf8.hpp"

namespace redco::data::chat_detail {

void fail_at(Where w, const std::string& msg) {
  fail("chat template line {}, column {}: {}", w.line, w.col, msg);
}

namespace {

using T = Token::Type;

bool is_ws(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

// jinja2 reads a template with its newlines made "\n" and one trailing
// newline dropped (keep_trailing_newline=False).
std::string normalize(std::string_view src) {
  std::string out;
  out.reserve(src.size());
  for (size_t i = 0; i < src.size(); ++i) {
    if (src[i] == '\r') {
      out += '\n';
      if (i + 1 < src.size() && src[i + 1] == '\n') ++i;
    } else {
      out += src[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

// Python's unicode-escape decoding of a string literal's inside, as jinja2's
// lexer applies it; an unknown escape keeps its backslash.
std::string unescape(std::string_view s) {
  std::string out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != '\\' || i + 1 == s.size()) {
      out += s[i];
      continue;
    }
    const char e = s[++i];
    static const std::string_view kSimple = "nrtabfv\\'\"";
    static const std::string_view kValue = "\n\r\t\a\b\f\v\\'\"";
    if (const size_t k = kSimple.find(e); k != std::string_view::npos) {
      out += kValue[k];
    } else if (e == '\n') {
      // A backslash before a newline joins the lines.
    } else if ((e == 'x' || e == 'u' || e == 'U') && i + 1 < s.size()) {
      const size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
      const std::string hex(s.substr(i + 1, n));
      char* end = nullptr;
      const unsigned long c = std::strtoul(hex.c_str(), &end, 16);
      if (hex.size() != n || end != hex.c_str() + n) {
        out += '\\';
        out += e;
        continue;
      }
      append_utf8(out, char32_t(c));
      i += n;
    } else if (e >= '0' && e <= '7') {
      unsigned c = 0;
      size_t k = 0;
      for (; k < 3 && i + k < s.size() && s[i + k] >= '0' && s[i + k] <= '7'; ++k)
        c = c * 8 + unsigned(s[i + k] - '0');
      append_utf8(out, char32_t(c));
      i += k - 1;
    } else {
      out += '\\';
      out += e;
    }
  }
  return out;
}

class Lexer {
 public:
  explicit Lexer(const std::string& src) : src_(src) {
    line_starts_.push_back(0);
    for (size_t i = 0; i < src_.size(); ++i)
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
  }

  std::vector<Token> run() {
    while (pos_ < src_.size()) {
      const size_t start = next_tag(pos_);
      if (start == std::string::npos) {
        emit(T::text, src_.substr(pos_), pos_);
        break;
      }
      lex_tag(start);
    }
    emit(T::eof, "", src_.size());
    return std::move(tokens_);
  }

 private:
  Where where(size_t pos) const {
    const auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), pos);
    const size_t line = size_t(it - line_starts_.begin());
    return {int(line), int(pos - line_starts_[line - 1]) + 1};
  }
  void emit(T type, std::string value, size_t pos) {
    if (type == T::text && value.empty()) return;
    tokens_.push_back({type, std::move(value), where(pos)});
  }
  size_t next_tag(size_t from) const {
    for (size_t i = src_.find('{', from); i != std::string::npos; i = src_.find('{', i + 1))
      if (i + 1 < src_.size() && (src_[i + 1] == '{' || src_[i + 1] == '%' || src_[i + 1] == '#'))
        return i;
    return std::string::npos;
  }

  // The text before a tag, with the tag's left whitespace control applied.
  void lex_tag(size_t start) {
    std::string text = src_.substr(pos_, start - pos_);
    const char kind = src_[start + 1];
    const char sign = start + 2 < src_.size() ? src_[start + 2] : '\0';
    if (sign == '-') {
      while (!text.empty() && is_ws(text.back())) text.pop_back();
    } else if (sign != '+' && kind != '{') {
      // lstrip_blocks: a block or comment tag alone after a line's indentation
      // takes the indentation with it.
      const size_t nl = text.rfind('\n');
      const size_t l_pos = nl == std::string::npos ? 0 : nl + 1;
      if ((l_pos > 0 || line_starting_) && l_pos < text.size() &&
          std::all_of(text.begin() + long(l_pos), text.end(), is_ws))
        text.resize(l_pos);
    }
    emit(T::text, std::move(text), pos_);
    pos_ = start + 2 + ((sign == '-' || sign == '+') ? 1 : 0);
    if (kind == '#') {
      lex_comment(start);
    } else {
      emit(kind == '%' ? T::block_begin : T::var_begin, "", start);
      lex_inside(start, kind == '%');
    }
  }

  // The tag end's right whitespace control: '-' eats all whitespace after it,
  // trim_blocks one newline after a block or comment.
  void after_end(char sign, bool trims) {
    const size_t from = pos_;
    if (sign == '-') {
      while (pos_ < src_.size() && is_ws(src_[pos_])) ++pos_;
    } else if (sign != '+' && trims && pos_ < src_.size() && src_[pos_] == '\n') {
      ++pos_;
    }
    line_starting_ = pos_ > from && src_[pos_ - 1] == '\n';
  }

  void lex_comment(size_t start) {
    const size_t end = src_.find("#}", pos_);
    if (end == std::string::npos) fail_at(where(start), "comment '{#' is never closed with '#}'");
    const char sign = end > pos_ ? src_[end - 1] : '\0';
    pos_ = end + 2;
    after_end(sign == '-' || sign == '+' ? sign : '\0', true);
  }

  // An end tag at pos_: "%}" / "-%}" / "+%}" or "}}" / "-}}".
  bool lex_end(bool block) {
    const std::string_view rest = std::string_view(src_).substr(pos_);
    const char* close = block ? "%}" : "}}";
    char sign = '\0';
    if (rest.starts_with(close)) {
      pos_ += 2;
    } else if ((rest.starts_with('-') || (block && rest.starts_with('+'))) &&
               rest.substr(1).starts_with(close)) {
      sign = rest[0];
      pos_ += 3;
    } else {
      return false;
    }
    emit(block ? T::block_end : T::var_end, "", pos_ - 1);
    after_end(sign, block);
    return true;
  }

  void lex_inside(size_t start, bool block) {
    int depth = 0;
    while (true) {
      while (pos_ < src_.size() && is_ws(src_[pos_])) ++pos_;
      if (pos_ >= src_.size())
        fail_at(where(start), block ? "tag '{%' is never closed with '%}'"
                                    : "expression '{{' is never closed with '}}'");
      if (depth == 0 && lex_end(block)) return;
      const char c = src_[pos_];
      if (std::isalpha(uint8_t(c)) || c == '_') {
        lex_name();
      } else if (std::isdigit(uint8_t(c))) {
        lex_number();
      } else if (c == '\'' || c == '"') {
        lex_string();
      } else {
        depth += lex_operator();
        if (depth < 0) fail_at(where(pos_ - 1), "unbalanced closing bracket");
      }
    }
  }

  void lex_name() {
    const size_t b = pos_;
    while (pos_ < src_.size() && (std::isalnum(uint8_t(src_[pos_])) || src_[pos_] == '_')) ++pos_;
    emit(T::name, src_.substr(b, pos_ - b), b);
  }

  void lex_number() {
    const size_t b = pos_;
    auto digits = [&] {
      while (pos_ < src_.size() && (std::isdigit(uint8_t(src_[pos_])) || src_[pos_] == '_')) ++pos_;
    };
    digits();
    bool real = false;
    if (pos_ + 1 < src_.size() && src_[pos_] == '.' && std::isdigit(uint8_t(src_[pos_ + 1]))) {
      ++pos_;
      digits();
      real = true;
    }
    if (pos_ < src_.size() && (src_[pos_] == 'e' || src_[pos_] == 'E')) {
      size_t p = pos_ + 1;
      if (p < src_.size() && (src_[p] == '+' || src_[p] == '-')) ++p;
      if (p < src_.size() && std::isdigit(uint8_t(src_[p]))) {
        pos_ = p;
        digits();
        real = true;
      }
    }
    std::string text = src_.substr(b, pos_ - b);
    std::erase(text, '_');
    emit(real ? T::real : T::integer, text, b);
  }

  void lex_string() {
    const size_t b = pos_;
    const char q = src_[pos_++];
    std::string raw;
    while (pos_ < src_.size() && src_[pos_] != q) {
      if (src_[pos_] == '\\' && pos_ + 1 < src_.size()) raw += src_[pos_++];
      raw += src_[pos_++];
    }
    if (pos_ >= src_.size()) fail_at(where(b), "string literal is never closed");
    ++pos_;
    emit(T::string, unescape(raw), b);
  }

  // Returns the change in bracket depth.
  int lex_operator() {
    static const char* kOps[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "/",
                                 "*",  "%",  "~",  "[",  "]",  "(",  ")", "{", "}",
                                 "<",  ">",  "=",  ".",  ":",  "|",  ",", ";"};
    const std::string_view rest = std::string_view(src_).substr(pos_);
    for (const char* op : kOps) {
      if (!rest.starts_with(op)) continue;
      emit(T::op, op, pos_);
      pos_ += std::string_view(op).size();
      const char c = op[0];
      return (c == '(' || c == '[' || c == '{') ? 1 : (c == ')' || c == ']' || c == '}') ? -1 : 0;
    }
    fail_at(where(pos_), fmt::format("unexpected character '{}'", src_[pos_]));
  }

  const std::string& src_;
  std::vector<size_t> line_starts_;
  std::vector<Token> tokens_;
  size_t pos_ = 0;
  bool line_starting_ = true;
};

}  // namespace

std::vector<Token> lex_template(const std::string& source) {
  const std::string src = normalize(source);
  return Lexer(src).run();
}

}  // namespace redco::data::chat_detail
