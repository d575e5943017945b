#pragma once
// Translation pairs from verse-aligned Bibles (data::aligned_verses), split by
// book: what a translation pipeline on the SWORD modules repeats.
//
//   auto pairs = data::verse_pairs("KJV", "WEB", {.valid_books = {"Jonah"}, .test_books =
//   {"Ruth"}}); pairs.train[0].source  // "In the beginning God created the heaven and the earth."
//   pairs.train[0].target  // "In the beginning, God created the heavens and the earth."
#include <string>
#include <vector>

#include "datasets/bibles.hpp"
#include "redco/data/seq2seq_batch.hpp"

namespace redco::data {

struct PairSplit {
  std::vector<TextPair> train, valid, test;
};
// Designated initialisers name these fields in the order declared below (C++20 rule).
struct BookSplit {
  std::vector<std::string> valid_books{}, test_books{};  // OSIS ids held out
  std::vector<std::string> train_books{};                // empty: every other book
};

inline std::vector<TextPair> text_pairs(const std::vector<AlignedVerse>& verses) {
  std::vector<TextPair> out;
  out.reserve(verses.size());
  for (const AlignedVerse& v : verses) out.push_back({v.texts.at(0), v.texts.at(1)});
  return out;
}

// The verses both modules have, as (source, target) pairs split by book;
// throws naming a book id that is in neither module.
inline PairSplit verse_pairs(const std::string& source, const std::string& target,
                             const BookSplit& books) {
  const AlignedSplit held = split_books(aligned_verses({source, target}), books.valid_books);
  const AlignedSplit test = split_books(held.train, books.test_books);
  PairSplit out{{}, text_pairs(held.valid), text_pairs(test.valid)};
  out.train = text_pairs(
      books.train_books.empty() ? test.train : split_books(test.train, books.train_books).valid);
  return out;
}

}  // namespace redco::data
