#pragma once
// Checkpoints of a run on a dp × mp mesh, in the same format as a
// single-process one (io/checkpoint.hpp): whole tensors under their names, so
// a checkpoint written on one mesh loads into any other by slicing.
//
// Saving never gathers a model in one place. Tensor i (parameters, then the
// optimizer state, in name order) is written by world rank i % world_size:
// only the model-parallel group holding that rank all-gathers it, and the rank
// pwrite()s it into the shared files at the offset every rank computes from
// the same header (io::SharedSafetensorsFile). So memory is bounded by one
// whole tensor, and the writing is spread over the ranks. Rank 0 creates the
// temporary folder and the files and, once every rank has closed them,
// writes state.json and publishes the folder atomically. All ranks must see
// the same filesystem at the workdir (one host, or a shared filesystem).
//
// Loading reads one whole tensor at a time and keeps this rank's slice.
#include <filesystem>
#include <string>

#include "redco/comm/mesh.hpp"
#include "redco/io/checkpoint.hpp"
#include "redco/train/deployer.hpp"

namespace redco::train {

// Collective over mesh.world(). `params` and `opt_state` hold this rank's
// shards under `plan`; optimizer buffers "<kind>.<buffer>.<param>" follow
// their parameter's split, anything else (the step count) is whole.
void save_sharded_checkpoint(comm::Mesh& mesh, const std::filesystem::path& dir,
                             const ParamTree& params, const ParamTree& opt_state,
                             const std::string& state_json, const ShardPlan& plan);

// Collective over mesh.world(): this rank's shards under `plan` of every
// parameter (the file must hold exactly the plan's parameters, each with the
// plan's shape) and of the optimizer state.
io::Checkpoint load_sharded_checkpoint(comm::Mesh& mesh, const std::filesystem::path& dir,
                                       const ShardPlan& plan);

// The whole tensor from this rank's shard: an all-gather over `mp` along the
// split dimension, reassembled block by block for fused splits (GPT-2's
// c_attn). A replicated tensor is returned as is. Collective over `mp`.
Tensor gather_whole(const Tensor& local, const shard::ParamSplit& split, comm::Comm& mp);

// Throws on every rank when any rank's `ok` is false, naming the failed ranks
// and `what`; so one rank's error stops the others instead of leaving them
// waiting. Collective over `world`.
void agree(comm::Comm& world, bool ok, const std::string& what);

}  // namespace redco::train
