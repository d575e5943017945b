#pragma once
// All that core knows of autograd: one opaque object a tensor may carry
// (TensorImpl::autograd), asked through this interface only. redco/autodiff
// defines what is inside (the node that produced the tensor, a leaf's gradient
// sink and accumulated gradient, a recompute recipe: autodiff/autograd_meta.hpp)
// and installs the factory below; core never includes autodiff. PyTorch's c10
// keeps autograd behind its AutogradMetaInterface the same way.
#include <memory>

namespace redco {

class Tensor;

class AutogradMetaInterface {
 public:
  virtual ~AutogradMetaInterface() = default;
  virtual bool requires_grad() const = 0;
  // Only a leaf may stop requiring a gradient (Tensor::set_requires_grad checks).
  virtual void set_requires_grad(bool r) = 0;
  virtual bool is_leaf() const = 0;
  // A leaf's accumulated gradient; null when none has been accumulated.
  virtual const Tensor* grad() const = 0;
  virtual void set_grad(const Tensor& g) = 0;  // an undefined g drops it
};

// Makes the autograd state of a tensor that starts requiring a gradient.
// redco/autodiff installs it at static initialisation (autodiff/node.cpp, linked
// into every program that records a graph); without it set_requires_grad(true)
// is an error naming what to link.
using AutogradMetaFactory = std::unique_ptr<AutogradMetaInterface> (*)();
void set_autograd_meta_factory(AutogradMetaFactory factory);
AutogradMetaFactory autograd_meta_factory();

}  // namespace redco
