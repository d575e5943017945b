#include "redco/optim/optimizer.hpp"

#include <fmt/format.h>
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <functional>
#include <string_view>
#include <utility>

#include "redco/core/allocator.hpp"
#include "redco/core/error.hpp"
#include "redco/ops/backend.hpp"
#include "redco/ops/cpu/parallel.hpp"

namespace redco::optim {
namespace {

// Elements per task: large enough that a task's memory traffic dwarfs the
// scheduling cost; smaller tensors run inline.
constexpr int64_t kGrain = 1 << 14;

// Element loops over tensors: TBB chunks of kGrain (cpu::parallel_chunks).
template <typename F>
void for_range(int64_t n, F&& f) {
  cpu::parallel_chunks(n, kGrain, f);
}

// g *= s in place. A CPU gradient is scaled where it is, allocating nothing
// (an optimizer step must not); a device's through its kernels.
void scale_in_place(Tensor& g, float s) {
  if (!g.device().is_cpu()) {
    g.copy_from(kernels::binary_scalar(BinaryOp::mul, g, s));
    return;
  }
  float* x = g.data<float>();
  for_range(g.numel(), [x, s](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) x[i] *= s;
  });
}

// Throws naming the tensor unless it is a defined f32 tensor. The updates run
// on its device, through the backend (Backend::adam_update and friends).
void check_f32(const Tensor& t, const char* what, const std::string& name) {
  REDCO_CHECK(t.defined(), "optimizer: the {} '{}' is an undefined tensor", what, name);
  REDCO_CHECK(t.dtype() == DType::f32, "optimizer: the {} '{}' must be f32, got {} on {}", what,
              name, dtype_name(t.dtype()), t.device().str());
}

[[noreturn]] void fail_non_finite(const std::string& name, const Tensor& g) {
  const Tensor host = g.to(Device::cpu());  // the error path: one explicit copy
  const float* x = host.data<float>();
  int64_t i = 0;
  while (i < g.numel() && std::isfinite(x[i])) ++i;
  fail(
      "optimizer: the gradient of '{}' (shape {}) is not finite: element {} is {}, so the global "
      "gradient norm is undefined. No parameter, gradient or optimizer state was modified; "
      "lower the learning rate or look for an overflow in the loss",
      name, g.shape(), i, i < g.numel() ? x[i] : 0.f);
}

bool is_norm_component(std::string_view c) {
  if (c == "bias" || c.find("norm") != std::string_view::npos) return true;
  if (!c.starts_with("ln")) return false;
  return c.size() == 2 || c[2] == '_' || (c[2] >= '0' && c[2] <= '9');
}

}  // namespace

bool default_decay_mask(const std::string& name, const Shape& shape) {
  if (shape.rank() < 2) return false;
  std::string_view rest = name;
  while (true) {
    const size_t dot = rest.find('.');
    if (is_norm_component(rest.substr(0, dot))) return false;
    if (dot == std::string_view::npos) return true;
    rest.remove_prefix(dot + 1);
  }
}

double sum_of_squares(const Tensor& grad, const std::string& name) {
  check_f32(grad, "gradient", name);
  return kernels::sum_of_squares(grad);
}

GradNorm checked_global_norm(const ParamTree& grads) {
  double total = 0.0;
  for (const auto& [name, g] : grads) {
    const double ss = sum_of_squares(g, name);
    // A double sum of squared floats cannot overflow, so this is non-finite
    // exactly when some element is NaN or infinite.
    if (!std::isfinite(ss)) return {ss, &name};
    total += ss;
  }
  return {std::sqrt(total), nullptr};
}

double global_norm(const ParamTree& grads) {
  const GradNorm n = checked_global_norm(grads);
  if (n.non_finite) fail_non_finite(*n.non_finite, grads.at(*n.non_finite));
  return n.norm;
}

int64_t first_non_finite(const Tensor& t) {
  const Tensor f = t.to(Device::cpu()).to(DType::f32);
  const float* x = f.data<float>();
  for (int64_t i = 0; i < f.numel(); ++i)
    if (!std::isfinite(x[i])) return i;
  return -1;
}

float clip_by_global_norm(ParamTree& grads, float max_norm) {
  REDCO_CHECK(max_norm > 0.f, "clip_by_global_norm: max_norm must be > 0, got {}", max_norm);
  const double norm = global_norm(grads);
  if (norm > double(max_norm)) {
    const float scale = float(double(max_norm) / norm);
    for (auto& [name, g] : grads)  // in place: other holders of the gradient see it clipped
      scale_in_place(g, scale);
  }
  return float(norm);
}

// ---- Optimizer ---------------------------------------------------------------

struct Optimizer::Slot {
  Tensor buf[2];
  bool fresh = true;   // buffers not yet written by an update (SGD starts momentum at g)
  bool bound = false;  // decay decided and shapes checked against the parameter once
  bool decay = false;
};

Optimizer::Optimizer(Kind kind, Schedule schedule, float max_grad_norm)
    : kind_(kind), schedule_(std::move(schedule)), max_grad_norm_(max_grad_norm) {
  REDCO_CHECK(max_grad_norm >= 0.f,
              "optimizer: max_grad_norm must be >= 0 (0: no clipping), got {}", max_grad_norm);
}
Optimizer::Optimizer(Optimizer&&) noexcept = default;
Optimizer& Optimizer::operator=(Optimizer&&) noexcept = default;
Optimizer::~Optimizer() = default;

const char* Optimizer::kind_name() const {
  switch (kind_) {
    case Kind::sgd:
      return "sgd";
    case Kind::adam:
      return "adam";
    case Kind::adamw:
      return "adamw";
  }
  return "?";
}

int Optimizer::buffers_per_param() const {
  if (kind_ == Kind::sgd) return sgd_.momentum != 0.f ? 1 : 0;
  return 2;
}

const char* Optimizer::buffer_name(int i) const {
  if (kind_ == Kind::sgd) return "momentum";
  return i == 0 ? "m" : "v";
}

void Optimizer::check_trees(const ParamTree& params, const ParamTree& grads) const {
  for (const auto& [name, g] : grads) {
    const auto it = params.find(name);
    REDCO_CHECK(it != params.end(),
                "optimizer step: the gradient '{}' (shape {}) has no parameter of that name", name,
                g.shape());
    REDCO_CHECK(it->second.shape() == g.shape(),
                "optimizer step: the parameter '{}' has shape {} but its gradient has shape {}",
                name, it->second.shape(), g.shape());
    check_f32(it->second, "parameter", name);
    check_f32(g, "gradient", name);
    REDCO_CHECK(it->second.device() == g.device(),
                "optimizer step: the parameter '{}' is on {} but its gradient on {}", name,
                it->second.device().str(), g.device().str());
  }
  if (grads.size() == params.size()) return;
  for (const auto& [name, p] : params)
    REDCO_CHECK(grads.count(name),
                "optimizer step: the parameter '{}' (shape {}) has no gradient; pass the "
                "optimizer only the parameters it trains",
                name, p.shape());
}

Optimizer::Slot& Optimizer::slot_for(const std::string& name, const Tensor& param) {
  auto it = slots_.find(name);
  if (it == slots_.end()) {
    auto slot = std::make_unique<Slot>();
    CachingAllocator::LongLivedScope long_lived;  // not in the holes of this step's activations
    for (int i = 0; i < buffers_per_param(); ++i)
      slot->buf[i] = Tensor::zeros(param.shape(), DType::f32, param.device());
    it = slots_.emplace(name, std::move(slot)).first;
  }
  Slot& s = *it->second;
  for (int i = 0; i < buffers_per_param(); ++i)
    REDCO_CHECK(s.buf[i].shape() == param.shape(),
                "optimizer: the state '{}.{}.{}' has shape {} but the parameter has shape {} "
                "(state loaded from another model?)",
                kind_name(), buffer_name(i), name, s.buf[i].shape(), param.shape());
  if (!s.bound) {
    s.decay = kind_ == Kind::adamw ? bool(adam_.mask) && adam_.mask(name, param.shape()) : true;
    s.bound = true;
  }
  return s;
}

void Optimizer::step(ParamTree& params, const ParamTree& grads) {
  step(params, grads, global_norm(grads));  // throws, naming a non-finite gradient
}

void Optimizer::step(ParamTree& params, const ParamTree& grads, double norm) {
  profile::Scope scope("optimizer.step");
  check_trees(params, grads);
  REDCO_CHECK(std::isfinite(norm), "optimizer step: the global gradient norm is {}", norm);
  // Everything that can fail runs before the first parameter is touched.
  for (const auto& [name, p] : params) slot_for(name, p);
  last_grad_norm_ = float(norm);
  float gscale = 1.f;  // clipping is folded into the update instead of rewriting the gradients
  if (max_grad_norm_ > 0.f && norm > double(max_grad_norm_))
    gscale = float(double(max_grad_norm_) / norm);
  const float lr = schedule_(steps_);
  for (auto& [name, p] : params) update(*slots_.at(name), p, grads.at(name), lr, gscale);
  ++steps_;
}

void Optimizer::update(Slot& slot, Tensor& param, const Tensor& grad, float lr,
                       float gscale) const {
  if (kind_ == Kind::sgd) {
    Tensor none;
    kernels::sgd_update(param, grad, buffers_per_param() ? slot.buf[0] : none,
                        {lr, gscale, sgd_.weight_decay, sgd_.momentum, 1.f - sgd_.dampening,
                         sgd_.nesterov, slot.fresh});
  } else {
    // Bias corrections in double, as torch computes them (Python floats).
    const double t = double(steps_ + 1);
    const double bc1 = 1.0 - std::pow(double(adam_.b1), t);
    const double bc2 = 1.0 - std::pow(double(adam_.b2), t);
    const bool adamw = kind_ == Kind::adamw;
    AdamCoeffs c;
    c.gscale = gscale;
    c.l2 = adamw ? 0.f : adam_.weight_decay;
    c.keep = adamw && slot.decay ? float(1.0 - double(lr) * adam_.weight_decay) : 1.f;
    c.b1 = adam_.b1;
    c.one_minus_b1 = float(1.0 - double(adam_.b1));
    c.b2 = adam_.b2;
    c.one_minus_b2 = float(1.0 - double(adam_.b2));
    c.step_size = float(double(lr) / bc1);
    c.bc2_sqrt = float(std::sqrt(bc2));
    c.eps = adam_.eps;
    kernels::adam_update(param, grad, slot.buf[0], slot.buf[1], c);
  }
  slot.fresh = false;
}

ParamTree Optimizer::state() const {
  ParamTree out;
  const int64_t step = steps_;
  out.emplace("step", Tensor::from<int64_t>(std::span(&step, 1), Shape{}));
  for (const auto& [name, slot] : slots_)
    for (int i = 0; i < buffers_per_param(); ++i)
      out.emplace(fmt::format("{}.{}.{}", kind_name(), buffer_name(i), name), slot->buf[i]);
  return out;
}

std::vector<std::string> Optimizer::state_keys(const std::string& param) const {
  std::vector<std::string> out;
  for (int i = 0; i < buffers_per_param(); ++i)
    out.push_back(fmt::format("{}.{}.{}", kind_name(), buffer_name(i), param));
  return out;
}

void Optimizer::load_state(const ParamTree& state) {
  const auto step_it = state.find("step");
  REDCO_CHECK(step_it != state.end() && step_it->second.numel() == 1,
              "load_state: the state has no scalar 'step' entry (is it an optimizer state?)");
  const Tensor st = step_it->second.to(Device::cpu());  // a host scalar
  const int64_t step = st.dtype() == DType::i64   ? st.data<int64_t>()[0]
                       : st.dtype() == DType::i32 ? int64_t(st.data<int32_t>()[0])
                                                  : int64_t(std::llround(st.item()));
  REDCO_CHECK(step >= 0, "load_state: 'step' is {}, must be >= 0", step);

  // Validate every key before changing anything, so a bad state leaves this one intact.
  const std::string prefix = std::string(kind_name()) + ".";
  std::map<std::string, std::array<const Tensor*, 2>> found;
  for (const auto& [key, t] : state) {
    if (key == "step") continue;
    REDCO_CHECK(key.starts_with(prefix),
                "load_state: '{}' is not state of an {} optimizer (its keys are "
                "'{}<buffer>.<parameter>')",
                key, kind_name(), prefix);
    const std::string rest = key.substr(prefix.size());
    const size_t dot = rest.find('.');
    int idx = -1;
    for (int i = 0; i < buffers_per_param() && dot != std::string::npos; ++i)
      if (rest.compare(0, dot, buffer_name(i)) == 0) idx = i;
    REDCO_CHECK(idx >= 0, "load_state: '{}' names no buffer of this {} optimizer", key,
                kind_name());
    check_f32(t, "state", key);
    found[rest.substr(dot + 1)][size_t(idx)] = &t;
  }
  for (const auto& [name, bufs] : found)
    for (int i = 0; i < buffers_per_param(); ++i)
      REDCO_CHECK(bufs[size_t(i)] != nullptr, "load_state: '{}{}.{}' is missing", prefix,
                  buffer_name(i), name);

  std::map<std::string, std::unique_ptr<Slot>> slots;
  for (const auto& [name, bufs] : found) {
    auto slot = std::make_unique<Slot>();
    const auto old = slots_.find(name);
    for (int i = 0; i < buffers_per_param(); ++i) {
      const Tensor& src = *bufs[size_t(i)];
      // Reuse this optimizer's buffer when it fits: resuming allocates nothing new.
      if (old != slots_.end() && old->second->buf[i].shape() == src.shape()) {
        slot->buf[i] = old->second->buf[i];
        if (!slot->buf[i].same(src)) slot->buf[i].copy_from(src);
      } else {
        slot->buf[i] = src.clone();
      }
    }
    slot->fresh = false;
    slots.emplace(name, std::move(slot));
  }
  slots_ = std::move(slots);
  steps_ = step;
}

Optimizer sgd(Schedule schedule, SgdOptions options) {
  REDCO_CHECK(options.momentum >= 0.f, "sgd: momentum must be >= 0, got {}", options.momentum);
  REDCO_CHECK(!options.nesterov || (options.momentum > 0.f && options.dampening == 0.f),
              "sgd: Nesterov momentum needs momentum > 0 and dampening == 0, got momentum {} "
              "and dampening {}",
              options.momentum, options.dampening);
  Optimizer opt(Optimizer::Kind::sgd, std::move(schedule), options.max_grad_norm);
  opt.sgd_ = options;
  return opt;
}

namespace {
void check_adam(const char* who, float b1, float b2, float eps) {
  REDCO_CHECK(b1 >= 0.f && b1 < 1.f && b2 >= 0.f && b2 < 1.f,
              "{}: betas must be in [0, 1), got b1 = {} and b2 = {}", who, b1, b2);
  REDCO_CHECK(eps >= 0.f, "{}: eps must be >= 0, got {}", who, eps);
}
}  // namespace

Optimizer adam(Schedule schedule, AdamOptions options) {
  check_adam("adam", options.b1, options.b2, options.eps);
  Optimizer opt(Optimizer::Kind::adam, std::move(schedule), options.max_grad_norm);
  opt.adam_ = {.b1 = options.b1,
               .b2 = options.b2,
               .eps = options.eps,
               .weight_decay = options.weight_decay,
               .mask = nullptr,
               .max_grad_norm = options.max_grad_norm};
  return opt;
}

Optimizer adamw(Schedule schedule, AdamWOptions options) {
  check_adam("adamw", options.b1, options.b2, options.eps);
  Optimizer opt(Optimizer::Kind::adamw, std::move(schedule), options.max_grad_norm);
  opt.adam_ = std::move(options);
  return opt;
}

// ---- GradAccumulator ---------------------------------------------------------

GradAccumulator::GradAccumulator(int64_t k) : k_(k) {
  REDCO_CHECK(k >= 1, "GradAccumulator: k (micro-batches per step) must be >= 1, got {}", k);
}

bool GradAccumulator::add(const ParamTree& grads) {
  const bool first = pending_ == 0;
  if (sum_.empty()) {
    CachingAllocator::LongLivedScope long_lived;
    for (const auto& [name, g] : grads)
      sum_.emplace(name, Tensor::empty(g.shape(), DType::f32, g.device()));
  }
  REDCO_CHECK(grads.size() == sum_.size(),
              "GradAccumulator: got {} gradients, but the first micro-batch had {}", grads.size(),
              sum_.size());
  for (const auto& [name, g] : grads) {
    const auto it = sum_.find(name);
    REDCO_CHECK(it != sum_.end(),
                "GradAccumulator: the gradient '{}' was not in the first micro-batch", name);
    REDCO_CHECK(it->second.shape() == g.shape(),
                "GradAccumulator: the gradient '{}' has shape {} but had shape {} before", name,
                g.shape(), it->second.shape());
    check_f32(g, "gradient", name);
  }
  const float scale = float(1.0 / double(k_));
  for (const auto& [name, g] : grads) {
    Tensor& dst = sum_.at(name);
    if (!g.device().is_cpu()) {  // a device: through its kernels (one temporary each)
      const Tensor part = kernels::binary_scalar(BinaryOp::mul, g, scale);
      if (first)
        dst.copy_from(part);
      else
        kernels::add_inplace(dst, part);
      continue;
    }
    REDCO_CHECK(dst.device().is_cpu(),
                "GradAccumulator: the gradient '{}' moved to the CPU from {}", name,
                dst.device().str());
    const float* src = g.data<float>();
    float* out = dst.data<float>();
    // The first micro-batch of a group overwrites, so the buffers never need zeroing.
    for_range(g.numel(), [=](int64_t b, int64_t e) {
      if (first)
        for (int64_t i = b; i < e; ++i) out[i] = src[i] * scale;
      else
        for (int64_t i = b; i < e; ++i) out[i] += src[i] * scale;
    });
  }
  if (++pending_ < k_) return false;
  pending_ = 0;
  return true;
}

bool GradAccumulator::step(Optimizer& opt, ParamTree& params, const ParamTree& grads) {
  if (!add(grads)) return false;
  opt.step(params, sum_);
  return true;
}

}  // namespace redco::optim
