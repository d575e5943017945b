// checkpoint(): a block run once without a graph, then again in backward.
#include "redco/autodiff/checkpoint.hpp"

#include <memory>
#include <utility>

#include "redco/autodiff/recording.hpp"
#include "redco/ops/backend.hpp"

namespace redco {
namespace {

// The backward rule: run the block again with its outside tensors replaced by
// fresh leaves (same data), then take the block's gradients with respect to
// those leaves from the gradient of its output.
TensorList recompute_vjp(const Node& self, const TensorList& outside,
                         const std::function<Tensor()>& recompute, const Tensor& grad_out) {
  REDCO_CHECK(!detail::building_higher_order(),
              "checkpoint: gradients of gradients (create_graph) through a recomputed block are "
              "not supported; run that block without nn::checkpoint / recompute");
  TensorList from, leaves;  // the outside tensors that need a gradient, and their stand-ins
  for (size_t i = 0; i < outside.size(); ++i) {
    if (!self.needs_grad(int(i))) continue;
    from.push_back(outside[i]);
    leaves.push_back(outside[i].detach().set_requires_grad(true));
  }
  Tensor y;
  {
    profile::Scope scope("checkpoint_recompute");
    GradModeGuard on(true);
    detail::Substitution stand_in(from, leaves);
    y = recompute();
  }
  REDCO_CHECK(y.defined() && y.shape() == self.output_meta()[0].shape,
              "checkpoint: the recomputed block returned shape {} but its first run returned {}; "
              "the block must compute the same thing each time",
              y.defined() ? y.shape() : Shape{}, self.output_meta()[0].shape);
  TensorList out(outside.size());
  if (!y.requires_grad()) return out;  // the recomputation reads none of them
  const TensorList g = grad({y}, leaves, {grad_out}, {.allow_unused = true});
  for (size_t i = 0, k = 0; i < outside.size(); ++i)
    if (self.needs_grad(int(i))) out[i] = g[k++];
  return out;
}

}  // namespace

Tensor checkpoint(const std::function<Tensor()>& forward, std::function<Tensor()> recompute) {
  if (!GradMode::enabled()) return forward();
  TensorList outside;  // [k] every tensor requiring a gradient that the block read
  Tensor y;
  {
    detail::CaptureScope capture(outside);
    NoGradGuard no_graph;  // nothing inside is kept for backward
    y = forward();
  }
  REDCO_CHECK(y.defined(), "checkpoint: the block returned an undefined tensor");
  if (outside.empty()) return y;  // nothing to differentiate
  // A new handle: the block may return one of its inputs, which has a history.
  return record("checkpoint", outside, y.detach(),
                [outside, recompute = std::move(recompute)](const Node& self, const TensorList& g) {
                  return recompute_vjp(self, outside, recompute, g[0]);
                });
}

}  // namespace redco
