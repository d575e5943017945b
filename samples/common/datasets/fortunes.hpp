#pragma once
// Fortune cookies as a text-classification data set: Debian's fortunes
// (English, /usr/share/games/fortunes) and fortunes-de (German, its de/
// folder) packages hold one category per file, entries separated by lines
// holding only "%". Each entry becomes an example labelled with its file.
//
//   data::Fortunes f = data::read_fortunes();                 // English, 30 categories
//   data::Fortunes all = data::read_fortunes(data::kFortunesDir, {.recursive = true});
//   f.items[i].text;                      // "Q: How many ...\nA: ..."
//   f.categories[f.items[i].category];    // "computers"; "de/witze" when recursive
//   auto [train, valid] = data::holdout(f, 10);   // every 10th entry of each category
//
// Order is deterministic: files sorted by their path below the folder
// (bytewise), entries in file order. Skipped: the strfile indexes (*.dat),
// the *.u8 links and any other symbolic link (Debian links every file to a
// .u8 name: reading both would count each entry twice), hidden files, and
// folders named "off" (the offensive fortunes of fortunes-off and friends).
//
// Encoding: every file of Debian 12's packages is UTF-8, but older fortune
// files are Latin-1. A file that is not valid UTF-8 is read as Latin-1 and
// converted (every byte is a Latin-1 character, so this cannot fail); its
// name is listed in latin1_files so a caller can see it happened.
#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

namespace redco::data {

inline constexpr const char* kFortunesDir = "/usr/share/games/fortunes";

struct Fortune {
  std::string text;      // UTF-8, without the separator line or the final newline
  int32_t category = 0;  // index into Fortunes::categories
};

struct Fortunes {
  std::vector<std::string> categories;  // file paths below the folder, sorted
  std::vector<Fortune> items;
  std::vector<std::string> latin1_files;  // categories that were converted from Latin-1
  // Entries per category, indexed like categories.
  std::vector<int64_t> counts() const;
};

struct FortuneOptions {
  bool recursive = false;        // also read subfolders (categories "de/witze")
  int64_t min_per_category = 1;  // leave out categories with fewer entries
};

// Throws redco::Error naming the folder when it does not exist (with the
// package to install) or holds no fortunes.
Fortunes read_fortunes(const std::filesystem::path& dir = kFortunesDir,
                       const FortuneOptions& options = {});

// Every `every`-th entry of each category (the 1st, every+1-th, ...) goes to
// the second set, the rest to the first: a stratified, deterministic split.
struct FortuneSplit {
  std::vector<Fortune> train, valid;
};
FortuneSplit holdout(const Fortunes& f, int64_t every);

}  // namespace redco::data
