// Tensor parallelism inside the layer DSL: placements, the layer helpers and
// the vocabulary-parallel embedding and loss (see tensor_parallel.hpp).
#include "redco/nn/tensor_parallel.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "redco/autodiff/loss_on_parts.hpp"
#include "redco/core/philox.hpp"
#include "redco/nn/parallel_ops.hpp"

namespace redco::nn {

// ---- placements --------------------------------------------------------------------------
namespace {

// `t`'s data and shape under another placement (null: none), as the output of
// a recorded identity, so gradients flow between the two.
Tensor alias(const Tensor& t, std::shared_ptr<const Placement> placement, const char* op) {
  auto impl = std::make_shared<TensorImpl>();
  impl->storage = t.impl().storage;
  impl->offset = t.impl().offset;
  impl->shape = t.impl().shape;
  impl->dtype = t.impl().dtype;
  impl->placement = std::move(placement);
  return record(op, {t}, Tensor(std::move(impl)),
                [](const Node&, const TensorList& g) -> TensorList { return {g[0]}; });
}

// Split along `dim` (counted from the end, so views that keep the trailing
// dims keep its meaning), this rank holding `part` of the `part * n` entries.
class SplitPlacement final : public Placement, public CrossEntropyOnParts {
 public:
  SplitPlacement(comm::Comm& comm, int dim_from_end, int64_t part)
      : comm_(&comm), dim_(dim_from_end), part_(part) {}

  std::string describe() const override {
    const std::string dim = dim_ == -1 ? "its last dim" : fmt::format("dim {}", dim_);
    return fmt::format("split along {} across {} model-parallel ranks (rank {} holds {} of {})",
                       dim, comm_->size(), comm_->rank(), part_, part_ * comm_->size());
  }
  Tensor whole(const Tensor& t) const override {
    check_layout(t, "whole()");
    return gather_from_parallel(local(t), *comm_, t.rank() + dim_);
  }
  std::string read_hint() const override {
    return "Call nn::whole(t) to gather it (cross_entropy takes split logits as they are, "
           "without gathering), or nn::local(t) for this rank's part as a plain tensor";
  }
  Tensor cross_entropy(const Tensor& logits, const Tensor& labels,
                       int64_t ignore_index) const override {
    REDCO_CHECK(dim_ == -1,
                "cross_entropy: the logits are {}, not by their last dim; call nn::whole(logits)",
                describe());
    check_layout(logits, "cross_entropy");
    return vocab_parallel_cross_entropy(local(logits), labels, *comm_, ignore_index);
  }

 private:
  // A reshape that moved the split dim leaves parts that no longer line up.
  void check_layout(const Tensor& t, const char* op) const {
    REDCO_CHECK(t.rank() + dim_ >= 0 && t.dim(dim_) == part_,
                "{}: a tensor of shape {} was {}, but has been reshaped across that dim; call "
                "nn::whole() before reshaping it",
                op, t.shape(), describe());
  }
  comm::Comm* comm_;
  int dim_;
  int64_t part_;
};

class PartialPlacement final : public Placement {
 public:
  explicit PartialPlacement(comm::Comm& comm) : comm_(&comm) {}
  std::string describe() const override {
    return fmt::format("rank {}'s term of a sum over {} model-parallel ranks", comm_->rank(),
                       comm_->size());
  }
  // A loss reads a partial sum whole (cross_entropy makes it so).
  Tensor whole(const Tensor& t) const override { return reduce_from_parallel(local(t), *comm_); }

 private:
  comm::Comm* comm_;
};

}  // namespace

Tensor split_by(const Tensor& part, comm::Comm& comm, int dim) {
  if (comm.size() == 1) return part;
  REDCO_CHECK(!part.placement(), "split_by: the tensor is already {}",
              part.placement()->describe());
  const int from_end = part.shape().axis(dim) - part.rank();
  return alias(part, std::make_shared<SplitPlacement>(comm, from_end, part.dim(dim)), "split_by");
}

Tensor partial_sum(const Tensor& part, comm::Comm& comm) {
  if (comm.size() == 1) return part;
  REDCO_CHECK(!part.placement(), "partial_sum: the tensor is already {}",
              part.placement()->describe());
  return alias(part, std::make_shared<PartialPlacement>(comm), "partial_sum");
}

Tensor whole(const Tensor& t) {
  const Placement* p = t.placement();
  return p ? p->whole(t) : t;
}

Tensor local(const Tensor& t) {
  const Placement* p = t.placement();
  if (!p) return t;
  return p->holds_values() ? alias(t, nullptr, "local") : p->whole(t);  // deferred: all here
}

// ---- layer helpers -----------------------------------------------------------------------

bool tp_active(const Ctx& ctx) { return ctx.mp && ctx.mp->size() > 1; }
int tp_size(const Ctx& ctx) { return ctx.mp ? ctx.mp->size() : 1; }

namespace {
// Whether `w` is `full` with one dimension cut by a whole factor > 1.
bool looks_like_shard(const Shape& w, const Shape& full) {
  if (w.rank() != full.rank()) return false;
  for (int d = 0; d < full.rank(); ++d)
    if (w.with(d, full[d]) == full && w[d] > 0 && w[d] < full[d] && full[d] % w[d] == 0)
      return true;
  return false;
}
}  // namespace

int split_of(const Params& p, std::string_view leaf, const Shape& full, const Ctx& ctx) {
  const int split = p.split(leaf);
  const int n = tp_size(ctx);
  const Shape expected = split < 0 ? full : full.with(split, full[split] / n);
  const Shape w = p.shape(leaf);
  if (w == expected) return split;
  const Name what = p.path().dot(leaf);
  REDCO_CHECK(n > 1 || !looks_like_shard(w, full),
              "'{}' has shape {} but the model needs {}: it looks like a model-parallel shard; "
              "set nn::Ctx::mp to the model-parallel group it was cut for",
              what.view(), w, full);
  if (n == 1)
    fail(
        "'{}' has shape {} but the model needs {}; build the parameters with "
        "nn::init_params(model, seed) or load a checkpoint of this model",
        what.view(), w, full);
  fail(
      "'{}' has shape {}, but the shard plan for {} model shards gives each rank {} of the "
      "whole {} ({}); cut the parameters with train::shard_params(full, shard::resolve(model, "
      "{}), rank, {})",
      what.view(), w, n, expected, full,
      split < 0 ? std::string("replicated") : fmt::format("split along dim {}", split), n, n);
}

Tensor whole_features(const Tensor& x, Ctx& ctx) {
  if (!ctx.split_features) return x;
  ctx.split_features = false;
  return gather_from_parallel(x, *ctx.mp, -1);
}

Tensor to_parallel(const Tensor& x, const Ctx& ctx) {
  return tp_active(ctx) ? copy_to_parallel(x, *ctx.mp) : x;
}

Tensor enter_parallel(const Tensor& x, Ctx& ctx) {
  return to_parallel(whole_features(x, ctx), ctx);
}

Tensor leave_parallel(const Tensor& partial, const Tensor& bias, Ctx& ctx) {
  ctx.split_features = false;
  const Tensor y = reduce_from_parallel(partial, *ctx.mp);
  return bias.defined() ? y + bias : y;
}

Tensor parallel_linear(const Tensor& x, const Params& p, std::string_view leaf, const Tensor& b,
                       int64_t in, int64_t out, Ctx& ctx) {
  const Tensor& w = p[leaf];
  switch (split_of(p, leaf, Shape{out, in}, ctx)) {
    case 0: {  // column: this rank's output features
      const Tensor y = linear(enter_parallel(x, ctx), w, b);
      ctx.split_features = true;
      return y;
    }
    case 1: {  // row: this rank's input features, partial sums reduced
      Tensor part = x;
      if (!ctx.split_features) {  // whole input: take this rank's columns of it
        const int64_t m = w.dim(1), begin = ctx.mp->rank() * m;
        part = slice(to_parallel(x, ctx), x.rank() - 1, begin, begin + m);
      }
      REDCO_CHECK(part.dim(-1) == w.dim(1), "{}: input {} does not match the shard {}",
                  p.path().dot(leaf).view(), part.shape(), w.shape());
      return leave_parallel(linear(part, w), b, ctx);
    }
    default:
      return linear(whole_features(x, ctx), w, b);
  }
}

Tensor parallel_embedding(const Tensor& table, int split, const Tensor& ids, Ctx& ctx) {
  ctx.split_features = false;  // the input is ids; the output is whole either way
  return split == 0 ? vocab_parallel_embedding(table, ids, *ctx.mp) : embedding(table, ids);
}

Tensor enter_vocab_head(const Tensor& x, int split, Ctx& ctx) {
  Tensor h = whole_features(x, ctx);
  if (split != 0) return h;
  ctx.split_features = true;  // the logits: this rank's rows of the vocabulary
  return to_parallel(h, ctx);
}

Tensor parallel_dropout(const Tensor& x, float rate, Ctx& ctx) {
  if (!ctx.train || rate == 0.f) return x;
  const uint64_t stream = stream_of("dropout") ^ (ctx.step << 20) ^ ctx.dropout_calls++;
  if (!ctx.split_features) return dropout(x, rate, ctx.seed, stream);
  // Split features: this rank's columns of the whole activation's mask (the
  // mask of a [.., m] part would restart the element index at 0).
  const int last = x.rank() - 1;
  const int64_t m = x.dim(last), begin = ctx.mp->rank() * m;
  Tensor mask;  // [..., m]: 0 or 1/(1-rate)
  {
    NoGradGuard no_grad;
    Tensor ones = Tensor::empty(x.shape().with(last, m * ctx.mp->size()), x.dtype(), x.device());
    ones.fill(1.f);
    mask = slice(dropout(ones, rate, ctx.seed, stream), last, begin, begin + m);
  }
  return x * mask;
}

Tensor finish_output(const Tensor& y, Ctx& ctx) {
  if (!ctx.split_features) return y;
  ctx.split_features = false;
  if (y.placement()) return y;  // a vocabulary-split head's deferred logits
  const bool keep = ctx.split_output == Ctx::SplitOutput::always ||
                    (ctx.split_output == Ctx::SplitOutput::in_training && ctx.train);
  return keep ? split_by(y, *ctx.mp, -1) : gather_from_parallel(y, *ctx.mp, -1);
}

// ---- vocabulary-parallel pieces ------------------------------------------------------------

Tensor vocab_parallel_embedding(const Tensor& table_shard, const Tensor& ids, comm::Comm& mp) {
  if (mp.size() == 1) return embedding(table_shard, ids);
  const int64_t rows = table_shard.dim(0), begin = int64_t(mp.rank()) * rows;
  std::vector<int64_t> mine = ids.to(Device::cpu()).values<int64_t>();  // an explicit copy
  std::vector<float> held(mine.size());
  for (size_t i = 0; i < mine.size(); ++i) {
    const bool here = mine[i] >= begin && mine[i] < begin + rows;
    held[i] = here ? 1.f : 0.f;
    mine[i] = here ? mine[i] - begin : 0;  // any valid row; masked out below
  }
  const Device device = table_shard.device();  // the host-built indices go where the table is
  const Tensor local_ids =
      Tensor::from<int64_t>(std::span<const int64_t>(mine), ids.shape()).to(device);
  const Tensor mask =  // [..., 1]: 1 where this rank holds the id
      Tensor::from<float>(std::span<const float>(held), ids.shape().insert(ids.rank(), 1))
          .to(device);
  return reduce_from_parallel(embedding(table_shard, local_ids) * mask, mp);
}

Tensor vocab_parallel_cross_entropy(const Tensor& logits, const Tensor& labels, comm::Comm& mp,
                                    int64_t ignore_index) {
  REDCO_CHECK(labels.dtype() == DType::i64, "cross_entropy: labels must be i64, got {}{}",
              dtype_name(labels.dtype()), labels.shape());
  REDCO_CHECK(logits.rank() >= 1 && labels.shape() == logits.shape().drop(-1),
              "cross_entropy: vocabulary-split logits {} need labels of shape {}, got {}",
              logits.shape(), logits.shape().drop(-1), labels.shape());
  const int64_t part = logits.dim(-1), begin = int64_t(mp.rank()) * part;
  const Tensor z2 = reshape(logits, {-1, part});  // [N, V/mp]
  const int64_t n = z2.dim(0);
  // The shift by the row max only keeps exp finite: it cancels, so it carries
  // no gradient, and a gather of the per-rank maxima suffices.
  Tensor shift;  // [N, 1]
  {
    NoGradGuard no_grad;
    const Tensor local_max = reshape(max(z2.detach(), 1), {1, n});
    shift = reshape(max(gather_from_parallel(local_max, mp, 0), 0), {n, 1});
  }
  const Tensor z = z2 - shift;
  const Tensor sum_exp = reduce_from_parallel(sum(exp(z), {1}), mp);  // [N]
  // The label's logit lives on one rank: a one-hot over this rank's columns
  // picks it there and gives zero elsewhere.
  const std::vector<int64_t> lab = labels.to(Device::cpu()).values<int64_t>();  // explicit copy
  std::vector<float> onehot(size_t(n * part), 0.f), valid(size_t(n), 0.f);
  float count = 0.f;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t l = lab[size_t(i)];
    if (l == ignore_index) continue;
    REDCO_CHECK(l >= 0 && l < part * mp.size(),
                "cross_entropy: label {} is out of range for {} classes (row {})", l,
                part * mp.size(), i);
    valid[size_t(i)] = 1.f;
    count += 1.f;
    if (l >= begin && l < begin + part) onehot[size_t(i * part + l - begin)] = 1.f;
  }
  const Device device = logits.device();
  const Tensor pick =  // [N, V/mp]
      Tensor::from<float>(std::span<const float>(onehot), Shape{n, part}).to(device);
  const Tensor target = reduce_from_parallel(sum(z * pick, {1}), mp);  // [N]
  const Tensor w = Tensor::from<float>(std::span<const float>(valid), Shape{n}).to(device);
  // All rows ignored: the loss is 0 (and so is its gradient), not 0/0.
  return sum((log(sum_exp) - target) * w) / std::max(count, 1.f);
}

}  // namespace redco::nn
