#include "redco/train/parallel.hpp"

#include <algorithm>
#include <coroutine>
#include <exception>
#include <map>

#include "redco/core/error.hpp"
#include "redco/core/philox.hpp"
#include "redco/nn/parallel_ops.hpp"

namespace redco::train {

// ---- parameter shards ------------------------------------------------------------------

Tensor slice_shard(const Tensor& full, const shard::ParamSplit& split, int mp_rank, int mp_size) {
  REDCO_CHECK(full.shape() == split.shape, "slice_shard: '{}' has shape {} but the plan says {}",
              split.name, full.shape(), split.shape);
  if (split.split_dim < 0 || mp_size == 1) return full;
  NoGradGuard no_grad;
  const shard::IndexRange r = shard::shard_range(split, mp_size, mp_rank);
  return slice(full.detach(), split.split_dim, r.begin, r.end).clone();
}

ParamTree shard_params(const ParamTree& full, const std::vector<shard::ParamSplit>& plan,
                       int mp_rank, int mp_size) {
  REDCO_CHECK(mp_size >= 1 && mp_rank >= 0 && mp_rank < mp_size,
              "shard_params: rank {} is not a shard of {}", mp_rank, mp_size);
  ParamTree out;
  for (const shard::ParamSplit& s : plan) {
    auto it = full.find(s.name);
    REDCO_CHECK(it != full.end(), "shard_params: parameter '{}' is missing", s.name);
    out.emplace(s.name, slice_shard(it->second, s, mp_rank, mp_size));
  }
  return out;
}

namespace {

// Draws the shard's elements of a normal-initialised parameter. Along the
// split dim d the shard holds, for every index of the dims before d, the runs
// [begin, end) of each fused block; each run is contiguous in the flat
// unsharded layout, so it is one Philox draw at that run's flat offset.
Tensor draw_normal_shard(const nn::ParamEntry& e, const shard::ParamSplit& s, uint64_t seed,
                         int mp_rank, int mp_size) {
  const Shape full = s.shape;
  const int d = s.split_dim;
  int64_t outer = 1, inner = 1;
  for (int i = 0; i < d; ++i) outer *= full[i];
  for (int i = d + 1; i < full.rank(); ++i) inner *= full[i];
  Tensor out = Tensor::empty(shard::shard_shape(s, mp_size));
  float* dst = out.data<float>();
  const uint64_t stream = stream_of(e.name.view());
  const shard::IndexRange r = shard::shard_range(s, mp_size, mp_rank);
  for (int64_t o = 0; o < outer; ++o) {
    const int64_t n = (r.end - r.begin) * inner;
    philox_normal(dst, n, seed, stream, (o * full[d] + r.begin) * inner, 0.f, e.init_std);
    dst += n;
  }
  return out;
}

}  // namespace

ParamTree init_shard(const std::vector<nn::ParamEntry>& entries,
                     const std::vector<shard::ParamSplit>& plan, uint64_t seed, int mp_rank,
                     int mp_size) {
  REDCO_CHECK(entries.size() == plan.size(), "init_shard: {} parameter entries but {} plan entries",
              entries.size(), plan.size());
  ParamTree out;
  for (size_t i = 0; i < plan.size(); ++i) {
    const nn::ParamEntry& e = entries[i];
    const shard::ParamSplit& s = plan[i];
    REDCO_CHECK(e.name.view() == s.name, "init_shard: entry {} is '{}' but the plan has '{}'", i,
                e.name.view(), s.name);
    Tensor t;
    if (s.split_dim < 0 || mp_size == 1)
      t = nn::init_param(e, seed);
    else if (e.init == nn::Init::normal)
      t = draw_normal_shard(e, s, seed, mp_rank, mp_size);
    else
      t = Tensor::full(shard::shard_shape(s, mp_size), e.init == nn::Init::ones ? 1.f : 0.f);
    out.emplace(s.name, std::move(t));
  }
  return out;
}

Tensor unshard(const Tensor& local, const shard::ParamSplit& split, comm::Comm& mp) {
  if (split.split_dim < 0 || mp.size() == 1) return local;
  NoGradGuard no_grad;
  return nn::gather_from_parallel(local.detach(), mp, split.split_dim);
}

std::vector<std::string> param_order(const std::vector<shard::ParamSplit>& plan) {
  std::vector<std::string> names;
  for (const shard::ParamSplit& s : plan) names.push_back(s.name);
  return names;
}

// ---- vocabulary-parallel pieces ------------------------------------------------------------

Tensor vocab_parallel_embedding(const Tensor& table_shard, const Tensor& ids, comm::Comm& mp) {
  return nn::vocab_parallel_embedding(table_shard, ids, mp);
}

Tensor vocab_parallel_cross_entropy(const Tensor& logits, const Tensor& labels, comm::Comm& mp,
                                    int64_t ignore_index) {
  return nn::vocab_parallel_cross_entropy(logits, labels, mp, ignore_index);
}

}  // namespace redco::train
