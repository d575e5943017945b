#pragma once
// What the user's functions must look like. Trainer, Predictor and Evaluation
// check them at their boundary with static_assert, one message per function,
// and instantiate nothing further when a check fails, so a wrong signature
// gives one compile error that names the function and the expected call
// (tests/compile_fail holds one program per message):
//
//   collate(std::span<const Example>)          -> Batch (any movable type)
//   loss(BoundModel<L>&, const Batch&, Rng)    -> Tensor (a scalar)
//   predict(BoundModel<L>&, const Batch&, Rng) -> a sized range, one output per example
//   output(Out)                                -> a user value (optional)
//   metric(std::span<const Example>, std::span<const Value>) -> named numbers
#include <concepts>
#include <ranges>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "redco/io/events.hpp"
#include "redco/train/bound_model.hpp"
#include "redco/train/rng.hpp"

namespace redco::train {

// Named numbers in order: what metric functions return and logs record.
using Metrics = io::Metrics;

// ---- the examples -----------------------------------------------------------------------
// Examples come in a random-access range of copyable values (a std::vector,
// a span, a view), read by index.
template <typename R>
concept ExampleRange = std::ranges::random_access_range<const R> &&
    std::ranges::sized_range<const R> && std::copyable<std::ranges::range_value_t<const R>>;
template <ExampleRange R>
using example_t = std::ranges::range_value_t<const R>;

// ---- collate ------------------------------------------------------------------------------
template <typename F, typename Ex>
concept CollateFn = std::invocable<F&, std::span<const Ex>> &&
    std::movable<std::remove_cvref_t<std::invoke_result_t<F&, std::span<const Ex>>>>;
template <typename F, typename Ex>
using batch_t = std::remove_cvref_t<std::invoke_result_t<F&, std::span<const Ex>>>;

// ---- loss and predict -----------------------------------------------------------------------
template <typename F, typename M, typename B>
concept LossFn = std::invocable<F&, M&, const B&, Rng> &&
    std::convertible_to<std::invoke_result_t<F&, M&, const B&, Rng>, Tensor>;

template <typename F, typename M, typename B>
concept PredictFn = std::invocable<F&, M&, const B&, Rng> &&
    std::ranges::sized_range<std::remove_cvref_t<std::invoke_result_t<F&, M&, const B&, Rng>>> &&
    std::movable<std::ranges::range_value_t<
        std::remove_cvref_t<std::invoke_result_t<F&, M&, const B&, Rng>>>>;
template <typename F, typename M, typename B>
using prediction_t =
    std::ranges::range_value_t<std::remove_cvref_t<std::invoke_result_t<F&, M&, const B&, Rng>>>;

// ---- output and metric ------------------------------------------------------------------------
// The default output function: predictions are the user's values as they are.
struct Identity {
  template <typename T>
  T operator()(T&& x) const {
    return std::forward<T>(x);
  }
};

template <typename F, typename Out>
concept OutputFn =
    std::invocable<F&, Out&&> && std::movable<std::remove_cvref_t<std::invoke_result_t<F&, Out&&>>>;
template <typename F, typename Out>
using output_t = std::remove_cvref_t<std::invoke_result_t<F&, Out&&>>;

// Anything iterable as (name, number) pairs: io::Metrics, std::map<std::string, double>.
template <typename R>
concept NamedNumbers = std::ranges::input_range<R> &&
    requires(std::ranges::range_reference_t<R> kv) {
  {std::string(kv.first)};
  {double(kv.second)};
};

template <typename F, typename Ex, typename V>
concept MetricFn = std::invocable<F&, std::span<const Ex>, std::span<const V>> &&
    NamedNumbers<std::invoke_result_t<F&, std::span<const Ex>, std::span<const V>>>;

template <NamedNumbers R>
Metrics to_metrics(R&& r) {
  Metrics out;
  for (auto&& kv : r) out.emplace_back(std::string(kv.first), double(kv.second));
  return out;
}

// ---- the messages -------------------------------------------------------------------------------
// Kept in one place so the compile-fail tests and the docs quote the same text.
#define REDCO_COLLATE_MESSAGE                                                                 \
  "redco: collate must be callable as collate(std::span<const Example>) -> Batch (a movable " \
  "value)"
#define REDCO_LOSS_MESSAGE \
  "redco: loss must be callable as loss(model, const Batch&, Rng) -> Tensor (a scalar)"
#define REDCO_PREDICT_MESSAGE                                                              \
  "redco: predict must be callable as predict(model, const Batch&, Rng) -> a sized range " \
  "with one output per example (e.g. std::vector<Out>)"
#define REDCO_OUTPUT_MESSAGE                                                                   \
  "redco: the output function must be callable as output(Out) -> Value, Out being an element " \
  "of what predict returns"
#define REDCO_METRIC_MESSAGE                                                                    \
  "redco: metric must be callable as metric(std::span<const Example>, std::span<const Value>) " \
  "-> named numbers (train::Metrics or std::map<std::string, double>)"
#define REDCO_EXAMPLES_MESSAGE \
  "redco: examples must be a random-access, sized range of copyable values (e.g. std::vector)"

}  // namespace redco::train
