// Streaming text and stop strings for generation (generation/text.hpp).
#include "redco/generation/text.hpp"

#include <algorithm>

namespace redco::generation::detail {

RowTexts::RowTexts(const TextOptions& options, const std::vector<std::vector<int64_t>>& rows,
                   const std::vector<std::string>& stop_strings)
    : options_(options), stops_(stop_strings) {
  rows_.reserve(rows.size());
  for (const auto& prompt : rows) {
    rows_.push_back({data::Tokenizer::Stream(*options.tokenizer, options.skip_special_tokens), {}});
    Row& row = rows_.back();
    // The prompt primes the decoder (spaces and byte runs depend on what
    // came before) and is where a stop string may begin.
    for (int64_t t : prompt) row.text += row.stream.step(int32_t(t));
  }
}

// transformers' StopStringCriteria stops at the token whose text overlaps the
// end of a stop string's occurrence: an occurrence that ends in the new text.
bool RowTexts::push(int64_t r, int64_t token) {
  Row& row = rows_[size_t(r)];
  const std::string piece = row.stream.step(int32_t(token));
  if (piece.empty()) return false;
  const size_t before = row.text.size();
  row.text += piece;
  if (options_.on_text) options_.on_text(r, piece, false);
  for (const std::string& s : stops_) {
    if (s.empty()) continue;
    const size_t from = before + 1 >= s.size() ? before + 1 - s.size() : 0;
    if (row.text.find(s, from) != std::string::npos) return true;
  }
  return false;
}

void RowTexts::finish(int64_t r) {
  Row& row = rows_[size_t(r)];
  if (row.finished) return;
  row.finished = true;
  const std::string rest = row.stream.flush();
  if (options_.on_text) options_.on_text(r, rest, true);
}

void RowTexts::finish_all() {
  for (size_t r = 0; r < rows_.size(); ++r) finish(int64_t(r));
}

}  // namespace redco::generation::detail
