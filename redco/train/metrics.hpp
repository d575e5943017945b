#pragma once
// Metrics of classification and regression predictions, for the metric
// functions given to Trainer::fit's `evaluate`, and the scores of ignoring the
// input that they should beat.
//
//   auto metric = [&](std::span<const Ex> ex, std::span<const int64_t> pred) {
//     return train::classification_metrics(labels_of(ex), pred, n_classes);  // accuracy, macro_f1
//   };
#include <algorithm>
#include <cstdint>
#include <span>
#include <vector>

#include "redco/core/error.hpp"
#include "redco/io/events.hpp"

namespace redco::train {

// "accuracy", and "macro_f1": the mean over the classes that occur in the
// labels or the predictions of F1 = 2 TP / (2 TP + FP + FN), as
// scikit-learn's f1_score(average="macro") computes it.
inline io::Metrics classification_metrics(std::span<const int64_t> labels,
                                          std::span<const int64_t> predictions, int64_t n_classes) {
  REDCO_CHECK(labels.size() == predictions.size() && !labels.empty(),
              "classification_metrics: {} labels but {} predictions", labels.size(),
              predictions.size());
  std::vector<int64_t> tp(size_t(n_classes), 0), fp(size_t(n_classes), 0), fn(size_t(n_classes), 0);
  int64_t correct = 0;
  for (size_t i = 0; i < labels.size(); ++i) {
    const int64_t y = labels[i], p = predictions[i];
    REDCO_CHECK(y >= 0 && y < n_classes && p >= 0 && p < n_classes,
                "classification_metrics: example {} has label {} and prediction {}; classes are "
                "0..{}",
                i, y, p, n_classes - 1);
    if (y == p) {
      ++correct, ++tp[size_t(y)];
    } else {
      ++fn[size_t(y)], ++fp[size_t(p)];
    }
  }
  double f1 = 0;
  int64_t present = 0;
  for (size_t c = 0; c < size_t(n_classes); ++c) {
    if (tp[c] + fp[c] + fn[c] == 0) continue;
    f1 += 2.0 * double(tp[c]) / double(2 * tp[c] + fp[c] + fn[c]);
    ++present;
  }
  return {{"accuracy", double(correct) / double(labels.size())},
          {"macro_f1", f1 / double(present)}};
}

// The mean of (prediction - target)^2.
inline double mean_squared_error(std::span<const float> targets,
                                 std::span<const float> predictions) {
  REDCO_CHECK(targets.size() == predictions.size() && !targets.empty(),
              "mean_squared_error: {} targets but {} predictions", targets.size(),
              predictions.size());
  double s = 0;
  for (size_t i = 0; i < targets.size(); ++i) {
    const double d = double(predictions[i]) - double(targets[i]);
    s += d * d;
  }
  return s / double(targets.size());
}

// classification_metrics of class ids a predictor returns as floats (one
// output type for a sample's classification and regression alike).
inline io::Metrics classification_metrics(std::span<const int64_t> labels,
                                          std::span<const float> predictions, int64_t n_classes) {
  const std::vector<int64_t> ids(predictions.begin(), predictions.end());
  return classification_metrics(labels, ids, n_classes);
}

// What a model that ignores its input scores, to judge whether one learned
// anything: the accuracy of always predicting the most frequent training
// label (the lowest of tied ones) ...
inline double majority_accuracy(std::span<const int64_t> train_labels,
                                std::span<const int64_t> valid_labels, int64_t n_classes) {
  REDCO_CHECK(!train_labels.empty() && !valid_labels.empty(),
              "majority_accuracy: needs training and validation labels, got {} and {}",
              train_labels.size(), valid_labels.size());
  std::vector<int64_t> n(size_t(n_classes), 0);
  for (const int64_t y : train_labels) {
    REDCO_CHECK(y >= 0 && y < n_classes, "majority_accuracy: label {}; classes are 0..{}", y,
                n_classes - 1);
    ++n[size_t(y)];
  }
  const auto top = int64_t(std::max_element(n.begin(), n.end()) - n.begin());
  return double(std::count(valid_labels.begin(), valid_labels.end(), top)) /
         double(valid_labels.size());
}
// ... and the mean squared error of always predicting the mean training target.
inline double mean_target_mse(std::span<const float> train_targets,
                              std::span<const float> valid_targets) {
  REDCO_CHECK(!train_targets.empty() && !valid_targets.empty(),
              "mean_target_mse: needs training and validation targets, got {} and {}",
              train_targets.size(), valid_targets.size());
  double mean = 0;
  for (const float t : train_targets) mean += double(t) / double(train_targets.size());
  double s = 0;
  for (const float t : valid_targets) s += (double(t) - mean) * (double(t) - mean);
  return s / double(valid_targets.size());
}

}  // namespace redco::train
