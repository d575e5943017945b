#pragma once
// The NCCL backend: collectives on CUDA tensors over NCCL, everything else
// over the host world it is built on.
//
//   std::unique_ptr<Comm> world = connect_ucx(...);            // host world first
//   world = connect_nccl(std::move(world), Device::cuda(0));   // then NCCL over it
//
// (The Deployer does this through comm_for_device when the rank's device is
// a GPU and every rank can open libnccl; REDCO_NCCL=0 keeps the host world.)
//
// Start-up: group rank 0 makes NCCL's unique id and broadcasts it over the
// host communicator (the rendezvous's transport), then every rank joins with
// ncclCommInitRank on its device. subgroup() does the same over the host
// world's subgroup.
//
// Streams: each communicator enqueues on a stream of its own, so a
// collective overlaps the computation queued after it. At the collective's
// start the communication stream waits for an event recorded on the device's
// compute stream (cuda_util.hpp), so NCCL reads what the kernels queued
// before it wrote; the task completes when the host sees the event recorded
// after the NCCL call, and keeps its tensors alive until then, so the caching
// allocator cannot hand their blocks to anyone while NCCL still uses them.
//
// Order: a rank must enqueue NCCL calls in the same order as every other
// rank, but Comm's tasks may be started in any order (when_all). The k-th
// call therefore waits, before it enqueues, until every earlier call of this
// communicator has been enqueued (or dropped unstarted): comm/call_order.hpp.
//
// Numerics: all_reduce and reduce_scatter reduce in f32 (bf16 and f16
// tensors through an f32 copy), deterministically for a given world and
// message size (NCCL's ring or tree order, not the host backends' rank order
// 0..n-1); the mean is NCCL's average. all_gather and broadcast move bytes.
// Host tensors, the barrier and point-to-point messages go to the host
// world (its send/recv stage device buffers through host memory).
//
// Failures: a collective not finished after `timeout` (a rank stopped
// calling collectives, or died) or an error NCCL reports asynchronously
// aborts the communicator and fails the collective with a message naming
// it; every later call then throws at once. A rank blocked inside an NCCL
// call for good is ended by the launcher's hang detection.
//
// Two limits of pairing by enqueue order: a call whose task fails before it
// enqueues (a dtype or device error) shifts this rank's later calls against
// the peers' unless every rank fails it alike (as SPMD programs do); and a
// task awaited alone while an earlier call's task is neither started nor
// destroyed waits for that turn until the task is.
#include <chrono>
#include <memory>

#include "redco/comm/comm.hpp"
#include "redco/core/device.hpp"

namespace redco::comm {

// Takes over `host` (any backend) and returns the NCCL communicator of the
// same ranks on `device` (a CUDA device). Throws when NCCL cannot be opened
// or the ranks cannot join.
std::unique_ptr<Comm> connect_nccl(std::unique_ptr<Comm> host, Device device,
                                   std::chrono::milliseconds timeout = std::chrono::minutes(3));

// Makes comm_for_device (device_comm.hpp) answer CUDA devices with NCCL when
// every rank can open it. Called by the CUDA backend's registration (a static
// library would otherwise leave this file out of programs that never name it).
void register_nccl_comm();

}  // namespace redco::comm
