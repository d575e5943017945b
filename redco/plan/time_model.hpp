#pragma once
// A training step's time on one rank, good enough to rank configurations:
// the FLOPs of forward and backward (plus a forward again under
// recomputation) at a sustained fraction of the device's peak, and the bytes
// each collective moves over the link that carries it, with data-parallel
// reductions overlapped with backward as the buckets allow.
//
//   StepTime t = step_time(shape, work, par, {.device = devices::h100(), .link = links::nvlink()});
//
// Tensor-parallel groups sit inside a host (the mesh puts a replica's model
// shards on consecutive ranks); data-parallel groups span hosts when there
// are several, so their collectives go at the inter-host link's rate.
#include <string>
#include <vector>

#include "redco/plan/memory_model.hpp"

namespace redco::plan {

// A device's sustained dense-matmul rate and its memory.
struct DeviceSpec {
  std::string name = {};
  double f32_flops =
      0;  // sustained FLOP/s in f32 training (what redco reaches, not the sheet's peak)
  double bf16_flops = 0;  // under Precision::bf16
  uint64_t memory = 0;    // bytes a process may use
  uint64_t reserved =
      0;  // of those, what the runtime takes before redco allocates (a CUDA context)
};

// A link's bandwidth per device in a ring collective (bus bandwidth, bytes/s)
// and the latency of one collective.
struct LinkSpec {
  std::string name = {};
  double bandwidth = 0;
  double latency = 0;  // seconds
};

// Presets (docs/planning.md says where each number comes from). `name` is
// one of the names listed by device_names() / link_names(); unknown names fail.
DeviceSpec device_preset(const std::string& name);
LinkSpec link_preset(const std::string& name);
std::vector<std::string> device_names();
std::vector<std::string> link_names();

struct Cluster {
  DeviceSpec device = {};
  int devices = 1;  // in all
  int hosts = 1;
  LinkSpec intra = {};  // between the devices of one host
  LinkSpec inter = {};  // between hosts
  // The fraction of backward's time that data-parallel communication can
  // hide behind: 1 where a GPU computes while its NIC or NVLink moves the
  // buckets; 0 on a CPU whose cores do both (measured: on 2 cores the
  // overlapped step hides about nothing).
  double overlap = 1.0;
};

// The overlap fraction (Cluster::overlap) of a device kind: 1 where an
// accelerator computes while its links move the buckets; on CPUs 0 within one
// host (the same cores compute and copy through shared memory) and 0.4 across
// hosts, where the NIC and the kernel carry the wire time (fitted to GPT-2
// small on two hosts joined by 1 Gbit/s under ZeRO-0/2/3, 0.15-0.51 measured;
// tools/bench/wire_bound.sh, docs/performance.md "Over a slow wire").
double overlap_of(bool accelerator, int hosts);

struct StepTime {
  double flops = 0;         // per rank per optimizer step
  double compute = 0;       // seconds
  double tp_comm = 0;       // tensor-parallel all-reduces (on the critical path)
  double dp_comm = 0;       // data-parallel / ZeRO collectives in all
  double exposed = 0;       // the part of dp_comm backward could not hide
  double seconds = 0;       // the step: compute + tp_comm + exposed
  double tokens_per_s = 0;  // all replicas' tokens
};

// Forward FLOPs of one token (matmuls of the blocks and the head, and
// attention's two products over `len` keys: causal halves them).
double forward_flops_per_token(const ModelShape& m, int64_t len);

StepTime step_time(const ModelShape& m, const Workload& w, const Parallelism& par,
                   const Cluster& cluster);

}  // namespace redco::plan
