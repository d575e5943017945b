#pragma once
// A hook that sees a model's parameter reads. While one is installed on a
// thread, every parameter a forward there looks up by name (nn::Params) is
// announced to it first. ZeRO uses it to start the next step's forward while
// the owners' updated parameters are still on their way
// (train/param_share.hpp): a read waits only for what carries that parameter.
// ZeRO-3 keeps only a part of each trained parameter on a replica, and the
// hook provides the whole one when a forward reads it (train/param_gather.hpp).
#include <optional>
#include <string_view>

#include "redco/core/tensor.hpp"

namespace redco::nn {

class ParamReadHook {
 public:
  virtual void before_read(std::string_view name) = 0;
  // The parameter `name` when the tree being read does not hold it (ZeRO-3:
  // gathered from its owners); undefined when this hook has none either.
  virtual Tensor provide(std::string_view name) { return (void)name, Tensor(); }
  // The shape provide(name) would give, without making the tensor: a layer
  // checking a shard's shape must not gather it.
  virtual std::optional<Shape> shape_of(std::string_view name) { return (void)name, std::nullopt; }

 protected:
  ~ParamReadHook() = default;
};

// The calling thread's hook; null when none is installed.
ParamReadHook*& param_read_hook();

}  // namespace redco::nn
