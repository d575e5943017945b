#include "redco/core/device_memory.hpp"

#include <array>
#include <cstring>
#include <vector>

#include "redco/core/error.hpp"

namespace redco {
namespace {
std::array<DeviceMemory*, kDeviceKinds>& registry() {
  static std::array<DeviceMemory*, kDeviceKinds> r{};
  return r;
}
}  // namespace

void register_device_memory(DeviceKind kind, DeviceMemory* mem) {
  REDCO_CHECK(kind != DeviceKind::cpu, "the cpu memory is built in and cannot be replaced");
  registry()[size_t(kind)] = mem;
}

bool has_device_memory(DeviceKind kind) { return registry()[size_t(kind)] != nullptr; }

DeviceMemory& device_memory(Device device) {
  DeviceMemory* m = registry()[size_t(device.kind)];
  REDCO_CHECK(m,
              "device {} has no allocator in this build (reconfigure redco with "
              "-Dcuda=enabled on a machine with the CUDA toolkit)",
              device.str());
  return *m;
}

void copy_bytes(void* dst, Device dst_dev, const void* src, Device src_dev, size_t bytes) {
  if (bytes == 0) return;
  if (dst_dev.is_cpu() && src_dev.is_cpu()) {
    std::memcpy(dst, src, bytes);
  } else if (dst_dev.is_cpu() || src_dev.is_cpu() || dst_dev.kind == src_dev.kind) {
    device_memory(dst_dev.is_cpu() ? src_dev : dst_dev).copy(dst, dst_dev, src, src_dev, bytes);
  } else {
    // Two different accelerator kinds share no copy engine: stage on the host.
    std::vector<char> host(bytes);
    device_memory(src_dev).copy(host.data(), Device::cpu(), src, src_dev, bytes);
    device_memory(dst_dev).copy(dst, dst_dev, host.data(), Device::cpu(), bytes);
  }
}

}  // namespace redco
