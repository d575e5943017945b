#pragma once
// Activation recomputation (gradient checkpointing). checkpoint(f) runs f
// without recording it: nothing f computes is kept for backward, only the
// tensors f reads from outside (its inputs and parameters, which live on
// anyway). Backward runs f again with grad mode on and differentiates that
// run, so a stack of checkpointed blocks holds one block's activations at a
// time instead of all of them, for one more forward pass of each block.
//
// The tensors f reads that require a gradient are found as f runs (every
// differentiable op reports its inputs), so f may capture them freely; they
// become the inputs of one recorded node whose backward rule is the
// recomputation. The gradients equal those of calling f directly, bit for bit,
// provided f computes the same values when run again: any randomness it draws
// must be keyed by something f replays (redco's dropout is keyed by the
// forward context's call counter, which nn::checkpoint restores).
#include <functional>

#include "redco/autodiff/node.hpp"

namespace redco {

// Runs forward() now and recompute() in backward; both must compute the same
// values from the same outside tensors (the second form exists for callers
// whose first run advances state that a replay must not touch, as the nn
// layer's forward context). recompute runs during backward, after the caller's
// scope is gone: it must own what it reads (capture by value, not [&]).
// Without grad mode, forward() runs as is.
// Gradients of gradients (create_graph) through a checkpoint are refused.
Tensor checkpoint(const std::function<Tensor()>& forward, std::function<Tensor()> recompute);
inline Tensor checkpoint(const std::function<Tensor()>& f) { return checkpoint(f, f); }

namespace detail {

// While a CaptureScope is alive on a thread, every tensor requiring a
// gradient that an op on that thread receives is added to `seen` (once).
class CaptureScope {
 public:
  explicit CaptureScope(TensorList& seen);
  ~CaptureScope();
  CaptureScope(const CaptureScope&) = delete;
  CaptureScope& operator=(const CaptureScope&) = delete;

 private:
  CaptureScope* previous_;
  TensorList* seen_;
  uint64_t id_;
  friend uint64_t capture_id();
  friend void note_inputs(const TensorList& inputs);
};
void note_inputs(const TensorList& inputs);  // called by needs_graph
// The innermost CaptureScope alive on this thread (a checkpointed block's
// first run), by a number no other scope of the thread has had; 0 when none.
uint64_t capture_id();

// While a Substitution is alive on a thread, an op recording a node links an
// input that is `from[i]` (the same tensor object) to `to[i]`'s history
// instead: a recomputation's graph then ends at fresh leaves, not at the
// outer graph.
class Substitution {
 public:
  Substitution(const TensorList& from, const TensorList& to);
  ~Substitution();
  Substitution(const Substitution&) = delete;
  Substitution& operator=(const Substitution&) = delete;
  // The tensor whose history stands for `t` (t itself when not substituted).
  static const Tensor& of(const Tensor& t);

 private:
  Substitution* previous_;
  const TensorList* from_;
  const TensorList* to_;
};

}  // namespace detail
}  // namespace redco
