#include "redco/comm/device_comm.hpp"

#include <array>
#include <mutex>
#include <utility>

namespace redco::comm {
namespace {

struct Registry {
  std::mutex mutex;
  std::array<DeviceCommFactory, kDeviceKinds> factories;
};

Registry& registry() {
  static Registry* r = new Registry();  // leaked: registrations run at static initialisation
  return *r;
}

}  // namespace

void register_device_comm(DeviceKind kind, DeviceCommFactory make) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  r.factories[size_t(kind)] = std::move(make);
}

bool has_device_comm(DeviceKind kind) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  return bool(r.factories[size_t(kind)]);
}

std::unique_ptr<Comm> comm_for_device(std::unique_ptr<Comm> host, Device device,
                                      std::chrono::milliseconds timeout) {
  DeviceCommFactory make;
  {
    Registry& r = registry();
    std::lock_guard lock(r.mutex);
    make = r.factories[size_t(device.kind)];
  }
  return make ? make(std::move(host), device, timeout) : std::move(host);
}

}  // namespace redco::comm
