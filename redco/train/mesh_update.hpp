#pragma once
// The optimizer update of a training step across the mesh, after backward
// has averaged the gradients over the data-parallel replicas:
//  - the global gradient norm (clipping, the non-finite check) over every
//    model shard: split parameters' squares summed over the model-parallel
//    group, replicated ones counted once;
//  - ZeRO (Deployer zero_stage >= 1 with several replicas, zero.hpp): the
//    trained parameters are partitioned; each replica updates those it owns
//    (with every parameter group, each group's optimizer on its own part,
//    with the group's norm over all replicas) and hands them to the others;
//    the optimizer state it keeps is its own part, gathered whole for
//    checkpoints; frozen parameters and polyak targets stay whole everywhere;
//  - replicated parameters and their optimizer buffers made identical on
//    every model shard again (their gradients may differ in the last bit), so
//    checkpoints keep one copy of them.
#include <memory>

#include "redco/autodiff/value_and_grad.hpp"
#include "redco/train/deployer.hpp"
#include "redco/train/fit_driver.hpp"
#include "redco/train/param_groups.hpp"
#include "redco/train/param_share.hpp"
#include "redco/train/zero.hpp"

namespace redco::train {

class MeshUpdate {
 public:
  // `plan`: every parameter with its split; `groups`: the optimizers (bound
  // to the plan). Both must outlive this object.
  MeshUpdate(Deployer& deployer, const ShardPlan& plan, ParamGroups& groups);
  ~MeshUpdate();
  MeshUpdate(const MeshUpdate&) = delete;
  MeshUpdate& operator=(const MeshUpdate&) = delete;

  // The ZeRO partition; nullptr without ZeRO.
  const ZeroPartition* zero() const { return zero_.get(); }
  // ZeRO-3: whether the trained parameters are kept as this replica's parts,
  // and those parts of `local` (the rank's whole shards), other entries kept.
  bool zero3() const;
  ParamTree keep_parts(const ParamTree& local);
  // ZeRO-3: `params` (parts) with every partitioned parameter gathered
  // whole; the same tree otherwise. Collective over the replicas.
  ParamTree gathered(const ParamTree& params) const;

  // The optimizer step on `params` (this rank's shards, updated in place),
  // unless the loss or a gradient is not finite on any rank: then
  // run.non_finite stops or skips, and false is returned. Collective over the mesh.
  // `overlap_share` (and the Deployer's zero_overlap): under ZeRO the owners'
  // updates are left on their way to the others (ParamShare), for the next
  // forward on this thread to take as it reads them; settle() before
  // anything else reads `params`.
  bool apply(ParamTree& params, const ParamTree& grads, double loss, FitDriver& run,
             bool overlap_share = false);
  // Waits for parameters still on their way from their owners (nothing to do
  // when none are). Collective over the data-parallel group when some are.
  void settle() const;

  // The whole optimizer state, as without ZeRO (collective over the
  // replicas), and the part of a whole state this replica keeps.
  ParamTree full_state(const ParamTree& params) const;
  ParamTree owned_state(const ParamTree& state) const;

  // The sum and the mean of a per-replica value over the data-parallel group.
  double dp_sum(double local) const;
  double dp_mean(double local) const;

 private:
  bool apply_groups(ParamTree& params, const ParamTree& grads, double loss, FitDriver& run);
  void optimizer_step(ParamTree& params, const ParamTree& grads, double norm, bool overlap_share);
  void share(ParamTree& params, bool overlap);
  void sync_replicated(ParamTree& params);

  Deployer* deployer_;
  const ShardPlan* plan_;
  ParamGroups* groups_;
  std::unique_ptr<ZeroPartition> zero_;
  mutable std::unique_ptr<ParamShare> share_;  // the last step's, while on its way
};

}  // namespace redco::train
