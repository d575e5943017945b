#pragma once
// What Trainer::fit takes besides the examples: FitOptions (batches, epochs,
// evaluation, checkpoints, logging), the Evaluation of a Predictor and a
// metric, and what on_step sees after each step (StepInfo).
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <type_traits>
#include <vector>

#include "redco/train/concepts.hpp"
#include "redco/train/fit_driver.hpp"
#include "redco/train/per_epoch.hpp"

namespace redco::train {

// Evaluation beyond the loss: a Predictor and a metric over its outputs,
// metric(std::span<const Example>, std::span<const Value>) -> named numbers.
// The predictor is copied, so a temporary is fine.
template <typename Example>
class Evaluation {
 public:
  Evaluation() = default;
  template <typename P, typename M>
  requires(!std::is_pointer_v<P>)
      Evaluation(const P& predictor, M metric) {  // NOLINT(google-explicit-constructor)
    if constexpr (P::template check<Example>()) {
      using V = typename P::template value_type<Example>;
      static_assert(MetricFn<M, Example, V>, REDCO_METRIC_MESSAGE);
      if constexpr (MetricFn<M, Example, V>) {
        fn_ = [p = std::make_shared<const P>(predictor), m = std::move(metric)](
                  std::span<const Example> ex, int64_t batch, const ParamTree& params) mutable {
          const std::vector<V> preds = p->predict(ex, batch, params);
          return to_metrics(m(ex, std::span<const V>(preds)));
        };
      }
    }
  }
  template <typename P, typename M>
  Evaluation(const P* predictor, M metric)  // NOLINT(google-explicit-constructor)
      : Evaluation(*predictor, std::move(metric)) {}

  explicit operator bool() const { return bool(fn_); }
  Metrics operator()(std::span<const Example> examples, int64_t per_device_batch_size,
                     const ParamTree& params) const {
    return fn_(examples, per_device_batch_size, params);
  }

 private:
  std::function<Metrics(std::span<const Example>, int64_t, const ParamTree&)> fn_;
};

// What on_step sees after each optimizer step.
struct StepInfo {
  int64_t step = 0;  // optimizer steps done, this one included
  int64_t epoch = 0;
  double loss = 0;       // mean over the step's micro-batches and the data-parallel replicas
  double lr = 0;         // the rate this step used
  bool skipped = false;  // the loss or a gradient was not finite (NonFinite::skip_step)
};

// Designated initialisers name these fields in the order declared below (C++20 rule):
// `{.max_steps = 30, .log_every = 1000}` does not compile (log_every comes
// first); to set fields in any order, assign them:
//   train::FitOptions<Example> fit;  fit.max_steps = 30;  fit.log_every = 1000;
template <typename Example>
struct FitOptions {
  int64_t per_device_batch_size = 0;  // 0: global_batch_size / dp_size()
  int64_t global_batch_size = 0;      // 0: per_device_batch_size × dp_size() (no accumulation)
  int64_t n_epochs = 1;
  bool shuffle = true;
  // Evaluation: loss over these (split "eval", metric "loss") plus `evaluate`'s metrics,
  // after every epoch and every eval_every_steps steps.
  std::span<const Example> eval_examples = {};
  Evaluation<Example> evaluate = {};
  int64_t eval_per_device_batch_size = 0;  // 0: per_device_batch_size
  int64_t eval_every_steps = 0;
  // Checkpoints in deployer.workdir(): the best by each save_best_by metric
  // (ckpt/best-<metric>: parameters and state.json, no optimizer state),
  // periodic ones (ckpt/step-NNNNNN; the newest keep_last are kept, 0 keeps
  // all) and one at the end of fit() when save_at_end (also when max_steps
  // stops it), so a later fit() with .resume = true continues from there.
  std::vector<BestBy> save_best_by = {};
  int64_t save_every_steps = 0;
  int64_t save_every_epochs = 0;
  int64_t keep_last = 0;
  bool save_at_end = true;
  // Continue from the latest ckpt/step-NNNNNN, if any; always done when
  // redco-run restarted the job (Deployer::restart_count() > 0).
  bool resume = false;
  int64_t log_every = 10;
  int64_t max_steps = 0;  // > 0: stop once this many steps are done in total
  // Logged with each train line: <items>_per_s, mfu (when FLOPs and the peak
  // are given), the allocator's peak bytes and the process's peak RSS.
  Throughput throughput = {};
  std::function<void(const StepInfo&)> on_step = {};
  // A NaN or infinite loss or gradient: stop with an error naming the step
  // and the tensor (default), or skip the update (see NonFinite).
  NonFinite on_non_finite = NonFinite::stop;
  // Activation recomputation: every copy of the model's nn::repeat keeps only
  // its input for backward and runs again there (nn::checkpoint), which
  // trades about one more forward pass for most of the activation memory.
  // The gradients are the same bit for bit.
  bool recompute = false;
};

namespace detail {
struct NotExamples {};  // lets fit() name FitOptions for any argument, then explain
template <typename R, typename L = void>
struct example_of {
  using type = NotExamples;
};
template <ExampleRange R, typename L>
struct example_of<R, L> {
  using type = example_t<R>;
};
template <typename F, nn::Layer L>
requires ExampleRange<epoch_result_t<F, L>>
struct example_of<PerEpoch<F>, L> {
  using type = example_t<epoch_result_t<F, L>>;
};
}  // namespace detail
template <typename R>
using fit_options_t = FitOptions<typename detail::example_of<R>::type>;

}  // namespace redco::train
