// The run-time parts of the DSL: parameter lookup, initialisation and the
// forward passes too long to sit in the headers.
#include <fmt/format.h>

#include "redco/core/allocator.hpp"
#include "redco/nn/model.hpp"

namespace redco::nn {

Name Params::next_scope_name() const {
  REDCO_CHECK(*pos_ < scope_size_,
              "model scope '{}' has {} named layers, but the forward pass asked for more",
              path_.view(), scope_size_);
  return scope_[(*pos_)++];
}

const Tensor& Params::operator[](std::string_view leaf) const {
  return at_root(path_.dot(leaf).view());
}

const Tensor& Params::at_root(std::string_view name) const {
  auto it = tree_->find(std::string(name));
  REDCO_CHECK(it != tree_->end(),
              "parameter '{}' is missing from the parameter tree ({} entries); build it with "
              "nn::init_params(model, seed) or load a checkpoint of this model",
              name, tree_->size());
  return it->second;
}

Tensor init_param(const ParamEntry& e, uint64_t seed) {
  const Shape shape = e.shape.shape();
  CachingAllocator::LongLivedScope long_lived;  // parameters live as long as the run
  switch (e.init) {
    case Init::normal:
      return Tensor::normal(shape, seed, stream_of(e.name.view()), 0.f, e.init_std);
    case Init::ones:
      return Tensor::ones(shape);
    case Init::zeros:
      break;
  }
  return Tensor::zeros(shape);
}

int64_t count_parameters(const ParamTree& params) {
  int64_t n = 0;
  for (const auto& [name, p] : params) n += p.numel();
  return n;
}

void check_params(const std::vector<ParamEntry>& expected, const ParamTree& params) {
  for (const ParamEntry& e : expected) {
    const std::string name(e.name.view());
    auto it = params.find(name);
    REDCO_CHECK(it != params.end(), "parameter '{}' (shape {}) is missing", name, e.shape.shape());
    REDCO_CHECK(it->second.shape() == e.shape.shape(),
                "parameter '{}' has shape {} but the model needs {}", name, it->second.shape(),
                e.shape.shape());
  }
  REDCO_CHECK(params.size() == expected.size(),
              "the parameter tree has {} entries but the model has {} parameters", params.size(),
              expected.size());
}

Tensor activate(Act a, const Tensor& x) {
  switch (a) {
    case Act::relu:
      return relu(x);
    case Act::gelu:
      return gelu(x, true);
    case Act::gelu_erf:
      return gelu(x, false);
    case Act::silu:
      return silu(x);
    case Act::tanh:
      return tanh(x);
  }
  return x;
}

Tensor Positions::forward(const Params& p, const Tensor& ids, Ctx&) const {
  REDCO_CHECK(ids.rank() >= 1, "positions: expected ids [batch, seq], got {}", ids.shape());
  const int64_t T = ids.dim(-1);
  REDCO_CHECK(T <= max_len, "positions: sequence length {} exceeds the model's maximum {}", T,
              max_len);
  return slice(p["weight"], 0, 0, T);  // [T, d], broadcast over the batch
}

AttentionExtras key_ranges(const Tensor& mask, int64_t batch, int64_t keys,
                           std::string_view where) {
  AttentionExtras x;
  if (!mask.defined()) return x;
  REDCO_CHECK(mask.shape() == (Shape{batch, keys}),
              "{}: the attention mask is {} but the keys are [batch {}, {} positions]", where,
              mask.shape(), batch, keys);
  const Tensor m = mask.to(Device::cpu()).to(DType::f32);
  const float* p = m.data<float>();
  x.key_begin = Tensor::empty({batch}, DType::i64);
  x.key_end = Tensor::empty({batch}, DType::i64);
  for (int64_t b = 0; b < batch; ++b) {
    const float* row = p + b * keys;
    int64_t lo = 0, hi = keys;
    while (lo < keys && row[lo] == 0.f) ++lo;
    while (hi > lo && row[hi - 1] == 0.f) --hi;
    for (int64_t j = lo; j < hi; ++j)
      REDCO_CHECK(row[j] == 1.f,
                  "{}: attention mask row {} is not one run of ones (position {} is {}); redco "
                  "supports left or right padding",
                  where, b, j, row[j]);
    x.key_begin.data<int64_t>()[b] = lo;
    x.key_end.data<int64_t>()[b] = hi;
  }
  return x;
}

template <bool Bias, bool Cross>
bool Attention<Bias, Cross>::split_heads(const Params& p, const Ctx& ctx) const {
  const std::string at(p.path().view());
  const int64_t hd = head_dim(), kv = kv_heads * hd, qw = heads * hd;
  const Tensor& wq = p["q_proj.weight"];
  const Tensor& wk = p["k_proj.weight"];
  const int q = shard_dim(wq, Shape{qw, dim}, {0}, ctx, at + ".q_proj.weight");
  const int k = shard_dim(wk, Shape{kv, dim}, {0}, ctx, at + ".k_proj.weight");
  const int v = shard_dim(p["v_proj.weight"], Shape{kv, dim}, {0}, ctx, at + ".v_proj.weight");
  const int o = shard_dim(p["o_proj.weight"], Shape{dim, qw}, {1}, ctx, at + ".o_proj.weight");
  REDCO_CHECK(q == k && k == v && (o == 1) == (q == 0),
              "{}: q/k/v/o_proj are split inconsistently (one split, another whole); cut them "
              "with train::shard_params(full, shard::resolve(model, n), rank, n)",
              at);
  REDCO_CHECK(q < 0 || (wq.dim(0) % hd == 0 && wk.dim(0) % hd == 0),
              "{}: a shard of {} query and {} key rows splits a {}-wide head; {} heads and {} kv "
              "heads must divide by the number of model shards",
              at, wq.dim(0), wk.dim(0), hd, heads, kv_heads);
  return q == 0;
}

template <bool Bias, bool Cross>
Tensor Attention<Bias, Cross>::project(const Params& p, const char* name, const Tensor& x) const {
  const std::string proj(name);
  const bool has_bias = Bias && qkv_bias;
  Tensor y =
      linear(x, p[proj + ".weight"], has_bias ? p[proj + ".bias"] : Tensor());  // [B, T, h*hd]
  const int64_t h = y.dim(2) / head_dim();                                      // this rank's heads
  return transpose(reshape(y, {x.dim(0), x.dim(1), h, head_dim()}), 1, 2);      // [B, h, T, hd]
}

// Self-attention projects the same input three times: one GEMM against the
// stacked weights [q rows + 2 kv rows, dim] replaces three. On GPT-2 small
// (2048 tokens) the stacked products run at 150-170 GFLOP/s on the 2-core dev
// box where the 768x768 ones reach 90-120 (the weight gradient worst); the
// stacking costs a 7 MB copy of the weights each way and one pass to split
// heads.
template <bool Bias, bool Cross>
TensorList Attention<Bias, Cross>::project_qkv(const Params& p, const Tensor& x) const {
  const Tensor& wq = p["q_proj.weight"];
  const Tensor& wk = p["k_proj.weight"];
  const TensorList ws{wq, wk, p["v_proj.weight"]};
  const TensorList bs = Bias && qkv_bias
                            ? TensorList{p["q_proj.bias"], p["k_proj.bias"], p["v_proj.bias"]}
                            : TensorList{};
  const int64_t hd = head_dim(), hq = wq.dim(0) / hd, hkv = wk.dim(0) / hd;  // this rank's heads
  const Tensor y = linear_stacked(x, ws, bs);  // [B, T, (hq + 2 hkv) * hd]
  const Tensor heads = transpose(reshape(y, {x.dim(0), x.dim(1), hq + 2 * hkv, hd}), 1, 2);
  return split(heads, {hq, hkv, hkv}, 1);  // [B, hq, T, hd], [B, hkv, T, hd] x 2
}

template <bool Bias, bool Cross>
Tensor Attention<Bias, Cross>::forward(const Params& p, const Tensor& x_in, Ctx& ctx) const {
  const Tensor x = whole_features(x_in, ctx);
  REDCO_CHECK(x.rank() == 3 && x.dim(2) == dim, "{}: expected input [batch, seq, {}], got {}",
              p.path().view(), dim, x.shape());
  REDCO_CHECK(window == 0 || x.dim(1) <= window,
              "{}: a sequence of {} tokens is longer than the sliding attention window ({}), "
              "which redco does not implement; use sequences of at most {} tokens",
              p.path().view(), x.dim(1), window, window);
  REDCO_CHECK(!Cross || ctx.memory.defined(),
              "{}: cross-attention needs the encoder output (ctx.memory)", p.path().view());
  // Split heads: the whole input enters the parallel region (its gradient is
  // summed over the ranks' heads), as does the encoder output.
  const bool split = split_heads(p, ctx);
  const Tensor in = split ? to_parallel(x, ctx) : x;
  const Tensor kv_in = !Cross ? in : split ? to_parallel(ctx.memory, ctx) : ctx.memory;
  Tensor q, k, v;
  if constexpr (Cross) {
    q = project(p, "q_proj", in);
    k = project(p, "k_proj", kv_in);
    v = project(p, "v_proj", kv_in);
  } else {
    TensorList qkv = project_qkv(p, in);
    q = std::move(qkv[0]), k = std::move(qkv[1]), v = std::move(qkv[2]);
  }
  if (rotary) {
    q = apply_rope(q, 0, rope);
    k = apply_rope(k, 0, rope);
  }
  AttentionExtras extras =
      key_ranges(Cross ? ctx.memory_mask : ctx.mask, k.dim(0), k.dim(2), p.path().view());
  if (score_bias) {
    REDCO_CHECK(ctx.score_bias.defined(),
                "{}: this attention adds a score bias, but none was computed before it (put an "
                "nn::RelativePositionBias before the layers)",
                p.path().view());
    REDCO_CHECK(ctx.score_bias.shape() == (Shape{q.dim(1), q.dim(2), k.dim(2)}),
                "{}: the score bias is {} but the scores are [{} heads, {} queries, {} keys]",
                p.path().view(), ctx.score_bias.shape(), q.dim(1), q.dim(2), k.dim(2));
    extras.bias = ctx.score_bias;
  }
  const Tensor o = attention_merged_heads(q, k, v, causal, logit_scale(ctx), extras);  // [B,T,h*hd]
  const Tensor bias = Bias && o_bias ? p["o_proj.bias"] : Tensor();
  if (split) return leave_parallel(linear(o, p["o_proj.weight"]), bias, ctx);
  return linear(o, p["o_proj.weight"], bias);
}

template <bool Bias, bool Cross>
float Attention<Bias, Cross>::logit_scale(const Ctx& ctx) const {
  const float s = scale > 0.f ? scale : 1.f / std::sqrt(float(head_dim()));
  return scale_by_inverse_layer ? s / float(ctx.layer + 1) : s;
}

template struct Attention<true, false>;
template struct Attention<false, false>;
template struct Attention<true, true>;
template struct Attention<false, true>;

Tensor GatedMLP::forward(const Params& p, const Tensor& x, Ctx& ctx) const {
  const std::string at(p.path().view());
  const Tensor& gate = p["gate_proj.weight"];
  const Tensor& up = p["up_proj.weight"];
  const Tensor& down = p["down_proj.weight"];
  const int g = shard_dim(gate, Shape{hidden, dim}, {0}, ctx, at + ".gate_proj.weight");
  const int u = shard_dim(up, Shape{hidden, dim}, {0}, ctx, at + ".up_proj.weight");
  const int d = shard_dim(down, Shape{dim, hidden}, {1}, ctx, at + ".down_proj.weight");
  REDCO_CHECK(g == u && (g == 0) == (d == 1),
              "{}: gate/up/down_proj are split inconsistently (one split, another whole); cut "
              "them with train::shard_params(full, shard::resolve(model, n), rank, n)",
              at);
  // Split: gate and up column-parallel on one entered input, down row-parallel.
  const bool split = g == 0;
  const Tensor in = split ? enter_parallel(x, ctx) : whole_features(x, ctx);
  const Tensor h = silu(linear(in, gate)) * linear(in, up);  // [B, T, hidden (/ n)]
  return split ? leave_parallel(linear(h, down), Tensor(), ctx) : linear(h, down);
}

}  // namespace redco::nn
