#pragma once
// The CUDA backend: every kernel of the op list (ops/op_list.hpp) on tensors in GPU
// memory, with the CPU backend's semantics (f32 compute, f32 outputs,
// half-precision inputs converted on the device). All inputs of a call must
// live on the same CUDA device; the result is allocated there. Methods the
// backend does not implement yet throw a redco::Error naming the op. The
// kernels are defined in backend_cuda.cpp and matmul.cpp (generic),
// backend_cuda_nn.cpp, backend_cuda_attention.cpp, backend_cuda_conv.cpp and
// backend_cuda_optim.cpp.
#include "redco/ops/backend.hpp"

namespace redco {

class CudaBackend final : public Backend {
 public:
  static CudaBackend& instance();

  REDCO_OP_OVERRIDES  // every op of ops/op_list.hpp
};

}  // namespace redco
