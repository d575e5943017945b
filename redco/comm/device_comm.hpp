#pragma once
// Device communicators: how a rank's collectives on accelerator tensors find
// the accelerator's own transport (NCCL for CUDA) without the layers above
// knowing of it.
//
// The host world (UCX, or threads) is always built first: it carries the
// rendezvous, the messages a device transport needs to start (NCCL's unique
// id), and every collective on host tensors. A backend that has a transport
// for its device registers it here; comm_for_device() hands it the host world
// and gets back a communicator that runs device tensors over the transport
// and everything else over the host world. Without one (a build without
// CUDA, a CPU or test device, a rank that cannot open the library) the host
// world is returned unchanged: the UCX backend stages device buffers through
// host memory, so every device still works, only slower.
#include <chrono>
#include <functional>
#include <memory>
#include <string>

#include "redco/comm/comm.hpp"
#include "redco/core/device.hpp"

namespace redco::comm {

struct DeviceTransport {
  std::string name;  // for messages: "NCCL"
  // Whether this rank can use it (its library opens, the environment allows
  // it); else *why says why (empty: turned off on purpose, nothing to say).
  std::function<bool(std::string* why)> usable;
  // The transport's communicator of the same ranks on `device`, taking over
  // `host`; a collective over `host`. `timeout`: how long one collective may
  // wait for the other ranks before it fails.
  std::function<std::unique_ptr<Comm>(std::unique_ptr<Comm> host, Device device,
                                      std::chrono::milliseconds timeout)>
      connect;
};

// A backend's registration, at static initialisation (one transport a kind).
void register_device_comm(DeviceKind kind, DeviceTransport transport);

// Whether a transport is registered for `kind` (it may still be unusable).
bool has_device_comm(DeviceKind kind);

// The communicator for this rank's `device` over the host world `host`. A
// collective: every rank of `host` calls it, whatever its device. The ranks
// first agree (an all-reduce over `host`); the transport is used only if
// every rank's device has one and every rank can use it, else every rank
// keeps `host` (and a rank that could not use it says why on stderr).
std::unique_ptr<Comm> comm_for_device(std::unique_ptr<Comm> host, Device device,
                                      std::chrono::milliseconds timeout);

}  // namespace redco::comm
