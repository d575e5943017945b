#pragma once
// Data and tensor parallelism over a comm::Mesh.
//
// Tensor parallel: every rank of a model-parallel group holds only its shard
// of each parameter (shard_params / init_shard, following the plan from
// shard::resolve), under the parameter's own name, and runs the ordinary
// nn::apply(model, shard, x, ctx) with ctx.mp set to its model-parallel group:
// the layers add the collectives (redco/nn/tensor_parallel.hpp). Logits come
// out split by vocabulary, which cross_entropy reads without gathering.
// Data parallel: each replica takes its rows of the
// global batch (DataParallel::local_batch) and gradients are averaged across
// the replicas in buckets (DataParallel::average).
#include <cstddef>
#include <memory>
#include <string>
#include <vector>

#include "redco/comm/comm.hpp"
#include "redco/nn/tensor_parallel.hpp"
#include "redco/nn/shard_plan.hpp"
#include "redco/train/data_parallel.hpp"

namespace redco::train {

using nn::ParamTree;

// ---- parameter shards ------------------------------------------------------------------

// The part of `full` that model shard `mp_rank` of `mp_size` holds under `split`.
Tensor slice_shard(const Tensor& full, const shard::ParamSplit& split, int mp_rank, int mp_size);

// Every parameter of `plan`, cut to this shard (replicated ones whole). Throws
// if `full` lacks a parameter of the plan or holds it with another shape.
ParamTree shard_params(const ParamTree& full, const std::vector<shard::ParamSplit>& plan,
                       int mp_rank, int mp_size);

// Draws only this shard's elements: element i of a parameter depends on
// (seed, name, i) alone (see core/philox.hpp), so the result equals
// shard_params(nn::init_params(model, seed), plan, ...) without ever holding
// a whole parameter. `entries` and `plan` list the same parameters in the same
// order (nn::param_entries(model) and shard::resolve(model, mp_size)).
ParamTree init_shard(const std::vector<nn::ParamEntry>& entries,
                     const std::vector<shard::ParamSplit>& plan, uint64_t seed, int mp_rank,
                     int mp_size);

// The whole tensor from every mp rank's shard (an all-gather along the split
// dimension; a replicated tensor is returned as is). Collective over `mp`.
Tensor unshard(const Tensor& local, const shard::ParamSplit& split, comm::Comm& mp);

// ---- vocabulary-parallel pieces (nn::vocab_parallel_*) ------------------------------------

// The token embedding with the table split by vocabulary rows.
Tensor vocab_parallel_embedding(const Tensor& table_shard, const Tensor& ids, comm::Comm& mp);

// cross_entropy(full logits, labels) from vocabulary-split logits [..., V/mp]
// without gathering them. cross_entropy(logits, labels) does this by itself
// for the split logits nn::apply returns.
Tensor vocab_parallel_cross_entropy(const Tensor& logits_shard, const Tensor& labels,
                                    comm::Comm& mp, int64_t ignore_index = -100);

// Parameter names in execution order, for DataParallel::average.
std::vector<std::string> param_order(const std::vector<shard::ParamSplit>& plan);

}  // namespace redco::train
