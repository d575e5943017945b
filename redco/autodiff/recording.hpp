#pragma once
// Helpers shared by the differentiable ops in ops_*.cpp (internal header).
#include <functional>
#include <memory>

#include "redco/autodiff/functional.hpp"
#include "redco/autodiff/node.hpp"

namespace redco::detail {

// Records an op whose backward rule needs the op's own output y. The output
// is handed to the rule through a SavedOutput (a plain capture would make the
// output own the node that owns the output: a reference cycle).
// rule: TensorList(const Node& self, const Tensor& y, const TensorList& grads)
template <typename Rule>
Tensor record_with_output(const char* name, const TensorList& inputs, Tensor out, Rule rule) {
  if (!needs_graph(inputs)) return out;
  auto saved = std::make_shared<SavedOutput>();
  out = record(name, inputs, std::move(out),
               [saved, rule = std::move(rule)](const Node& self, const TensorList& g) {
                 return rule(self, saved->get(), g);
               });
  *saved = SavedOutput(out);
  return out;
}

// An op's input, captured for its backward rule. An input that its producer
// can compute again from tensors it keeps anyway (a norm's output, see
// AutogradMeta::recompute) is held as that recipe instead of its values: the
// activation is freed after forward and recomputed in backward (one cheap
// pass; on GPT-2 the two norms of each block keep 12.6 MB less each).
class SavedInput {
 public:
  explicit SavedInput(const Tensor& x);
  // The input's values; under create_graph reconnected to its producer, so
  // higher-order gradients flow through it.
  Tensor get() const;

 private:
  Tensor value_;                       // when there is no recipe
  std::function<Tensor()> recompute_;  // otherwise
  std::weak_ptr<Node> node_;           // the producer (kept alive by the consumer's edge)
  int slot_ = 0;
};

// Under create_graph, a fused op's gradient is taken through `reference`, an
// equivalent composition of primitive ops applied to the op's (graph-connected)
// inputs; the result is itself differentiable to any order.
// Returns one gradient per input (undefined where self.needs_grad(i) is false).
TensorList reference_vjp(const Node& self, const TensorList& inputs, const Tensor& grad_out,
                         const std::function<Tensor(const TensorList&)>& reference);

// True while a backward rule runs with create_graph (grad mode is then on).
inline bool building_higher_order() { return GradMode::enabled(); }

// True while a backward rule runs for the last time: neither create_graph nor
// retain_graph, so the engine drops the rule (and what it captured) right
// after. A rule may then reuse a captured tensor's buffer for its gradient,
// if nothing else references that buffer (see owns_buffer).
bool last_run_of_rule();

// The gradient summed so far for input `input` of the running rule's node,
// handed over so that the rule adds its own part in place and returns the
// total; undefined (nothing taken) unless it is an f32 buffer of the input's
// shape that nothing else references, in a first-order backward.
Tensor take_pending_grad(const Node& self, int input);

// True when `t` is the only handle to its buffer.
inline bool owns_buffer(const Tensor& t) {
  return t.impl_ptr().use_count() == 1 && t.impl().storage.use_count() == 1;
}

// How many of `labels` are not ignore_index (the rows a mean loss divides by).
int64_t counted_labels(const Tensor& labels, int64_t ignore_index);

// Sums a broadcast gradient back to `shape` (a no-op when they already match).
inline Tensor unbroadcast(const Tensor& g, const Shape& shape) {
  return g.shape() == shape ? g : sum_to(g, shape);
}

}  // namespace redco::detail
