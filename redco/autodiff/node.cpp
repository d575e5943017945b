// Graph recording: grad mode, nodes, SavedOutput. The engine that runs the
// graph backwards is in engine.cpp.
#include "redco/autodiff/node.hpp"

#include <algorithm>

#include "redco/autodiff/checkpoint.hpp"
#include "redco/autodiff/recording.hpp"

namespace redco {
namespace {
thread_local bool grad_mode_enabled = true;
std::atomic<uint64_t> next_sequence{1};
thread_local detail::CaptureScope* t_capture = nullptr;
thread_local detail::Substitution* t_substitution = nullptr;
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
  if (t.grad_fn()) return {t.grad_fn(), t.output_nr()};
  return {t.leaf_node(), 0};
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
    TensorImpl& impl = outputs[i].impl();
    REDCO_CHECK(!impl.grad_fn && !impl.requires_grad,
                "op '{}' returned a tensor that already has autograd history", name);
    impl.grad_fn = node;
    impl.output_nr = int(i);
    impl.requires_grad = is_floating(impl.dtype);
    node->output_meta_.push_back({impl.shape, impl.dtype, impl.storage->device});
  }
  return outputs;
}

Tensor record(const char* name, const TensorList& inputs, Tensor output, Node::Backward backward) {
  return record(name, inputs, TensorList{std::move(output)}, std::move(backward))[0];
}

SavedOutput::SavedOutput(const Tensor& out)
    : data_(out.detach()),
      node_(out.defined() ? out.grad_fn() : nullptr),
      slot_(out.defined() ? out.output_nr() : 0) {}

Tensor SavedOutput::get() const {
  auto node = node_.lock();
  if (!node || !GradMode::enabled()) return data_;
  Tensor t = data_.detach();
  t.impl().grad_fn = node;
  t.impl().output_nr = slot_;
  t.impl().requires_grad = true;
  return t;
}

namespace detail {

CaptureScope::CaptureScope(TensorList& seen) : previous_(t_capture), seen_(&seen) {
  t_capture = this;
}
CaptureScope::~CaptureScope() { t_capture = previous_; }

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
  if (x.defined() && x.impl().recompute && x.grad_fn()) {
    recompute_ = x.impl().recompute;
    node_ = x.grad_fn();
    slot_ = x.output_nr();
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
  if (node && GradMode::enabled()) {
    t.impl().grad_fn = node;
    t.impl().output_nr = slot_;
    t.impl().requires_grad = true;
  }
  return t;
}

}  // namespace detail
}  // namespace redco
