#pragma once
// A custom training step, for algorithms the default step (the mean loss's
// gradient, averaged over the replicas) does not express: FedAvg's local
// client steps, DP-SGD's per-example clipping and noise, MAML's inner loop.
//
//   auto step = [&](train::StepContext<M>& s, const Batch& b, Rng rng) {
//     auto [loss, g] = s.value_and_grad([&](auto& model) { return my_loss(model, b); });
//     ...                                          // clip, add noise, local steps, ...
//     return train::StepResult{loss, g};
//   };
//   trainer.fit(train, options, step);
//
// The step receives one micro-batch (fit with a custom step takes no gradient
// accumulation: global_batch_size = per_device_batch_size x replicas) and
// returns the loss to report and one gradient per trained parameter (this
// rank's shard). The Trainer then does what it does after the default step:
// averages the gradients over the data-parallel replicas, checks them for
// NaN and infinity, steps each group's optimizer (see ParamGroups), runs the
// polyak updates, logs, evaluates and checkpoints; resuming is exact as long
// as the step's randomness comes from the Rng it receives.
//
// An algorithm that produces new parameters rather than a gradient (FedAvg's
// average of client models) returns the pseudo-gradient params - new_params
// and trains with optim::sgd at learning rate 1, which sets the parameters to
// new_params exactly when the subtraction is exact, as FedOpt formulates it.
#include <cmath>
#include <concepts>
#include <cstdint>
#include <deque>
#include <utility>

#include "redco/autodiff/value_and_grad.hpp"
#include "redco/comm/comm.hpp"
#include "redco/sched/task.hpp"
#include "redco/train/bound_model.hpp"
#include "redco/train/param_groups.hpp"

namespace redco::train {

// What a custom step returns.
struct StepResult {
  Tensor loss;      // a scalar: this replica's loss (the logged loss is the replicas' mean)
  ParamTree grads;  // one per trained parameter (ParamGroups), this rank's shard
};

template <nn::Layer L>
class StepContext {
 public:
  StepContext(const L& model, const ParamTree& params, const ParamGroups& groups, nn::Ctx ctx,
              comm::Comm* dp, int64_t step)
      : model_(&model),
        params_(&params),
        groups_(&groups),
        ctx_(std::move(ctx)),
        dp_(dp),
        step_(step),
        trained_(groups.single() ? params : groups.trained_of(params)) {}

  // Every parameter (this rank's shards), trained and frozen.
  const ParamTree& params() const { return *params_; }
  // The trained ones: the keys the returned gradients must have.
  const ParamTree& trained() const { return trained_; }
  // The model bound to params(), in training mode with this step's dropout stream.
  BoundModel<L> model() { return BoundModel<L>(*model_, *params_, {}, ctx_); }
  // The model bound to params() with `trained` replacing the trained ones
  // (a client's local copy, adapted weights), valid for this step.
  BoundModel<L> bind(const ParamTree& trained) {
    ParamTree& tree = bound_.emplace_back(*params_);
    for (const auto& [name, t] : trained) tree.insert_or_assign(name, t);
    return BoundModel<L>(*model_, tree, {}, ctx_);
  }

  // f(BoundModel<L>&) -> scalar, or f(BoundModel<L>&, const ParamTree&
  // trained) to see the tensors being differentiated: the loss and its gradients with respect to
  // the trained parameters (this replica's, not averaged). value_and_grad_at
  // differentiates at other values of them: a tree of plain tensors, or of
  // tensors recorded by an outer value_and_grad with {.create_graph = true},
  // through which the gradient then flows on (MAML).
  template <typename F>
  std::pair<Tensor, ParamTree> value_and_grad(F&& f, GradOptions options = {}) {
    return value_and_grad_at(trained_, std::forward<F>(f), options);
  }
  template <typename F>
  std::pair<Tensor, ParamTree> value_and_grad_at(const ParamTree& at, F&& f,
                                                 GradOptions options = {}) {
    return redco::value_and_grad(
        [&](const ParamTree& p) {
          BoundModel<L> m = bind(p);
          if constexpr (std::invocable<F&, BoundModel<L>&, const ParamTree&>)
            return Tensor(f(m, p));
          else
            return Tensor(f(m));
        },
        at, options);
  }

  int64_t step() const { return step_; }  // optimizer steps done before this one
  int dp_size() const { return dp_ ? dp_->size() : 1; }
  int dp_rank() const { return dp_ ? dp_->rank() : 0; }
  // Every tensor of `tree` replaced in place by its mean over the
  // data-parallel replicas (f32). Collective over the replicas.
  void dp_mean(ParamTree& tree) const {
    if (!dp_ || dp_->size() == 1) return;
    for (auto& [name, t] : tree) sched::sync_wait(dp_->all_reduce(t, comm::ReduceOp::mean));
  }
  // Every tensor of `tree` replaced in place by the weighted mean over the
  // replicas, sum_r w_r t_r / sum_r w_r, with `weight` this replica's w_r >= 0
  // (FedAvg: the mean of client models, weighted by their examples, of
  // clients spread over the replicas). Collective; all weights 0 is an error.
  void dp_weighted_mean(ParamTree& tree, double weight) const {
    REDCO_CHECK(weight >= 0 && std::isfinite(weight),
                "dp_weighted_mean: the weight must be finite and >= 0, got {}", weight);
    const bool many = dp_ && dp_->size() > 1;
    double total = weight;
    if (many) {
      Tensor w = Tensor::full({1}, float(weight));
      sched::sync_wait(dp_->all_reduce(w, comm::ReduceOp::sum));
      total = double(w.item());
    }
    REDCO_CHECK(total > 0, "dp_weighted_mean: the replicas' weights sum to {}, not > 0", total);
    for (auto& [name, t] : tree) {
      t = t.to(DType::f32) *
          float(weight / total);  // a fresh tensor: the caller's is not reduced in place
      if (many) sched::sync_wait(dp_->all_reduce(t, comm::ReduceOp::sum));
    }
  }

 private:
  const L* model_;
  const ParamTree* params_;
  const ParamGroups* groups_;
  nn::Ctx ctx_;
  comm::Comm* dp_;
  int64_t step_;
  ParamTree trained_;
  std::deque<ParamTree> bound_;  // the trees bind() made this step (stable addresses)
};

template <typename F, typename L, typename B>
concept StepFn = std::invocable < F&,
        StepContext<L>
&, const B&,
    Rng >
        &&std::convertible_to<std::invoke_result_t<F&, StepContext<L>&, const B&, Rng>, StepResult>;

#define REDCO_STEP_MESSAGE                                                                        \
  "redco: a custom step must be callable as step(train::StepContext<Model>&, const Batch&, Rng) " \
  "-> train::StepResult"

// fit() without a custom step.
struct DefaultStep {};

}  // namespace redco::train
