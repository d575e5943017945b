// Reverse-mode engine: walks the recorded graph from the outputs back to the
// inputs, running each node's backward rule once all gradient contributions
// to its outputs have arrived. Nodes are numbered in creation order, and a
// node is always created after the nodes of its inputs, so visiting nodes in
// decreasing creation order is a valid reverse topological order.
#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "redco/autodiff/functional.hpp"
#include "redco/autodiff/node.hpp"
#include "redco/autodiff/recording.hpp"
#include "redco/ops/backend.hpp"

namespace redco {
class Engine;
namespace {
thread_local bool t_last_run = false;     // set around a rule that runs for the last time
thread_local Engine* t_engine = nullptr;  // the engine running the current rule
}  // namespace

bool detail::last_run_of_rule() { return t_last_run; }

class Engine {
 public:
  Engine(const GradOptions& o) : opts_(o), mode_(o.create_graph) {}

  // Runs backward from `roots` (with their gradients). If `targets` is empty,
  // gradients are accumulated into leaves; otherwise they are returned.
  TensorList run(const std::vector<Edge>& roots, const TensorList& root_grads,
                 const std::vector<Edge>& targets);

 private:
  void collect(const std::vector<Edge>& roots, const std::vector<Edge>& targets);
  void add_pending(const Edge& e, Tensor g);
  TensorList take_grads(Node* n);
  void accumulate_leaf(Node* n, Tensor g);
  void execute(Node* n, const TensorList& gouts);

 public:
  Tensor take_pending(const Node& n, int input);

 private:
  GradOptions opts_;
  GradModeGuard mode_;
  std::vector<Node*> order_;
  std::unordered_set<Node*> needed_;
  std::unordered_map<Node*, TensorList> pending_;
};

void Engine::collect(const std::vector<Edge>& roots, const std::vector<Edge>& targets) {
  std::vector<Node*> reach;
  std::unordered_set<Node*> seen;
  std::vector<Node*> stack;
  for (const Edge& r : roots)
    if (r.node && seen.insert(r.node.get()).second) stack.push_back(r.node.get());
  while (!stack.empty()) {
    Node* n = stack.back();
    stack.pop_back();
    reach.push_back(n);
    for (const Edge& e : n->inputs())
      if (e.node && seen.insert(e.node.get()).second) stack.push_back(e.node.get());
  }
  // Children before parents: a node is needed if it is a target or feeds one
  // (without targets, every reachable node is needed: gradients go to leaves).
  std::sort(reach.begin(), reach.end(),
            [](Node* a, Node* b) { return a->sequence() < b->sequence(); });
  std::unordered_set<Node*> target_nodes;
  for (const Edge& e : targets) target_nodes.insert(e.node.get());
  for (Node* n : reach) {
    bool need = targets.empty() || target_nodes.count(n);
    for (const Edge& e : n->inputs()) need = need || (e.node && needed_.count(e.node.get()));
    if (need) needed_.insert(n);
  }
  // Each node runs as soon as its last consumer has run: ordered by the
  // smallest sequence number among its consumers (its own for roots), later
  // first, ties by its own number. For nodes made during the forward pass this
  // is the usual reverse creation order; a node made *before* its consumers
  // (DataParallel's per-parameter "gradient ready" hook, recorded on the
  // parameters before the forward pass) no longer waits for the end of
  // backward, so its bucket's all-reduce starts while backward goes on.
  std::unordered_map<Node*, uint64_t> key;  // the smallest consumer's sequence number
  for (Node* n : reach) {
    if (!needed_.count(n)) continue;
    for (const Edge& e : n->inputs()) {
      if (!e.node || !needed_.count(e.node.get())) continue;
      auto [it, fresh] = key.try_emplace(e.node.get(), n->sequence());
      if (!fresh && it->second > n->sequence()) it->second = n->sequence();
    }
  }
  for (Node* n : reach)
    if (needed_.count(n)) key.try_emplace(n, n->sequence());  // roots: their own
  for (auto it = reach.rbegin(); it != reach.rend(); ++it)
    if (needed_.count(*it)) order_.push_back(*it);
  std::stable_sort(order_.begin(), order_.end(), [&](Node* a, Node* b) {
    const uint64_t ka = key.at(a), kb = key.at(b);
    return ka != kb ? ka > kb : a->sequence() > b->sequence();
  });
}

void Engine::add_pending(const Edge& e, Tensor g) {
  TensorList& slots = pending_[e.node.get()];
  if (slots.empty()) slots.resize(e.node->output_meta().size());
  Tensor& s = slots[size_t(e.slot)];
  if (!s.defined()) {
    s = std::move(g);
    return;
  }
  profile::Scope scope("grad_accumulate");
  // A partial sum nobody else can see (first-order backward, its own buffer)
  // takes the next contribution in place: no new buffer, one pass less.
  if (!opts_.create_graph && detail::owns_buffer(s) && s.shape() == g.shape() &&
      s.dtype() == g.dtype())
    kernels::add_inplace(s, g);
  else
    s = add(s, g);
}

Tensor Engine::take_pending(const Node& n, int input) {
  const Edge& e = n.inputs()[size_t(input)];
  if (opts_.create_graph || !e.node) return {};
  auto it = pending_.find(e.node.get());
  if (it == pending_.end()) return {};
  Tensor& s = it->second[size_t(e.slot)];
  if (!s.defined() || !detail::owns_buffer(s) || s.dtype() != DType::f32 ||
      s.shape() != n.input_meta()[size_t(input)].shape)
    return {};
  return std::move(s);  // the slot is empty until the rule returns the total
}

Tensor detail::take_pending_grad(const Node& self, int input) {
  return t_engine ? t_engine->take_pending(self, input) : Tensor();
}

TensorList Engine::take_grads(Node* n) {
  TensorList g;
  if (auto it = pending_.find(n); it != pending_.end()) {
    g = std::move(it->second);
    pending_.erase(it);
  }
  g.resize(n->output_meta().size());
  for (size_t i = 0; i < g.size(); ++i)
    if (!g[i].defined()) {  // no gradient flowed into this output: zeros where it lives
      const TensorMeta& m = n->output_meta()[i];
      g[i] = Tensor::zeros(m.shape, DType::f32, m.device);
    }
  return g;
}

void Engine::accumulate_leaf(Node* n, Tensor g) {
  auto impl = n->leaf_.lock();
  if (!impl) return;  // the leaf is gone: nobody can read its gradient
  Tensor leaf(impl);
  Tensor old = leaf.grad();
  if (!old.defined()) {
    // Keep the buffer if nothing else references it; else copy, so that
    // in-place accumulation later cannot write into another tensor.
    leaf.set_grad(opts_.create_graph || detail::owns_buffer(g) ? g : g.clone());
  } else if (opts_.create_graph) {
    leaf.set_grad(add(old, g));
  } else {
    kernels::add_inplace(old, g);
  }
}

void Engine::execute(Node* n, const TensorList& gouts) {
  REDCO_CHECK(n->backward_,
              "backward through op '{}' a second time, but its saved tensors were "
              "freed; pass retain_graph = true to the first backward",
              n->name());
  TensorList gins;
  const bool last_run = !opts_.retain_graph && !opts_.create_graph;
  {
    profile::Scope scope(n->name(), ".backward");
    struct Flag {  // restored on exit, also when the rule throws
      bool saved = t_last_run;
      Engine* saved_engine = t_engine;
      Flag(bool v, Engine* e) {
        t_last_run = v;
        t_engine = e;
      }
      ~Flag() {
        t_last_run = saved;
        t_engine = saved_engine;
      }
    } flag(last_run, this);
    gins = n->backward_(*n, gouts);
  }
  if (last_run) n->backward_ = nullptr;
  REDCO_CHECK(gins.size() == n->inputs().size(),
              "backward of '{}' returned {} gradients for {} inputs", n->name(), gins.size(),
              n->inputs().size());
  for (size_t i = 0; i < gins.size(); ++i) {
    const Edge& e = n->inputs()[i];
    if (!e.node || !needed_.count(e.node.get()) || !gins[i].defined()) continue;
    REDCO_CHECK(gins[i].shape() == n->input_meta()[i].shape,
                "backward of '{}' produced a gradient of shape {} for input {} of shape {}",
                n->name(), gins[i].shape(), i, n->input_meta()[i].shape);
    // A rule that makes its gradient on another device than its input's
    // (a CPU tensor for a GPU input) would fail later, far from the cause.
    REDCO_CHECK(gins[i].device() == n->input_meta()[i].device,
                "backward of '{}' produced a gradient on {} for input {}, which lives on {}",
                n->name(), gins[i].device().str(), i, n->input_meta()[i].device.str());
    add_pending(e, std::move(gins[i]));
  }
}

TensorList Engine::run(const std::vector<Edge>& roots, const TensorList& root_grads,
                       const std::vector<Edge>& targets) {
  collect(roots, targets);
  for (size_t i = 0; i < roots.size(); ++i)
    if (roots[i].node && needed_.count(roots[i].node.get())) add_pending(roots[i], root_grads[i]);
  TensorList result(targets.size());
  for (Node* n : order_) {
    if (!pending_.count(n)) continue;  // no gradient reached this node
    TensorList gouts = take_grads(n);
    for (size_t t = 0; t < targets.size(); ++t)
      if (targets[t].node.get() == n) result[t] = gouts[size_t(targets[t].slot)];
    if (n->is_leaf()) {
      if (targets.empty()) accumulate_leaf(n, std::move(gouts[0]));
      continue;
    }
    // A target whose inputs lead to no other target: its gradient is all we
    // wanted, and running (and freeing) its backward would be wasted work.
    const auto& ins = n->inputs();
    if (std::none_of(ins.begin(), ins.end(),
                     [&](const Edge& e) { return e.node && needed_.count(e.node.get()); }))
      continue;
    execute(n, gouts);
  }
  return result;
}

static TensorList default_grad_outputs(const TensorList& outputs, const TensorList& given) {
  if (!given.empty()) {
    REDCO_CHECK(given.size() == outputs.size(), "grad: {} grad_outputs for {} outputs",
                given.size(), outputs.size());
    for (size_t i = 0; i < given.size(); ++i)
      check_same_shape(outputs[i], given[i], "grad_outputs");
    return given;
  }
  TensorList g;
  for (const Tensor& o : outputs) {
    REDCO_CHECK(o.numel() == 1, "grad of a non-scalar output (shape {}) needs grad_outputs",
                o.shape());
    g.push_back(Tensor::full(o.shape(), 1.f, DType::f32, o.device()));  // the seed, on o's device
  }
  return g;
}

TensorList grad(const TensorList& outputs, const TensorList& inputs, const TensorList& grad_outputs,
                GradOptions options) {
  std::vector<Edge> roots, targets;
  for (const Tensor& o : outputs) {
    REDCO_CHECK(o.requires_grad(),
                "grad: an output does not require grad (was it computed from "
                "inputs with requires_grad, outside a NoGradGuard?)");
    roots.push_back(edge_of(o));
  }
  for (const Tensor& in : inputs) {
    REDCO_CHECK(in.requires_grad(),
                "grad: input {} does not require grad; call "
                "set_requires_grad() on it before computing the outputs",
                in.shape());
    targets.push_back(edge_of(in));
  }
  Engine engine(options);
  TensorList result = engine.run(roots, default_grad_outputs(outputs, grad_outputs), targets);
  for (size_t i = 0; i < result.size(); ++i) {
    if (result[i].defined()) continue;
    REDCO_CHECK(options.allow_unused,
                "grad: the outputs do not depend on input {} (shape {}); "
                "pass allow_unused = true to get an undefined gradient",
                i, inputs[i].shape());
  }
  return result;
}

void backward(const Tensor& output, const Tensor& grad_output, GradOptions options) {
  REDCO_CHECK(output.requires_grad(), "backward: the output does not require grad");
  TensorList g = default_grad_outputs(
      {output}, grad_output.defined() ? TensorList{grad_output} : TensorList{});
  Engine engine(options);
  engine.run({edge_of(output)}, g, {});
}

}  // namespace redco
