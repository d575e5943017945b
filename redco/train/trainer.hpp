#pragma once
// Training from three user functions. The Trainer owns the parameters and the
// optimizer; fit() runs epochs of shuffled batches with gradient
// accumulation, evaluates, logs, keeps checkpoints and resumes exactly.
//
//   Trainer trainer(deployer, model, collate, loss, optim::adamw(schedule));
//   trainer.fit(train, {.per_device_batch_size = 8, .global_batch_size = 32, .n_epochs = 2,
//                       .eval_examples = valid, .evaluate = {predictor, accuracy},
//                       .save_best_by = {{"accuracy", Mode::max}}, .save_every_steps = 100,
//                       .keep_last = 2, .resume = true});
//
// Batches. A step consumes global_batch_size examples: dp_size() devices ×
// accumulation micro-batches of per_device_batch_size each, so
// global_batch_size must be a multiple of per_device_batch_size × dp_size().
// Give only global_batch_size and the per-device size follows from the mesh,
// so the same options run on any number of devices.
//
// The mesh (see Deployer). Every data-parallel replica collates only its
// slice of each global batch; its gradients are averaged across the replicas
// in buckets (DataParallel), each bucket's all-reduce started by backward;
// reported losses are global means. Every rank of a model-parallel group holds
// only its shards of the parameters (shard::resolve(model, n_model_shards)),
// and so does the optimizer's state; the model runs with ctx.mp set, and
// global-norm clipping counts split parameters across the group once.
// params() are this rank's shards; whole_params() gathers them.
// Gradients of the micro-batches are averaged (loss should be a mean over its
// batch) and the schedule advances once per step. An epoch is
// floor(n / global_batch_size) steps: training drops the last partial batch
// (every step has the same size); evaluation and prediction do not.
//
// Order and randomness. Epoch e visits the examples in
// deployer.epoch_order(e, n): a function of (seed, e) alone. Micro-batch m of
// step s on data-parallel rank r runs loss with Rng{seed, s, train}.split(j)
// and dropout keyed by (seed, (s * accumulation + m) * dp_size + r), where
// j = m * dp_size + r. Nothing depends on the wall clock or on
// which thread collates, so a run that is interrupted and resumed with
// .resume = true reproduces the uninterrupted run's parameters bit for bit
// (it restarts from the latest checkpoint: parameters, optimizer state with
// the schedule position, and the position in the epoch from state.json).
//
// Collation of the next micro-batch runs on the oneTBB pool while the current
// one is computed, so collate must be safe to call concurrently with loss
// (it usually only reads the examples).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <memory>
#include <numeric>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include "redco/dist/mesh.hpp"
#include "redco/optim/optimizer.hpp"
#include "redco/sched/task.hpp"
#include "redco/shard/plan.hpp"
#include "redco/train/concepts.hpp"
#include "redco/train/data_parallel.hpp"
#include "redco/train/deployer.hpp"
#include "redco/train/fit_driver.hpp"
#include "redco/train/parallel.hpp"
#include "redco/train/pipeline.hpp"
#include "redco/train/predictor.hpp"
#include "redco/train/sharded_checkpoint.hpp"

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

// Designated initialisers name these fields in the order declared below (C++20 rule),
// group by group: batches and epochs, evaluation, checkpoints, logging and
// stopping, callbacks. `{.max_steps = 30, .log_every = 1000}` does not compile
// (log_every comes first); to set fields in any order, assign them:
//   train::FitOptions<Example> fit;  fit.max_steps = 30;  fit.log_every = 1000;
template <typename Example>
struct FitOptions {
  // -- batches and epochs
  int64_t per_device_batch_size = 0;  // 0: global_batch_size / dp_size()
  int64_t global_batch_size = 0;      // 0: per_device_batch_size × dp_size() (no accumulation)
  int64_t n_epochs = 1;
  bool shuffle = true;
  // -- evaluation: loss over these (split "eval", metric "loss") plus `evaluate`'s metrics,
  // after every epoch and every eval_every_steps steps.
  std::span<const Example> eval_examples = {};
  Evaluation<Example> evaluate = {};
  int64_t eval_per_device_batch_size = 0;  // 0: per_device_batch_size
  int64_t eval_every_steps = 0;
  // -- checkpoints in deployer.workdir(): the best by each save_best_by metric
  // (ckpt/best-<metric>: parameters and state.json, no optimizer state),
  // periodic ones (ckpt/step-NNNNNN; the newest keep_last are kept, 0 keeps
  // all) and one at the end of fit() when save_at_end (also when max_steps
  // stops it), so a later fit() with .resume = true continues from there.
  std::vector<BestBy> save_best_by = {};
  int64_t save_every_steps = 0;
  int64_t save_every_epochs = 0;
  int64_t keep_last = 0;
  bool save_at_end = true;
  bool resume = false;  // continue from the latest ckpt/step-NNNNNN, if any
  // -- logging and stopping
  int64_t log_every = 10;
  int64_t max_steps = 0;  // > 0: stop once this many steps are done in total
  // Logged with each train line: <items>_per_s, mfu (when FLOPs and the peak
  // are given), the allocator's peak bytes and the process's peak RSS.
  Throughput throughput = {};
  // -- callbacks and failure handling
  std::function<void(const StepInfo&)> on_step = {};
  // A NaN or infinite loss or gradient: stop with an error naming the step
  // and the tensor (default), or skip the update (see NonFinite).
  NonFinite on_non_finite = NonFinite::stop;
};

namespace detail {
struct NotExamples {};  // lets fit() name FitOptions for any argument, then explain
template <typename R>
struct example_of {
  using type = NotExamples;
};
template <ExampleRange R>
struct example_of<R> {
  using type = example_t<R>;
};
}  // namespace detail
template <typename R>
using fit_options_t = FitOptions<typename detail::example_of<R>::type>;

template <nn::Layer L, typename Collate, typename Loss>
class Trainer {
 public:
  // Parameters start from nn::init_params(model, deployer.seed()) unless
  // given (whole tensors); each rank keeps only its shards of them.
  Trainer(Deployer& deployer, L model, Collate collate, Loss loss, optim::Optimizer optimizer,
          std::optional<ParamTree> params = std::nullopt)
      : deployer_(&deployer),
        model_(std::move(model)),
        collate_(std::move(collate)),
        loss_(std::move(loss)),
        opt_(std::move(optimizer)),
        plan_(shard::resolve(model_, deployer.n_model_shards())),
        order_(param_order(plan_)),
        params_(initial_params(std::move(params))) {
    if (deployer.dp_size() > 1) dp_ = std::make_unique<DataParallel>(deployer.mesh().dp_comm());
  }

  template <typename Ex>
  static constexpr bool check() {
    static_assert(CollateFn<Collate, Ex>, REDCO_COLLATE_MESSAGE);
    if constexpr (CollateFn<Collate, Ex>) {
      static_assert(LossFn<Loss, BoundModel<L>, batch_t<Collate, Ex>>, REDCO_LOSS_MESSAGE);
      return LossFn<Loss, BoundModel<L>, batch_t<Collate, Ex>>;
    } else {
      return false;
    }
  }

  // Trains on `train` (a random-access range of examples). Each call starts
  // at step 0 of epoch 0 with the current parameters and optimizer state,
  // unless .resume finds a checkpoint in the workdir. Collective.
  template <typename R>
  void fit(const R& train, const fit_options_t<R>& options) {
    static_assert(ExampleRange<R>, REDCO_EXAMPLES_MESSAGE);
    if constexpr (ExampleRange<R>) {
      if constexpr (check<example_t<R>>()) fit_checked(train, options);
    }
  }

  // The mean loss over `examples` in evaluation mode (batches of
  // per_device_batch_size × dp_size(), the last one partial; each batch's
  // loss weighted by its size). Collective.
  template <typename R>
  double eval_loss(const R& examples, int64_t per_device_batch_size) {
    static_assert(ExampleRange<R>, REDCO_EXAMPLES_MESSAGE);
    if constexpr (ExampleRange<R>) {
      if constexpr (check<example_t<R>>())
        return eval_loss_checked(examples, per_device_batch_size);
    }
    return 0;
  }

  // This rank's shards of the parameters (whole ones with one model shard).
  const ParamTree& params() const { return params_; }
  ParamTree& params() { return params_; }
  // Every parameter whole, on every rank. Collective over the model shards.
  ParamTree whole_params() const {
    ParamTree out;
    for (const shard::ParamSplit& s : plan_)
      out.emplace(s.name, gather_whole(params_.at(s.name), s, deployer_->mesh().mp_comm()));
    return out;
  }
  const ShardPlan& plan() const { return plan_; }
  optim::Optimizer& optimizer() { return opt_; }
  const L& model() const { return model_; }
  Deployer& deployer() const { return *deployer_; }

 private:
  ParamTree initial_params(std::optional<ParamTree> given) const {
    const int mp = deployer_->n_model_shards(), rank = deployer_->mp_rank();
    if (given) {
      nn::check_params(nn::param_entries(model_), *given);
      return mp == 1 ? std::move(*given) : shard_params(*given, plan_, rank, mp);
    }
    if (mp == 1) return nn::init_params(model_, deployer_->seed());
    return init_shard(nn::param_entries(model_), plan_, deployer_->seed(), rank, mp);
  }

  // The forward context: the model-parallel group when there is one.
  nn::Ctx ctx(bool train, uint64_t step) const {
    dist::Comm* mp = deployer_->n_model_shards() > 1 ? &deployer_->mesh().mp_comm() : nullptr;
    return nn::Ctx{.train = train, .seed = deployer_->seed(), .step = step, .mp = mp};
  }

  template <typename R>
  void fit_checked(const R& train, const fit_options_t<R>& o) {
    using Ex = example_t<R>;
    using Batch = batch_t<Collate, Ex>;
    const int64_t n = int64_t(std::ranges::size(train));
    FitDriver run(*deployer_, fit_config(o, n));
    if (o.resume) restore(run);
    optim::GradAccumulator acc(run.accumulation());
    while (!run.done()) {
      const Position at = run.position();
      const std::vector<int64_t> order = deployer_->epoch_order(at.epoch, n, o.shuffle);
      const int64_t micro = run.micro_batch(), first = at.step_in_epoch * run.accumulation();
      const int64_t n_micro = run.steps_per_epoch() * run.accumulation() - first;
      // Micro-batch i of this epoch, this replica's share of it: replicas take
      // consecutive slices, so the step covers the same examples at any dp_size.
      const int64_t dp = deployer_->dp_size(), rank = deployer_->dp_rank();
      auto make = [&](int64_t i) {
        const int64_t begin = ((first + i) * dp + rank) * micro;
        const auto idx = std::span(order).subspan(size_t(begin), size_t(micro));
        const auto ex = detail::gather(train, idx);
        return collate_(std::span<const Ex>(ex));
      };
      double loss_sum = 0;
      auto use = [&](int64_t i, const Batch& batch) {
        const int64_t m = (first + i) % run.accumulation();
        const float lr = opt_.lr();
        const std::optional<StepOutcome> s = micro_step(batch, run, m, acc, loss_sum);
        return s ? after_step(run, o, *s, lr) : true;
      };
      detail::pipelined<Batch>(n_micro, make, use);
    }
    run.finish(params_, opt_);
  }

  struct StepOutcome {
    double loss = 0;  // mean over the micro-batches and the replicas
    bool skipped = false;
  };

  // One micro-batch: loss and gradients (averaged over the replicas),
  // accumulated, this replica's loss added to loss_sum; on the last
  // micro-batch of a step the optimizer steps and the step's outcome is
  // returned.
  template <typename Batch>
  std::optional<StepOutcome> micro_step(const Batch& batch, FitDriver& run, int64_t m,
                                        optim::GradAccumulator& acc, double& loss_sum) {
    const int64_t step = run.position().step, accumulation = run.accumulation();
    // Dropout and the loss's Rng differ per micro-batch and per replica.
    const int64_t j = m * deployer_->dp_size() + deployer_->dp_rank();
    const nn::Ctx c = ctx(true, uint64_t(step * accumulation * deployer_->dp_size() + j));
    const Rng rng = deployer_->rng(Purpose::train, uint64_t(step)).split(uint64_t(j));
    auto [loss, grads] = value_and_grad(
        [&](const ParamTree& p) {
          // Watched parameters hand each gradient to its bucket as backward
          // finalises it, so the all-reduces overlap the rest of backward.
          const ParamTree watched = dp_ ? dp_->watch(p, order_) : ParamTree{};
          BoundModel<L> bound(model_, dp_ ? watched : p, c);
          return Tensor(loss_(bound, batch, rng));
        },
        params_);
    if (dp_) dp_->finish(grads);
    loss_sum += double(loss.item());
    // Accumulation: the k-th add completes a step (no averaging buffers when k is 1).
    if (accumulation > 1 && !acc.add(grads)) return std::nullopt;
    // A global mean, so every replica sees the same loss and makes the same
    // non-finite decision (the gradients are already averaged).
    const double mean = dp_mean(loss_sum / double(accumulation));
    loss_sum = 0;
    const bool applied = apply(accumulation == 1 ? grads : acc.mean(), mean, run);
    return StepOutcome{mean, !applied};
  }

  // The optimizer step, unless the loss or a gradient is not finite (then
  // run.non_finite stops or skips; false when skipped). The non-finite check
  // is the global gradient norm the step needs anyway. With model shards the
  // optimizer is handed the global gradient norm (split parameters' squares
  // summed over the group, replicated ones counted once), so its clipping and
  // last_grad_norm() see the whole model, and every shard sees a NaN or
  // infinity of any other. Replicated parameters and their buffers are then
  // made identical again (copied from model shard 0; their gradients may
  // differ in the last bit between shards): checkpoints keep one copy of them.
  bool apply(const ParamTree& grads, double loss, FitDriver& run) {
    if (deployer_->n_model_shards() == 1) {
      const optim::GradNorm n = optim::checked_global_norm(grads);
      if (!std::isfinite(loss) || n.non_finite)
        return run.non_finite(loss, n.non_finite, grads, params_), false;
      opt_.step(params_, grads, n.norm);
      return true;
    }
    double split_sq = 0, whole_sq = 0;
    for (const shard::ParamSplit& s : plan_) {
      const Tensor g = grads.at(s.name).to(DType::f32);
      for (const float x : std::span(g.data<float>(), size_t(g.numel())))
        (s.split_dim >= 0 ? split_sq : whole_sq) += double(x) * x;
    }
    // [1] summed over the group; a shard's non-finite loss or gradient makes it NaN everywhere.
    Tensor total =
        Tensor::full(Shape{1}, std::isfinite(loss + whole_sq) ? float(split_sq) : std::nanf(""));
    sched::sync_wait(deployer_->mesh().mp_comm().all_reduce(total));
    const double global_sq = double(total.data<float>()[0]) + whole_sq;
    if (!std::isfinite(global_sq) || !std::isfinite(loss)) {
      const optim::GradNorm n = optim::checked_global_norm(grads);  // this shard's offender, if any
      return run.non_finite(loss, n.non_finite, grads, params_), false;
    }
    opt_.step(params_, grads, std::sqrt(global_sq));
    sync_replicated();
    return true;
  }

  // Replicated parameters and their optimizer buffers (shared with the
  // optimizer, so written in place) copied from model shard 0.
  void sync_replicated() {
    std::vector<Tensor> parts;
    const ParamTree state = opt_.state();
    for (const shard::ParamSplit& s : plan_) {
      if (s.split_dim >= 0) continue;
      parts.push_back(params_.at(s.name));
      for (const auto& [key, t] : state)
        if (key.ends_with("." + s.name) && key.size() > s.name.size() + 1 &&
            std::count(key.begin(), key.end() - int64_t(s.name.size()), '.') == 2)
          parts.push_back(t);
    }
    int64_t numel = 0;
    for (const Tensor& t : parts) numel += t.numel();
    Tensor flat = Tensor::empty(Shape{numel});  // [replicated numel] all parts, packed
    float* at = flat.data<float>();
    for (const Tensor& t : parts) at = std::copy_n(t.data<float>(), t.numel(), at);
    sched::sync_wait(deployer_->mesh().mp_comm().broadcast(flat, 0));
    at = flat.data<float>();
    for (Tensor& t : parts) at += (std::copy_n(at, t.numel(), t.data<float>()), t.numel());
  }

  // The mean of a per-replica value over the data-parallel group.
  double dp_mean(double local) const {
    if (deployer_->dp_size() == 1) return local;
    Tensor t = Tensor::full(Shape{1}, float(local));  // [1]
    sched::sync_wait(deployer_->mesh().dp_comm().all_reduce(t, dist::ReduceOp::mean));
    return double(t.data<float>()[0]);
  }

  template <typename Opts>
  bool after_step(FitDriver& run, const Opts& o, StepOutcome s, float lr) {
    run.step_done(s.loss, lr, opt_.last_grad_norm(), s.skipped);
    if (o.on_step) o.on_step({run.position().step, run.position().epoch, s.loss, lr, s.skipped});
    if (run.eval_due()) run.eval_done(evaluate(o, run.micro_batch()), params_, opt_);
    if (run.save_due()) run.save(params_, opt_);
    return !run.done() && !run.epoch_ended();
  }

  template <typename Ex>
  Metrics evaluate(const FitOptions<Ex>& o, int64_t micro_batch) {
    const int64_t batch =
        o.eval_per_device_batch_size > 0 ? o.eval_per_device_batch_size : micro_batch;
    Metrics m;
    if (o.eval_examples.empty()) return m;
    m.emplace_back("loss", eval_loss_checked(o.eval_examples, batch));
    if (o.evaluate) {
      for (auto& kv : o.evaluate(o.eval_examples, batch, params_)) m.push_back(std::move(kv));
    }
    return m;
  }

  template <typename R>
  double eval_loss_checked(const R& examples, int64_t per_device_batch_size) {
    using Ex = example_t<R>;
    using Batch = batch_t<Collate, Ex>;
    REDCO_CHECK(per_device_batch_size > 0, "eval_loss: per_device_batch_size must be > 0, got {}",
                per_device_batch_size);
    const int64_t n = int64_t(std::ranges::size(examples));
    const detail::Slices slices(n, per_device_batch_size, deployer_->dp_size(),
                                deployer_->dp_rank());
    auto make = [&](int64_t b) {
      return collate_(
          std::span<const Ex>(detail::gather_range(examples, slices.begin(b), slices.size(b))));
    };
    NoGradGuard no_grad;
    double total = 0;
    auto use = [&](int64_t b, const Batch& x) {
      const uint64_t id = uint64_t(slices.id(b));
      BoundModel<L> bound(model_, params_, ctx(false, id));
      const Tensor l = loss_(bound, x, deployer_->rng(Purpose::eval, id));
      total += double(l.item()) * double(slices.size(b));
      return true;
    };
    detail::pipelined<Batch>(slices.count(), make, use);
    // Sum over the replicas, then divide by every example.
    total = dp_mean(total) * double(deployer_->dp_size());
    return n > 0 ? total / double(n) : 0.0;
  }

  template <typename Ex>
  FitConfig fit_config(const FitOptions<Ex>& o, int64_t n) const {
    return {.per_device_batch_size = o.per_device_batch_size,
            .global_batch_size = o.global_batch_size,
            .n_epochs = o.n_epochs,
            .shuffle = o.shuffle,
            .n_examples = n,
            .evaluates = !o.eval_examples.empty(),
            .eval_every_steps = o.eval_every_steps,
            .save_best_by = o.save_best_by,
            .save_every_steps = o.save_every_steps,
            .save_every_epochs = o.save_every_epochs,
            .keep_last = o.keep_last,
            .save_at_end = o.save_at_end,
            .log_every = o.log_every,
            .max_steps = o.max_steps,
            .throughput = o.throughput,
            .plan = &plan_,
            .on_non_finite = o.on_non_finite};
  }

  void restore(FitDriver& run) {
    std::optional<CheckpointData> ck = run.resume();
    if (!ck) return;
    params_ = std::move(ck->params);
    opt_.load_state(ck->opt_state);
  }

  Deployer* deployer_;
  L model_;
  // Mutable for the same reason as in Predictor: stateful lambdas work.
  mutable Collate collate_;
  mutable Loss loss_;
  optim::Optimizer opt_;
  ShardPlan plan_;
  std::vector<std::string> order_;  // parameters in execution order, for the buckets
  ParamTree params_;
  std::unique_ptr<DataParallel> dp_;  // with more than one replica
};

}  // namespace redco::train

// The names a program uses, next to the rest of redco (using namespace redco;).
namespace redco {
using train::BoundModel;
using train::Deployer;
using train::NonFinite;
using train::Predictor;
using train::Rng;
using train::Trainer;
}  // namespace redco
