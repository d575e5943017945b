#pragma once
// The spelling users write: nn::linear(784, 256) | nn::relu() | ...
#include "redco/nn/combinators.hpp"

namespace redco::nn {

inline Linear<true> linear(int64_t in, int64_t out) { return {.in = in, .out = out}; }
inline Linear<false> linear_no_bias(int64_t in, int64_t out) { return {.in = in, .out = out}; }
inline Embedding embedding(int64_t vocab, int64_t dim) { return {.vocab = vocab, .dim = dim}; }
inline Positions positions(int64_t max_len, int64_t dim, int64_t offset = 0) {
  return {.max_len = max_len, .dim = dim, .offset = offset};
}
inline Projection projection(int64_t in, int64_t out) { return {.in = in, .out = out}; }
// `vocab` (the embedding's rows) is optional: the plan says whether the table is split.
inline TiedLMHead<> tied_lm_head(int64_t vocab = 0) { return {.vocab = vocab}; }
inline LMHead lm_head(int64_t dim, int64_t vocab) { return {.dim = dim, .vocab = vocab}; }
inline BiasedLMHead biased_lm_head(int64_t dim, int64_t vocab) {
  return {.dim = dim, .vocab = vocab};
}
inline LayerNorm<true> layer_norm(int64_t dim, float eps = 1e-5f) {
  return {.dim = dim, .eps = eps};
}
inline RMSNorm rms_norm(int64_t dim, float eps = 1e-6f) { return {.dim = dim, .eps = eps}; }

// Designated initialisers name these fields in the order declared below (C++20 rule).
struct AttentionOptions {
  int64_t kv_heads = 0;  // 0: as many as query heads; fewer: grouped-query attention
  bool rotary = false;
  RopeOptions rope{};
  int64_t head_dim = 0;                 // 0: dim / heads
  bool qkv_bias = true, o_bias = true;  // with a Bias layer: which projections have one
};
template <bool Bias = true>
Attention<Bias> causal_attention(int64_t dim, int64_t heads, AttentionOptions o = {}) {
  REDCO_CHECK(heads > 0 && (o.head_dim > 0 || dim % heads == 0),
              "causal_attention: dim {} must be a multiple of heads {} (or give head_dim)", dim,
              heads);
  const int64_t kv = o.kv_heads ? o.kv_heads : heads;
  REDCO_CHECK(heads % kv == 0, "causal_attention: heads {} must be a multiple of kv_heads {}",
              heads, kv);
  return {.dim = dim,
          .heads = heads,
          .kv_heads = kv,
          .causal = true,
          .rotary = o.rotary,
          .rope = o.rope,
          .head_size = o.head_dim,
          .qkv_bias = o.qkv_bias,
          .o_bias = o.o_bias};
}
template <bool Bias = true>
Attention<Bias> self_attention(int64_t dim, int64_t heads, AttentionOptions o = {}) {
  auto a = causal_attention<Bias>(dim, heads, o);
  a.causal = false;
  return a;
}
template <bool Bias = true>
Attention<Bias, true> cross_attention(int64_t dim, int64_t heads) {
  REDCO_CHECK(heads > 0 && dim % heads == 0,
              "cross_attention: dim {} must be a multiple of heads {}", dim, heads);
  return {.dim = dim, .heads = heads, .kv_heads = heads, .causal = false};
}

template <bool Bias = true>
MLP<Bias> mlp(int64_t dim, int64_t hidden, Act act = Act::gelu) {
  return {.dim = dim, .hidden = hidden, .act = act};
}
inline GatedMLP gated_mlp(int64_t dim, int64_t hidden) { return {.dim = dim, .hidden = hidden}; }

inline Activation relu() { return {.act = Act::relu}; }
inline Activation gelu() { return {.act = Act::gelu}; }
inline Activation silu() { return {.act = Act::silu}; }
inline Activation tanh() { return {.act = Act::tanh}; }
inline Dropout dropout(float rate) { return {.rate = rate}; }

inline Conv2d conv2d(int64_t in, int64_t out, int64_t kernel = 3, int64_t stride = 1,
                     int64_t pad = 1) {
  return {.in = in, .out = out, .kernel = kernel, .stride = stride, .pad = pad};
}
inline Pool2d max_pool(int64_t kernel = 2) {
  return {.kernel = kernel, .stride = kernel, .max = true};
}
inline Pool2d avg_pool(int64_t kernel = 2) {
  return {.kernel = kernel, .stride = kernel, .max = false};
}
inline Flatten flatten() { return {}; }

}  // namespace redco::nn
