#pragma once
// What autograd keeps on a tensor, behind core's opaque hook
// (core/autograd_hook.hpp): whether it requires a gradient, the node that
// produced it (null for a leaf), a leaf's gradient sink and accumulated
// gradient, and a recompute recipe. Only redco/autodiff reads these fields.
#include <functional>
#include <memory>

#include "redco/core/tensor.hpp"

namespace redco {

class Node;

class AutogradMeta final : public AutogradMetaInterface {
 public:
  bool requires_grad() const override { return requires_grad_; }
  void set_requires_grad(bool r) override { requires_grad_ = r; }
  bool is_leaf() const override { return !grad_fn; }
  const Tensor* grad() const override { return grad_.defined() ? &grad_ : nullptr; }
  void set_grad(const Tensor& g) override { grad_ = g; }

  std::shared_ptr<Node> grad_fn;    // null for leaves
  int output_nr = 0;                // which output of grad_fn this is
  std::shared_ptr<Node> leaf_node;  // a leaf's gradient sink, created on demand
  // Computes these values again from tensors the producing op keeps anyway
  // (a norm's output from its input): ops that save this tensor for backward
  // keep the recipe instead and free the activation (SavedInput, recording.hpp).
  std::function<Tensor()> recompute;

 private:
  bool requires_grad_ = false;
  Tensor grad_;  // a leaf's accumulated gradient
};

// The tensor's autograd state, or null where it has none (it never required a gradient).
inline AutogradMeta* autograd_meta(const Tensor& t) {
  return t.defined() ? static_cast<AutogradMeta*>(t.impl().autograd.get()) : nullptr;
}
// The tensor's autograd state, made when it has none.
inline AutogradMeta& ensure_autograd_meta(const Tensor& t) {
  auto& slot = t.impl().autograd;
  if (!slot) slot = std::make_unique<AutogradMeta>();
  return static_cast<AutogradMeta&>(*slot);
}

}  // namespace redco
