#pragma once
// ZeRO stages 1 and 2 over the data-parallel group. Stage 1: the optimizer's
// state is partitioned by data-parallel rank. Gradients are still averaged
// across the replicas (DataParallel); then each replica updates only the
// parameters it owns, keeping their optimizer buffers and no others, and
// every parameter is handed from its owner to the other replicas (one packed
// broadcast per owner). Stage 2: each gradient is averaged into its owner
// only (DataParallel::reduce_to_owners), so a replica keeps 1/dp of the
// gradients past backward too, and the global norm is summed over the
// replicas (squared_norm). The update of each parameter is the one the
// unpartitioned optimizer makes (same gradient, same global norm, same
// buffers), so training matches the plain run bit for bit (stage 2 with
// model shards: to rounding, its norm's parts are summed in another order);
// the optimizer state per rank falls to about 1/dp of it.
//
// Ownership is by whole parameter, decided from the plan's whole sizes
// (largest first, to the least loaded replica), so every rank of a
// model-parallel group owns the same names and the replicas of a group agree
// without communicating. Checkpoints stay whole: full_state() collects every
// buffer from its owner before a save, and owned_state() keeps a loaded
// state's own part, so a checkpoint moves freely between runs with and
// without ZeRO and between meshes.
//
// The Trainer partitions the trained parameters only (frozen ones have no
// gradient and no state, and every replica keeps them whole); with parameter
// groups each replica steps each group's optimizer on the parameters of that
// group it owns, with the group's norm over every replica's gradients
// (MeshUpdate, ParamGroups::step_all).
#include <functional>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "redco/autodiff/value_and_grad.hpp"
#include "redco/shard/name_rules.hpp"

namespace redco::comm {
class Comm;
}

namespace redco::train {

class ZeroPartition {
 public:
  // `plan`: every parameter to partition, with its whole shape. Throws when a replica
  // would own nothing (fewer parameters than replicas).
  ZeroPartition(const std::vector<shard::ParamSplit>& plan, int dp_size, int dp_rank);

  int owner(const std::string& name) const;
  bool owns(const std::string& name) const { return owner(name) == rank_; }
  // The entries of `tree` this replica owns (handles sharing the tensors).
  ParamTree owned(const ParamTree& tree) const;
  // Every parameter of `params` (this rank's shards, updated in place) set to
  // its owner's values. Collective over the data-parallel group `dp`.
  void share_params(ParamTree& params, comm::Comm& dp) const;
  // The whole optimizer state (the form Optimizer::state() has without
  // ZeRO): this replica's buffers and every other owner's. `params` give the
  // buffers' shapes, `keys(param)` the state keys of a parameter's buffers
  // (Optimizer::state_keys); entries not of a parameter ("step",
  // "step.<group>") are this replica's. Collective over `dp`.
  using StateKeys = std::function<std::vector<std::string>(const std::string& param)>;
  ParamTree full_state(const ParamTree& state, const ParamTree& params, comm::Comm& dp,
                       const StateKeys& keys) const;
  // ZeRO-2: the squared global gradient norm from each replica's own
  // gradients (`owned_grads`), bit for bit as optim::checked_global_norm
  // forms it over all of them; NaN when any is not finite. Collective over `dp`.
  double squared_norm(const ParamTree& owned_grads, comm::Comm& dp) const;
  // ZeRO-2: every partitioned parameter's gradient sum of squares (exact, as
  // optim::sum_of_squares forms it at its owner; NaN when not finite), from
  // each replica's own gradients. Collective over `dp`.
  std::map<std::string, double> squares(const ParamTree& owned_grads, comm::Comm& dp) const;
  // The part of a whole optimizer state this replica keeps ("step" and the
  // buffers of the parameters it owns).
  ParamTree owned_state(const ParamTree& state) const;

 private:
  // names[r]: the parameters replica r owns, in key order.
  std::vector<std::vector<std::string>> names_;
  std::unordered_map<std::string, int> owner_;
  std::vector<std::string> all_;  // every parameter, in key order
  int rank_ = 0;
};

}  // namespace redco::train
