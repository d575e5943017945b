#pragma once
// A parameter tree: dotted names ("h.3.attn.q_proj.weight") to tensors, as a
// model's walk names them, checkpoints store them and value_and_grad takes them.
#include <map>
#include <string>

#include "redco/core/tensor.hpp"

namespace redco {

using ParamTree = std::map<std::string, Tensor>;

}  // namespace redco
