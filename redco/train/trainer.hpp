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
//
// Beyond one model and one loss (docs/pipelines.md): the model may be a
// collection of parts (nn::parts; the loss picks them with part<"name">(m)),
// the optimizer a ParamGroups (per-part optimizers, frozen parameters,
// adapter-only checkpoints, polyak targets), the examples per_epoch(n, fn)
// (made afresh each epoch; resuming stays exact), and fit(train, options,
// step) replaces the default step by a custom one (StepContext, StepResult:
// FedAvg, DP-SGD, MAML with second-order gradients). With a plain optimizer
// and fixed examples the default step runs exactly as before.
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

#include "redco/comm/mesh.hpp"
#include "redco/core/allocator.hpp"
#include "redco/core/device_memory.hpp"
#include "redco/optim/optimizer.hpp"
#include "redco/sched/task.hpp"
#include "redco/shard/plan.hpp"
#include "redco/train/concepts.hpp"
#include "redco/train/custom_step.hpp"
#include "redco/train/data_parallel.hpp"
#include "redco/train/deployer.hpp"
#include "redco/train/fit_driver.hpp"
#include "redco/train/fit_options.hpp"
#include "redco/train/on_device.hpp"
#include "redco/train/parallel.hpp"
#include "redco/train/param_groups.hpp"
#include "redco/train/per_epoch.hpp"
#include "redco/train/pipeline.hpp"
#include "redco/train/predictor.hpp"
#include "redco/train/sharded_checkpoint.hpp"
#include "redco/train/zero.hpp"

namespace redco::train {

template <nn::Layer L, typename Collate, typename Loss>
class Trainer {
 public:
  // Parameters start from nn::init_params(model, deployer.seed()) unless
  // given (whole tensors); each rank keeps only its shards of them. One
  // optimizer trains every parameter, or ParamGroups say which optimizer
  // trains which part and which parts stay frozen.
  Trainer(Deployer& deployer, L model, Collate collate, Loss loss, ParamGroups optimizer,
          std::optional<ParamTree> params = std::nullopt)
      : deployer_(&deployer),
        model_(std::move(model)),
        collate_(std::move(collate)),
        loss_(std::move(loss)),
        groups_(std::move(optimizer)),
        plan_(shard::resolve(model_, deployer.n_model_shards())),
        params_(initial_params(std::move(params))) {
    groups_.bind(plan_);
    if (!params) groups_.start_targets(params_);  // given parameters are taken as they are
    order_ = groups_.trained_only(param_order(plan_));
    saved_plan_ = groups_.saved_plan(plan_);
    if (deployer.dp_size() > 1) dp_ = std::make_unique<DataParallel>(deployer.mesh().dp_comm());
    REDCO_CHECK(deployer.zero_stage() == 0 || groups_.single(),
                "Trainer: zero_stage {} with parameter groups (several optimizers, frozen "
                "parameters or polyak targets) is not supported yet; use one optimizer for "
                "every parameter, or zero_stage = 0 in the Deployer's config",
                deployer.zero_stage());
    if (deployer.zero_stage() >= 1 && deployer.dp_size() > 1)
      zero_ = std::make_unique<ZeroPartition>(plan_, deployer.dp_size(), deployer.dp_rank());
    if (deployer.zero_stage() >= 2 && dp_) dp_->reduce_to_owners(zero_.get());
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

  template <typename R>
  using options_t = FitOptions<typename detail::example_of<R, L>::type>;

  // Trains on `train`: a random-access range of examples, or
  // per_epoch(n, examples) for examples that change every epoch (see
  // per_epoch.hpp). Each call starts at step 0 of epoch 0 with the current
  // parameters and optimizer state, unless .resume finds a checkpoint in the
  // workdir. `step`: a custom step (see custom_step.hpp) instead of the
  // default one. Collective.
  template <typename R, typename Step = DefaultStep>
  void fit(const R& train, const options_t<R>& options, Step step = {}) {
    if constexpr (is_per_epoch<R>::value) {
      using Examples = epoch_result_t<decltype(train.fn), L>;
      static_assert(ExampleRange<Examples>, REDCO_PER_EPOCH_MESSAGE);
      if constexpr (ExampleRange<Examples>) {
        if constexpr (check_all<example_t<Examples>, Step>()) fit_checked(train, options, step);
      }
    } else {
      static_assert(ExampleRange<R>, REDCO_EXAMPLES_MESSAGE);
      if constexpr (ExampleRange<R>) {
        if constexpr (check_all<example_t<R>, Step>()) fit_checked(train, options, step);
      }
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
  // The first trained group's optimizer. Under ZeRO (Deployer zero_stage >= 1)
  // its state() holds this replica's part only; checkpoints gather the whole of it.
  optim::Optimizer& optimizer() { return groups_.optimizer(); }
  ParamGroups& groups() { return groups_; }
  const L& model() const { return model_; }
  Deployer& deployer() const { return *deployer_; }

 private:
  ParamTree initial_params(std::optional<ParamTree> given) const {
    const int mp = deployer_->n_model_shards(), rank = deployer_->mp_rank();
    // Drawn (or sliced) on the host, then placed on the run's device.
    if (given) {
      nn::check_params(nn::param_entries(model_), *given);
      return deployer_->place(mp == 1 ? std::move(*given) : shard_params(*given, plan_, rank, mp));
    }
    if (mp == 1) return deployer_->place(nn::init_params(model_, deployer_->seed()));
    return deployer_->place(
        init_shard(nn::param_entries(model_), plan_, deployer_->seed(), rank, mp));
  }

  // The forward context: the model-parallel group when there is one.
  nn::Ctx ctx(bool train, uint64_t step) const {
    comm::Comm* mp = deployer_->n_model_shards() > 1 ? &deployer_->mesh().mp_comm() : nullptr;
    nn::Ctx c{.train = train, .seed = deployer_->seed(), .step = step, .mp = mp};
    c.recompute = train && recompute_;
    return c;
  }

  template <typename Ex, typename Step>
  static constexpr bool check_all() {
    if constexpr (!check<Ex>()) {
      return false;
    } else if constexpr (std::is_same_v<Step, DefaultStep>) {
      return true;
    } else {
      static_assert(StepFn<Step, L, batch_t<Collate, Ex>>, REDCO_STEP_MESSAGE);
      return StepFn<Step, L, batch_t<Collate, Ex>>;
    }
  }

  template <typename Source, typename Opts, typename Step>
  void fit_checked(const Source& source, const Opts& o, Step& step_fn) {
    using Ex = typename detail::example_of<Source, L>::type;
    using Batch = batch_t<Collate, Ex>;
    constexpr bool custom = !std::is_same_v<Step, DefaultStep>;
    const int64_t n = examples_size(source);
    FitDriver run(*deployer_, fit_config(o, n));
    REDCO_CHECK(!custom || run.accumulation() == 1,
                "fit: a custom step takes no gradient accumulation, but global_batch_size {} is "
                "{} micro-batches of {} on {} replicas; set global_batch_size = "
                "per_device_batch_size x replicas",
                run.global_batch(), run.accumulation(), run.micro_batch(), deployer_->dp_size());
    REDCO_CHECK(!custom || deployer_->zero_stage() == 0,
                "fit: zero_stage {} with a custom step is not supported yet; use zero_stage = 0 "
                "in the Deployer's config for custom steps",
                deployer_->zero_stage());
    recompute_ = o.recompute;
    memory_logged_ = false;
    // A job the launcher restarted after a failure continues where it stopped.
    if (o.resume || deployer_->restart_count() > 0) restore(run);
    optim::GradAccumulator acc(run.accumulation());
    std::optional<detail::epoch_storage_t<Source, L>> fresh;  // this epoch's examples (per_epoch)
    while (!run.done()) {
      const Position at = run.position();
      const auto& train = examples_at(source, at, fresh);
      const std::vector<int64_t> order = epoch_order(source, at.epoch, o.shuffle);
      const int64_t micro = run.micro_batch(), first = at.step_in_epoch * run.accumulation();
      const int64_t n_micro = run.steps_per_epoch() * run.accumulation() - first;
      // Micro-batch i of this epoch, this replica's share of it: replicas take
      // consecutive slices, so the step covers the same examples at any dp_size.
      const int64_t dp = deployer_->dp_size(), rank = deployer_->dp_rank();
      auto make = [&](int64_t i) {
        const int64_t begin =
            per_replica(source) ? (first + i) * micro : ((first + i) * dp + rank) * micro;
        const auto idx = std::span(order).subspan(size_t(begin), size_t(micro));
        const auto ex = detail::gather(train, idx);
        return on_device(collate_(std::span<const Ex>(ex)), deployer_->device());
      };
      double loss_sum = 0;
      auto use = [&](int64_t i, const Batch& batch) {
        const int64_t m = (first + i) % run.accumulation();
        const float lr = groups_.lr();
        std::optional<StepOutcome> s;
        if constexpr (custom) {
          s = custom_step(step_fn, batch, run);
        } else {
          s = micro_step(batch, run, m, acc, loss_sum);
        }
        return s ? after_step(run, o, *s, lr) : true;
      };
      detail::pipelined<Batch>(n_micro, make, use);
    }
    run.finish(saved_params(), groups_);
  }

  // ---- per-epoch examples -----------------------------------------------------------------

  // Examples an epoch visits: with per_epoch, n per pass.
  template <typename Source>
  static int64_t examples_size(const Source& s) {
    if constexpr (is_per_epoch<Source>::value) {
      REDCO_CHECK(s.n > 0, "fit: per_epoch(n, ...) needs n > 0 examples per epoch, got {}", s.n);
      REDCO_CHECK(s.passes >= 1, "fit: per_epoch(n, fn, {{.passes = {}}}) needs passes >= 1",
                  s.passes);
      return s.n * s.passes;
    } else {
      return int64_t(std::ranges::size(s));
    }
  }

  // Each data-parallel replica makes its own share of the epoch's examples.
  template <typename Source>
  static bool per_replica(const Source& s) {
    if constexpr (is_per_epoch<Source>::value) {
      return s.per_replica;
    } else {
      return false;
    }
  }
  // The examples this replica holds in an epoch (per pass).
  template <typename Source>
  int64_t local_size(const Source& s) const {
    if constexpr (is_per_epoch<Source>::value) {
      if (s.per_replica) {
        REDCO_CHECK(s.n % deployer_->dp_size() == 0,
                    "fit: per_epoch(n = {}, fn, {{.per_replica = true}}) on {} data-parallel "
                    "replicas: n must be a multiple of the replicas",
                    s.n, deployer_->dp_size());
        return s.n / deployer_->dp_size();
      }
      return s.n;
    } else {
      return int64_t(std::ranges::size(s));
    }
  }

  // The epoch's order: the passes' orders one after the other (indices into
  // the epoch's examples).
  template <typename Source>
  std::vector<int64_t> epoch_order(const Source& s, int64_t epoch, bool shuffle) const {
    if constexpr (is_per_epoch<Source>::value) {
      if (s.passes > 1 || s.per_replica) {
        const int64_t n = local_size(s);
        std::vector<int64_t> order;
        order.reserve(size_t(n * s.passes));
        for (int64_t p = 0; p < s.passes; ++p) {
          const std::vector<int64_t> pass =
              deployer_->epoch_order(epoch * s.passes + p, n, shuffle);
          order.insert(order.end(), pass.begin(), pass.end());
        }
        return order;
      }
    }
    return deployer_->epoch_order(epoch, examples_size(s), shuffle);
  }

  // The examples of the epoch at `at`: the range itself, or the per-epoch
  // function's result, made at the start of the epoch (and again after a
  // resume inside it, from the parameters the epoch started with).
  template <typename Source, typename Store>
  const auto& examples_at(const Source& source, const Position& at, std::optional<Store>& fresh) {
    if constexpr (!is_per_epoch<Source>::value) {
      return source;
    } else {
      if (at.step_in_epoch != 0 && fresh) return *fresh;
      auto& fn = const_cast<Source&>(source).fn;  // stateful functions are the user's business
      using Fn = decltype(source.fn);
      REDCO_CHECK(!source.per_replica || (EpochCountFn<Fn, L>),
                  "fit: per_epoch(n, fn, {{.per_replica = true}}) needs fn(int64_t epoch, model&, "
                  "Rng, int64_t count) returning this replica's count examples");
      if constexpr (EpochOnlyFn<Fn>) {
        fresh.emplace(fn(at.epoch));
      } else {
        keep_epoch_start_ = true;
        if (at.step_in_epoch == 0) {
          epoch_start_.clear();
          for (const auto& [name, t] : params_) epoch_start_.emplace(name, t.clone());
        }
        REDCO_CHECK(!epoch_start_.empty(),
                    "fit: resuming inside epoch {} of per-epoch examples needs the parameters "
                    "the epoch started with, which the checkpoint does not hold; resume from a "
                    "checkpoint written by a per_epoch fit",
                    at.epoch);
        NoGradGuard no_grad;
        BoundModel<L> bound(model_, epoch_start_, ctx(false, uint64_t(at.epoch)));
        const Rng rng = deployer_->rng(Purpose::examples, uint64_t(at.epoch));
        if constexpr (EpochCountFn<Fn, L>) {
          fresh.emplace(fn(at.epoch, bound,
                           source.per_replica ? rng.split(uint64_t(deployer_->dp_rank())) : rng,
                           local_size(source)));
        } else {
          fresh.emplace(fn(at.epoch, bound, rng));
        }
      }
      REDCO_CHECK(int64_t(std::ranges::size(*fresh)) == local_size(source),
                  "fit: the per-epoch examples of epoch {} are {}, but per_epoch(n, ...) said n = "
                  "{}{}; return the same number every epoch",
                  at.epoch, std::ranges::size(*fresh), source.n,
                  source.per_replica ? fmt::format(" (each of {} replicas: {})",
                                                   deployer_->dp_size(), local_size(source))
                                     : "");
      return *fresh;
    }
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
    uint64_t activations = 0;  // bytes the forward pass left for backward
    auto [loss, grads] = groups_.single()
                             ? value_and_grad(
                                   [&](const ParamTree& p) {
                                     // Watched parameters hand each gradient to its
                                     // bucket as backward finalises it, so the
                                     // all-reduces overlap the rest of backward.
                                     const ParamTree watched =
                                         dp_ ? dp_->watch(p, order_) : ParamTree{};
                                     BoundModel<L> bound(model_, dp_ ? watched : p, c);
                                     return measured_loss(bound, batch, rng, activations);
                                   },
                                   params_)
                             : grouped_value_and_grad(batch, c, rng, activations);
    if (dp_) dp_->finish(grads);
    loss_sum += double(loss.to(Device::cpu()).item());  // the step's one host read
    // Accumulation: the k-th add completes a step (no averaging buffers when k is 1).
    if (accumulation > 1 && !acc.add(grads)) return std::nullopt;
    // A global mean, so every replica sees the same loss and makes the same
    // non-finite decision (the gradients are already averaged).
    const double mean = dp_mean(loss_sum / double(accumulation));
    loss_sum = 0;
    const bool applied = apply(accumulation == 1 ? grads : acc.mean(), mean, run);
    if (!memory_logged_) log_memory(run, grads, activations);
    return StepOutcome{mean, !applied};
  }

  // The loss, with the bytes its forward pass left for backward in `activations`.
  template <typename Bound, typename Batch>
  Tensor measured_loss(Bound& bound, const Batch& batch, const Rng& rng, uint64_t& activations) {
    const size_t held = memory_stats().bytes_in_use;
    Tensor l(loss_(bound, batch, rng));
    activations = memory_stats().bytes_in_use - held;
    return l;
  }

  // The allocator of the run's device.
  AllocatorStats memory_stats() const {
    const Device d = deployer_->device();
    return d.is_cpu() ? CachingAllocator::cpu().stats() : device_memory(d).stats(d.index);
  }

  // The first step's memory, logged after its optimizer step (its state exists
  // then). Collective over the world.
  void log_memory(FitDriver& run, const ParamTree& grads, uint64_t activations) {
    memory_logged_ = true;
    const MemoryAccount mine{.params = tree_bytes(params_),
                             .grads = tree_bytes(grads),
                             .opt_state = tree_bytes(groups_.state()),
                             .activations = activations,
                             .slack = memory_stats().bytes_cached};
    run.memory_measured(gather_accounts(mine, &deployer_->mesh().world()));
  }

  // With frozen parameters: gradients of the trained ones only, the frozen
  // ones joined in as constants.
  template <typename Batch>
  std::pair<Tensor, ParamTree> grouped_value_and_grad(const Batch& batch, const nn::Ctx& c,
                                                      const Rng& rng, uint64_t& activations) {
    return value_and_grad(
        [&](const ParamTree& p) {
          ParamTree all = params_;
          const ParamTree watched = dp_ ? dp_->watch(p, order_) : ParamTree{};
          for (const auto& [name, t] : dp_ ? watched : p) all.insert_or_assign(name, t);
          BoundModel<L> bound(model_, all, c);
          return measured_loss(bound, batch, rng, activations);
        },
        groups_.trained_of(params_));
  }

  // A custom step on one micro-batch: its gradients averaged over the
  // replicas, then the same update as the default step.
  template <typename Step, typename Batch>
  std::optional<StepOutcome> custom_step(Step& step_fn, const Batch& batch, FitDriver& run) {
    const int64_t step = run.position().step;
    const int64_t j = deployer_->dp_rank();
    comm::Comm* dp = dp_ ? &deployer_->mesh().dp_comm() : nullptr;
    StepContext<L> sc(model_, params_, groups_,
                      ctx(true, uint64_t(step * deployer_->dp_size() + j)), dp, step);
    StepResult r =
        step_fn(sc, batch, deployer_->rng(Purpose::train, uint64_t(step)).split(uint64_t(j)));
    REDCO_CHECK(r.loss.defined() && r.loss.numel() == 1,
                "fit: the custom step must return a scalar loss, got shape {}",
                r.loss.defined() ? r.loss.shape() : Shape{});
    check_step_grads(r.grads, sc.trained());
    if (dp_) dp_->average(r.grads, order_);
    const double mean = dp_mean(double(r.loss.to(Device::cpu()).item()));
    const bool applied = apply(r.grads, mean, run);
    return StepOutcome{mean, !applied};
  }

  static void check_step_grads(const ParamTree& grads, const ParamTree& trained) {
    for (const auto& [name, t] : trained) {
      const auto it = grads.find(name);
      REDCO_CHECK(it != grads.end() && it->second.defined(),
                  "fit: the custom step returned no gradient for the trained parameter '{}'", name);
      REDCO_CHECK(it->second.shape() == t.shape(),
                  "fit: the custom step's gradient of '{}' is {} but the parameter is {}", name,
                  it->second.shape(), t.shape());
    }
    for (const auto& [name, g] : grads)
      REDCO_CHECK(trained.contains(name),
                  "fit: the custom step returned a gradient for '{}', which is not a trained "
                  "parameter (frozen, or not in the model)",
                  name);
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
    if (!groups_.single()) return apply_groups(grads, loss, run);
    const bool zero2 = deployer_->zero_stage() >= 2 && zero_;
    if (deployer_->n_model_shards() == 1) {
      const optim::GradNorm n = optim::checked_global_norm(grads);
      // ZeRO-2: this replica holds its own gradients only; the norm is formed
      // over all replicas' (a non-finite one anywhere makes it NaN).
      const double sq = zero2 ? zero_->squared_norm(grads, deployer_->mesh().dp_comm()) : 0;
      if (!std::isfinite(loss) || n.non_finite || !std::isfinite(sq))
        return run.non_finite(loss, n.non_finite, grads, params_), false;
      optimizer_step(grads, zero2 ? std::sqrt(sq) : n.norm);
      return true;
    }
    double split_sq = 0, whole_sq = 0;
    for (const shard::ParamSplit& s : plan_) {
      if (zero2 && !grads.count(s.name)) continue;  // another replica's
      const Tensor g = grads.at(s.name).to(DType::f32);
      (s.split_dim >= 0 ? split_sq : whole_sq) += optim::sum_of_squares(g, s.name);
    }
    if (zero2) split_sq = dp_sum(split_sq), whole_sq = dp_sum(whole_sq);
    // [1] summed over the group; a shard's non-finite loss or gradient makes it NaN everywhere.
    Tensor total =
        Tensor::full(Shape{1}, std::isfinite(loss + whole_sq) ? float(split_sq) : std::nanf(""));
    sched::sync_wait(deployer_->mesh().mp_comm().all_reduce(total));
    const double global_sq = double(total.data<float>()[0]) + whole_sq;
    if (!std::isfinite(global_sq) || !std::isfinite(loss)) {
      const optim::GradNorm n = optim::checked_global_norm(grads);  // this shard's offender, if any
      return run.non_finite(loss, n.non_finite, grads, params_), false;
    }
    optimizer_step(grads, std::sqrt(global_sq));
    return true;
  }

  // apply() with parameter groups: each optimizer steps with its group's
  // norm; then replicated parameters are synchronised and the polyak
  // targets move.
  bool apply_groups(const ParamTree& grads, double loss, FitDriver& run) {
    const bool sharded = deployer_->n_model_shards() > 1;
    if (!groups_.step_all(params_, grads, loss, sharded ? &deployer_->mesh().mp_comm() : nullptr)) {
      const optim::GradNorm n = optim::checked_global_norm(grads);  // this shard's offender, if any
      return run.non_finite(loss, n.non_finite, grads, params_), false;
    }
    if (sharded) sync_replicated();
    groups_.after_step(params_);
    return true;
  }

  // The update with the global gradient norm given. Under ZeRO each replica
  // updates the parameters it owns (with their buffers, which only it keeps)
  // and then hands them to the others.
  void optimizer_step(const ParamTree& grads, double norm) {
    optim::Optimizer& opt = groups_.optimizer();
    if (!zero_) {
      opt.step(params_, grads, norm);
    } else {
      ParamTree mine = zero_->owned(params_);
      opt.step(mine, zero_->owned(grads), norm);
    }
    if (deployer_->n_model_shards() > 1) sync_replicated();
    if (zero_) zero_->share_params(params_, deployer_->mesh().dp_comm());
  }

  // Replicated parameters and their optimizer buffers (shared with the
  // optimizer, so written in place) copied from model shard 0.
  void sync_replicated() {
    std::vector<Tensor> parts;
    const ParamTree state = groups_.state();
    for (const shard::ParamSplit& s : plan_) {
      if (s.split_dim >= 0 || (!groups_.single() && !groups_.trained(s.name))) continue;
      parts.push_back(params_.at(s.name));
      for (const auto& [key, t] : state)
        if (key.ends_with("." + s.name) && key.size() > s.name.size() + 1 &&
            std::count(key.begin(), key.end() - int64_t(s.name.size()), '.') == 2)
          parts.push_back(t);
    }
    int64_t numel = 0;
    for (const Tensor& t : parts) numel += t.numel();
    // [replicated numel] all parts, packed where they live
    Tensor flat = Tensor::empty(Shape{numel}, DType::f32, deployer_->device());
    int64_t at = 0;
    for (const Tensor& t : parts) flat.slice0(at, at + t.numel()).copy_from(t), at += t.numel();
    sched::sync_wait(deployer_->mesh().mp_comm().broadcast(flat, 0));
    at = 0;
    for (Tensor& t : parts) t.copy_from(flat.slice0(at, at + t.numel())), at += t.numel();
  }

  // The sum of a per-replica value over the data-parallel group, carried as
  // two floats (high and low parts) so that it keeps about double precision.
  double dp_sum(double local) const {
    Tensor t = Tensor::empty(Shape{2});  // [2] high, low
    t.data<float>()[0] = float(local);
    t.data<float>()[1] = std::isfinite(local) ? float(local - double(float(local))) : 0.f;
    sched::sync_wait(deployer_->mesh().dp_comm().all_reduce(t));
    return double(t.data<float>()[0]) + double(t.data<float>()[1]);
  }

  // The mean of a per-replica value over the data-parallel group.
  double dp_mean(double local) const {
    if (deployer_->dp_size() == 1) return local;
    Tensor t = Tensor::full(Shape{1}, float(local));  // [1]
    sched::sync_wait(deployer_->mesh().dp_comm().all_reduce(t, comm::ReduceOp::mean));
    return double(t.data<float>()[0]);
  }

  template <typename Opts>
  bool after_step(FitDriver& run, const Opts& o, StepOutcome s, float lr) {
    run.step_done(
        s.loss, lr,
        groups_.single() ? groups_.optimizer().last_grad_norm() : groups_.last_grad_norm(),
        s.skipped);
    if (o.on_step) o.on_step({run.position().step, run.position().epoch, s.loss, lr, s.skipped});
    if (run.eval_due()) run.eval_done(evaluate(o, run.micro_batch()), saved_params(), groups_);
    if (run.save_due()) run.save(saved_params(), groups_);
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
      return on_device(collate_(std::span<const Ex>(
                           detail::gather_range(examples, slices.begin(b), slices.size(b)))),
                       deployer_->device());
    };
    NoGradGuard no_grad;
    double total = 0;
    auto use = [&](int64_t b, const Batch& x) {
      const uint64_t id = uint64_t(slices.id(b));
      BoundModel<L> bound(model_, params_, ctx(false, id));
      const Tensor l = loss_(bound, x, deployer_->rng(Purpose::eval, id));
      total += double(l.to(Device::cpu()).item()) * double(slices.size(b));
      return true;
    };
    detail::pipelined<Batch>(slices.count(), make, use);
    // Sum over the replicas, then divide by every example.
    total = dp_mean(total) * double(deployer_->dp_size());
    return n > 0 ? total / double(n) : 0.0;
  }

  template <typename Ex>
  FitConfig fit_config(const FitOptions<Ex>& o, int64_t n) const {
    return {
        .per_device_batch_size = o.per_device_batch_size,
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
        .plan = &saved_plan_,
        .extra_state =
            [this](const Position& at, ParamTree& state) {
              if (!keep_epoch_start_ || at.step_in_epoch == 0) return;
              for (const auto& [name, t] : groups_.saved_of(epoch_start_))
                state.emplace(std::string(kEpochStart) + name, t);
            },
        .on_non_finite = o.on_non_finite,
        .opt_state =
            zero_ ? std::function<ParamTree(const ParamGroups&)>([this](const ParamGroups& groups) {
              return zero_->full_state(groups.state(), params_, deployer_->mesh().dp_comm());
            })
                  : nullptr};
  }

  // Parameters (those checkpoints hold: frozen ones left out keep their
  // values), optimizer state, and the parameters the epoch started with when
  // per-epoch examples need them.
  void restore(FitDriver& run) {
    std::optional<CheckpointData> ck = run.resume();
    if (!ck) return;
    if (groups_.single()) {
      params_ = std::move(ck->params);
    } else {
      for (auto& [name, t] : ck->params) params_.insert_or_assign(name, std::move(t));
    }
    epoch_start_.clear();
    for (auto it = ck->opt_state.begin(); it != ck->opt_state.end();) {
      if (!it->first.starts_with(kEpochStart)) {
        ++it;
        continue;
      }
      epoch_start_.emplace(it->first.substr(kEpochStart.size()), it->second);
      it = ck->opt_state.erase(it);
    }
    if (!epoch_start_.empty()) {
      for (const auto& [name, t] : params_) epoch_start_.emplace(name, t);  // kept as given
    }
    groups_.load_state(zero_ ? zero_->owned_state(ck->opt_state) : ck->opt_state);
  }

  // What checkpoints hold: every parameter but frozen ones saved with .checkpoint = false.
  const ParamTree& saved_params() {
    if (groups_.single()) return params_;
    saved_ = groups_.saved_of(params_);
    return saved_;
  }

  static constexpr std::string_view kEpochStart = "epoch_start.params.";

  Deployer* deployer_;
  L model_;
  // Mutable for the same reason as in Predictor: stateful lambdas work.
  mutable Collate collate_;
  mutable Loss loss_;
  ParamGroups groups_;
  ShardPlan plan_;
  ShardPlan saved_plan_;            // the parameters checkpoints hold
  std::vector<std::string> order_;  // trained parameters in execution order, for the buckets
  ParamTree params_;
  ParamTree saved_;                   // saved_params() when some are left out
  std::unique_ptr<DataParallel> dp_;  // with more than one replica
  // Per-epoch examples given the model: the parameters at the start of the
  // current epoch (checkpoints inside the epoch keep them).
  bool keep_epoch_start_ = false;
  ParamTree epoch_start_;
  bool recompute_ = false;               // FitOptions::recompute of the running fit()
  bool memory_logged_ = false;           // the running fit() has logged its memory
  std::unique_ptr<ZeroPartition> zero_;  // Deployer zero_stage >= 1 with several replicas
};

}  // namespace redco::train

// The names a program uses, next to the rest of redco (using namespace redco;).
namespace redco {
using train::BoundModel;
using train::Deployer;
using train::NonFinite;
using train::ParamGroups;
using train::per_epoch;
using train::Predictor;
using train::Rng;
using train::StepContext;
using train::StepResult;
using train::Trainer;
}  // namespace redco
