#pragma once
// Compile-time strings for the DSL: `Name` is a fixed-capacity string usable
// in constexpr values (parameter paths in a shard plan), `Literal` lets a
// string be a template argument (`nn::named<"ln_f">(...)`).
#include <algorithm>
#include <cstddef>
#include <string_view>

namespace redco::nn {

template <size_t N>
struct Literal {
  char chars[N]{};
  constexpr Literal(const char (&s)[N]) { std::copy_n(s, N, chars); }
  constexpr std::string_view view() const { return {chars, N - 1}; }
};

// A dotted parameter path such as "h.*.attn.q_proj.weight" ("*" stands for
// every index of a repeat in compile-time plans).
class Name {
 public:
  static constexpr size_t kCapacity = 96;
  constexpr Name() = default;
  constexpr Name(std::string_view s) { append(s); }
  constexpr std::string_view view() const { return {chars_, len_}; }
  constexpr size_t size() const { return len_; }
  constexpr void append(std::string_view s) {
    // Names longer than the capacity are a programming error in a layer's
    // definition; constexpr evaluation stops here with a readable reason.
    if (len_ + s.size() > kCapacity) throw "redco::nn::Name: parameter path too long";
    for (char c : s) chars_[len_++] = c;
  }
  constexpr void append_index(long long i) {
    char digits[24];
    int n = 0;
    do {
      digits[n++] = char('0' + i % 10);
      i /= 10;
    } while (i > 0);
    while (n > 0) append(std::string_view(&digits[--n], 1));
  }
  // "a.b" + "c" -> "a.b.c"; an empty part adds nothing.
  constexpr Name dot(std::string_view part) const {
    Name n = *this;
    if (part.empty()) return n;
    if (n.len_) n.append(".");
    n.append(part);
    return n;
  }
  friend constexpr bool operator==(const Name& a, const Name& b) { return a.view() == b.view(); }

 private:
  char chars_[kCapacity]{};
  size_t len_ = 0;
};

}  // namespace redco::nn
