#pragma once
// Text data for language-model tests and samples: the King James Version of
// the Bible (about 4.1 MB of verse text, public domain, shipped by Debian's
// bible-kjv package), a character-level tokenizer, and next-token windows.
//
//   auto verses = data::read_kjv();                  // 31102 verses
//   std::string text = data::join_verses(verses);    // one verse per line
//   auto tok = data::CharTokenizer::fit(text);       // ~64 symbols
//   auto ids = tok.encode(text);
//   auto batch = data::next_token_batch(ids, 16, 64, seed, step);  // inputs/targets [16, 64]
#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "redco/core/tensor.hpp"

namespace redco::data {

struct Verse {
  std::string book;  // "Genesis", "1 Samuel", "Revelation of John", ...
  int chapter = 0;
  int verse = 0;
  std::string text;
};

// Runs the `bible` program of the bible-kjv package on `range` (its verse
// syntax: "Gen1:1-Rev22:21", "John3:16", "Ps23") and parses what it prints.
// Throws redco::Error saying how to install the package when the program is
// missing, and naming the range when it yields no verses.
std::vector<Verse> read_kjv(std::string_view range = "Gen1:1-Rev22:21");

// The verses' text, each followed by `separator`.
std::string join_verses(std::span<const Verse> verses, char separator = '\n');

// The whole KJV as training and held-out text, one verse per line: the last
// `held_out` of the verses (1555 of 31102 at 5%, from the late epistles on) are held out.
struct TextSplit {
  std::string train, valid;
};
TextSplit kjv_split(double held_out = 0.05);

// One id per distinct byte of an alphabet, in byte order; any byte string
// made of those bytes round-trips through encode/decode.
class CharTokenizer {
 public:
  // The alphabet is every byte that occurs in `text`, plus those in `extra`
  // (symbols the corpus lacks, such as a start-of-sequence marker).
  static CharTokenizer fit(std::string_view text, std::string_view extra = {});

  int64_t vocab_size() const { return int64_t(symbols_.size()); }
  bool contains(char c) const { return ids_[uint8_t(c)] >= 0; }
  int64_t id(char c) const;  // throws redco::Error for a byte outside the alphabet
  char symbol(int64_t id) const;
  std::vector<int64_t> encode(std::string_view text) const;
  std::string decode(std::span<const int64_t> ids) const;

 private:
  std::string symbols_;
  std::array<int32_t, 256> ids_{};
};

// `batch` windows of seq_len + 1 consecutive tokens as an i64 tensor
// [batch, seq_len + 1], starting at offsets drawn uniformly from the valid
// range with Philox(seed, step): the same arguments give the same windows
// on every machine, and consecutive steps give fresh ones.
Tensor sample_windows(std::span<const int64_t> tokens, int64_t batch, int64_t seq_len,
                      uint64_t seed, uint64_t step);

struct LmBatch {
  Tensor inputs;   // i64 [B, T]: window[:, :T]
  Tensor targets;  // i64 [B, T]: window[:, 1:], the token after each input
};
LmBatch next_token_batch(std::span<const int64_t> tokens, int64_t batch, int64_t seq_len,
                         uint64_t seed, uint64_t step);

}  // namespace redco::data
