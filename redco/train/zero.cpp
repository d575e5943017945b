// ZeRO stages 1 and 2: optimizer state and gradients partitioned by data-parallel rank
// (zero.hpp).
#include "redco/train/zero.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

#include "redco/comm/comm.hpp"
#include "redco/core/error.hpp"
#include "redco/optim/optimizer.hpp"
#include "redco/sched/task.hpp"

namespace redco::train {
namespace {

// The name of the parameter a state key "<kind>.<buffer>.<param>" belongs to
// (empty for "step").
std::string param_of(const std::string& key) {
  const size_t a = key.find('.');
  const size_t b = a == std::string::npos ? a : key.find('.', a + 1);
  return b == std::string::npos ? std::string() : key.substr(b + 1);
}

// Packs `parts` (f32) into one buffer, broadcasts it from `root` over `dp`
// and copies the received values back into them.
void broadcast_packed(std::vector<Tensor>& parts, int root, comm::Comm& dp) {
  int64_t numel = 0;
  for (const Tensor& t : parts) {
    REDCO_CHECK(t.dtype() == DType::f32,
                "ZeRO: parameters and optimizer buffers must be f32, got {}",
                dtype_name(t.dtype()));
    numel += t.numel();
  }
  if (numel == 0) return;
  // [numel] the parts, packed in order, where they live
  Tensor flat = Tensor::empty(Shape{numel}, DType::f32, parts.front().device());
  int64_t at = 0;
  if (dp.rank() == root)
    for (const Tensor& t : parts) flat.slice0(at, at + t.numel()).copy_from(t), at += t.numel();
  sched::sync_wait(dp.broadcast(flat, root));
  if (dp.rank() == root) return;
  at = 0;
  for (Tensor& t : parts) t.copy_from(flat.slice0(at, at + t.numel())), at += t.numel();
}

}  // namespace

ZeroPartition::ZeroPartition(const std::vector<shard::ParamSplit>& plan, int dp_size, int dp_rank)
    : names_(size_t(dp_size)), rank_(dp_rank) {
  REDCO_CHECK(int64_t(plan.size()) >= dp_size,
              "ZeRO: {} parameters cannot be shared out among {} data-parallel replicas (each "
              "must own one); run without zero_stage or with fewer replicas",
              plan.size(), dp_size);
  int64_t total = 0;
  for (const auto& p : plan) total += p.shape.numel();
  std::vector<int> every(static_cast<size_t>(dp_size));
  std::iota(every.begin(), every.end(), 0);
  std::vector<int64_t> load(size_t(dp_size), 0);
  std::vector<size_t> whole;  // plan entries owned whole
  for (size_t i = 0; i < plan.size(); ++i) {
    const Shape& s = plan[i].shape;
    // Larger than half a share, and rows enough that no part is empty on any
    // model shard (split rows are cut again per shard, at most 8 ways here).
    const bool big = dp_size > 1 && 2 * dp_size * s.numel() > total && s.rank() >= 1 &&
                     s[0] >= 8 * int64_t(dp_size);
    if (!big) {
      whole.push_back(i);
      continue;
    }
    owners_.emplace(plan[i].name, every);
    for (int r = 0; r < dp_size; ++r) {
      const auto [a, b] = part_rows(s[0], r, dp_size);
      load[size_t(r)] += (b - a) * (s.numel() / s[0]);
      names_[size_t(r)].push_back(plan[i].name);
    }
  }
  std::stable_sort(whole.begin(), whole.end(), [&](size_t a, size_t b) {
    return plan[a].shape.numel() > plan[b].shape.numel();
  });
  for (const size_t i : whole) {
    const auto r = size_t(std::min_element(load.begin(), load.end()) - load.begin());
    load[r] += plan[i].shape.numel();
    owners_.emplace(plan[i].name, std::vector<int>{int(r)});
    names_[r].push_back(plan[i].name);
  }
  for (auto& n : names_) std::sort(n.begin(), n.end());
  for (const auto& p : plan) all_.push_back(p.name);
  in_plan_order_ = all_;
  std::sort(all_.begin(), all_.end());
}

const std::vector<int>& ZeroPartition::part_owners(const std::string& name) const {
  const auto it = owners_.find(name);
  REDCO_CHECK(it != owners_.end(), "ZeRO: '{}' is not a parameter of the model", name);
  return it->second;
}

bool ZeroPartition::owns(const std::string& name) const {
  const std::vector<int>& o = part_owners(name);
  return o.size() > 1 || o[0] == rank_;
}

std::pair<int64_t, int64_t> ZeroPartition::part_rows(int64_t n, int k, int count) {
  return {n * k / count, n * (k + 1) / count};
}

Tensor ZeroPartition::part(const std::string& name, const Tensor& t, int r) const {
  const std::vector<int>& o = part_owners(name);
  if (o.size() == 1) return t;
  const auto [a, b] = part_rows(t.dim(0), r, int(o.size()));
  return t.slice0(a, b);
}

ParamTree ZeroPartition::owned(const ParamTree& tree) const {
  ParamTree out;
  for (const std::string& n : names_[size_t(rank_)])
    if (const auto it = tree.find(n); it != tree.end()) out.emplace(n, part(n, it->second, rank_));
  return out;
}

// A part of at least kBucketFloats goes as it is (no copy); smaller
// consecutive ones are packed into buckets of at most that size. One packed
// buffer for all of an owner's parameters (half of GPT-2 large's 3 GB at dp
// 2) stayed in the allocator's cache from step to step. Each owner's parts
// go in the plan's order, and the buckets in the order of their first part,
// so that the next forward, which reads the parameters about in that order,
// finds its first ones first.
std::vector<ZeroPartition::ShareBucket> ZeroPartition::share_buckets(
    const ParamTree& params) const {
  // A part of 1 MiB or more goes alone, received in place: packing it would
  // keep a copy alive until the forward reads it, and the copies of every
  // weight matrix at once cost GPT-2 large under ZeRO-2 1.6 GB of peak RSS
  // per rank. Smaller parts (biases, norms) share messages of up to 32 MiB,
  // so that they do not cost a message each.
  constexpr int64_t kAloneFloats = (int64_t(1) << 20) / 4;
  constexpr int64_t kBucketFloats = (int64_t(32) << 20) / 4;
  std::vector<std::pair<size_t, ShareBucket>> out;  // (plan position of the first part, bucket)
  for (int r = 0; r < int(names_.size()); ++r) {
    int64_t packed = -1, packed_floats = 0;  // this owner's open bucket of small parts in `out`
    for (size_t i = 0; i < in_plan_order_.size(); ++i) {
      const std::string& n = in_plan_order_[i];
      const std::vector<int>& o = part_owners(n);
      if (std::find(o.begin(), o.end(), r) == o.end()) continue;
      const Tensor p = part(n, params.at(n), r);
      REDCO_CHECK(p.dtype() == DType::f32, "ZeRO: parameters must be f32, got {} for '{}'",
                  dtype_name(p.dtype()), n);
      if (p.numel() >= kAloneFloats) {
        out.push_back({i, {r, {n}, {p}}});
        continue;
      }
      if (packed < 0 || packed_floats + p.numel() > kBucketFloats) {
        packed = int64_t(out.size()), packed_floats = 0;
        out.push_back({i, {r, {}, {}}});
      }
      packed_floats += p.numel();
      out[size_t(packed)].second.names.push_back(n);
      out[size_t(packed)].second.parts.push_back(p);
    }
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<ShareBucket> buckets;
  for (auto& [first, b] : out) buckets.push_back(std::move(b));
  return buckets;
}

ParamTree ZeroPartition::full_state(const ParamTree& state, const ParamTree& params, comm::Comm& dp,
                                    const StateKeys& keys) const {
  ParamTree out;
  ParamTree assembled;  // the whole buffers of split parameters, filled part by part
  for (int r = 0; r < int(names_.size()); ++r) {
    std::vector<std::string> names;
    std::vector<Tensor> parts(1);  // [0]: which buffers the owner has (1) or not yet (0)
    for (const std::string& n : names_[size_t(r)])
      for (const std::string& key : keys(n)) {
        const auto it = state.find(key);
        const bool have = r == rank_ && it != state.end();
        names.push_back(key);
        // Under ZeRO-3 `params` are parts: the whole shape is the remembered one.
        const Tensor& part_or_whole = params.at(n);
        const Tensor like = local_shapes_.empty()
                                ? part_or_whole
                                : Tensor::empty(Shape{0}, DType::f32, part_or_whole.device());
        const Shape& shape = local_shapes_.empty() ? like.shape() : local_shape(n);
        if (!split(n)) {
          parts.push_back(have ? it->second : Tensor::zeros(shape, DType::f32, like.device()));
          continue;
        }
        auto whole = assembled.find(key);
        if (whole == assembled.end())
          whole = assembled.emplace(key, Tensor::zeros(shape, DType::f32, like.device())).first;
        Tensor into = part(n, whole->second, r);  // received in place
        if (have) into.copy_from(it->second);
        parts.push_back(into);
      }
    parts[0] = Tensor::zeros(Shape{int64_t(names.size()) + 1});  // [keys + 1], never empty
    if (r == rank_)
      for (size_t i = 0; i < names.size(); ++i)
        parts[0].data<float>()[i] = state.count(names[i]) ? 1.f : 0.f;
    broadcast_packed(parts, r, dp);
    // A buffer the owner has not made yet (before its parameter's first
    // step) stays out, as it is out of an unpartitioned state.
    for (size_t i = 0; i < names.size(); ++i) {
      if (parts[0].data<float>()[i] == 0.f) continue;
      const auto whole = assembled.find(names[i]);
      out.emplace(names[i], whole != assembled.end() ? whole->second : parts[i + 1]);
    }
  }
  for (const auto& [key, t] : state)
    if (param_of(key).empty()) out.emplace(key, t);
  return out;
}

std::map<std::string, double> ZeroPartition::squares(const ParamTree& owned_grads,
                                                     comm::Comm& dp) const {
  // [n * dp * 3]: each parameter's (or part's) sum of squares as three
  // floats that add up to the double exactly, filled by its owner only, so
  // the sum over the replicas (adding zeros) is exact; a split parameter's
  // parts are then added in rank order.
  const auto n = int64_t(all_.size()), replicas = int64_t(names_.size());
  Tensor parts = Tensor::zeros(Shape{3 * n * replicas});
  float* v = parts.data<float>();
  for (int64_t i = 0; i < n; ++i) {
    const auto it = owned_grads.find(all_[size_t(i)]);
    if (it == owned_grads.end()) continue;
    const double ss = optim::sum_of_squares(it->second, it->first);
    float* x = v + 3 * (i * replicas + rank_);
    x[0] = float(ss);
    if (!std::isfinite(ss)) continue;
    x[1] = float(ss - double(x[0]));
    x[2] = float(ss - double(x[0]) - double(x[1]));
  }
  sched::sync_wait(dp.all_reduce(parts));
  std::map<std::string, double> out;
  for (int64_t i = 0; i < n; ++i) {
    const std::string& name = all_[size_t(i)];
    const std::vector<int>& o = part_owners(name);
    double ss = 0;
    for (const int r : o) {
      const float* x = v + 3 * (i * replicas + r);
      ss += double(x[0]) + double(x[1]) + double(x[2]);
    }
    out.emplace(name, ss);
  }
  return out;
}

double ZeroPartition::squared_norm(const ParamTree& owned_grads, comm::Comm& dp) const {
  double total = 0.0;  // in key order, as checked_global_norm adds them
  for (const auto& [name, ss] : squares(owned_grads, dp)) total += ss;
  return total;
}

ParamTree ZeroPartition::owned_state(const ParamTree& state) const {
  ParamTree out;
  for (const auto& [key, t] : state) {
    const std::string p = param_of(key);
    if (p.empty()) {
      out.emplace(key, t);
    } else if (owners_.count(p) && owns(p)) {
      out.emplace(key, part(p, t, rank_));  // load_state copies it in
    }
  }
  return out;
}

ParamTree ZeroPartition::keep_parts(const ParamTree& local) {
  ParamTree out;
  for (const auto& [name, t] : local) {
    if (!owners_.count(name)) {
      out.emplace(name, t);
      continue;
    }
    local_shapes_.insert_or_assign(name, t.shape());
    REDCO_CHECK(t.dtype() == DType::f32, "ZeRO-3: parameters must be f32, got {} for '{}'",
                dtype_name(t.dtype()), name);
    // A copy, so that the whole tensor's buffer goes back to the allocator.
    const Tensor none =
        t.rank() == 0 ? Tensor::empty(Shape{0}, DType::f32, t.device()) : t.slice0(0, 0);
    const Tensor mine = owns(name) ? part(name, t, rank_) : none;
    out.emplace(name, mine.clone());
  }
  return out;
}

const Shape& ZeroPartition::local_shape(const std::string& name) const {
  const auto it = local_shapes_.find(name);
  REDCO_CHECK(it != local_shapes_.end(), "ZeRO-3: no shape is known for '{}' (keep_parts first)",
              name);
  return it->second;
}

ParamTree ZeroPartition::owned_parts(const ParamTree& parts) const {
  ParamTree out;
  for (const std::string& n : names_[size_t(rank_)])
    if (const auto it = parts.find(n); it != parts.end()) out.emplace(n, it->second);
  return out;
}

}  // namespace redco::train
