#pragma once
// Device communicators: how a rank's collectives on accelerator tensors find
// the accelerator's own transport (NCCL for CUDA) without the layers above
// knowing of it.
//
// The host world (UCX, or threads) is always built first: it carries the
// rendezvous, the messages a device transport needs to start (NCCL's unique
// id), and every collective on host tensors. A backend that has a transport
// for its device registers a factory here; comm_for_device() hands it the
// host world and gets back a communicator that runs device tensors over the
// transport and everything else over the host world. Without a registered
// factory (a build without CUDA, a CPU or test device) the host world is
// returned unchanged: the UCX backend stages device buffers through host
// memory, so every device still works, only slower.
#include <chrono>
#include <functional>
#include <memory>

#include "redco/comm/comm.hpp"
#include "redco/core/device.hpp"

namespace redco::comm {

// Builds the device communicator over `host` (taking it over), or hands
// `host` back when the transport declines (its library is missing, or the
// environment turned it off); it says why on stderr once. `timeout`: how
// long one collective may wait for the other ranks before it fails.
using DeviceCommFactory = std::function<std::unique_ptr<Comm>(
    std::unique_ptr<Comm> host, Device device, std::chrono::milliseconds timeout)>;

// A backend's registration, at static initialisation (one factory a kind).
void register_device_comm(DeviceKind kind, DeviceCommFactory make);

// Whether a transport is registered for `kind` (it may still decline at run time).
bool has_device_comm(DeviceKind kind);

// The communicator for this rank's `device` over the host world `host`.
std::unique_ptr<Comm> comm_for_device(std::unique_ptr<Comm> host, Device device,
                                      std::chrono::milliseconds timeout);

}  // namespace redco::comm
