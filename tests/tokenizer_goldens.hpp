#pragma once
// Shared by the tokenizer tests: the repository's tokenizer fixtures
// (tests/data/tokenizers/<kind>/, made by tests/python/make_tokenizer_goldens.py)
// and the reference's character offsets.
#include <zlib.h>

#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "redco/core/error.hpp"
#include "redco/data/tokenizer.hpp"
#include "redco/io/json.hpp"

namespace tokenizer_test {

// From the source path the compiler saw, else upwards from the working
// directory or the executable (build folders live inside the repository).
inline std::filesystem::path repo_root() {
  namespace fs = std::filesystem;
  std::error_code ec;
  for (fs::path start : {fs::path(__FILE__).parent_path(), fs::current_path(),
                         fs::read_symlink("/proc/self/exe", ec).parent_path()}) {
    for (fs::path p = fs::absolute(start, ec); !p.empty(); p = p.parent_path()) {
      if (fs::exists(p / "tests/python/make_tokenizer_goldens.py", ec)) return p;
      if (p == p.parent_path()) break;
    }
  }
  throw redco::Error("cannot find the redco repository from " + std::string(__FILE__));
}

inline std::filesystem::path fixture(const std::string& kind) {
  return repo_root() / "tests" / "data" / "tokenizers" / kind;
}

inline std::string read_gz(const std::filesystem::path& p) {
  gzFile f = gzopen(p.c_str(), "rb");
  if (!f) throw redco::Error("cannot open " + p.string());
  std::string out;
  char buf[1 << 16];
  int n = 0;
  while ((n = gzread(f, buf, sizeof buf)) > 0) out.append(buf, size_t(n));
  gzclose(f);
  return out;
}

// Byte offsets -> the character offsets the Python package reports (its
// BytesToCharOffsetConverter: each byte maps to the index of its character;
// an end at the text's end maps past the last character).
inline std::vector<std::pair<uint32_t, uint32_t>> char_offsets(
    const std::string& text, const std::vector<std::pair<uint32_t, uint32_t>>& bytes) {
  std::vector<int64_t> map(text.size() + 1, -1);
  int64_t chars = 0;
  for (size_t i = 0; i < text.size(); ++i) {
    if ((uint8_t(text[i]) & 0xC0) != 0x80 && i > 0) ++chars;
    map[i] = chars;
  }
  // The reference converts before trimming offsets, so an offset trimmed to
  // the very end counts the characters.
  map[text.size()] = text.empty() ? 0 : chars + 1;
  std::vector<std::pair<uint32_t, uint32_t>> out;
  for (auto [b, e] : bytes) {
    if (b == 0 && e == 0) {
      out.emplace_back(0, 0);
    } else {
      out.emplace_back(uint32_t(map[std::min<size_t>(b, text.size())]),
                       uint32_t(map[std::min<size_t>(e, text.size())]));
    }
  }
  return out;
}

}  // namespace tokenizer_test
