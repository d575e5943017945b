// The run-time parts of the DSL: parameter lookup, initialisation and the
// forward passes too long to sit in the headers.
#include <fmt/format.h>

#include <cstring>

#include "redco/comm/comm.hpp"
#include "redco/core/allocator.hpp"
#include "redco/core/device_memory.hpp"
#include "redco/nn/kv_cache.hpp"
#include "redco/nn/model.hpp"
#include "redco/nn/param_read_hook.hpp"

namespace redco::nn {

void record_tap(Ctx& ctx, const Params& p, const Tensor& x, const Tensor& y, bool bias,
                int64_t kernel, int64_t stride, int64_t pad) {
  REDCO_CHECK(!ctx.mp || ctx.mp->size() == 1,
              "per-example gradient clipping: layer '{}' is split across {} model shards; "
              "run it with n_model_shards = 1",
              p.path().view(), ctx.mp->size());
  ctx.taps->push_back({std::string(p.path().dot("weight").view()),
                       bias ? std::string(p.path().dot("bias").view()) : std::string(), x, y,
                       kernel, stride, pad});
}

Name Params::next_scope_name() const {
  REDCO_CHECK(*pos_ < scope_size_,
              "model scope '{}' has {} named layers, but the forward pass asked for more",
              path_.view(), scope_size_);
  return scope_[(*pos_)++];
}

Tensor Params::operator[](std::string_view leaf) const { return lookup(path_.dot(leaf).view()); }

Tensor Params::at_root(std::string_view name) const {
  return root_.size() == 0 ? lookup(name) : lookup(root_.dot(name).view());
}

Shape Params::shape(std::string_view leaf) const {
  const Name full = path_.dot(leaf);
  if (auto it = tree_->find(std::string(full.view())); it != tree_->end())
    return it->second.shape();
  if (ParamReadHook* hook = param_read_hook())
    if (std::optional<Shape> s = hook->shape_of(full.view())) return *s;
  return lookup(full.view()).shape();  // a missing parameter fails there, with its message
}

int Params::split(std::string_view leaf) const {
  const Name full = path_.dot(leaf);
  // The plan names parameters relative to the model, without its root.
  std::string_view name = full.view();
  if (root_.size()) name.remove_prefix(std::min(name.size(), root_.size() + 1));
  return split_of(name);
}

int Params::split_at_root(std::string_view name) const { return split_of(name); }

int Params::split_of(std::string_view model_name) const {
  if (!splits_) return -1;
  auto it = splits_->find(model_name);
  REDCO_CHECK(it != splits_->end(),
              "parameter '{}' is read by the forward pass but is not in the model's shard plan "
              "(its layer's walk() must declare it with w.param)",
              model_name);
  return it->second;
}

ParamReadHook*& param_read_hook() {
  thread_local ParamReadHook* hook = nullptr;
  return hook;
}

Tensor Params::lookup(std::string_view name) const {
  ParamReadHook* hook = param_read_hook();
  if (hook) hook->before_read(name);
  auto it = tree_->find(std::string(name));
  if (it == tree_->end() && hook)
    if (Tensor provided = hook->provide(name); provided.defined()) return provided;
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

Tensor take_logit_rows(const Tensor& x, const Ctx& ctx) {
  if (!ctx.logit_rows.defined()) return x;
  REDCO_CHECK(!GradMode::enabled() || !x.requires_grad(),
              "logit_rows is for generation: run the model without gradients");
  const int64_t B = x.dim(0), T = x.dim(1), d = x.dim(2);
  REDCO_CHECK(ctx.logit_rows.shape() == Shape{B}, "logit_rows must be i64 [{}], got {}", B,
              ctx.logit_rows.shape());
  const Device dev = x.device();
  const Tensor rows = ctx.logit_rows.to(Device::cpu());  // host bookkeeping
  Tensor y = Tensor::empty({B, 1, d}, x.dtype(), dev);
  const size_t row = size_t(d) * dtype_size(x.dtype());
  for (int64_t b = 0; b < B; ++b) {
    const int64_t t = rows.data<int64_t>()[b];
    REDCO_CHECK(t >= 0 && t < T, "logit_rows: row {} asks for position {} of {}", b, t, T);
    copy_bytes(static_cast<char*>(y.device_ptr()) + size_t(b) * row, dev,
               static_cast<const char*>(x.device_ptr()) + size_t(b * T + t) * row, dev, row);
  }
  return y;
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

Tensor Positions::forward(const Params& p, const Tensor& ids, Ctx& ctx) const {
  REDCO_CHECK(ids.rank() >= 1, "positions: expected ids [batch, seq], got {}", ids.shape());
  const int64_t T = ids.dim(-1);
  if (ctx.cache) {  // each row continues from its own length: [B, T, d]
    Tensor pos = Tensor::empty(ids.shape(), DType::i64);
    int64_t* q = pos.data<int64_t>();
    for (int64_t b = 0; b < ids.dim(0); ++b)
      for (int64_t t = 0; t < T; ++t)
        q[b * T + t] = std::min(ctx.cache->length(b) + t, max_len - offset - 1) + offset;
    for (int64_t b = 0; b < ids.dim(0); ++b)
      REDCO_CHECK(ctx.cache->length(b) + ctx.cache->appended(b) <= max_len - offset,
                  "positions: row {} reaches position {}, past the model's maximum {}", b,
                  ctx.cache->length(b) + ctx.cache->appended(b), max_len - offset);
    return embedding(p["weight"], pos.to(p["weight"].device()));  // host-built positions
  }
  REDCO_CHECK(T + offset <= max_len, "positions: sequence length {} exceeds the model's maximum {}",
              T, max_len - offset);
  if (count_tokens && ctx.mask.defined()) return counted(p, ids, ctx.mask);
  return slice(p["weight"], 0, offset, offset + T);  // [T, d], broadcast over the batch
}

// Row b's token t sits at (real tokens up to t) - 1; padding at -1 (the
// table's row offset - 1, as transformers' OPT does). [B, T, d].
Tensor Positions::counted(const Params& p, const Tensor& ids, const Tensor& mask) const {
  REDCO_CHECK(mask.shape() == ids.shape(), "positions: the mask {} does not match the ids {}",
              mask.shape(), ids.shape());
  const Tensor m = mask.to(Device::cpu()).to(DType::f32);
  Tensor pos = Tensor::empty(ids.shape(), DType::i64);
  const int64_t B = ids.dim(0), T = ids.dim(1);
  for (int64_t b = 0; b < B; ++b) {
    int64_t seen = 0;
    for (int64_t t = 0; t < T; ++t) {
      const bool real = m.data<float>()[b * T + t] != 0.f;
      seen += real;
      pos.data<int64_t>()[b * T + t] = std::max<int64_t>(0, offset + (real ? seen - 1 : -1));
    }
  }
  return embedding(p["weight"], pos.to(p["weight"].device()));
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
  // Host-computed ranges go where the mask (and so the attention) is.
  x.key_begin = x.key_begin.to(mask.device()), x.key_end = x.key_end.to(mask.device());
  return x;
}

template <bool Bias>
Tensor LMHeadOf<Bias>::forward(const Params& p, const Tensor& x, Ctx& ctx) const {
  // A tied table's shape was checked by the embedding that owns it.
  const Tensor& table = tied_to ? p.at_root(tied_to) : p["weight"];
  const int split =
      tied_to ? p.split_at_root(tied_to) : split_of(p, "weight", Shape{vocab, dim}, ctx);
  const Tensor h = enter_vocab_head(take_logit_rows(x, ctx), split, ctx);
  if constexpr (!Bias) {
    return vocab_head_logits(h, table, ctx);
  } else {
    const Tensor& b = p["bias"];  // [vocab] or this rank's slice, as the table
    REDCO_CHECK(b.rank() == 1 && b.dim(0) == table.dim(0),
                "'{}' has shape {} but the LM head's table holds {} rows here; cut both with "
                "train::shard_params(full, shard::resolve(model, n), rank, n)",
                p.path().dot("bias").view(), b.shape(), table.dim(0));
    return matmul(h, table, false, true) + b;  // [B, T, vocab (/ n)]
  }
}

template struct LMHeadOf<false>;
template struct LMHeadOf<true>;

template <bool Bias, bool Cross>
bool Attention<Bias, Cross>::split_heads(const Params& p, const Ctx& ctx) const {
  // The plan splits the four projections together, by whole heads, or none
  // of them (one group); reading each checks its shard's shape.
  const int64_t hd = head_dim(), kv = kv_heads * hd, qw = heads * hd;
  const int q = split_of(p, "q_proj.weight", Shape{qw, dim}, ctx);
  split_of(p, "k_proj.weight", Shape{kv, dim}, ctx);
  split_of(p, "v_proj.weight", Shape{kv, dim}, ctx);
  split_of(p, "o_proj.weight", Shape{dim, qw}, ctx);
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
  const Tensor o = ctx.cache ? attend_cached(p, in, split, ctx) : attend(p, in, split, ctx);
  const Tensor bias = Bias && o_bias ? p["o_proj.bias"] : Tensor();
  if (split) return leave_parallel(linear(o, p["o_proj.weight"]), bias, ctx);
  return linear(o, p["o_proj.weight"], bias);
}

// Every query against every key of this call: training, evaluation, and
// generation without a cache. Returns [B, T, local heads * hd].
template <bool Bias, bool Cross>
Tensor Attention<Bias, Cross>::attend(const Params& p, const Tensor& in, bool split,
                                      Ctx& ctx) const {
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
  return attention_merged_heads(q, k, v, causal, logit_scale(ctx), extras);
}

// Generation: this step's queries against the cached keys and values.
template <bool Bias, bool Cross>
Tensor Attention<Bias, Cross>::attend_cached(const Params& p, const Tensor& in, bool split,
                                             Ctx& ctx) const {
  KVCache& cache = *ctx.cache;
  const std::string path(p.path().view());
  REDCO_CHECK(cache.in_step() && in.dim(0) == cache.batch(),
              "{}: the KV cache (batch {}) must be in a step (KVCache::begin) for this input {}",
              path, cache.batch(), in.shape());
  if constexpr (Cross) {
    KVCache::Slots* s = &cache.cross(path);
    if (!s->k.defined()) {  // the encoder's keys and values, once per source (not per beam)
      const Tensor kv_in = split ? to_parallel(ctx.memory, ctx) : ctx.memory;
      s = &cache.set_cross(path, project(p, "k_proj", kv_in), project(p, "v_proj", kv_in));
    }
    const Tensor q = project(p, "q_proj", in);
    const AttentionExtras extras = key_ranges(ctx.memory_mask, s->k.dim(0), s->k.dim(2), path);
    return attention_merged_heads(q, s->k, s->v, false, logit_scale(ctx), extras);
  } else {
    REDCO_CHECK(causal, "{}: a KV cache serves causal self-attention only", path);
    // A decode step reads each weight once: three GEMVs beat stacking the
    // weights (a copy of all three) for one GEMM. Weights packed for decoding
    // or quantized are never stacked: the copy would widen or re-quantize all
    // three on every prefill (LLaMA 1.1B bf16, 17-token prompt: 0.6 s, of
    // which the projections take 0.2), while each has its own prefill kernel.
    Tensor q, k, v;
    if (in.dim(0) * in.dim(1) <= 16 || !stacks_as_stored(p["q_proj.weight"])) {
      q = project(p, "q_proj", in), k = project(p, "k_proj", in), v = project(p, "v_proj", in);
    } else {
      TensorList qkv = project_qkv(p, in);
      q = std::move(qkv[0]), k = std::move(qkv[1]), v = std::move(qkv[2]);
    }
    if (rotary) {
      thread_local RopeTable table;  // reused step after step
      fill_rope_table(table, cache.lengths(), q.dim(2), head_dim(), rope);
      q = apply_rope_table(q, table), k = apply_rope_table(k, table);
    }
    // Weights in bf16 or int8 (inference): a bf16 cache by default, so a decode
    // step streams half the bytes of it as well (the CPU's decode attention reads bf16).
    const DType stored =
        cache.dtype().value_or(p["k_proj.weight"].dtype() != DType::f32 ? DType::bf16 : k.dtype());
    // The cache lives where the keys are.
    KVCache::Slots& s = cache.self(path, k.dim(1), head_dim(), stored, k.device());
    cache.store(s, k, v);
    // The rows' key ranges are the host's bookkeeping: a small copy per step.
    AttentionExtras extras;
    extras.key_begin = Tensor::zeros({cache.batch()}, DType::i64, q.device());
    extras.key_end = cache.key_end().to(q.device());
    extras.causal_offset = cache.causal_offset().to(q.device());
    extras.block_table = cache.block_table();  // paged: the rows' blocks (host)
    if (score_bias) {  // one per row, over every slot (RelativePositionBias)
      REDCO_CHECK(!cache.paged(),
                  "{}: a paged KV cache serves attention without a score bias (T5's relative "
                  "positions need rows of slots: a KVCache without Paging)",
                  path);
      REDCO_CHECK(ctx.score_bias.shape() == (Shape{q.dim(0), q.dim(1), q.dim(2), s.k.dim(2)}),
                  "{}: the score bias is {} but the cached scores are [{} rows, {} heads, {} "
                  "queries, {} slots] (put an nn::RelativePositionBias before the layers)",
                  path, ctx.score_bias.shape(), q.dim(0), q.dim(1), q.dim(2), s.k.dim(2));
      extras.bias = ctx.score_bias;
    }
    return attention_merged_heads(q, s.k, s.v, true, logit_scale(ctx), extras);
  }
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
  const Tensor& gate = p["gate_proj.weight"];
  const Tensor& up = p["up_proj.weight"];
  const Tensor& down = p["down_proj.weight"];
  // One group in the plan: gate and up column-parallel on one entered input,
  // down row-parallel, or all three whole.
  const bool split = split_of(p, "gate_proj.weight", Shape{hidden, dim}, ctx) == 0;
  split_of(p, "up_proj.weight", Shape{hidden, dim}, ctx);
  split_of(p, "down_proj.weight", Shape{dim, hidden}, ctx);
  const Tensor in = split ? enter_parallel(x, ctx) : whole_features(x, ctx);
  const Tensor h = silu(linear(in, gate)) * linear(in, up);  // [B, T, hidden (/ n)]
  return split ? leave_parallel(linear(h, down), Tensor(), ctx) : linear(h, down);
}

}  // namespace redco::nn
