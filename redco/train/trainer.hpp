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
#include "redco/nn/shard_plan.hpp"
#include "redco/optim/optimizer.hpp"
#include "redco/sched/task.hpp"
#include "redco/train/concepts.hpp"
#include "redco/train/custom_step.hpp"
#include "redco/train/data_parallel.hpp"
#include "redco/train/deployer.hpp"
#include "redco/train/epoch_examples.hpp"
#include "redco/train/fit_driver.hpp"
#include "redco/train/fit_options.hpp"
#include "redco/train/memory_account.hpp"
#include "redco/train/mesh_update.hpp"
#include "redco/train/on_device.hpp"
#include "redco/train/parallel.hpp"
#include "redco/train/param_gather.hpp"
#include "redco/train/param_groups.hpp"
#include "redco/train/per_epoch.hpp"
#include "redco/train/pipeline.hpp"
#include "redco/train/predictor.hpp"
#include "redco/train/sharded_checkpoint.hpp"

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
        params_(initial_params(std::move(params))),
        epochs_(deployer, model_) {
    groups_.bind(plan_);
    if (!params) groups_.start_targets(params_);  // given parameters are taken as they are
    order_ = groups_.trained_only(param_order(plan_));
    saved_plan_ = groups_.saved_plan(plan_);
    if (deployer.dp_size() > 1)
      dp_ = std::make_unique<DataParallel>(deployer.mesh().dp_comm(), deployer.grad_bucket_bytes());
    update_ = std::make_unique<MeshUpdate>(deployer, plan_, groups_);
    if (deployer.zero_stage() >= 2 && dp_) dp_->reduce_to_owners(update_->zero());
    params_ = update_->keep_parts(params_);  // ZeRO-3: this replica's parts only
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
  // Under ZeRO-3, where a replica keeps only its parts of the trained ones
  // (train/param_gather.hpp), a copy gathered whole (collective over the
  // replicas: every rank calls it), held until the next fit(): writing to it
  // does not reach training there.
  const ParamTree& params() const {
    update_->settle();
    if (!update_->zero3()) return params_;
    gathered_ = update_->gathered(params_);
    return gathered_;
  }
  ParamTree& params() { return const_cast<ParamTree&>(std::as_const(*this).params()); }
  // What this rank keeps: params(), except under ZeRO-3 its parts of the
  // trained parameters (no gathering; what its memory holds).
  const ParamTree& kept_params() const { return update_->settle(), params_; }
  // This rank's shards whole (under ZeRO-3 gathered over the replicas:
  // collective), params() otherwise.
  ParamTree local_params() const { return update_->settle(), update_->gathered(params_); }
  // Every parameter whole, on every rank. Collective over the model shards
  // (and under ZeRO-3 over the replicas).
  ParamTree whole_params() const {
    const ParamTree local = local_params();
    ParamTree out;
    for (const shard::ParamSplit& s : plan_)
      out.emplace(s.name, gather_whole(local.at(s.name), s, deployer_->mesh().mp_comm()));
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
    const int64_t n = EpochExamples<L>::size(source);
    FitDriver run(*deployer_, fit_config(o, n));
    REDCO_CHECK(!custom || run.accumulation() == 1,
                "fit: a custom step takes no gradient accumulation, but global_batch_size {} is "
                "{} micro-batches of {} on {} replicas; set global_batch_size = "
                "per_device_batch_size x replicas",
                run.global_batch(), run.accumulation(), run.micro_batch(), deployer_->dp_size());
    recompute_ = o.recompute || deployer_->auto_recompute();
    trace_ = {};  // ZeRO-3's backward order, recorded again (recomputation changes it)
    gathered_ = {};
    REDCO_CHECK(!custom || !update_->zero3(),
                "fit: a custom step reads whole parameters, which ZeRO-3 does not keep; run it "
                "with zero_stage 2 or less");
    if constexpr (is_per_epoch<Source>::value)
      if constexpr (!EpochOnlyFn<decltype(source.fn)>)
        REDCO_CHECK(!update_->zero3(),
                    "fit: per_epoch examples made from the model need its whole parameters, "
                    "which ZeRO-3 does not keep; run with zero_stage 2 or less");
    memory_logged_ = memory_measured_ = false;
    first_memory_ = {};
    // A job the launcher restarted after a failure continues where it stopped.
    if (o.resume || deployer_->restart_count() > 0) restore(run);
    optim::GradAccumulator acc(run.accumulation());
    std::optional<detail::epoch_storage_t<Source, L>> fresh;  // this epoch's examples (per_epoch)
    while (!run.done()) {
      const Position at = run.position();
      const auto& train = epochs_.at(source, at, fresh, params_);
      const std::vector<int64_t> order = epochs_.order(source, at.epoch, o.shuffle);
      const int64_t micro = run.micro_batch(), first = at.step_in_epoch * run.accumulation();
      const int64_t n_micro = run.steps_per_epoch() * run.accumulation() - first;
      // Micro-batch i of this epoch, this replica's share of it: replicas take
      // consecutive slices, so the step covers the same examples at any dp_size.
      const int64_t dp = deployer_->dp_size(), rank = deployer_->dp_rank();
      auto make = [&](int64_t i) {
        const int64_t begin = EpochExamples<L>::per_replica(source)
                                  ? (first + i) * micro
                                  : ((first + i) * dp + rank) * micro;
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
    run.finish(saved_params_on_demand(), groups_);
    saved_ = {};
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
    StepMemory& mem = first_memory_;  // what the first step measures
    if (!memory_measured_) reset_peak(deployer_->device());
    auto [loss, grads] = loss_and_grads(batch, c, rng, mem);
    if (!memory_measured_) mem.grad_peak = dp_ ? dp_->last_grad_peak() : tree_bytes(grads);
    memory_measured_ = true;
    loss_sum += double(loss.item());  // the step's one host read
    // Accumulation: the k-th add completes a step (no averaging buffers when k is 1).
    if (accumulation > 1 && !acc.add(grads)) return std::nullopt;
    // A global mean, so every replica sees the same loss and makes the same
    // non-finite decision (the gradients are already averaged).
    const double mean = update_->dp_mean(loss_sum / double(accumulation));
    loss_sum = 0;
    // Under ZeRO the next forward takes the owners' updates as they arrive.
    const bool applied =
        update_->apply(params_, accumulation == 1 ? grads : acc.mean(), mean, run, true);
    // Logged after the second step, whose peak holds the optimizer's state
    // through a whole step (the first makes it at its end), or after the only one.
    if (!memory_logged_ && (step >= 1 || step + 1 >= run.last_step())) log_memory(run, grads, mem);
    return StepOutcome{mean, !applied};
  }

  // The loss; on the first step the bytes its forward pass left for backward.
  template <typename Bound, typename Batch>
  Tensor measured_loss(Bound& bound, const Batch& batch, const Rng& rng, StepMemory& mem) {
    if (memory_measured_) return loss_(bound, batch, rng);
    const AllocatorDelta forward(deployer_->device());
    Tensor l(loss_(bound, batch, rng));
    mem.activations = forward.bytes();
    return l;
  }

  // The first step's memory, logged after its optimizer step (its state exists
  // then). Collective over the world.
  void log_memory(FitDriver& run, const ParamTree& grads, const StepMemory& mem) {
    memory_logged_ = true;
    MemoryAccount mine =
        account_now(params_, grads, groups_.state(), mem.activations, deployer_->device());
    mine.grad_peak = mem.grad_peak;
    run.memory_measured(gather_accounts(mine, &deployer_->mesh().world()));
  }

  // Loss and gradients of one micro-batch. With several replicas, averaged
  // over them in buckets: the watched parameters hand each gradient to its
  // bucket as backward finalises it, so the reductions overlap the rest of
  // backward. With frozen parameters: gradients of the trained ones only, the
  // frozen ones joined in as constants.
  template <typename Batch>
  std::pair<Tensor, ParamTree> loss_and_grads(const Batch& batch, const nn::Ctx& c, const Rng& rng,
                                              StepMemory& mem) {
    if (update_->zero3())  // the frozen parameters in the tree, the trained ones gathered
      return zero3_value_and_grad(
          [&](const ParamTree& frozen) {
            BoundModel<L> bound(model_, frozen, c);
            return measured_loss(bound, batch, rng, mem);
          },
          *update_->zero(), params_, order_, *dp_, deployer_->mesh().dp_comm(), trace_);
    auto loss = [&](const ParamTree& p) {
      if (groups_.single()) {
        BoundModel<L> bound(model_, p, c);
        return measured_loss(bound, batch, rng, mem);
      }
      ParamTree all = params_;
      for (const auto& [name, t] : p) all.insert_or_assign(name, t);
      BoundModel<L> bound(model_, all, c);
      return measured_loss(bound, batch, rng, mem);
    };
    ParamTree some;  // the trained ones, when some are frozen
    if (!groups_.single()) some = groups_.trained_of(params_);
    const ParamTree& trained = groups_.single() ? params_ : some;
    if (dp_) return dp_->value_and_grad(loss, trained, order_);
    return value_and_grad(loss, trained);
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
    const double mean = update_->dp_mean(double(r.loss.item()));
    const bool applied = update_->apply(params_, r.grads, mean, run);
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

  template <typename Opts>
  bool after_step(FitDriver& run, const Opts& o, StepOutcome s, float lr) {
    run.step_done(
        s.loss, lr,
        groups_.single() ? groups_.optimizer().last_grad_norm() : groups_.last_grad_norm(),
        s.skipped);
    // Only the next training forward may find parameters still on their way
    // (an on_step callback reaches them through params(), which waits).
    if (run.eval_due() || run.save_due() || run.done() || run.epoch_ended()) update_->settle();
    if (o.on_step) o.on_step({run.position().step, run.position().epoch, s.loss, lr, s.skipped});
    if (run.eval_due())
      run.eval_done(evaluate(o, run.micro_batch()), saved_params_on_demand(), groups_);
    if (run.save_due()) run.save(saved_params_on_demand(), groups_);
    saved_ = {};  // under ZeRO-3 the whole model: not held between checkpoints
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
      const ParamTree local = update_->gathered(params_);  // ZeRO-3: whole for the callback
      for (auto& kv : o.evaluate(o.eval_examples, batch, local)) m.push_back(std::move(kv));
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
    // ZeRO-3: the trained parameters gathered as the forward reads them.
    const bool zero3 = update_->zero3();
    // The tree the model reads (ZeRO-3: the frozen parameters only), and the parts.
    const auto [held, parts] =
        zero3 ? split_partitioned(*update_->zero(), params_) : std::pair{params_, ParamTree()};
    auto use = [&](int64_t b, const Batch& x) {
      const uint64_t id = uint64_t(slices.id(b));
      std::optional<ParamGather> gather;
      if (zero3) gather.emplace(*update_->zero(), parts, order_, deployer_->mesh().dp_comm());
      BoundModel<L> bound(model_, held, ctx(false, id));
      const Tensor l = loss_(bound, x, deployer_->rng(Purpose::eval, id));
      total += double(l.to(Device::cpu()).item()) * double(slices.size(b));
      return true;
    };
    detail::pipelined<Batch>(slices.count(), make, use);
    // Sum over the replicas, then divide by every example.
    total = update_->dp_mean(total) * double(deployer_->dp_size());
    return n > 0 ? total / double(n) : 0.0;
  }

  template <typename Ex>
  FitConfig fit_config(const FitOptions<Ex>& o, int64_t n) const {
    // 0: the planner's micro-batch (DeployerConfig::auto_mesh), else the step's share.
    return {.per_device_batch_size =
                o.per_device_batch_size ? o.per_device_batch_size : deployer_->auto_micro_batch(),
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
            .extra_state = [this](const Position& at,
                                  ParamTree& state) { epochs_.save_into(at, groups_, state); },
            .on_non_finite = o.on_non_finite,
            .opt_state = update_->zero() ? std::function<ParamTree(const ParamGroups&)>(
                                               [this](const ParamGroups&) {
                                                 return update_->full_state(params_);  // (parts)
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
      params_ = update_->keep_parts(ck->params);  // ZeRO-3: cut into this replica's parts
    } else {
      ParamTree local = update_->gathered(params_);
      for (auto& [name, t] : ck->params) local.insert_or_assign(name, std::move(t));
      params_ = update_->keep_parts(local);
    }
    epochs_.restore_from(ck->opt_state, params_);
    groups_.load_state(update_->owned_state(ck->opt_state));
  }

  // What checkpoints hold: every parameter but frozen ones saved with .checkpoint = false.
  // Under ZeRO-3 gathered whole for the while (collective over the replicas),
  // asked for only as a checkpoint is written and let go after it.
  FitDriver::SavedParams saved_params_on_demand() {
    return [this]() -> const ParamTree& { return saved_params(); };
  }
  const ParamTree& saved_params() {
    update_->settle();
    if (groups_.single() && !update_->zero3()) return params_;
    saved_ = update_->gathered(params_);
    if (!groups_.single()) saved_ = groups_.saved_of(saved_);
    return saved_;
  }

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
  ParamTree
      saved_;  // saved_params() when some are left out or gathered, while a checkpoint is written
  std::unique_ptr<DataParallel> dp_;    // with more than one replica
  EpochExamples<L> epochs_;             // which examples each epoch visits
  bool recompute_ = false;              // FitOptions::recompute of the running fit()
  GatherTrace trace_;                   // ZeRO-3: backward's gathers, in their order
  mutable ParamTree gathered_;          // ZeRO-3: params(), gathered whole
  bool memory_logged_ = false;          // the running fit() has logged its memory
  bool memory_measured_ = false;        // and measured its first step's activations
  StepMemory first_memory_;             // what that step measured
  std::unique_ptr<MeshUpdate> update_;  // the optimizer step across the mesh (and ZeRO)
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
