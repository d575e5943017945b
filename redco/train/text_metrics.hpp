#pragma once
// Metrics of predicted text against references, for the metric functions
// given to Trainer::fit's `evaluate` (reading text from images, transcription):
//
//   auto metric = [](std::span<const Line> ls, std::span<const std::string> pred) {
//     return train::text_metrics(texts_of(ls), pred);  // cer, exact_match
//   };
#include <algorithm>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "redco/core/error.hpp"
#include "redco/io/events.hpp"

namespace redco::train {

// Levenshtein distance (insertions, deletions, substitutions, each 1) between
// two byte strings, with one row of the table.
inline size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0]++;  // the cell above-left of row[j]
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t best = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] != b[j - 1])});
      diag = std::exchange(row[j], best);
    }
  }
  return row[b.size()];
}

// cer: the summed edit distances over the summed reference lengths (bytes);
// exact_match: the fraction of predictions equal to their reference.
inline io::Metrics text_metrics(std::span<const std::string> references,
                                std::span<const std::string> predictions) {
  REDCO_CHECK(references.size() == predictions.size() && !references.empty(),
              "text_metrics: {} references and {} predictions (need as many, at least one)",
              references.size(), predictions.size());
  double errors = 0, length = 0, exact = 0;
  for (size_t i = 0; i < references.size(); ++i) {
    errors += double(edit_distance(predictions[i], references[i]));
    length += double(references[i].size());
    exact += predictions[i] == references[i];
  }
  return {{"cer", errors / std::max(length, 1.0)},
          {"exact_match", exact / double(references.size())}};
}

}  // namespace redco::train
