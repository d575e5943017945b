#include "redco/train/param_groups.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "redco/comm/comm.hpp"
#include "redco/core/error.hpp"
#include "redco/sched/task.hpp"

namespace redco::train {
namespace {

// "actor" claims "actor" and "actor.*"; "" claims everything.
ParamFilter prefix_filter(const std::string& part) {
  return [part](const std::string& name) {
    return part.empty() || name == part ||
           (name.size() > part.size() && name.starts_with(part) && name[part.size()] == '.');
  };
}

std::string group_name(const std::string& part) { return part.empty() ? "all" : part; }

}  // namespace

ParamGroups::Group ParamGroups::make(std::string name, ParamFilter match,
                                     std::optional<optim::Optimizer> optimizer, bool checkpoint) {
  Group g;
  g.name = std::move(name), g.match = std::move(match), g.optimizer = std::move(optimizer);
  g.checkpoint = checkpoint;
  return g;
}

namespace {}  // namespace

ParamGroups::ParamGroups(optim::Optimizer optimizer) {
  add(make("all", prefix_filter(""), std::move(optimizer), true));
}

ParamGroups& ParamGroups::add(Group g) {
  REDCO_CHECK(!g.name.empty() && g.name.find('.') == std::string::npos,
              "ParamGroups: the group name '{}' must be non-empty and have no '.' (it names the "
              "group's step count in checkpoints); give the filter form a plain name",
              g.name);
  for (const Group& h : groups_)
    REDCO_CHECK(h.name != g.name, "ParamGroups: two groups are named '{}'", g.name);
  groups_.push_back(std::move(g));
  return *this;
}

ParamGroups& ParamGroups::train(std::string part, optim::Optimizer optimizer) & {
  return add(make(group_name(part), prefix_filter(part), std::move(optimizer), true));
}
ParamGroups& ParamGroups::train(std::string name, ParamFilter filter,
                                optim::Optimizer optimizer) & {
  return add(make(std::move(name), std::move(filter), std::move(optimizer), true));
}
ParamGroups& ParamGroups::freeze(std::string part, FreezeOptions options) & {
  return add(make(group_name(part), prefix_filter(part), std::nullopt, options.checkpoint));
}
ParamGroups& ParamGroups::freeze(std::string name, ParamFilter filter, FreezeOptions options) & {
  return add(make(std::move(name), std::move(filter), std::nullopt, options.checkpoint));
}
ParamGroups& ParamGroups::polyak(std::string target, std::string source, float tau) & {
  REDCO_CHECK(tau >= 0.f && tau <= 1.f,
              "ParamGroups::polyak('{}', '{}'): tau must be in [0, 1], got {}", target, source,
              tau);
  polyak_.push_back({std::move(target), std::move(source), tau, {}});
  return *this;
}
ParamGroups&& ParamGroups::train(std::string part, optim::Optimizer optimizer) && {
  return std::move(train(std::move(part), std::move(optimizer)));
}
ParamGroups&& ParamGroups::train(std::string name, ParamFilter filter,
                                 optim::Optimizer optimizer) && {
  return std::move(train(std::move(name), std::move(filter), std::move(optimizer)));
}
ParamGroups&& ParamGroups::freeze(std::string part, FreezeOptions options) && {
  return std::move(freeze(std::move(part), options));
}
ParamGroups&& ParamGroups::freeze(std::string name, ParamFilter filter, FreezeOptions options) && {
  return std::move(freeze(std::move(name), std::move(filter), options));
}
ParamGroups&& ParamGroups::polyak(std::string target, std::string source, float tau) && {
  return std::move(polyak(std::move(target), std::move(source), tau));
}

void ParamGroups::bind(const ShardPlan& plan) {
  REDCO_CHECK(!groups_.empty(),
              "Trainer: ParamGroups declares no group; add .train(\"\", optimizer)");
  owner_.clear(), trained_.clear();
  for (Group& g : groups_) g.params.clear();
  std::map<std::string, const shard::ParamSplit*> splits;
  for (const shard::ParamSplit& s : plan) {
    splits.emplace(s.name, &s);
    split_.insert_or_assign(s.name, s.split_dim >= 0);
    const auto g = std::find_if(groups_.begin(), groups_.end(),
                                [&](const Group& h) { return h.match(s.name); });
    REDCO_CHECK(g != groups_.end(),
                "Trainer: no parameter group claims the parameter '{}'; add a group for it (or "
                ".train(\"\", optimizer) / .freeze(\"\") for all the rest)",
                s.name);
    g->params.push_back(s.name);
    owner_.emplace(s.name, size_t(g - groups_.begin()));
  }
  for (size_t i = 0; i < groups_.size(); ++i) {
    REDCO_CHECK(!groups_[i].params.empty(),
                "Trainer: the parameter group '{}' claims no parameter of the model (is the part "
                "named differently, or claimed by an earlier group?)",
                groups_[i].name);
    if (groups_[i].optimizer) trained_.push_back(i);
  }
  REDCO_CHECK(!trained_.empty(),
              "Trainer: every parameter group is frozen, so there is nothing to train; give at "
              "least one group an optimizer with .train(part, optimizer)");
  for (Polyak& p : polyak_) {
    p.pairs.clear();
    const ParamFilter in_target = prefix_filter(p.target), in_source = prefix_filter(p.source);
    size_t n_source = 0;
    for (const shard::ParamSplit& s : plan) n_source += in_source(s.name);
    for (const shard::ParamSplit& s : plan) {
      if (!in_target(s.name)) continue;
      const std::string src = p.source + s.name.substr(p.target.size());
      const auto it = splits.find(src);
      REDCO_CHECK(it != splits.end(),
                  "polyak('{}', '{}'): the target parameter '{}' has no source '{}'", p.target,
                  p.source, s.name, src);
      REDCO_CHECK(it->second->shape == s.shape && it->second->split_dim == s.split_dim,
                  "polyak('{}', '{}'): '{}' is {} (split dim {}) but '{}' is {} (split dim {})",
                  p.target, p.source, s.name, s.shape, s.split_dim, src, it->second->shape,
                  it->second->split_dim);
      REDCO_CHECK(groups_[owner_.at(s.name)].checkpoint,
                  "polyak('{}', '{}'): the target parameter '{}' is frozen with .checkpoint = "
                  "false, so a resumed run would lose its average; keep it in checkpoints",
                  p.target, p.source, s.name);
      REDCO_CHECK(!groups_[owner_.at(s.name)].optimizer,
                  "polyak('{}', '{}'): the target parameter '{}' is trained by the group '{}'; "
                  "freeze the target",
                  p.target, p.source, s.name, groups_[owner_.at(s.name)].name);
      p.pairs.emplace_back(s.name, src);
    }
    REDCO_CHECK(!p.pairs.empty() && p.pairs.size() == n_source,
                "polyak('{}', '{}'): the target has {} parameters and the source {}; both must "
                "be parts of the same structure",
                p.target, p.source, p.pairs.size(), n_source);
  }
}

const ParamGroups::Group* ParamGroups::group_of(const std::string& param) const {
  const auto it = owner_.find(param);
  return it == owner_.end() ? nullptr : &groups_[it->second];
}

bool ParamGroups::trained(const std::string& param) const {
  const Group* g = group_of(param);
  return g && g->optimizer;
}

std::vector<std::string> ParamGroups::trained_only(const std::vector<std::string>& order) const {
  std::vector<std::string> out;
  for (const std::string& n : order)
    if (trained(n)) out.push_back(n);
  return out;
}

ParamTree ParamGroups::trained_of(const ParamTree& params) const {
  ParamTree out;
  for (const size_t i : trained_)
    for (const std::string& n : groups_[i].params) out.emplace(n, params.at(n));
  return out;
}

ShardPlan ParamGroups::saved_plan(const ShardPlan& plan) const {
  ShardPlan out;
  for (const shard::ParamSplit& s : plan)
    if (const Group* g = group_of(s.name); !g || g->optimizer || g->checkpoint) out.push_back(s);
  return out;
}

ParamTree ParamGroups::saved_of(const ParamTree& params) const {
  ParamTree out;
  for (const auto& [n, t] : params)
    if (const Group* g = group_of(n); !g || g->optimizer || g->checkpoint) out.emplace(n, t);
  return out;
}

bool ParamGroups::step_all(ParamTree& params, const ParamTree& grads, double loss, comm::Comm* mp,
                           const StepScope& scope) {
  const size_t n = trained_.size();
  std::vector<double> split_sq(n), whole_sq(n);
  bool finite = std::isfinite(loss);
  for (size_t i = 0; i < n; ++i) {
    for (const std::string& name : groups_[trained_[i]].params) {
      double norm = 0;  // of this parameter's gradient
      if (scope.squares.empty()) {
        ParamTree one;
        one.emplace(name, grads.at(name));
        const optim::GradNorm g = optim::checked_global_norm(one);
        finite = finite && !g.non_finite;
        norm = g.norm;
      } else {
        norm = std::sqrt(scope.squares.at(name));  // as checked_global_norm forms it
        finite = finite && std::isfinite(norm);
      }
      (mp && split_.at(name) ? split_sq : whole_sq)[i] += norm * norm;
    }
  }
  if (mp) {
    // [n] summed over the group; a shard's non-finite loss or gradient makes it NaN everywhere.
    Tensor total = Tensor::empty(Shape{int64_t(n)});
    for (size_t i = 0; i < n; ++i)
      total.data<float>()[i] = finite ? float(split_sq[i]) : std::nanf("");
    sched::sync_wait(mp->all_reduce(total));
    for (size_t i = 0; i < n; ++i) split_sq[i] = double(total.data<float>()[i]);
  }
  double all_sq = 0;
  for (size_t i = 0; i < n; ++i) all_sq += split_sq[i] + whole_sq[i];
  if (!finite || !std::isfinite(all_sq)) return false;
  for (size_t i = 0; i < n; ++i) {
    Group& g = groups_[trained_[i]];
    ParamTree p, d;
    for (const std::string& name : g.params) {
      p.emplace(name, params.at(name));
      if (const auto it = grads.find(name); it != grads.end()) d.emplace(name, it->second);
    }
    if (scope.own_params) p = scope.own_params(p);
    if (scope.own_grads) d = scope.own_grads(d);
    // Every replica steps every group (maybe on no parameters), so its step
    // count and schedule advance alike.
    g.optimizer->step(p, d, std::sqrt(split_sq[i] + whole_sq[i]));
  }
  last_grad_norm_ = float(std::sqrt(all_sq));
  return true;
}

void ParamGroups::after_step(ParamTree& params) const {
  for (const Polyak& p : polyak_) {
    const float keep = 1.f - p.tau, take = p.tau;
    for (const auto& [target, source] : p.pairs) {
      Tensor& t = params.at(target);
      const Tensor& s = params.at(source);
      float* x = t.data<float>();
      const float* y = s.data<float>();
      for (int64_t k = 0; k < t.numel(); ++k) x[k] = keep * x[k] + take * y[k];
    }
  }
}

void ParamGroups::start_targets(ParamTree& params) const {
  for (const Polyak& p : polyak_)
    for (const auto& [target, source] : p.pairs) {
      Tensor& t = params.at(target);
      const Tensor& s = params.at(source);
      std::copy_n(s.data<float>(), s.numel(), t.data<float>());
    }
}

optim::Optimizer& ParamGroups::optimizer(const std::string& name) {
  return const_cast<optim::Optimizer&>(std::as_const(*this).optimizer(name));
}

const optim::Optimizer& ParamGroups::optimizer(const std::string& name) const {
  for (const Group& g : groups_)
    if (g.optimizer && (name.empty() || g.name == name)) return *g.optimizer;
  fail("ParamGroups: no trained group named '{}'", name);
}

float ParamGroups::lr() const { return optimizer().lr(); }
int64_t ParamGroups::steps() const { return optimizer().steps(); }

std::string ParamGroups::step_key(size_t i) const {
  return single() ? "step" : "step." + groups_[trained_[i]].name;
}

ParamTree ParamGroups::state() const {
  if (single()) return groups_[0].optimizer->state();
  ParamTree out;
  for (size_t i = 0; i < trained_.size(); ++i) {
    for (auto& [k, t] : groups_[trained_[i]].optimizer->state())
      out.emplace(k == "step" ? step_key(i) : k, t);
  }
  return out;
}

std::vector<std::string> ParamGroups::state_keys(const std::string& param) const {
  const Group* g = group_of(param);
  return g && g->optimizer ? g->optimizer->state_keys(param) : std::vector<std::string>{};
}

// Each optimizer gets its own buffers (those of its parameters) and its step.
void ParamGroups::load_state(const ParamTree& state) {
  if (single()) return groups_[0].optimizer->load_state(state);
  for (size_t i = 0; i < trained_.size(); ++i) {
    const Group& g = groups_[trained_[i]];
    ParamTree mine;
    const auto step = state.find(step_key(i));
    REDCO_CHECK(step != state.end(),
                "resume: the optimizer state has no '{}' (the step count of group '{}'); was it "
                "written with other parameter groups?",
                step_key(i), g.name);
    mine.emplace("step", step->second);
    for (const auto& [k, t] : state) {
      const size_t first = k.find('.'), second = k.find('.', first + 1);
      if (first == std::string::npos || second == std::string::npos || k.starts_with("step."))
        continue;
      const auto owner = owner_.find(k.substr(second + 1));
      if (owner != owner_.end() && owner->second == trained_[i]) mine.emplace(k, t);
    }
    groups_[trained_[i]].optimizer->load_state(mine);
  }
}

}  // namespace redco::train
