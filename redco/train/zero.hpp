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
// Ownership is decided from the plan's whole sizes, so every rank of a
// model-parallel group owns the same names and the replicas of a group agree
// without communicating. A parameter larger than half a replica's share (a
// tied embedding can be 40% of a small model) is split in dp equal row
// ranges of dim 0 of the tensor a rank holds, part r owned by replica r;
// the others are owned whole, largest first, by the least loaded replica.
// An owned part is a view of the parameter (rows are contiguous), so the
// optimizer steps it in place with buffers of its shape: the elementwise
// updates (SGD, Adam, AdamW) are those of the whole tensor. Under ZeRO-2 a
// split parameter's squared gradient norm is the sum of its parts', so the
// global norm equals the plain run's to rounding, not bit for bit. Checkpoints stay whole:
// full_state() collects every buffer from its owner before a save, and owned_state() keeps a loaded
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
#include <utility>
#include <vector>

#include "redco/autodiff/value_and_grad.hpp"
#include "redco/shard/split.hpp"

namespace redco::comm {
class Comm;
}

namespace redco::train {

class ZeroPartition {
 public:
  // `plan`: every parameter to partition, with its whole shape. Throws when a replica
  // would own nothing (fewer parameters than replicas).
  ZeroPartition(const std::vector<shard::ParamSplit>& plan, int dp_size, int dp_rank);

  // The owners of a parameter's parts in row order: one replica (owned
  // whole) or every replica (split). Throws for a name not in the plan.
  const std::vector<int>& part_owners(const std::string& name) const;
  bool split(const std::string& name) const { return part_owners(name).size() > 1; }
  // Whether this replica owns the parameter or a part of it.
  bool owns(const std::string& name) const;
  // Rows [first, second) of dim 0 (of n) that part k of `count` covers.
  static std::pair<int64_t, int64_t> part_rows(int64_t n, int k, int count);
  // The part of `t` (a parameter's tensor, or a buffer of its shape) that
  // replica r owns: a view, the whole of `t` for a parameter owned whole.
  Tensor part(const std::string& name, const Tensor& t, int r) const;
  // The entries of `tree` this replica owns, as views of its parts (handles
  // sharing the tensors). Names of the plan not in `tree` are left out.
  ParamTree owned(const ParamTree& tree) const;
  // The broadcasts that set every parameter of `params` (this rank's shards)
  // to its owner's values: per owner, each part of 1 MiB or more alone (a
  // view of `params`, received in place), the smaller ones packed in
  // messages of at most 32 MiB.
  // train/param_share.hpp runs them, overlapped with the next forward.
  struct ShareBucket {
    int root = 0;
    std::vector<std::string> names;  // parts[i] is (a part of) names[i]
    std::vector<Tensor> parts;
  };
  std::vector<ShareBucket> share_buckets(const ParamTree& params) const;
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
  // optim::sum_of_squares forms it at its owner, or its parts' in rank
  // order; NaN when not finite), from each replica's own gradients.
  // Collective over `dp`.
  std::map<std::string, double> squares(const ParamTree& owned_grads, comm::Comm& dp) const;
  // The part of a whole optimizer state this replica keeps ("step" and the
  // buffers, or the parts of buffers, of the parameters it owns).
  ParamTree owned_state(const ParamTree& state) const;

  // ZeRO-3 (the parameters themselves partitioned, param_gather.hpp): this
  // replica's part of every parameter of the partition in `local` (the rank's
  // shards, whole across the replicas), each a tensor of its own: its rows
  // of a split one, a parameter owned whole at its owner and as an empty
  // [0, ...] tensor at the others. Other entries are kept as they are. The
  // first call remembers the shapes (local_shape).
  ParamTree keep_parts(const ParamTree& local);
  // A partitioned parameter's shape on this rank (whole across the replicas).
  const Shape& local_shape(const std::string& name) const;
  // The entries of a tree of parts (keep_parts) that this replica owns.
  ParamTree owned_parts(const ParamTree& parts) const;
  // Whether `name` is a parameter of the partition.
  bool has(const std::string& name) const { return owners_.count(name) > 0; }
  // Every partitioned parameter's name, in key order.
  const std::vector<std::string>& names() const { return all_; }

 private:
  // names[r]: the parameters replica r owns whole or a part of, in key order.
  std::vector<std::vector<std::string>> names_;
  std::unordered_map<std::string, std::vector<int>> owners_;  // part_owners()
  std::vector<std::string> all_;                              // every parameter, in key order
  std::vector<std::string> in_plan_order_;     // every parameter, as the plan has them
  std::map<std::string, Shape> local_shapes_;  // ZeRO-3: keep_parts' wholes
  int rank_ = 0;
};

}  // namespace redco::train
