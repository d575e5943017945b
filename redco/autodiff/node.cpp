// Graph recording: grad mode, nodes, SavedOutput. The engine that runs the
// graph backwards is in engine.cpp.
#include "redco/autodiff/node.hpp"

#include <algorithm>

#include "redco/autodiff/autograd_meta.hpp"
#include "redco/autodiff/checkpoint.hpp"
#include "redco/autodiff/recording.hpp"

namespace redco {
namespace {
thread_local bool grad_mode_enabled = true;
std::atomic<uint64_t> next_sequence{1};
thread_local detail::CaptureScope* t_capture = nullptr;
thread_local detail::Substitution* t_substitution = nullptr;

std::unique_ptr<AutogradMetaInterface> make_autograd_meta() {
  return std::make_unique<AutogradMeta>();
}
// Core's Tensor::set_requires_grad makes autograd state through this factory.
[[maybe_unused]] const bool factory_installed =
    (set_autograd_meta_factory(&make_autograd_meta), true);

// Marks `t` as output `slot` of `node`, requiring a gradient or not.
void attach(const Tensor& t, std::shared_ptr<Node> node, int slot, bool requires_grad = true) {
  AutogradMeta& m = ensure_autograd_meta(t);
  m.grad_fn = std::move(node);
  m.output_nr = slot;
  m.set_requires_grad(requires_grad);
}
}  // namespace

bool GradMode::enabled() { return grad_mode_enabled; }
void GradMode::set(bool on) { grad_mode_enabled = on; }

std::shared_ptr<Node> Node::make_leaf(const std::shared_ptr<TensorImpl>& leaf) {
  auto n = std::make_shared<Node>();
  n->is_leaf_ = true;
  n->leaf_ = leaf;
  n->output_meta_ = {{leaf->shape, leaf->dtype, leaf->storage->device}};
  return n;
}

bool needs_graph(const TensorList& inputs) {
  if (t_capture) [[unlikely]]
    detail::note_inputs(inputs);
  if (!GradMode::enabled()) return false;
  return std::any_of(inputs.begin(), inputs.end(),
                     [](const Tensor& t) { return t.requires_grad(); });
}

Edge edge_of(const Tensor& t) {
  if (!t.requires_grad()) return {};
  AutogradMeta& m = *autograd_meta(t);
  if (m.grad_fn) return {m.grad_fn, m.output_nr};
  if (!m.leaf_node) m.leaf_node = Node::make_leaf(t.impl_ptr());
  return {m.leaf_node, 0};
}

std::shared_ptr<Node> grad_fn_of(const Tensor& t) {
  const AutogradMeta* m = autograd_meta(t);
  return m ? m->grad_fn : nullptr;
}

TensorList record(const char* name, const TensorList& inputs, TensorList outputs,
                  Node::Backward backward) {
  if (!needs_graph(inputs)) return outputs;
  auto node = std::make_shared<Node>();
  node->name_ = name;
  node->seq_ = next_sequence.fetch_add(1);
  node->backward_ = std::move(backward);
  for (const Tensor& in : inputs) {
    node->inputs_.push_back(edge_of(detail::Substitution::of(in)));
    node->input_meta_.push_back(in.defined() ? TensorMeta{in.shape(), in.dtype(), in.device()}
                                             : TensorMeta{Shape{}, DType::f32, Device::cpu()});
  }
  for (size_t i = 0; i < outputs.size(); ++i) {
    const Tensor& out = outputs[i];
    REDCO_CHECK(!out.requires_grad() && out.is_leaf(),
                "op '{}' returned a tensor that already has autograd history", name);
    attach(out, node, int(i), is_floating(out.dtype()));
    node->output_meta_.push_back({out.shape(), out.dtype(), out.device()});
  }
  return outputs;
}

Tensor record(const char* name, const TensorList& inputs, Tensor output, Node::Backward backward) {
  return record(name, inputs, TensorList{std::move(output)}, std::move(backward))[0];
}

Tensor rejoin(Tensor values, std::shared_ptr<Node> node, int slot) {
  REDCO_CHECK(!values.requires_grad() && values.is_leaf(),
              "rejoin: the values already have autograd history");
  const bool floating = is_floating(values.dtype());
  attach(values, std::move(node), slot, floating);
  return values;
}

SavedOutput::SavedOutput(const Tensor& out) : data_(out.detach()) {
  if (const AutogradMeta* m = autograd_meta(out)) {
    node_ = m->grad_fn;
    slot_ = m->output_nr;
  }
}

Tensor SavedOutput::get() const {
  auto node = node_.lock();
  if (!node || !GradMode::enabled()) return data_;
  Tensor t = data_.detach();
  attach(t, std::move(node), slot_);
  return t;
}

namespace detail {

CaptureScope::CaptureScope(TensorList& seen) : previous_(t_capture), seen_(&seen) {
  thread_local uint64_t made = 0;
  id_ = ++made;
  t_capture = this;
}
CaptureScope::~CaptureScope() { t_capture = previous_; }
uint64_t capture_id() { return t_capture ? t_capture->id_ : 0; }

void note_inputs(const TensorList& inputs) {
  TensorList& seen = *t_capture->seen_;
  for (const Tensor& t : inputs) {
    if (!t.requires_grad()) continue;
    const bool known = std::any_of(seen.begin(), seen.end(),
                                   [&](const Tensor& s) { return s.impl_ptr() == t.impl_ptr(); });
    if (!known) seen.push_back(t);
  }
}

Substitution::Substitution(const TensorList& from, const TensorList& to)
    : previous_(t_substitution), from_(&from), to_(&to) {
  t_substitution = this;
}
Substitution::~Substitution() { t_substitution = previous_; }

const Tensor& Substitution::of(const Tensor& t) {
  const Substitution* s = t_substitution;
  if (!s || !t.defined()) [[likely]]
    return t;
  // Only the innermost one: a nested recomputation substitutes every tensor
  // its block reads from outside, those of the enclosing block included.
  for (size_t i = 0; i < s->from_->size(); ++i)
    if ((*s->from_)[i].impl_ptr() == t.impl_ptr()) return (*s->to_)[i];
  return t;
}

SavedInput::SavedInput(const Tensor& x) {
  const AutogradMeta* m = autograd_meta(x);
  if (m && m->recompute && m->grad_fn) {
    recompute_ = m->recompute;
    node_ = m->grad_fn;
    slot_ = m->output_nr;
  } else {
    value_ = x;
  }
}

Tensor SavedInput::get() const {
  if (!recompute_) return value_;
  Tensor t;
  {
    GradModeGuard off(false);  // values only; reconnected below when needed
    t = recompute_().detach();
  }
  auto node = node_.lock();
  if (node && GradMode::enabled()) attach(t, std::move(node), slot_);
  return t;
}

}  // namespace detail
}  // namespace redco
