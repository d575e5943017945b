// The optimizer update across the mesh (mesh_update.hpp).
#include "redco/train/mesh_update.hpp"

#include <algorithm>
#include <cmath>
#include <span>

#include "redco/comm/comm.hpp"
#include "redco/comm/mesh.hpp"
#include "redco/core/error.hpp"
#include "redco/sched/task.hpp"
#include "redco/train/param_gather.hpp"

namespace redco::train {

MeshUpdate::MeshUpdate(Deployer& deployer, const ShardPlan& plan, ParamGroups& groups)
    : deployer_(&deployer), plan_(&plan), groups_(&groups) {
  if (deployer.zero_stage() == 0 || deployer.dp_size() == 1) return;
  // Frozen parameters have no gradient and no state to partition.
  ShardPlan trained;
  for (const shard::ParamSplit& s : plan)
    if (groups.single() || groups.trained(s.name)) trained.push_back(s);
  zero_ = std::make_unique<ZeroPartition>(trained, deployer.dp_size(), deployer.dp_rank());
}

MeshUpdate::~MeshUpdate() = default;

bool MeshUpdate::zero3() const { return zero_ && deployer_->zero_stage() >= 3; }

ParamTree MeshUpdate::keep_parts(const ParamTree& local) {
  return zero3() ? zero_->keep_parts(local) : local;
}

ParamTree MeshUpdate::gathered(const ParamTree& params) const {
  if (!zero3()) return params;
  ParamTree out;
  for (const auto& [name, t] : params)
    out.emplace(name, zero_->has(name)
                          ? ParamGather::gather(*zero_, name, t, deployer_->mesh().dp_comm())
                          : t);
  return out;
}

// The non-finite check is the global gradient norm the step needs anyway.
// With model shards the optimizer is handed the global norm, so its clipping
// and last_grad_norm() see the whole model, and every shard sees a NaN or
// infinity of any other.
bool MeshUpdate::apply(ParamTree& params, const ParamTree& grads, double loss, FitDriver& run,
                       bool overlap_share) {
  settle();  // the previous step's parameters, before this one writes them
  if (!groups_->single()) return apply_groups(params, grads, loss, run);
  const bool zero2 = deployer_->zero_stage() >= 2 && zero_;
  if (deployer_->n_model_shards() == 1) {
    const optim::GradNorm n = optim::checked_global_norm(grads);
    // ZeRO-2: this replica holds its own gradients only; the norm is formed
    // over all replicas' (a non-finite one anywhere makes it NaN).
    const double sq = zero2 ? zero_->squared_norm(grads, deployer_->mesh().dp_comm()) : 0;
    if (!std::isfinite(loss) || n.non_finite || !std::isfinite(sq))
      return run.non_finite(loss, n.non_finite, grads, params), false;
    optimizer_step(params, grads, zero2 ? std::sqrt(sq) : n.norm, overlap_share);
    return true;
  }
  double split_sq = 0, whole_sq = 0;
  for (const shard::ParamSplit& s : *plan_) {
    if (zero2 && !grads.count(s.name)) continue;  // another replica's
    const Tensor g = grads.at(s.name).to(DType::f32);
    (s.split_dim >= 0 ? split_sq : whole_sq) += optim::sum_of_squares(g, s.name);
  }
  if (zero2) split_sq = dp_sum(split_sq), whole_sq = dp_sum(whole_sq);
  // [1] summed over the group; a shard's non-finite loss or gradient makes it NaN everywhere.
  Tensor total =
      Tensor::full(Shape{1}, std::isfinite(loss + whole_sq) ? float(split_sq) : std::nanf(""));
  sched::sync_wait(deployer_->mesh().mp_comm().all_reduce(total));
  const double global_sq = double(total.data<float>()[0]) + whole_sq;
  if (!std::isfinite(global_sq) || !std::isfinite(loss)) {
    const optim::GradNorm n = optim::checked_global_norm(grads);  // this shard's offender, if any
    return run.non_finite(loss, n.non_finite, grads, params), false;
  }
  optimizer_step(params, grads, std::sqrt(global_sq), overlap_share);
  return true;
}

// With parameter groups each optimizer steps with its group's norm; then
// replicated parameters are synchronised, the owners' updates shared (ZeRO)
// and the polyak targets move, on every replica alike.
bool MeshUpdate::apply_groups(ParamTree& params, const ParamTree& grads, double loss,
                              FitDriver& run) {
  const bool sharded = deployer_->n_model_shards() > 1;
  ParamGroups::StepScope scope;
  if (zero_) {
    const ZeroPartition* z = zero_.get();
    if (deployer_->zero_stage() >= 3)  // the parameters are this replica's parts already
      scope.own_params = [z](const ParamTree& t) { return z->owned_parts(t); };
    else
      scope.own_params = [z](const ParamTree& t) { return z->owned(t); };
    if (deployer_->zero_stage() >= 2)  // the gradients are this replica's parts already
      scope.squares = zero_->squares(grads, deployer_->mesh().dp_comm());
    else
      scope.own_grads = scope.own_params;
  }
  if (!groups_->step_all(params, grads, loss, sharded ? &deployer_->mesh().mp_comm() : nullptr,
                         scope)) {
    const optim::GradNorm n = optim::checked_global_norm(grads);  // this shard's offender, if any
    return run.non_finite(loss, n.non_finite, grads, params), false;
  }
  if (sharded) sync_replicated(params);
  share(params, false);  // the polyak targets read every parameter next
  if (zero3() && groups_->moves_targets()) {
    // The targets (frozen, whole here) move towards the whole trained
    // parameters: gathered for the while, the targets written in place.
    ParamTree whole = gathered(params);
    groups_->after_step(whole);
  } else {
    groups_->after_step(params);
  }
  return true;
}

// Under ZeRO each replica updates the parameters it owns (with their
// buffers, which only it keeps) and then hands them to the others.
void MeshUpdate::optimizer_step(ParamTree& params, const ParamTree& grads, double norm,
                                bool overlap_share) {
  optim::Optimizer& opt = groups_->optimizer();
  if (!zero_) {
    opt.step(params, grads, norm);
  } else {
    // Under ZeRO-2 the gradients are this replica's parts already, under
    // ZeRO-3 the parameters too.
    ParamTree mine =
        deployer_->zero_stage() >= 3 ? zero_->owned_parts(params) : zero_->owned(params);
    opt.step(mine, deployer_->zero_stage() >= 2 ? grads : zero_->owned(grads), norm);
  }
  if (deployer_->n_model_shards() > 1) sync_replicated(params);
  share(params, overlap_share);
}

// Under ZeRO every replica's updated parameters go to the others: started
// now and, with `overlap`, left on their way for the next forward.
void MeshUpdate::share(ParamTree& params, bool overlap) {
  // ZeRO-3: nobody keeps the others' parameters; the next forward gathers them.
  if (!zero_ || deployer_->zero_stage() >= 3) return;
  share_ = std::make_unique<ParamShare>(zero_->share_buckets(params), deployer_->mesh().dp_comm());
  if (!overlap || !deployer_->zero_overlap()) settle();
}

void MeshUpdate::settle() const {
  if (!share_) return;
  const std::unique_ptr<ParamShare> s = std::move(share_);
  s->settle();
}

// Replicated parameters and their optimizer buffers (shared with the
// optimizer, so written in place) copied from model shard 0. A large tensor
// is broadcast where it lives and small ones are packed a few MiB at a time:
// one buffer of them all would hold a copy of every replicated tensor at
// once (a table the shards cannot split, GPT-2's 50257 rows over 2, with its
// two AdamW buffers: 447 MiB, the step's high-water mark).
void MeshUpdate::sync_replicated(ParamTree& params) {
  std::vector<Tensor> parts;
  const ParamTree state = groups_->state();
  for (const shard::ParamSplit& s : *plan_) {
    if (s.split_dim >= 0 || (!groups_->single() && !groups_->trained(s.name))) continue;
    parts.push_back(params.at(s.name));
    for (const auto& [key, t] : state)
      if (key.ends_with("." + s.name) && key.size() > s.name.size() + 1 &&
          std::count(key.begin(), key.end() - int64_t(s.name.size()), '.') == 2)
        parts.push_back(t);
  }
  comm::Comm& mp = deployer_->mesh().mp_comm();
  constexpr int64_t kPacked = int64_t(4) << 20;  // f32 elements a packed broadcast: 16 MiB
  std::vector<Tensor> pack;
  int64_t numel = 0;
  auto flush = [&] {
    if (pack.empty()) return;
    // [numel] the packed parts, in order
    Tensor flat = Tensor::empty(Shape{numel}, DType::f32, deployer_->device());
    int64_t at = 0;
    for (const Tensor& t : pack) flat.slice0(at, at + t.numel()).copy_from(t), at += t.numel();
    sched::sync_wait(mp.broadcast(flat, 0));
    at = 0;
    for (Tensor& t : pack) t.copy_from(flat.slice0(at, at + t.numel())), at += t.numel();
    pack.clear(), numel = 0;
  };
  for (Tensor& t : parts) {
    if (t.numel() >= kPacked) {
      sched::sync_wait(mp.broadcast(t, 0));
      continue;
    }
    if (numel + t.numel() > kPacked) flush();
    pack.push_back(t), numel += t.numel();
  }
  flush();
}

ParamTree MeshUpdate::full_state(const ParamTree& params) const {
  const ParamTree state = groups_->state();
  if (!zero_) return state;
  return zero_->full_state(state, params, deployer_->mesh().dp_comm(),
                           [this](const std::string& p) { return groups_->state_keys(p); });
}

ParamTree MeshUpdate::owned_state(const ParamTree& state) const {
  return zero_ ? zero_->owned_state(state) : state;
}

// Carried as two floats (high and low parts) so that it keeps about double precision.
double MeshUpdate::dp_sum(double local) const {
  Tensor t = Tensor::empty(Shape{2});  // [2] high, low
  t.data<float>()[0] = float(local);
  t.data<float>()[1] = std::isfinite(local) ? float(local - double(float(local))) : 0.f;
  sched::sync_wait(deployer_->mesh().dp_comm().all_reduce(t));
  return double(t.data<float>()[0]) + double(t.data<float>()[1]);
}

double MeshUpdate::dp_mean(double local) const {
  if (deployer_->dp_size() == 1) return local;
  Tensor t = Tensor::full(Shape{1}, float(local));  // [1]
  sched::sync_wait(deployer_->mesh().dp_comm().all_reduce(t, comm::ReduceOp::mean));
  return double(t.data<float>()[0]);
}

}  // namespace redco::train
