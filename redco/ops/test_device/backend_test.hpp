#pragma once
// The test device's backend (DeviceKind::test). Its memory is host memory
// from its own pool, so the CPU kernels can compute on it; but the only way
// they reach it is through this class, which hands them host aliases of the
// operands for the duration of one op and moves the results back onto the
// device. Everywhere else the bytes are off limits to the host (Tensor::raw
// refuses them), exactly as a GPU's are. CI runs the whole training and
// inference path on this device to prove that nothing falls back to the CPU
// silently; the CPU's own path pays nothing for it.
#include "redco/ops/cpu/backend_cpu.hpp"

namespace redco {

class TestBackend final : public Backend {
 public:
  REDCO_OP_OVERRIDES  // every op of ops/op_list.hpp

 private:
  CpuBackend cpu_;
};

}  // namespace redco
