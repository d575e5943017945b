#include "redco/ops/backend.hpp"

#include <array>

#include "redco/ops/cpu/backend_cpu.hpp"
#include "redco/ops/test_device/backend_test.hpp"

namespace redco {
namespace {
std::array<Backend*, kDeviceKinds>& registry() {
  static CpuBackend cpu;
  static TestBackend test;
  static std::array<Backend*, kDeviceKinds> r{&cpu, nullptr, &test};
  return r;
}
}  // namespace

Backend& backend(Device device) {
  Backend* b = registry()[size_t(device.kind)];
  REDCO_CHECK(b,
              "no backend for device {}: this build of redco has no CUDA support "
              "(reconfigure with -Dcuda=enabled on a machine with the CUDA toolkit)",
              device.str());
  return *b;
}

void detail::mixed_devices(const char* op, Device first, const Tensor& other) {
  fail(
      "{}: operands on two devices, {} and {} (a {}{} tensor{}); move one with .to(device) "
      "before the op: no op copies between devices implicitly",
      op, first.str(), other.device().str(), dtype_name(other.dtype()), other.shape(),
      other.name().empty() ? "" : " '" + other.name() + "'");
}

void detail::no_tensor(const char* op) {
  fail("{}: an input tensor is undefined (no defined tensor names a device to run on)", op);
}

void register_backend(DeviceKind kind, Backend* b) { registry()[size_t(kind)] = b; }

}  // namespace redco
