#include "redco/comm/device_comm.hpp"

#include <array>
#include <iostream>
#include <mutex>
#include <utility>

#include "redco/core/tensor.hpp"
#include "redco/sched/task.hpp"

namespace redco::comm {
namespace {

struct Registry {
  std::mutex mutex;
  std::array<DeviceTransport, kDeviceKinds> transports;
};

Registry& registry() {
  static Registry* r = new Registry();  // leaked: registrations run at static initialisation
  return *r;
}

DeviceTransport lookup(DeviceKind kind) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  return r.transports[size_t(kind)];
}

}  // namespace

void register_device_comm(DeviceKind kind, DeviceTransport transport) {
  Registry& r = registry();
  std::lock_guard lock(r.mutex);
  r.transports[size_t(kind)] = std::move(transport);
}

bool has_device_comm(DeviceKind kind) { return bool(lookup(kind).connect); }

std::unique_ptr<Comm> comm_for_device(std::unique_ptr<Comm> host, Device device,
                                      std::chrono::milliseconds timeout) {
  const DeviceTransport t = lookup(device.kind);
  std::string why;
  const bool usable = t.connect && t.usable && t.usable(&why);
  // Connecting is a collective over `host`: every rank must decide alike.
  Tensor votes = Tensor::from({usable ? 1.f : 0.f}, {1});
  sched::sync_wait(host->all_reduce(votes, ReduceOp::sum));
  if (votes.item() == float(host->size())) return t.connect(std::move(host), device, timeout);
  if (t.connect && (usable || !why.empty()))
    std::cerr << "redco: rank " << host->rank() << ": "
              << (usable ? "another rank cannot use " + t.name : why) << "; collectives on "
              << device.str() << " tensors go through host memory\n";
  return host;
}

}  // namespace redco::comm
