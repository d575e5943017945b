#pragma once
// Optimizers over parameter trees (redco::ParamTree, dotted names), with the
// update rules of torch.optim (SGD with momentum / Nesterov, Adam, AdamW),
// global-norm gradient clipping and gradient accumulation.
//
//   auto opt = optim::adamw(optim::warmup(100, optim::cosine(3e-4f, 900)),
//                           {.weight_decay = 0.1f, .max_grad_norm = 1.f});
//   for (...) {
//     auto [loss, grads] = value_and_grad(loss_fn, params);
//     opt.step(params, grads);  // updates the tensors in `params` in place
//   }
//
// A step updates each parameter's data in place with one fused loop over its
// elements (parallel for large tensors). State buffers are created on the
// first step, so later steps allocate nothing (the CachingAllocator's
// system_allocs stays flat), and tensors that share a parameter's storage see
// the update.
//
// Every step first computes the global gradient norm (one read pass, in
// double): it is reported by last_grad_norm(), it drives clipping, and a
// non-finite gradient throws a redco::Error naming the parameter before
// anything is modified, so a diverging run stops with parameters and state
// intact.
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "redco/autodiff/value_and_grad.hpp"
#include "redco/core/tensor.hpp"
#include "redco/optim/schedule.hpp"

namespace redco::optim {

// Which parameters AdamW decays: true = apply weight decay.
using DecayMask = std::function<bool(const std::string& name, const Shape& shape)>;

// The default AdamW mask: decays tensors of rank >= 2 (weight matrices,
// embeddings, convolution kernels) and skips
//   * tensors of rank 0 or 1 (biases, norm gains and offsets, scalars), and
//   * any tensor whose name has a dotted component that is "bias", contains
//     "norm" (layer_norm, rmsnorm, norm1), or is "ln" / "ln" followed by '_'
//     or a digit (GPT-2's ln_1, ln_f; ln1).
bool default_decay_mask(const std::string& name, const Shape& shape);

// Designated initialisers name these fields in the order declared below (C++20 rule).
struct SgdOptions {
  float momentum = 0.f;
  float dampening = 0.f;
  bool nesterov = false;      // needs momentum > 0 and dampening == 0 (as torch)
  float weight_decay = 0.f;   // L2: wd * p is added to the gradient
  float max_grad_norm = 0.f;  // > 0: clip the global gradient norm to this first
};

// Designated initialisers name these fields in the order declared below (C++20 rule).
struct AdamOptions {
  float b1 = 0.9f;
  float b2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.f;  // L2 (torch.optim.Adam): wd * p is added to the gradient
  float max_grad_norm = 0.f;
};

// Designated initialisers name these fields in the order declared below (C++20 rule).
struct AdamWOptions {
  float b1 = 0.9f;
  float b2 = 0.999f;
  float eps = 1e-8f;
  float weight_decay = 0.01f;  // decoupled: p *= 1 - lr * wd, before the Adam update
  DecayMask mask = default_decay_mask;
  float max_grad_norm = 0.f;
};

// The global L2 norm of all gradients, accumulated in double. Throws a
// redco::Error naming the first parameter (in key order) whose gradient has a
// NaN or infinity.
double global_norm(const ParamTree& grads);

// The same single pass, reporting instead of throwing: `non_finite` is the
// name of the first gradient (in key order) holding a NaN or infinity, or
// null (then `norm` is the global norm). The Trainer decides what a
// non-finite gradient means (stop or skip the step) from this, so checking
// costs nothing beyond the norm every step computes anyway.
struct GradNorm {
  double norm = 0;
  const std::string* non_finite = nullptr;  // points into the tree's keys
};
GradNorm checked_global_norm(const ParamTree& grads);
// The sum of squares of one gradient's elements in double, bit for bit as
// checked_global_norm forms it for each tensor before adding them in key
// order (so a norm over gradients spread across ranks can be formed exactly).
double sum_of_squares(const Tensor& grad, const std::string& name);

// The index of the first NaN or infinite element of an f32 tensor, or -1.
int64_t first_non_finite(const Tensor& t);

// Scales every gradient in place by max_norm / norm when the global norm
// exceeds max_norm (> 0), so the result has norm max_norm; does nothing
// otherwise. Returns the norm before clipping. Unlike torch's
// clip_grad_norm_ there is no 1e-6 added to the norm, and a non-finite norm
// throws (see global_norm) instead of spreading NaN into every gradient.
float clip_by_global_norm(ParamTree& grads, float max_norm);

class Optimizer {
 public:
  enum class Kind { sgd, adam, adamw };

  // Applies one update: grads must have exactly the keys of params with the
  // same shapes (pass only the trainable parameters). Parameters are f32 on
  // the CPU and are updated in place.
  void step(ParamTree& params, const ParamTree& grads);
  // The same with the global gradient norm given, for gradients spread over
  // several processes (model shards), whose norm only the caller can form;
  // `grads` must be finite (step(params, grads) checks and names offenders).
  void step(ParamTree& params, const ParamTree& grads, double global_norm);

  int64_t steps() const { return steps_; }                  // optimizer steps taken
  float lr() const { return schedule_(steps_); }            // the rate the next step uses
  float last_grad_norm() const { return last_grad_norm_; }  // before clipping, last step
  Kind kind() const { return kind_; }
  const char* kind_name() const;  // "sgd", "adam", "adamw"
  const Schedule& schedule() const { return schedule_; }

  // Checkpoint state: "step" (an i64 scalar) and one tensor per buffer,
  // named "<kind>.<buffer>.<param>": "sgd.momentum.<p>", "adam.m.<p>",
  // "adam.v.<p>", "adamw.m.<p>", "adamw.v.<p>". The buffers are shared with
  // the optimizer, not copied: write them out (or clone) before the next step.
  ParamTree state() const;
  // Restores a state() of an optimizer of the same kind (buffers are copied
  // in, so `state` can be freed afterwards). Unknown keys, another kind's
  // keys or a missing "step" throw; a parameter with no buffers in `state`
  // starts fresh at its next step. Shapes are checked against the
  // parameters at the next step.
  void load_state(const ParamTree& state);
  // The keys state() gives the buffers of parameter `param` (none for SGD
  // without momentum): what a partitioned state (ZeRO) gathers for it.
  std::vector<std::string> state_keys(const std::string& param) const;

  Optimizer(Optimizer&&) noexcept;
  Optimizer& operator=(Optimizer&&) noexcept;
  ~Optimizer();

 private:
  struct Slot;  // per-parameter buffers
  friend Optimizer sgd(Schedule, SgdOptions);
  friend Optimizer adam(Schedule, AdamOptions);
  friend Optimizer adamw(Schedule, AdamWOptions);
  Optimizer(Kind kind, Schedule schedule, float max_grad_norm);

  int buffers_per_param() const;
  const char* buffer_name(int i) const;
  Slot& slot_for(const std::string& name, const Tensor& param);
  void check_trees(const ParamTree& params, const ParamTree& grads) const;
  void update(Slot& slot, Tensor& param, const Tensor& grad, float lr, float gscale) const;

  Kind kind_;
  Schedule schedule_;
  float max_grad_norm_ = 0.f;
  SgdOptions sgd_;
  AdamWOptions adam_;  // Adam and AdamW (Adam's weight decay is L2, stored here too)
  int64_t steps_ = 0;
  float last_grad_norm_ = 0.f;
  std::map<std::string, std::unique_ptr<Slot>> slots_;
};

Optimizer sgd(Schedule schedule, SgdOptions options = {});
Optimizer adam(Schedule schedule, AdamOptions options = {});
Optimizer adamw(Schedule schedule, AdamWOptions options = {});

// Gradient accumulation: k micro-batches make one optimizer step. Gradients
// are averaged, not summed (each is scaled by 1/k as it is added), so with a
// per-micro-batch mean loss over equal-sized micro-batches the step equals
// one step on the k-times-larger batch, and the learning rate needs no
// change. The schedule advances once per optimizer step, not per micro-batch.
// Buffers are created by the first micro-batch and reused afterwards.
class GradAccumulator {
 public:
  explicit GradAccumulator(int64_t k);

  // Adds one micro-batch's gradients (the same keys and shapes each time).
  // Returns true when this was the k-th: mean() then holds the average and
  // the next add() starts a new group.
  bool add(const ParamTree& grads);
  // add(), and on the k-th micro-batch opt.step(params, mean()). Returns true
  // when a step was taken.
  bool step(Optimizer& opt, ParamTree& params, const ParamTree& grads);

  // The average of the last complete group (the buffers themselves), valid
  // from an add() that returned true until the next add().
  const ParamTree& mean() const { return sum_; }
  int64_t k() const { return k_; }
  int64_t pending() const { return pending_; }  // micro-batches since the last complete group

 private:
  int64_t k_;
  int64_t pending_ = 0;
  ParamTree sum_;  // running sum of g / k
};

}  // namespace redco::optim
