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
  TensorList parts;
  for (const shard::IndexRange& r : shard::shard_ranges(split, mp_size, mp_rank))
    parts.push_back(slice(full.detach(), split.split_dim, r.begin, r.end));
  return parts.size() == 1 ? parts[0].clone() : concat(parts, split.split_dim);
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
  for (int64_t o = 0; o < outer; ++o)
    for (const shard::IndexRange& r : shard::shard_ranges(s, mp_size, mp_rank)) {
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

Tensor unshard(const Tensor& local, const shard::ParamSplit& split, dist::Comm& mp) {
  if (split.split_dim < 0 || mp.size() == 1) return local;
  REDCO_CHECK(split.fused_blocks == 1,
              "unshard: '{}' is split per fused block, which a plain gather does not undo",
              split.name);
  NoGradGuard no_grad;
  return nn::gather_from_parallel(local.detach(), mp, split.split_dim);
}

std::vector<std::string> param_order(const std::vector<shard::ParamSplit>& plan) {
  std::vector<std::string> names;
  for (const shard::ParamSplit& s : plan) names.push_back(s.name);
  return names;
}

// ---- tensor-parallel GPT-2 -----------------------------------------------------------------

namespace {

Tensor i64_tensor(const std::vector<int64_t>& v, const Shape& shape) {
  return Tensor::from<int64_t>(std::span<const int64_t>(v), shape);
}

// The rows of the vocabulary this rank holds: [begin, begin + rows).
int64_t vocab_begin(int64_t rows, dist::Comm& mp) { return int64_t(mp.rank()) * rows; }

// Same masks as nn::Dropout: they depend on (seed, step, call index) only, and
// every activation dropped here is whole on every rank.
Tensor maybe_dropout(const Tensor& x, float rate, nn::Ctx& ctx) {
  if (!ctx.train || rate == 0.f) return x;
  const uint64_t stream = stream_of("dropout") ^ (ctx.step << 20) ^ ctx.dropout_calls++;
  return dropout(x, rate, ctx.seed, stream);
}

const Tensor& param(const ParamTree& p, const std::string& name) {
  auto it = p.find(name);
  REDCO_CHECK(it != p.end(), "tp_gpt_forward: the shard lacks parameter '{}'", name);
  return it->second;
}

// [B, T, h * hd] -> [B, h, T, hd]
Tensor split_heads(const Tensor& y, int64_t hd) {
  return transpose(reshape(y, {y.dim(0), y.dim(1), y.dim(2) / hd, hd}), 1, 2);
}

// Heads split across ranks: q, k, v column-parallel over whole heads, o
// row-parallel; its bias is added once, after the partial sums are reduced.
Tensor tp_attention(const ParamTree& p, const std::string& at, const Tensor& x, int64_t hd,
                    dist::Comm& mp) {
  const Tensor in = nn::copy_to_parallel(x, mp);
  auto proj = [&](const char* name) {
    const std::string w = at + name;
    return split_heads(linear(in, param(p, w + ".weight"), param(p, w + ".bias")), hd);
  };
  const Tensor o = transpose(attention(proj("q_proj"), proj("k_proj"), proj("v_proj"), true), 1, 2);
  const Tensor partial =
      linear(reshape(o, {x.dim(0), x.dim(1), -1}), param(p, at + "o_proj.weight"));
  return nn::reduce_from_parallel(partial, mp) + param(p, at + "o_proj.bias");
}

Tensor tp_mlp(const ParamTree& p, const std::string& at, const Tensor& x, dist::Comm& mp) {
  const Tensor in = nn::copy_to_parallel(x, mp);
  const Tensor h = gelu(linear(in, param(p, at + "fc1.weight"), param(p, at + "fc1.bias")), true);
  const Tensor partial = linear(h, param(p, at + "fc2.weight"));
  return nn::reduce_from_parallel(partial, mp) + param(p, at + "fc2.bias");
}

Tensor norm(const ParamTree& p, const std::string& at, const Tensor& x) {
  return layer_norm(x, param(p, at + ".weight"), param(p, at + ".bias"));
}

}  // namespace

Tensor vocab_parallel_embedding(const Tensor& table_shard, const Tensor& ids, dist::Comm& mp) {
  if (mp.size() == 1) return embedding(table_shard, ids);
  const int64_t rows = table_shard.dim(0), begin = vocab_begin(rows, mp);
  std::vector<int64_t> local = ids.values<int64_t>();
  std::vector<float> held(local.size());
  for (size_t i = 0; i < local.size(); ++i) {
    const bool mine = local[i] >= begin && local[i] < begin + rows;
    held[i] = mine ? 1.f : 0.f;
    local[i] = mine ? local[i] - begin : 0;  // any valid row; masked out below
  }
  Shape mask_shape = ids.shape();
  std::vector<int64_t> dims(mask_shape.dims().begin(), mask_shape.dims().end());
  dims.push_back(1);
  const Tensor mask =
      Tensor::from<float>(std::span<const float>(held), Shape(std::span<const int64_t>(dims)));
  const Tensor partial = embedding(table_shard, i64_tensor(local, ids.shape())) * mask;
  return nn::reduce_from_parallel(partial, mp);
}

Tensor tp_gpt_forward(const models::Gpt2Config& c, const ParamTree& shard, const Tensor& ids,
                      dist::Comm& mp, nn::Ctx& ctx) {
  const int n = mp.size();
  REDCO_CHECK(c.heads % n == 0 && c.vocab % n == 0,
              "tp_gpt_forward: {} heads and a vocabulary of {} must divide by {} model shards",
              c.heads, c.vocab, n);
  REDCO_CHECK(ids.rank() == 2 && ids.dim(1) <= c.context,
              "tp_gpt_forward: expected ids [batch, seq <= {}], got {}", c.context, ids.shape());
  const Tensor& wte = param(shard, "wte.weight");
  Tensor x =
      vocab_parallel_embedding(wte, ids, mp) + slice(param(shard, "wpe.weight"), 0, 0, ids.dim(1));
  x = maybe_dropout(x, c.dropout, ctx);
  const int64_t hd = c.dim / c.heads;
  for (int64_t l = 0; l < c.layers; ++l) {
    const std::string at = "h." + std::to_string(l) + ".";
    x = x + maybe_dropout(tp_attention(shard, at + "attn.", norm(shard, at + "ln_1", x), hd, mp),
                          c.dropout, ctx);
    x = x +
        maybe_dropout(tp_mlp(shard, at + "mlp.", norm(shard, at + "ln_2", x), mp), c.dropout, ctx);
  }
  // The tied head is column-parallel over the vocabulary: each rank's logits
  // are its rows of wte, and the gradient into x sums over ranks.
  return matmul(nn::copy_to_parallel(norm(shard, "ln_f", x), mp), wte, false, true);
}

Tensor vocab_parallel_cross_entropy(const Tensor& logits, const Tensor& labels, dist::Comm& mp,
                                    int64_t ignore_index) {
  const int64_t rows_v = logits.dim(-1), begin = vocab_begin(rows_v, mp);
  const Tensor z2 = reshape(logits, {-1, rows_v});  // [N, V/mp]
  const int64_t n = z2.dim(0);
  REDCO_CHECK(labels.numel() == n, "vocab_parallel_cross_entropy: {} labels for {} rows",
              labels.numel(), n);
  // The shift by the row max only keeps exp finite: it cancels, so it carries
  // no gradient, and a gather of the per-rank maxima suffices.
  Tensor shift;
  {
    NoGradGuard no_grad;
    const Tensor local_max = reshape(max(z2.detach(), 1), {1, n});
    shift = reshape(max(nn::gather_from_parallel(local_max, mp, 0), 0), {n, 1});
  }
  const Tensor z = z2 - shift;
  const Tensor sum_exp = nn::reduce_from_parallel(sum(exp(z), {1}), mp);  // [N]
  // The label's logit lives on one rank: a one-hot over this rank's columns
  // picks it there and gives zero elsewhere.
  const std::vector<int64_t> lab = labels.values<int64_t>();
  std::vector<float> onehot(size_t(n * rows_v), 0.f), valid(size_t(n), 0.f);
  float count = 0.f;
  for (int64_t i = 0; i < n; ++i) {
    if (lab[size_t(i)] == ignore_index) continue;
    valid[size_t(i)] = 1.f;
    count += 1.f;
    const int64_t col = lab[size_t(i)] - begin;
    if (col >= 0 && col < rows_v) onehot[size_t(i * rows_v + col)] = 1.f;
  }
  const Tensor pick = Tensor::from<float>(std::span<const float>(onehot), Shape{n, rows_v});
  const Tensor target = nn::reduce_from_parallel(sum(z * pick, {1}), mp);  // [N]
  const Tensor w = Tensor::from<float>(std::span<const float>(valid), Shape{n});
  return sum((log(sum_exp) - target) * w) / std::max(count, 1.f);
}

}  // namespace redco::train
