#include "redco/ops/backend.hpp"

#include <array>

#include "redco/ops/cpu/backend_cpu.hpp"

namespace redco {
namespace {
std::array<Backend*, kDeviceKinds>& registry() {
  static CpuBackend cpu;
  static std::array<Backend*, kDeviceKinds> r{&cpu, nullptr};
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

void register_backend(DeviceKind kind, Backend* b) { registry()[size_t(kind)] = b; }

}  // namespace redco
