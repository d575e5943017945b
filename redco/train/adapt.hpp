#pragma once
// MAML's inner loop, for use inside a loss or predict function: a few plain
// SGD steps of a task's loss, starting from the parameters the model is
// bound to, returned as a parameter tree to bind with model.with(...).
//
//   auto loss = [](auto& model, const Tasks& b, Rng) {
//     Tensor total = Tensor::zeros({});
//     for (const Task& t : b.tasks) {
//       const ParamTree fast = adapt(model, [&](auto& m) { return mse(m(t.sx), t.sy); },
//                                    {.steps = 1, .lr = 0.01f});
//       auto adapted = model.with(fast);                     // `fast` must outlive it
//       total = total + mse(adapted(t.qx), t.qy) * (1.f / n);  // the query loss
//     }
//     return total;
//   };
//
// Inside the Trainer's loss the parameters are being differentiated, so the
// query loss's gradient flows back through the inner steps to them: the
// meta-gradient. By default the inner gradients are recorded
// (create_graph) and the meta-gradient is the second-order one,
// prod_k (I - lr H_k) times the query gradient at the adapted parameters;
// with first_order the inner gradients are constants and it is the query
// gradient alone (first-order MAML). Where nothing is being differentiated
// (predict, the evaluation loss: no grad mode), each step's gradient is
// taken on fresh leaves and no graph is kept, whatever first_order says.
//
// Under data parallelism each replica adapts its own tasks and the Trainer
// averages the meta-gradients as usual; the inner gradients stop at the
// parameters the loss receives, so they never reach the replicas'
// gradient buckets. The model's dropout stream is shared with the outer
// loss (inner steps draw their own masks). For a part of a collection
// (part<"learner">(model)) only that part's parameters are adapted; the
// returned tree holds every parameter, so model.with(tree) and the part's
// own with() both find what they need.
#include <cstdint>
#include <string>
#include <utility>

#include "redco/autodiff/value_and_grad.hpp"
#include "redco/core/error.hpp"
#include "redco/train/bound_model.hpp"

namespace redco::train {

// Designated initialisers name these fields in the order declared below (C++20 rule).
struct AdaptOptions {
  int64_t steps = 1;         // inner SGD steps (0: the parameters as they are)
  float lr = 0.01f;          // inner learning rate
  bool first_order = false;  // true: do not differentiate through the inner gradients
};

// `task_loss(BoundModel<L>&) -> scalar Tensor`, evaluated at the adapted
// parameters of each step. Returns every parameter of the model's tree, the
// adapted ones (the model's own, or its part's) replaced.
template <nn::Layer L, typename F>
ParamTree adapt(BoundModel<L>& model, F&& task_loss, const AdaptOptions& o = {}) {
  REDCO_CHECK(o.steps >= 0, "adapt: steps must be >= 0, got {}", o.steps);
  REDCO_CHECK(o.steps == 0 || o.lr > 0.f, "adapt: the inner learning rate must be > 0, got {}",
              o.lr);
  const std::string prefix =
      model.root().size() > 0 ? std::string(model.root().view()) + "." : std::string();
  ParamTree all = model.params();  // handles, not copies
  ParamTree own;                   // the parameters being adapted
  for (const auto& [name, t] : all)
    if (name.starts_with(prefix)) own.emplace(name, t);
  REDCO_CHECK(!own.empty(), "adapt: the model has no parameters under '{}'", prefix);
  // Second order only where an outer gradient will flow through the steps.
  const bool record = !o.first_order && GradMode::enabled();
  for (int64_t k = 0; k < o.steps; ++k) {
    auto [loss, g] = value_and_grad(
        [&](const ParamTree& p) {
          ParamTree tree = all;
          for (const auto& [name, t] : p) tree.insert_or_assign(name, t);
          BoundModel<L> m = model.with(tree);
          return Tensor(task_loss(m));
        },
        own, {.create_graph = record});
    for (auto& [name, t] : own) t = t - g.at(name) * o.lr;
  }
  for (const auto& [name, t] : own) all.insert_or_assign(name, t);
  return all;
}

}  // namespace redco::train

namespace redco {
using train::adapt;
using train::AdaptOptions;
}  // namespace redco
