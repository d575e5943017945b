// The planner's choice for a run about to start.
#include "redco/train/auto_mesh.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <sstream>

#include "redco/comm/launch_env.hpp"
#include "redco/core/error.hpp"

namespace redco::train {
namespace {

// The processes of this job as its launcher describes them: the CPU's
// devices, on shared-memory links inside a host and TCP between hosts
// (plan::overlap_of: the cores compute and copy, the NIC carries the wire).
plan::Cluster cluster_of(const AutoMeshOptions& o) {
  const comm::LaunchEnv env = comm::detect_launch_env();
  plan::Cluster c{.device = plan::device_preset("cpu"),
                  .devices = o.world_size > 0 ? o.world_size : env.world_size,
                  .hosts = env.nnodes,
                  .intra = plan::link_preset("shm"),
                  .inter = plan::link_preset("tcp10")};
  if (c.hosts < 1 || c.devices % c.hosts != 0) c.hosts = 1;
  c.overlap = plan::overlap_of(false, c.hosts);
  c.device.memory = o.memory_per_device
                        ? o.memory_per_device
                        : available_host_memory() / uint64_t(std::max(1, env.local_world_size));
  c.device.reserved = 0;
  return c;
}

// The first candidate cut as a user would cut it without knowing better
// (one shard a device's worth of replicas, no ZeRO, no recomputation), for
// the message that says what the choice saved.
const plan::Candidate* plain(const std::vector<plan::Candidate>& all) {
  for (const plan::Candidate& k : all)
    if (k.par.mp == 1 && k.par.zero == 0 && !k.par.recompute && k.work.accumulation == 1) return &k;
  return nullptr;
}

}  // namespace

uint64_t available_host_memory() {
  std::ifstream in("/proc/meminfo");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string key;
    uint64_t kib = 0;
    if (words >> key >> kib && key == "MemAvailable:") return kib * 1024;
  }
  fail(
      "n_model_shards = auto: /proc/meminfo gives no MemAvailable; give the memory per device "
      "(--memory-per-device 16GB)");
}

namespace {

// The fix for a run that does not fit: when the user fixed the shards, the
// ZeRO stage or recomputation and the planner, free to choose them, finds a
// cut that fits, that cut; else more devices or less memory a row.
std::string unpinned_advice(plan::Request r) {
  const std::string general =
      "Use more devices, shorter sequences or Precision::bf16 (redco-plan lists every "
      "configuration and the longest sequence each fits)";
  if (!r.mp && !r.zero && !r.recompute) return general;
  r.mp = std::nullopt, r.zero = std::nullopt, r.recompute = std::nullopt;
  const std::optional<plan::Candidate> k = plan::best(r);
  if (!k) return general;
  return fmt::format(
      "The shards, ZeRO stage or recomputation given are what does not fit: {} model shard(s) x "
      "{} replica(s), ZeRO-{}, recomputation {} fits in {} (leave them to the planner: "
      "--n-model-shards auto)",
      k->par.mp, k->par.dp, k->par.zero, k->par.recompute ? "on" : "off",
      plan::bytes_text(k->needed));
}

}  // namespace

MeshChoice choose_mesh(const plan::ModelShape& model, const AutoMeshOptions& o) {
  REDCO_CHECK(o.seq_len > 0, "n_model_shards = auto needs the sequence length (seq_len > 0)");
  const plan::Cluster cluster = cluster_of(o);
  plan::Request r{.model = model, .cluster = cluster, .seq_len = o.seq_len};
  r.source_len = o.source_len, r.global_batch = o.global_batch;
  r.precision = o.precision, r.optimizer = o.optimizer;
  r.mp = o.n_model_shards, r.zero = o.zero_stage, r.recompute = o.recompute;
  const std::vector<plan::Candidate> all = plan::search(r);
  REDCO_CHECK(!all.empty(),
              "n_model_shards = auto: no way to give each of the {} devices' replicas the same "
              "number of the {} rows of a step; make the global batch a multiple of the device "
              "count",
              cluster.devices, o.global_batch);
  const plan::Candidate& k = all.front();
  REDCO_CHECK(k.fits,
              "{} ({:.1f}M parameters) does not fit {} device(s) of {} at {} tokens a row: the "
              "nearest configuration, {} model shard(s) x {} replica(s), ZeRO-{}{}, micro-batch "
              "{}, needs {}. {}",
              model.family, double(model.n_params()) / 1e6, cluster.devices,
              plan::bytes_text(cluster.device.memory), o.seq_len, k.par.mp, k.par.dp, k.par.zero,
              k.par.recompute ? ", recomputation" : "", k.work.micro_batch, plan::describe_need(k),
              unpinned_advice(r));
  MeshChoice c{.n_model_shards = k.par.mp,
               .zero_stage = k.par.zero,
               .recompute = k.par.recompute,
               .micro_batch = k.work.micro_batch,
               .plan = k};
  c.why = fmt::format(
      "auto: {} model shard(s) x {} replica(s), ZeRO-{}, recomputation {}, micro-batch {} x {} "
      "accumulated: {} of the {} each device has",
      k.par.mp, k.par.dp, k.par.zero, k.par.recompute ? "on" : "off", k.work.micro_batch,
      k.work.accumulation, plan::bytes_text(k.needed), plan::bytes_text(cluster.device.memory));
  if (const plan::Candidate* p = plain(all); p && p != &k)
    c.why += fmt::format("; one shard per device without ZeRO or recomputation would need {}{}",
                         plan::bytes_text(p->needed), p->fits ? " and train slower" : "");
  return c;
}

}  // namespace redco::train
