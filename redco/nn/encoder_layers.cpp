// Forward passes of the encoder-family layers (encoder_layers.hpp).
#include "redco/nn/encoder_layers.hpp"

#include <algorithm>

#include "redco/nn/kv_cache.hpp"

namespace redco::nn {

Tensor relative_position_buckets(int64_t tq, int64_t tk, int64_t buckets, int64_t max_distance,
                                 bool bidirectional) {
  REDCO_CHECK(buckets >= (bidirectional ? 4 : 2) && max_distance > 0,
              "relative position bias: {} buckets and max distance {} leave no exact bucket "
              "(need at least {} buckets and a positive distance)",
              buckets, max_distance, bidirectional ? 4 : 2);
  const int64_t side = bidirectional ? buckets / 2 : buckets;  // buckets per direction
  const int64_t exact = side / 2;                              // distances below: own bucket
  // The logarithmic buckets in f32 with the span's log in f64, as
  // transformers computes them, so distances on a bucket edge land there too.
  const float log_span = float(std::log(double(max_distance) / double(exact)));
  Tensor out = Tensor::empty({tq, tk}, DType::i64);  // [Tq, Tk]
  int64_t* o = out.data<int64_t>();
  for (int64_t i = 0; i < tq; ++i)
    for (int64_t j = 0; j < tk; ++j) {
      int64_t rel = j - i, base = 0;  // key position - query position
      if (bidirectional) {
        base = rel > 0 ? side : 0;
        rel = rel < 0 ? -rel : rel;
      } else {
        rel = rel < 0 ? -rel : 0;  // keys after the query: distance 0
      }
      int64_t b = rel;
      if (rel >= exact) {
        const float scaled = std::log(float(rel) / float(exact)) / log_span * float(side - exact);
        b = std::min(exact + int64_t(scaled), side - 1);
      }
      o[i * tk + j] = base + b;
    }
  return out;
}

namespace {
// Generation: row b's queries sit at positions length(b) + t among its cache
// slots, so each row gets its own bias over all the slots, keyed by the
// causal distance (query - key; keys after the query share bucket 0):
// ids [B, Tq, capacity] into the table.
Tensor cached_bucket_ids(const KVCache& cache, int64_t tq, int64_t buckets, int64_t max_distance) {
  const int64_t B = cache.batch(), cap = cache.capacity();
  // bucket of each distance 0 .. cap + tq - 1: query d against key 0.
  const Tensor by_distance = relative_position_buckets(cap + tq, 1, buckets, max_distance, false);
  const int64_t* bd = by_distance.data<int64_t>();
  Tensor ids = Tensor::empty({B, tq, cap}, DType::i64);  // [B, Tq, capacity]
  int64_t* o = ids.data<int64_t>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < tq; ++t) {
      const int64_t pos = cache.length(b) + t;
      for (int64_t j = 0; j < cap; ++j) *o++ = j <= pos ? bd[pos - j] : bd[0];
    }
  return ids;
}
}  // namespace

Tensor RelativePositionBias::forward(const Params& p, const Tensor& x, Ctx& ctx) const {
  REDCO_CHECK(x.rank() >= 2, "{}: expected input [batch, seq, ...], got {}", p.path().view(),
              x.shape());
  REDCO_CHECK(!ctx.cache || !bidirectional,
              "{}: a bidirectional (encoder) relative position bias has no KV cache; the "
              "encoder runs on whole sources",
              p.path().view());
  const Tensor& table = p["weight"];                  // [buckets, heads] or this rank's heads of it
  split_of(p, "weight", Shape{buckets, heads}, ctx);  // checks the shard: heads split or whole
  const int64_t t = x.dim(1);
  if (ctx.cache) {  // [B, heads here, Tq, capacity]: each row at its own positions
    REDCO_CHECK(x.dim(0) == ctx.cache->batch(), "{}: input {} for a KV cache of batch {}",
                p.path().view(), x.shape(), ctx.cache->batch());
    const Tensor ids = cached_bucket_ids(*ctx.cache, t, buckets, max_distance);
    ctx.score_bias = permute(embedding(table, ids.to(table.device())), {0, 3, 1, 2});
    return x;
  }
  const Tensor ids =
      relative_position_buckets(t, t, buckets, max_distance, bidirectional).to(table.device());
  ctx.score_bias = permute(embedding(table, ids), {2, 0, 1});  // [heads here, Tq, Tk]
  return x;
}

Tensor DenseActDense::forward(const Params& p, const Tensor& x, Ctx& ctx) const {
  const char* in_name = gated ? "wi_0.weight" : "wi.weight";
  const Tensor& wi = p[in_name];
  const Tensor& wo = p["wo.weight"];
  // One group in the plan: wi (and wi_1) column-parallel on one entered
  // input, wo row-parallel, or all whole.
  const bool split = split_of(p, in_name, Shape{hidden, dim}, ctx) == 0;
  split_of(p, "wo.weight", Shape{dim, hidden}, ctx);
  if (gated) split_of(p, "wi_1.weight", Shape{hidden, dim}, ctx);
  const Tensor in = split ? enter_parallel(x, ctx) : whole_features(x, ctx);
  Tensor h = activate(act, linear(in, wi));  // [B, T, hidden (/ n)]
  if (gated) h = h * linear(in, p["wi_1.weight"]);
  return split ? leave_parallel(linear(h, wo), Tensor(), ctx) : linear(h, wo);
}

Tensor TokenTypeEmbedding::forward(const Params& p, const Tensor& ids, Ctx& ctx) const {
  const Tensor& table = p["weight"];                             // [types, d]
  if (!ctx.token_types.defined()) return slice(table, 0, 0, 1);  // [1, d]: type 0 everywhere
  REDCO_CHECK(ctx.token_types.shape() == ids.shape(),
              "{}: ctx.token_types is {} but the input ids are {}", p.path().view(),
              ctx.token_types.shape(), ids.shape());
  const Tensor t = ctx.token_types.to(Device::cpu());
  for (int64_t v : t.values<int64_t>())
    REDCO_CHECK(v >= 0 && v < types, "{}: token type {} is outside [0, {})", p.path().view(), v,
                types);
  return embedding(table, t.to(table.device()));
}

Tensor PaddedPositions::forward(const Params& p, const Tensor& ids, Ctx& ctx) const {
  REDCO_CHECK(!ctx.cache, "{}: RoBERTa's positions are not implemented with a KV cache",
              p.path().view());
  REDCO_CHECK(ids.rank() == 2, "{}: expected ids [batch, seq], got {}", p.path().view(),
              ids.shape());
  const std::vector<int64_t> in = ids.values<int64_t>();
  const int64_t B = ids.dim(0), T = ids.dim(1);
  Tensor pos = Tensor::empty({B, T}, DType::i64);  // [B, T]
  int64_t* o = pos.data<int64_t>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0, seen = 0; t < T; ++t) {
      const bool token = in[size_t(b * T + t)] != pad;
      seen += token;
      o[b * T + t] = token ? pad + seen : pad;
    }
  REDCO_CHECK(pad + T < max_len,
              "{}: {} tokens need positions up to {}, beyond the model's {} position rows",
              p.path().view(), T, pad + T, max_len);
  const Tensor& table = p["weight"];
  return embedding(table, pos.to(table.device()));  // the host-built ids go where the table is
}

Tensor LogitBias::forward(const Params& p, const Tensor& logits, Ctx& ctx) const {
  const Tensor& b = p["final_logits_bias"];  // [vocab, 1] or this rank's rows
  const Name name = p.path().dot("final_logits_bias");
  const int split = split_of(p, "final_logits_bias", Shape{vocab, 1}, ctx);
  REDCO_CHECK((split == 0) == ctx.split_features,
              "{}: the bias is {} but the logits are {}; the head and the bias must be split "
              "alike (cut both with train::shard_params and one plan)",
              name.view(), split == 0 ? "split by vocabulary" : "whole",
              ctx.split_features ? "split" : "whole");
  // Logits deferred for the loss (a head in training) are formed first: the
  // bias is added to every one of them (this rank's columns when split).
  const Tensor x = !logits.placement()  ? logits
                   : ctx.split_features ? form_split_logits(logits)
                                        : whole(logits);
  return x + reshape(b, {b.dim(0)});
}

}  // namespace redco::nn
