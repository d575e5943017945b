#pragma once
// The CPU backend: oneTBB for parallelism, oneDNN for GEMM, Eigen for
// vectorised math. Its methods are defined across ops/cpu/*.cpp, grouped by
// kind: the generic kernels in tensor_ops.hpp, the nn kernels in nn_backend.cpp.
#include "redco/ops/backend.hpp"

namespace redco {

class CpuBackend final : public Backend {
 public:
  REDCO_OP_OVERRIDES  // every op of ops/op_list.hpp
};

}  // namespace redco
