#pragma once
// Internal: the text side of generation, one per row: streamed pieces from
// the tokenizer's incremental decoder and stop-string matching
// (GenerationConfig::stop_strings, TextOptions).
#include <string>
#include <vector>

#include "redco/generation/generate.hpp"

namespace redco::generation::detail {

class RowTexts {
 public:
  // rows[r] is row r's prompt; its text is the context of the row's new text.
  RowTexts(const TextOptions& options, const std::vector<std::vector<int64_t>>& rows,
           const std::vector<std::string>& stop_strings);
  // Row r's new token: streams the text it completes; true when that text
  // completes a stop string.
  bool push(int64_t r, int64_t token);
  // Row r has ended: emits what is held back, with last = true (once).
  void finish(int64_t r);
  void finish_all();

 private:
  struct Row {
    data::Tokenizer::Stream stream;
    std::string text;  // the prompt's and the new tokens' text so far
    bool finished = false;
  };
  const TextOptions& options_;
  const std::vector<std::string>& stops_;
  std::vector<Row> rows_;
};

}  // namespace redco::generation::detail
