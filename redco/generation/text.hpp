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
  // Beam search: whether `token` appended to row r would complete a stop
  // string (nothing changes), and rows following their beams (row i becomes
  // old row rows[i]).
  bool would_stop(int64_t r, int64_t token) const;
  void reorder(const std::vector<int64_t>& rows);

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

// Beam search's streamed text: a finished sequence's pieces, in the context
// of its prompt, to options.on_text as row `row`, then last = true.
void stream_final(const TextOptions& options, const std::vector<int64_t>& prompt,
                  const std::vector<int64_t>& tokens, int64_t row);

}  // namespace redco::generation::detail
