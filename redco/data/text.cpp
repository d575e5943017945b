// The KJV reader, the character tokenizer and next-token windows.
#include "redco/data/text.hpp"

#include <sys/wait.h>

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cstdio>

#include "redco/core/error.hpp"
#include "redco/core/philox.hpp"

namespace redco::data {
namespace {

constexpr const char* kInstallHint =
    "the KJV text comes from the `bible` program of Debian's bible-kjv package; install it with "
    "`sudo apt-get install bible-kjv`";

bool parse_int(std::string_view s, int& out) {
  const auto [end, ec] = std::from_chars(s.data(), s.data() + s.size(), out);
  return ec == std::errc() && end == s.data() + s.size() && !s.empty();
}

// The program's output: a blank line, "Book Chapter", a blank line, then one
// line per verse, "  N text". Verse text is never wrapped (we pass a huge
// line width), but a wrapped line would be a non-indented line that does not
// follow a blank one, so it is joined to its verse rather than misread.
class KjvParser {
 public:
  explicit KjvParser(std::string_view range) : range_(range) {}

  void line(std::string_view l) {
    if (l.empty()) {
      prev_blank_ = true;
      return;
    }
    const bool was_blank = prev_blank_;
    prev_blank_ = false;
    if (l.starts_with("  ") && verse(l)) return;
    if (was_blank && header(l)) return;
    REDCO_CHECK(!verses_.empty(), "read_kjv('{}'): the bible program said: {}", range_, l);
    verses_.back().text += ' ';
    verses_.back().text += l;
  }
  std::vector<Verse> take() { return std::move(verses_); }

 private:
  bool verse(std::string_view l) {
    l.remove_prefix(l.find_first_not_of(' '));
    const size_t space = l.find(' ');
    int n = 0;
    if (space == std::string_view::npos || !parse_int(l.substr(0, space), n)) return false;
    REDCO_CHECK(chapter_ > 0, "read_kjv('{}'): verse {} before any chapter heading", range_, n);
    verses_.push_back({book_, chapter_, n, std::string(l.substr(space + 1))});
    return true;
  }
  bool header(std::string_view l) {
    const size_t space = l.rfind(' ');
    int chapter = 0;
    if (space == std::string_view::npos || !parse_int(l.substr(space + 1), chapter)) return false;
    book_ = std::string(l.substr(0, space));
    chapter_ = chapter;
    return true;
  }

  std::string_view range_;
  std::vector<Verse> verses_;
  std::string book_;
  int chapter_ = 0;
  bool prev_blank_ = true;
};

}  // namespace

std::vector<Verse> read_kjv(std::string_view range) {
  // The range goes into a shell command, so it is limited to the characters
  // of the program's verse syntax.
  const bool safe = !range.empty() && std::all_of(range.begin(), range.end(), [](char c) {
    return std::isalnum(uint8_t(c)) || c == ':' || c == '-' || c == ' ' || c == ',';
  });
  REDCO_CHECK(safe, "read_kjv: '{}' is not a verse range such as \"Gen1:1-Rev22:21\"", range);
  const std::string cmd = "bible -l100000 '" + std::string(range) + "' 2>&1";
  FILE* pipe = popen(cmd.c_str(), "r");
  REDCO_CHECK(pipe, "read_kjv: could not start `{}`; {}", cmd, kInstallHint);
  KjvParser parser(range);
  std::string line;
  char buf[4096];
  try {
    while (fgets(buf, sizeof buf, pipe)) {
      line += buf;
      if (line.back() != '\n') continue;  // a line longer than the buffer
      line.pop_back();
      parser.line(line);
      line.clear();
    }
    if (!line.empty()) parser.line(line);
  } catch (...) {
    pclose(pipe);
    throw;
  }
  const int status = pclose(pipe);
  REDCO_CHECK(status != -1 && WIFEXITED(status) && WEXITSTATUS(status) != 127,
              "read_kjv: `bible` was not found; {}", kInstallHint);
  REDCO_CHECK(WEXITSTATUS(status) == 0, "read_kjv('{}'): `bible` exited with status {}", range,
              WEXITSTATUS(status));
  std::vector<Verse> verses = parser.take();
  REDCO_CHECK(!verses.empty(), "read_kjv('{}'): no verses in that range", range);
  return verses;
}

std::string join_verses(std::span<const Verse> verses, char separator) {
  size_t n = 0;
  for (const Verse& v : verses) n += v.text.size() + 1;
  std::string out;
  out.reserve(n);
  for (const Verse& v : verses) {
    out += v.text;
    out += separator;
  }
  return out;
}

TextSplit kjv_split(double held_out) {
  REDCO_CHECK(held_out >= 0 && held_out < 1, "kjv_split: held_out {} must be in [0, 1)", held_out);
  const std::vector<Verse> verses = read_kjv();
  const size_t n_valid = size_t(double(verses.size()) * held_out);
  const std::span<const Verse> all(verses);
  return {join_verses(all.first(verses.size() - n_valid)), join_verses(all.last(n_valid))};
}

CharTokenizer CharTokenizer::fit(std::string_view text, std::string_view extra) {
  std::array<bool, 256> seen{};
  for (char c : text) seen[uint8_t(c)] = true;
  for (char c : extra) seen[uint8_t(c)] = true;
  CharTokenizer t;
  t.ids_.fill(-1);
  for (int b = 0; b < 256; ++b) {
    if (!seen[size_t(b)]) continue;
    t.ids_[size_t(b)] = int32_t(t.symbols_.size());
    t.symbols_ += char(b);
  }
  REDCO_CHECK(!t.symbols_.empty(), "CharTokenizer::fit: the text and the extra symbols are empty");
  return t;
}

int64_t CharTokenizer::id(char c) const {
  const int32_t i = ids_[uint8_t(c)];
  REDCO_CHECK(i >= 0, "CharTokenizer: byte 0x{:02x} is not in the {}-symbol alphabet", uint8_t(c),
              symbols_.size());
  return i;
}

char CharTokenizer::symbol(int64_t id) const {
  REDCO_CHECK(id >= 0 && id < vocab_size(), "CharTokenizer: id {} is outside [0, {})", id,
              vocab_size());
  return symbols_[size_t(id)];
}

std::vector<int64_t> CharTokenizer::encode(std::string_view text) const {
  std::vector<int64_t> out(text.size());
  for (size_t i = 0; i < text.size(); ++i) out[i] = id(text[i]);
  return out;
}

std::string CharTokenizer::decode(std::span<const int64_t> ids) const {
  std::string out(ids.size(), '\0');
  for (size_t i = 0; i < ids.size(); ++i) out[i] = symbol(ids[i]);
  return out;
}

Tensor sample_windows(std::span<const int64_t> tokens, int64_t batch, int64_t seq_len,
                      uint64_t seed, uint64_t step) {
  REDCO_CHECK(batch > 0 && seq_len > 0, "sample_windows: batch {} and seq_len {} must be > 0",
              batch, seq_len);
  const int64_t starts = int64_t(tokens.size()) - seq_len;  // valid offsets: [0, starts)
  REDCO_CHECK(starts > 0, "sample_windows: {} tokens cannot hold a window of {} + 1", tokens.size(),
              seq_len);
  Tensor out = Tensor::empty({batch, seq_len + 1}, DType::i64);
  int64_t* p = out.data<int64_t>();
  const uint64_t stream = stream_of("redco.data.windows") ^ step;
  for (int64_t b = 0; b < batch; ++b) {
    // 64 random bits make the modulo bias negligible for any corpus size.
    const uint64_t r = (uint64_t(philox_bits(seed, stream, uint64_t(2 * b))) << 32) |
                       philox_bits(seed, stream, uint64_t(2 * b + 1));
    const int64_t start = int64_t(r % uint64_t(starts));
    std::copy_n(tokens.begin() + start, seq_len + 1, p + b * (seq_len + 1));
  }
  return out;
}

LmBatch next_token_batch(std::span<const int64_t> tokens, int64_t batch, int64_t seq_len,
                         uint64_t seed, uint64_t step) {
  const Tensor w = sample_windows(tokens, batch, seq_len, seed, step);
  LmBatch out{Tensor::empty({batch, seq_len}, DType::i64),
              Tensor::empty({batch, seq_len}, DType::i64)};
  const int64_t* src = w.data<int64_t>();
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t* row = src + b * (seq_len + 1);
    std::copy_n(row, seq_len, out.inputs.data<int64_t>() + b * seq_len);
    std::copy_n(row + 1, seq_len, out.targets.data<int64_t>() + b * seq_len);
  }
  return out;
}

}  // namespace redco::data
