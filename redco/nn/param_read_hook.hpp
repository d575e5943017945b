#pragma once
// A hook that sees a model's parameter reads. While one is installed on a
// thread, every parameter a forward there looks up by name (nn::Params) is
// announced to it first. ZeRO uses it to start the next step's forward while
// the owners' updated parameters are still on their way
// (train/param_share.hpp): a read waits only for what carries that parameter.
#include <string_view>

namespace redco::nn {

class ParamReadHook {
 public:
  virtual void before_read(std::string_view name) = 0;

 protected:
  ~ParamReadHook() = default;
};

// The calling thread's hook; null when none is installed.
ParamReadHook*& param_read_hook();

}  // namespace redco::nn
