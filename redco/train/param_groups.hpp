#pragma once
// Which parameters a Trainer trains, with which optimizer, and which it
// keeps frozen: the mechanism behind actor-critic pairs, target networks,
// LoRA adapters on a frozen base and a frozen text encoder beside a denoiser.
//
//   auto groups = train::ParamGroups()
//       .train("actor", optim::adam(3e-4f))      // actor and actor.* parameters
//       .train("critic", optim::adam(1e-3f))
//       .freeze("target")                        // no gradient, no optimizer state
//       .polyak("target", "critic", 0.005f);     // target <- 0.995 target + 0.005 critic
//   Trainer trainer(deployer, nn::parts(...), collate, loss, std::move(groups));
//
// A plain optim::Optimizer converts to one group training every parameter
// (the Trainer's default path, unchanged). Groups are matched in the order
// they are declared; the first that claims a parameter owns it, and every
// parameter must be claimed ("" claims all the rest). A group selects by part
// (a dotted prefix: "actor" matches "actor" and "actor.*") or by a filter on
// the name (LoRA: freeze("base", [](auto& n) { return !n.contains("lora"); })).
//
// Frozen parameters get no gradient (backward does not compute them, the
// data-parallel buckets leave them out), no optimizer state, and are never
// written except by polyak(). With {.checkpoint = false} they are also left
// out of checkpoints (an adapter-only checkpoint); a resumed run then keeps
// the frozen values the Trainer was constructed with.
//
// Each trained group's optimizer steps on its own parameters with its own
// schedule, gradient norm and clipping (the norm of that group's gradients,
// over every model shard). Checkpoint state keeps each optimizer's buffers
// under their usual names ("adam.m.actor.0.weight"; parameters are disjoint)
// and its step count as "step.<group>" ("step" with a single group).
//
// A polyak target starts as a copy of its source when the Trainer
// initialises the parameters itself (DQN's and DDPG's target networks);
// parameters given to the Trainer are taken as they are.
//
// Polyak averaging runs after every optimizer step, in place on this rank's
// shards: for each parameter target.X, t = (1 - tau) * t + tau * s with s the
// source's source.X (f32, element by element). Both parts must have the same
// parameter names below their prefixes and the same shapes (the same model
// type gives the same shard plan), and the target must be frozen.
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "redco/optim/optimizer.hpp"
#include "redco/train/deployer.hpp"

namespace redco::comm {
class Comm;
}

namespace redco::train {

// Selects parameters by their full dotted name.
using ParamFilter = std::function<bool(const std::string& name)>;

struct FreezeOptions {
  bool checkpoint = true;  // false: leave these parameters out of checkpoints
};

class ParamGroups {
 public:
  ParamGroups() = default;
  // One group training every parameter with `optimizer`.
  ParamGroups(optim::Optimizer optimizer);  // NOLINT(google-explicit-constructor)
  ParamGroups(ParamGroups&&) noexcept = default;
  ParamGroups& operator=(ParamGroups&&) noexcept = default;

  // Declarations (return *this, so they chain). `part`: a dotted prefix, ""
  // for every parameter not claimed before; the group is named after it
  // ("all" for ""). Group names are distinct and have no '.'.
  ParamGroups&& train(std::string part, optim::Optimizer optimizer) &&;
  ParamGroups&& train(std::string name, ParamFilter filter, optim::Optimizer optimizer) &&;
  ParamGroups&& freeze(std::string part, FreezeOptions options = {}) &&;
  ParamGroups&& freeze(std::string name, ParamFilter filter, FreezeOptions options = {}) &&;
  ParamGroups&& polyak(std::string target, std::string source, float tau) &&;
  ParamGroups& train(std::string part, optim::Optimizer optimizer) &;
  ParamGroups& train(std::string name, ParamFilter filter, optim::Optimizer optimizer) &;
  ParamGroups& freeze(std::string part, FreezeOptions options = {}) &;
  ParamGroups& freeze(std::string name, ParamFilter filter, FreezeOptions options = {}) &;
  ParamGroups& polyak(std::string target, std::string source, float tau) &;

  // Assigns every parameter of `plan` to its group and checks the
  // declarations against it (a parameter no group claims, a group that
  // claims nothing, a polyak pair whose names or shapes differ, a polyak
  // target that is trained): one redco::Error naming the offender.
  void bind(const ShardPlan& plan);

  // One group training every parameter: the Trainer's original path.
  bool single() const { return groups_.size() == 1 && groups_[0].optimizer.has_value(); }
  bool trained(const std::string& param) const;
  // Of `order`, the trained parameters (the data-parallel bucket order).
  std::vector<std::string> trained_only(const std::vector<std::string>& order) const;
  ParamTree trained_of(const ParamTree& params) const;  // handles, not copies
  // What checkpoints hold: every parameter but frozen ones with .checkpoint = false.
  ShardPlan saved_plan(const ShardPlan& plan) const;
  ParamTree saved_of(const ParamTree& params) const;

  // The trained groups, in declaration order: names and parameters.
  size_t n_trained() const { return trained_.size(); }
  const std::string& trained_name(size_t i) const { return groups_[trained_[i]].name; }
  const std::vector<std::string>& trained_params(size_t i) const {
    return groups_[trained_[i]].params;
  }
  // Under ZeRO (zero.hpp) a replica updates only the parameters it owns, and
  // under ZeRO-2 holds only their gradients: the groups' norms then come from
  // every trained parameter's sum of squares over the replicas.
  struct StepScope {
    // The parts of a group's parameters (and gradients) this replica
    // updates, as views; null: all of them, as they are.
    std::function<ParamTree(const ParamTree&)> own_params = nullptr, own_grads = nullptr;
    std::map<std::string, double> squares;  // per trained parameter; empty: from `grads`
  };
  // Every trained group's optimizer step on its parameters, each with the
  // global norm of its own gradients (split parameters' squares summed over
  // `mp`, the model-parallel group, when given; replicated ones counted
  // once). Returns false, changing nothing, when the loss or any gradient on
  // any model shard is not finite. Collective over `mp`.
  bool step_all(ParamTree& params, const ParamTree& grads, double loss, comm::Comm* mp,
                const StepScope& scope);
  bool step_all(ParamTree& params, const ParamTree& grads, double loss, comm::Comm* mp) {
    return step_all(params, grads, loss, mp, {});
  }
  // The polyak updates, after every step.
  void after_step(ParamTree& params) const;
  // Whether after_step moves any target (a group has a polyak target).
  bool moves_targets() const { return !polyak_.empty(); }
  // Every polyak target set to its source (bitwise): where a Trainer that
  // initialises the parameters itself starts them.
  void start_targets(ParamTree& params) const;

  // For logs and state.json: the first trained group's.
  float lr() const;
  int64_t steps() const;
  float last_grad_norm() const { return last_grad_norm_; }
  void set_last_grad_norm(double n) { last_grad_norm_ = float(n); }
  // The optimizer of trained group `name` ("" : the first).
  optim::Optimizer& optimizer(const std::string& name = "");
  const optim::Optimizer& optimizer(const std::string& name = "") const;

  ParamTree state() const;
  void load_state(const ParamTree& state);
  // The state keys of a trained parameter's optimizer buffers (Optimizer::state_keys).
  std::vector<std::string> state_keys(const std::string& param) const;

 private:
  struct Group {
    std::string name;
    ParamFilter match;
    std::optional<optim::Optimizer> optimizer;  // none: frozen
    bool checkpoint = true;
    std::vector<std::string> params;  // filled by bind
  };
  struct Polyak {
    std::string target, source;
    float tau = 0;
    std::vector<std::pair<std::string, std::string>> pairs;  // (target, source) parameters
  };
  static Group make(std::string name, ParamFilter match, std::optional<optim::Optimizer> optimizer,
                    bool checkpoint);
  ParamGroups& add(Group g);
  const Group* group_of(const std::string& param) const;
  std::string step_key(size_t trained_index) const;

  std::vector<Group> groups_;
  std::vector<size_t> trained_;  // indices of the trained groups
  std::vector<Polyak> polyak_;
  std::map<std::string, size_t> owner_;  // parameter -> its group (filled by bind)
  std::map<std::string, bool> split_;    // parameter -> split across the model shards
  float last_grad_norm_ = 0;
};

}  // namespace redco::train
