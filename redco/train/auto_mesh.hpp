#pragma once
// n_model_shards = auto: the planner (redco/plan) picks how this run is cut
// before the Deployer builds its mesh: the model shards, the ZeRO stage, the
// recomputation and the micro-batch that fit the memory of each device and
// train fastest, and says why. A user with no systems knowledge names none of
// them; one who names some pins those and lets the rest be chosen.
//
//   const plan::ModelShape shape = plan::model_shape(models::hf::Config(dir));
//   const train::MeshChoice c = train::choose_mesh(shape, {.seq_len = 512, .global_batch = 32});
//   train::Deployer deployer({.n_model_shards = c.n_model_shards, .zero_stage = c.zero_stage});
//   trainer.fit(data, {.per_device_batch_size = c.micro_batch, .global_batch_size = 32,
//                      .recompute = c.recompute});
//
// When nothing fits, choose_mesh fails before anything is allocated, with the
// nearest configuration's need per rank against the memory there is: never an
// out-of-memory kill in the middle of the first step.
#include <cstdint>
#include <optional>
#include <string>

#include "redco/plan/planner.hpp"

namespace redco::train {

// Designated initialisers name these fields in the order declared below.
struct AutoMeshOptions {
  int64_t seq_len = 0;       // tokens per row (an encoder-decoder's target)
  int64_t source_len = 0;    // an encoder-decoder's source tokens; 0: seq_len
  int64_t global_batch = 0;  // rows per optimizer step; 0: one per replica
  Precision precision = Precision::f32;
  plan::Optimizer optimizer = plan::Optimizer::adamw;
  // Bytes each rank may use; 0: on the CPU, the host's available memory
  // shared by the ranks on it (required on an accelerator).
  uint64_t memory_per_device = 0;
  // Pinned by the user (unset: chosen).
  std::optional<int> n_model_shards = {};
  std::optional<int> zero_stage = {};
  std::optional<bool> recompute = {};
  int world_size = 0;  // 0: from the launch environment (redco-run, Slurm, Open MPI)
};

struct MeshChoice {
  int n_model_shards = 1;
  int zero_stage = 0;
  bool recompute = false;
  int64_t micro_batch = 1;  // rows per replica per micro-batch (FitOptions::per_device_batch_size)
  plan::Candidate plan = {};
  std::string why = {};  // what was chosen, its memory, and what a cheaper cut would have needed
};

// Fails (redco::Error) when no configuration fits, naming the nearest one's need.
MeshChoice choose_mesh(const plan::ModelShape& model, const AutoMeshOptions& o);

// What DeployerConfig::auto_mesh points at: the model and the run, for a
// Deployer that asks the planner for its mesh itself.
//   const train::AutoMesh a{plan::model_shape(models::hf::Config(dir)), {.seq_len = 512,
//                                                                     .global_batch = 32}};
//   train::Deployer deployer({.seed = 42, .auto_mesh = &a});  // shards and ZeRO stage chosen
//   trainer.fit(data, {.global_batch_size = 32});  // micro-batch and recomputation chosen
// The Deployer's world (its communicator, or the launch environment) gives
// the device count; its device's memory, unless options.memory_per_device.
struct AutoMesh {
  plan::ModelShape model;
  AutoMeshOptions options = {};
};

// MemAvailable of this host (Linux /proc/meminfo), in bytes.
uint64_t available_host_memory();

}  // namespace redco::train
