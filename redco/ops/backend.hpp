#pragma once
// The dispatch table: one Backend per device kind, each implementing every
// kernel of the op list (ops/op_list.hpp) on Tensors. Differentiable ops (redco/autodiff) call the
// free functions in `redco::kernels`, which check that every tensor argument
// is on one device (an op mixing devices is an error naming the op and both
// devices, whatever the backend) and pick the backend of that device. The CPU
// and test-device backends are always registered; the CUDA backend registers
// itself when built.
#include <atomic>
#include <span>
#include <string>
#include <vector>

#include "redco/core/profile.hpp"
#include "redco/core/tensor.hpp"
#include "redco/ops/meta.hpp"
#include "redco/ops/op_list.hpp"
#include "redco/ops/op_types.hpp"

namespace redco {

class Backend {
 public:
  virtual ~Backend() = default;
  // One pure virtual per entry of the op list (ops/op_list.hpp documents each).
#define REDCO_OP_PURE(ret, name, params, args) virtual ret name params = 0;
  REDCO_OPS(REDCO_OP_PURE)
#undef REDCO_OP_PURE
};

Backend& backend(Device device);
void register_backend(DeviceKind kind, Backend* backend);

// Device checks of the kernel entry points: a few comparisons per op.
namespace detail {
[[noreturn]] void mixed_devices(const char* op, Device first, const Tensor& other);
inline void same_device(const char* op, Device d, const Tensor& t) {
  if (t.defined() && t.device() != d) [[unlikely]]
    mixed_devices(op, d, t);
}
inline void same_device(const char* op, Device d, const AttentionExtras& x) {
  for (const Tensor* t : {&x.key_begin, &x.key_end, &x.causal_offset, &x.bias})
    same_device(op, d, *t);
}
inline void same_device(const char* op, Device d, const LayerNormSaved& s) {
  same_device(op, d, s.mean);
  same_device(op, d, s.rstd);
}
template <typename T>
void same_device(const char*, Device, const T&) {}  // not a tensor
inline const Tensor* as_tensor(const Tensor& t) { return t.defined() ? &t : nullptr; }
template <typename T>
const Tensor* as_tensor(const T&) {
  return nullptr;
}
[[noreturn]] void no_tensor(const char* op);
// The device of an op's first defined tensor argument, every other tensor
// checked against it.
struct DeviceOf {
  const char* op;
  template <typename... A>
  Device operator()(const A&... args) const {
    const Tensor* first = nullptr;
    ((first = first ? first : as_tensor(args)), ...);
    if (!first) [[unlikely]]
      no_tensor(op);
    const Device d = first->device();
    (same_device(op, d, args), ...);
    return d;
  }
};
}  // namespace detail

// Kernel entry points, one per op of the list: check that every tensor
// argument is on one device, run the op's meta function (ops/meta.hpp: the
// shape and dtype checks every backend shares) and dispatch to that device's
// backend.
namespace kernels {
#define REDCO_KERNEL_ENTRY(ret, name, params, args)     \
  inline ret name params {                              \
    profile::Scope scope(#name);                        \
    const Device device = detail::DeviceOf{#name} args; \
    meta::name args;                                    \
    return backend(device).name args;                   \
  }
REDCO_DISPATCHED_OPS(REDCO_KERNEL_ENTRY)
#undef REDCO_KERNEL_ENTRY
inline Tensor dropout_mask(const Shape& s, float p, uint64_t seed, uint64_t stream, Device d) {
  meta::dropout_mask(s, p, seed, stream);
  return backend(d).dropout_mask(s, p, seed, stream);
}
}  // namespace kernels

}  // namespace redco
