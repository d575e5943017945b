#pragma once
// data::Regex: Unicode-aware regular expressions (\p{L}, \p{N}, \s, lookahead)
// for tokenizer split patterns, through PCRE2 with its JIT compiler. Patterns
// are the Oniguruma/Rust-regex dialect that tokenizer.json files carry; the
// constructs they use (classes, \p{..}, (?i:..), (?!..), {m,n}) mean the same
// in PCRE2 with UTF and UCP on, so \s, \w and \d are Unicode-aware too.
//
//   data::Regex re(R"( ?\p{L}+| ?\p{N}+)");
//   re.for_each_match(text, [](size_t begin, size_t end) { ... });
#include <cstddef>
#include <memory>
#include <string>
#include <string_view>

namespace redco::data {

class Regex {
 public:
  // Throws redco::Error naming the pattern and PCRE2's message when it does
  // not compile.
  explicit Regex(std::string_view pattern);
  ~Regex();
  Regex(Regex&&) noexcept;
  Regex& operator=(Regex&&) noexcept;

  const std::string& pattern() const { return pattern_; }

  // Calls f(begin, end) for each non-overlapping match, left to right, in byte
  // offsets of `text` (valid UTF-8). An empty match advances by one character.
  template <typename F>
  void for_each_match(std::string_view text, F&& f) const {
    size_t pos = 0, begin = 0, end = 0;
    while (next(text, pos, begin, end)) f(begin, end);
  }
  // The first match at or after byte `pos`; false when there is none. Sets
  // pos past the match (one character past an empty one).
  bool next(std::string_view text, size_t& pos, size_t& begin, size_t& end) const;

 private:
  struct Impl;
  std::string pattern_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace redco::data
