#pragma once
// GPT-2's vocab.json: one JSON object of token spellings (strings in the byte
// alphabet, any JSON escape) to ids. Its own small reader rather than io::Json
// because every error names the file and line of the entry.
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace redco::data {

struct VocabEntry {
  std::u32string spelled;  // the key, as code points
  int64_t id;
  int line;  // where it stands in the file, for messages
};

// The entries in file order; fails naming file:line on anything but an object
// of string keys and non-negative integer values.
std::vector<VocabEntry> parse_vocab_json(std::string_view text, const std::string& file);

}  // namespace redco::data
