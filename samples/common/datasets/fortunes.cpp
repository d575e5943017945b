// Fortune files: one category per file, entries separated by "%" lines.
#include "datasets/fortunes.hpp"

#include <algorithm>
#include <fstream>
#include <sstream>

#include "redco/core/error.hpp"
#include "redco/data/utf8.hpp"

namespace redco::data {
namespace fs = std::filesystem;
namespace {

// The fortune files below `dir`, as paths relative to it, sorted bytewise.
std::vector<std::string> fortune_files(const fs::path& dir, bool recursive) {
  std::vector<std::string> out;
  auto consider = [&](const fs::directory_entry& e) {
    const std::string name = e.path().filename().string();
    if (e.is_symlink() || name.starts_with('.') || !e.is_regular_file()) return;
    if (name.ends_with(".dat") || name.ends_with(".u8")) return;
    out.push_back(fs::relative(e.path(), dir).generic_string());
  };
  if (recursive) {
    for (auto it = fs::recursive_directory_iterator(dir); it != fs::recursive_directory_iterator();
         ++it) {
      const std::string name = it->path().filename().string();
      // Offensive collections and hidden folders are never read.
      if (it->is_directory() && (name == "off" || name.starts_with('.'))) {
        it.disable_recursion_pending();
        continue;
      }
      consider(*it);
    }
  } else {
    for (const auto& e : fs::directory_iterator(dir)) consider(e);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string read_file(const fs::path& file) {
  std::ifstream in(file, std::ios::binary);
  REDCO_CHECK(in.good(), "read_fortunes: cannot open {}", file.string());
  std::ostringstream s;
  s << in.rdbuf();
  return s.str();
}

// The entries of one file's text: lines up to a line holding only "%"
// (a CR before the newline is tolerated); empty entries are dropped.
void split_entries(std::string_view text, int32_t category, std::vector<Fortune>& out) {
  std::string entry;
  auto flush = [&] {
    while (!entry.empty() && (entry.back() == '\n' || entry.back() == '\r')) entry.pop_back();
    if (entry.find_first_not_of(" \t\r\n") != std::string::npos)
      out.push_back({std::move(entry), category});
    entry.clear();
  };
  size_t pos = 0;
  while (pos < text.size()) {
    size_t end = text.find('\n', pos);
    if (end == std::string_view::npos) end = text.size();
    std::string_view line = text.substr(pos, end - pos);
    if (line == "%" || line == "%\r") {
      flush();
    } else {
      entry += line;
      entry += '\n';
    }
    pos = end + 1;
  }
  flush();
}

}  // namespace

std::vector<int64_t> Fortunes::counts() const {
  std::vector<int64_t> n(categories.size(), 0);
  for (const Fortune& f : items) ++n[size_t(f.category)];
  return n;
}

Fortunes read_fortunes(const fs::path& dir, const FortuneOptions& options) {
  REDCO_CHECK(fs::is_directory(dir),
              "read_fortunes: {} is not a folder; the English fortunes come with Debian's "
              "`fortunes` package and the German ones (its de/ folder) with `fortunes-de`: "
              "`sudo apt-get install fortunes fortunes-de`",
              dir.string());
  Fortunes f;
  for (const std::string& rel : fortune_files(dir, options.recursive)) {
    std::string text = read_file(dir / rel);
    const bool latin1 = !is_valid_utf8(text);
    if (latin1) text = latin1_to_utf8(text);
    std::vector<Fortune> entries;
    split_entries(text, int32_t(f.categories.size()), entries);
    if (int64_t(entries.size()) < std::max<int64_t>(1, options.min_per_category)) continue;
    if (latin1) f.latin1_files.push_back(rel);
    f.categories.push_back(rel);
    for (Fortune& e : entries) f.items.push_back(std::move(e));
  }
  REDCO_CHECK(!f.items.empty(),
              "read_fortunes: no fortune files with at least {} entries in {} (files of entries "
              "separated by lines holding only '%')",
              options.min_per_category, dir.string());
  return f;
}

FortuneSplit holdout(const Fortunes& f, int64_t every) {
  REDCO_CHECK(every >= 2, "holdout: every must be >= 2 (one entry in `every` is held out), got {}",
              every);
  FortuneSplit s;
  std::vector<int64_t> seen(f.categories.size(), 0);
  for (const Fortune& e : f.items)
    (seen[size_t(e.category)]++ % every == 0 ? s.valid : s.train).push_back(e);
  return s;
}

}  // namespace redco::data
