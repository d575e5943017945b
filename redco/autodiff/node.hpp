#pragma once
// The autograd graph: each differentiable op that sees an input requiring a
// gradient records a Node holding its backward rule and an Edge to the node
// that produced each input. Backward rules are written with differentiable
// ops, so running them with grad mode on (create_graph) records a graph of
// the gradient itself: gradients of gradients (Hessian-vector products, MAML).
#include <atomic>
#include <functional>
#include <memory>
#include <vector>

#include "redco/core/tensor.hpp"

namespace redco {

class Node;

// Grad mode is per thread; ops record nodes only while it is on.
class GradMode {
 public:
  static bool enabled();
  static void set(bool on);
};
class GradModeGuard {
 public:
  explicit GradModeGuard(bool on) : prev_(GradMode::enabled()) { GradMode::set(on); }
  ~GradModeGuard() { GradMode::set(prev_); }
  GradModeGuard(const GradModeGuard&) = delete;
  GradModeGuard& operator=(const GradModeGuard&) = delete;

 private:
  bool prev_;
};
// Inside this scope no op records history (inference, optimizer updates).
class NoGradGuard : public GradModeGuard {
 public:
  NoGradGuard() : GradModeGuard(false) {}
};

struct Edge {
  std::shared_ptr<Node> node;  // null: this input needs no gradient
  int slot = 0;                // which output of `node`
};

struct TensorMeta {
  Shape shape;
  DType dtype;
  Device device;  // where a zero gradient standing in for this tensor's must live
};

class Node {
 public:
  // Receives one gradient per output (zeros where none flowed) and returns one
  // per input (undefined where !self.needs_grad(i)).
  using Backward = std::function<TensorList(const Node& self, const TensorList& grad_outputs)>;

  static std::shared_ptr<Node> make_leaf(const std::shared_ptr<TensorImpl>& leaf);

  const char* name() const { return name_; }
  uint64_t sequence() const { return seq_; }
  bool is_leaf() const { return is_leaf_; }
  bool needs_grad(int input) const { return bool(inputs_[size_t(input)].node); }
  const std::vector<Edge>& inputs() const { return inputs_; }
  const std::vector<TensorMeta>& input_meta() const { return input_meta_; }
  const std::vector<TensorMeta>& output_meta() const { return output_meta_; }

 private:
  friend TensorList record(const char*, const TensorList&, TensorList, Backward);
  friend class Engine;
  const char* name_ = "leaf";
  uint64_t seq_ = 0;  // creation order; leaves are 0 (they run last)
  bool is_leaf_ = false;
  std::vector<Edge> inputs_;
  std::vector<TensorMeta> input_meta_, output_meta_;
  Backward backward_;
  std::weak_ptr<TensorImpl> leaf_;
};

// The edge through which a gradient for `t` flows (null node: none needed).
Edge edge_of(const Tensor& t);
// The node that produced `t`; null for a leaf or a tensor outside any graph.
std::shared_ptr<Node> grad_fn_of(const Tensor& t);

// True when grad mode is on and some input requires a gradient.
bool needs_graph(const TensorList& inputs);
// Records `outputs` as computed by op `name` from `inputs` with the given
// backward rule (if needs_graph(inputs)); returns the outputs, now carrying
// their grad_fn. Backward rules must capture the inputs they need by value and
// an op's own outputs only through SavedOutput (a plain capture would be a
// reference cycle).
TensorList record(const char* name, const TensorList& inputs, TensorList outputs,
                  Node::Backward backward);
Tensor record(const char* name, const TensorList& inputs, Tensor output, Node::Backward backward);

// `values` as one more handle of output `slot` of `node` (values equal to
// that output's: a ZeRO-3 parameter gathered again for a second read).
// Gradients reaching either handle are summed at the node, as for one
// tensor read twice.
Tensor rejoin(Tensor values, std::shared_ptr<Node> node, int slot);

// An op's own output, captured for its backward rule without owning the node.
class SavedOutput {
 public:
  SavedOutput() = default;
  explicit SavedOutput(const Tensor& out);
  // The saved value; while grad mode is on (create_graph) it is reconnected
  // to the node that produced it, so higher-order gradients flow through it.
  Tensor get() const;

 private:
  Tensor data_;
  std::weak_ptr<Node> node_;
  int slot_ = 0;
};

// Designated initialisers name these fields in the order declared below (C++20 rule).
struct GradOptions {
  bool create_graph = false;  // record the backward pass (for higher-order gradients)
  bool retain_graph =
      false;  // keep saved tensors so backward can run again (implied by create_graph)
  bool allow_unused = false;  // an input the outputs do not depend on gets an undefined gradient
};

// Gradients of sum_k <outputs[k], grad_outputs[k]> with respect to `inputs`
// (grad_outputs default to ones for scalar outputs). Leaves' .grad() is untouched.
TensorList grad(const TensorList& outputs, const TensorList& inputs,
                const TensorList& grad_outputs = {}, GradOptions options = {});
// Accumulates d output / d leaf into every reachable leaf's .grad() buffer.
void backward(const Tensor& output, const Tensor& grad_output = {}, GradOptions options = {});

}  // namespace redco
