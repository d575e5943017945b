#pragma once
// Function transforms in the style of jax.value_and_grad / jax.grad, over a
// parameter tree: a map from dotted names ("h.3.attn.q_proj.weight") to
// tensors. The function sees fresh leaves that share the parameters' data, so
// the caller's tensors are never mutated and no history leaks out; nested
// transforms compose (grad of grad).
#include <map>
#include <string>
#include <utility>

#include "redco/autodiff/node.hpp"
#include "redco/core/param_tree.hpp"

namespace redco {

// f(params) -> scalar loss; returns {loss, d loss / d params} with the same keys.
template <typename F>
std::pair<Tensor, ParamTree> value_and_grad(F&& f, const ParamTree& params,
                                            GradOptions options = {}) {
  ParamTree leaves;
  TensorList inputs;
  for (const auto& [name, p] : params) {
    // A parameter that is already part of a recorded graph (an outer
    // value_and_grad with create_graph, a MAML inner step) is used as is, so
    // gradients keep flowing to the outer level.
    Tensor leaf = p;
    if (!p.requires_grad()) leaf = p.detach().set_requires_grad(true).set_name(name);
    leaves.emplace(name, leaf);
    inputs.push_back(leaf);
  }
  GradModeGuard on(true);
  Tensor loss = f(static_cast<const ParamTree&>(leaves));
  REDCO_CHECK(loss.defined() && loss.numel() == 1,
              "value_and_grad: the function must return a scalar loss, got shape {}",
              loss.defined() ? loss.shape() : Shape{});
  options.allow_unused = true;  // a parameter the loss ignores gets a zero gradient
  TensorList grads = grad({loss}, inputs, {}, options);
  ParamTree out;
  size_t i = 0;
  for (const auto& [name, p] : leaves) {
    Tensor g = grads[i++];
    // An unused parameter gets zeros, where the parameter lives.
    out.emplace(name, g.defined() ? g : Tensor::zeros(p.shape(), DType::f32, p.device()));
  }
  return {options.create_graph ? loss : loss.detach(), std::move(out)};
}

template <typename F>
ParamTree grad_of(F&& f, const ParamTree& params, GradOptions options = {}) {
  return value_and_grad(std::forward<F>(f), params, options).second;
}

}  // namespace redco
