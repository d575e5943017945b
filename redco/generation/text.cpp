// Streaming text and stop strings for generation (generation/text.hpp).
#include "redco/generation/text.hpp"

#include <algorithm>

namespace redco::generation::detail {
namespace {
// Whether a stop string ends past `before` in `text` (in the text appended).
bool ends_stop(const std::vector<std::string>& stops, std::string_view text, size_t before) {
  for (const std::string& s : stops) {
    if (s.empty()) continue;
    const size_t from = before + 1 >= s.size() ? before + 1 - s.size() : 0;
    if (text.find(s, from) != std::string::npos) return true;
  }
  return false;
}
}  // namespace

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
  return ends_stop(stops_, row.text, before);
}

bool RowTexts::would_stop(int64_t r, int64_t token) const {
  if (stops_.empty()) return false;
  data::Tokenizer::Stream stream = rows_[size_t(r)].stream;  // the candidate may not be chosen
  const std::string piece = stream.step(int32_t(token));
  if (piece.empty()) return false;
  // Only the last (longest stop - 1) bytes of the text can begin a match.
  size_t longest = 0;
  for (const std::string& s : stops_) longest = std::max(longest, s.size());
  const std::string& text = rows_[size_t(r)].text;
  const size_t keep = std::min(text.size(), longest > 0 ? longest - 1 : 0);
  const std::string tail = text.substr(text.size() - keep) + piece;
  return ends_stop(stops_, tail, keep);
}

void RowTexts::reorder(const std::vector<int64_t>& rows) {
  std::vector<Row> moved;
  moved.reserve(rows.size());
  for (int64_t r : rows) moved.push_back(rows_[size_t(r)]);
  rows_ = std::move(moved);
}

void stream_final(const TextOptions& options, const std::vector<int64_t>& prompt,
                  const std::vector<int64_t>& tokens, int64_t row) {
  data::Tokenizer::Stream stream(*options.tokenizer, options.skip_special_tokens);
  for (int64_t t : prompt) stream.step(int32_t(t));
  for (int64_t t : tokens) {
    const std::string piece = stream.step(int32_t(t));
    if (!piece.empty()) options.on_text(row, piece, false);
  }
  options.on_text(row, stream.flush(), true);
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
