#pragma once
// Corpus-level BLEU and chrF of translations, computed as sacrebleu 2.x
// computes them with its defaults, for the metric functions given to
// Trainer::fit's `evaluate` (scores on sacrebleu's 0..100 scale):
//
//   auto metric = [&](std::span<const Pair> ex, std::span<const std::string> out) {
//     return train::translation_metrics(out, references_of(ex));  // "bleu", "chrF"
//   };
//
// BLEU (Papineni et al., 2002): 13a tokenisation (mteval-v13a, as WMT),
// n-grams up to 4, clipped counts summed over the corpus, the brevity penalty
// and NIST's "exp" smoothing of zero precisions (sacrebleu's corpus_bleu).
// chrF (Popović, 2015): character 1..6-grams with whitespace removed, β = 2,
// precision and recall averaged over the orders that occur in both texts
// (sacrebleu's corpus_chrf: chrF2, no word n-grams). One reference per
// hypothesis. Text is UTF-8; characters are Unicode code points, and
// whitespace is what Python's str.split() splits on.
#include <span>
#include <string>
#include <string_view>

#include "redco/io/events.hpp"

namespace redco::train {

double corpus_bleu(std::span<const std::string> hypotheses,
                   std::span<const std::string> references);
double corpus_chrf(std::span<const std::string> hypotheses,
                   std::span<const std::string> references);
// {"bleu", corpus_bleu}, {"chrF", corpus_chrf}.
io::Metrics translation_metrics(std::span<const std::string> hypotheses,
                                std::span<const std::string> references);

// sacrebleu's 13a tokenisation of one segment (trailing whitespace removed
// first, as BLEU does): tokens separated by single spaces. Exposed for tests.
std::string tokenize_13a(std::string_view segment);

}  // namespace redco::train
