#pragma once
// Layers. Each one holds its sizes (run-time values) and says, in `walk`,
// which parameters it owns and what part each plays in tensor parallelism;
// `forward` computes with the parameters found under its path: whole ones,
// or this rank's shards when ctx.mp is a model-parallel group, which a layer
// tells apart by their shapes (see tensor_parallel.hpp).
// Shapes: tokens are [B, T] (i64), activations [B, T, d], images [N, C, H, W].
#include <cmath>

#include "redco/autodiff/functional.hpp"
#include "redco/core/philox.hpp"
#include "redco/nn/rope.hpp"
#include "redco/nn/tensor_parallel.hpp"
#include "redco/nn/walk.hpp"

namespace redco::nn {

inline constexpr float kTransformerInitStd = 0.02f;  // GPT-2's initialiser

// Appends a layer's input and output to ctx.taps (see LayerTap); a layer split
// across model shards is one redco::Error.
void record_tap(Ctx& ctx, const Params& p, const Tensor& x, const Tensor& y, bool bias,
                int64_t kernel = 0, int64_t stride = 1, int64_t pad = 0);

// ---- fully connected -------------------------------------------------------------------
// y = x W^T + b with W stored [out, in]. Rule 1 decides column or row.
template <bool Bias = true>
struct Linear {
  static constexpr bool kTransparent = false;
  static constexpr std::string_view kName = "fc";
  int64_t in = 0, out = 0;
  static constexpr void walk(Walker& w, const Linear* l) {
    const Role role = w.next_linear_role();
    w.param("weight", role, l ? Dims{l->out, l->in} : Dims{}, Init::normal,
            l ? 1.f / std::sqrt(float(l->in)) : 0.f);
    if constexpr (Bias)
      w.param("bias", role == Role::column ? Role::column_bias : Role::row_bias,
              l ? Dims{l->out} : Dims{}, Init::zeros);
  }
  Tensor forward(const Params& p, const Tensor& x, Ctx& ctx) const {
    Tensor y = parallel_linear(x, p, "weight", Bias ? p["bias"] : Tensor(), in, out, ctx);
    if (ctx.taps) record_tap(ctx, p, x, y, Bias);
    return y;
  }
};

// ---- embeddings and heads -----------------------------------------------------------------
struct Embedding {  // ids [B, T] -> [B, T, d]; the vocabulary is split across shards
  static constexpr bool kTransparent = false;
  static constexpr std::string_view kName = "wte";
  int64_t vocab = 0, dim = 0;
  static constexpr void walk(Walker& w, const Embedding* l) {
    w.need_whole();
    w.new_group();
    w.param("weight", Role::vocab, l ? Dims{l->vocab, l->dim} : Dims{}, Init::normal,
            kTransformerInitStd);
    w.add_collective(Collective::all_reduce);  // each shard looks up its slice of the vocabulary
  }
  Tensor forward(const Params& p, const Tensor& ids, Ctx& ctx) const {
    return parallel_embedding(p["weight"], split_of(p, "weight", Shape{vocab, dim}, ctx), ids, ctx);
  }
};

// ids [B, T] -> learned positions [T, d] (broadcast over B): rows offset ..
// offset + T - 1 of the table [max_len, d] (OPT and BART keep two rows
// before position 0, a fairseq convention: offset 2). With count_tokens, a
// padded batch (Ctx::mask) numbers each row's tokens from its first real one,
// as OPT does; otherwise positions are the input's indices, padding included
// (GPT-2's forward without position ids).
struct Positions {
  static constexpr bool kTransparent = false;
  static constexpr std::string_view kName = "wpe";
  int64_t max_len = 0, dim = 0;
  int64_t offset = 0;
  bool count_tokens = false;
  static constexpr void walk(Walker& w, const Positions* l) {
    w.param("weight", Role::replicated, l ? Dims{l->max_len, l->dim} : Dims{}, Init::normal,
            kTransformerInitStd);
  }
  Tensor forward(const Params& p, const Tensor& ids, Ctx&) const;

 private:
  Tensor counted(const Params& p, const Tensor& ids, const Tensor& mask) const;
};

// Generation asks for one position's logits per row (Ctx::logit_rows):
// x [B, T, d] -> those rows [B, 1, d]; x itself when none are asked for.
Tensor take_logit_rows(const Tensor& x, const Ctx& ctx);

// Logits from the token embedding (GPT-2's tied head): [B, T, d] -> [B, T, vocab].
// Whether the table is split by vocabulary is the plan's word for the
// embedding that owns it (which also checked its shape); `vocab` is kept for
// the callers that name it.
template <Literal Embedding = "wte.weight">
struct TiedLMHead {
  static constexpr bool kTransparent = false;
  static constexpr std::string_view kName = "";
  int64_t vocab = 0;
  static constexpr void walk(Walker& w, const TiedLMHead*) {
    w.need_whole();
    w.add_collective(Collective::vocab_logits);
  }
  Tensor forward(const Params& p, const Tensor& x, Ctx& ctx) const {
    const Tensor& table = p.at_root(Embedding.view());
    const Tensor h =
        enter_vocab_head(take_logit_rows(x, ctx), p.split_at_root(Embedding.view()), ctx);
    return vocab_head_logits(h, table, ctx);
  }
};

// An LM head [vocab, d] of its own, or, when `tied_to` names the token
// embedding (a checkpoint's tie_word_embeddings), that table: the parameter
// is then absent at run time (the compile-time plan lists it, with the role
// the embedding has too). With Bias (GPT-J's lm_head) a logit bias [vocab]
// is added; it is split by vocabulary with the table, so each rank adds its
// slice to its slice of the logits. Biased logits are formed whole even in
// training (the deferred, chunked loss knows no bias).
template <bool Bias>
struct LMHeadOf {
  static constexpr bool kTransparent = false;
  static constexpr std::string_view kName = "lm_head";
  int64_t dim = 0, vocab = 0;
  const char* tied_to = nullptr;
  static constexpr void walk(Walker& w, const LMHeadOf* l) {
    w.need_whole();
    w.new_group();
    if (!l || !l->tied_to)
      w.param("weight", Role::vocab, l ? Dims{l->vocab, l->dim} : Dims{}, Init::normal,
              kTransformerInitStd);
    if constexpr (Bias) w.param("bias", Role::vocab, l ? Dims{l->vocab} : Dims{}, Init::zeros);
    w.add_collective(Collective::vocab_logits);
  }
  Tensor forward(const Params& p, const Tensor& x, Ctx& ctx) const;
};
using LMHead = LMHeadOf<false>;
using BiasedLMHead = LMHeadOf<true>;

// A bias-free linear map between two feature sizes that stays whole on every
// shard (OPT's project_in / project_out between word_embed_proj_dim and
// hidden_size): it sits between layers that need whole features (the
// embedding's sum, the final norm and the vocabulary-split head), so
// splitting it would add a gather for a matrix of well under 1% of the model.
struct Projection {
  static constexpr bool kTransparent = false;
  static constexpr std::string_view kName = "proj";
  int64_t in = 0, out = 0;
  static constexpr void walk(Walker& w, const Projection* l) {
    w.need_whole();
    w.param("weight", Role::replicated, l ? Dims{l->out, l->in} : Dims{}, Init::normal,
            l ? 1.f / std::sqrt(float(l->in)) : 0.f);
  }
  Tensor forward(const Params& p, const Tensor& x, Ctx& ctx) const {
    return linear(whole_features(x, ctx), p["weight"]);
  }
};

// ---- norms ------------------------------------------------------------------------------
template <bool Bias = true>
struct LayerNorm {
  static constexpr bool kTransparent = false;
  static constexpr std::string_view kName = "ln";
  int64_t dim = 0;
  float eps = 1e-5f;
  static constexpr void walk(Walker& w, const LayerNorm* l) {
    w.need_whole();
    w.param("weight", Role::replicated, l ? Dims{l->dim} : Dims{}, Init::ones);
    if constexpr (Bias) w.param("bias", Role::replicated, l ? Dims{l->dim} : Dims{}, Init::zeros);
  }
  Tensor forward(const Params& p, const Tensor& x, Ctx& ctx) const {
    return layer_norm(whole_features(x, ctx), p["weight"], Bias ? p["bias"] : Tensor(), eps);
  }
};

struct RMSNorm {
  static constexpr bool kTransparent = false;
  static constexpr std::string_view kName = "norm";
  int64_t dim = 0;
  float eps = 1e-6f;
  static constexpr void walk(Walker& w, const RMSNorm* l) {
    w.need_whole();
    w.param("weight", Role::replicated, l ? Dims{l->dim} : Dims{}, Init::ones);
  }
  Tensor forward(const Params& p, const Tensor& x, Ctx& ctx) const {
    return rms_norm(whole_features(x, ctx), p["weight"], eps);
  }
};

// ---- attention ---------------------------------------------------------------------------
// Multi-head attention, q/k/v/o projections named as in Hugging Face models.
// kv_heads < heads is grouped-query attention; `rotary` applies rotary
// positions (nn/rope.hpp) to q and k. Cross-attention reads keys and values
// from ctx.memory. The head size is dim / heads unless head_size says
// otherwise (q is [heads * head_size, dim], o [dim, heads * head_size]).
// With Bias, qkv_bias / o_bias say which projections carry one (Qwen2: q, k
// and v only). Logits are scaled by `scale` (0: 1/sqrt(head size)), further
// divided by the layer's index + 1 with scale_by_inverse_layer (GPT-2's
// scale_attn_by_inverse_layer_idx; the index is the enclosing repeat's copy).
// With score_bias, ctx.score_bias [this rank's heads, Tq, Tk] is added to the
// scaled scores (T5's relative position bias, nn::RelativePositionBias).
// Tensor-parallel: each rank holds whole heads of q, k and v (as many local
// heads as its q rows hold) and the matching input columns of o.
template <bool Bias = true, bool Cross = false>
struct Attention {
  static constexpr bool kTransparent = false;
  static constexpr std::string_view kName = Cross ? "cross_attn" : "attn";
  int64_t dim = 0, heads = 0, kv_heads = 0;
  bool causal = true, rotary = false;
  RopeOptions rope{};
  int64_t head_size = 0;
  bool qkv_bias = true, o_bias = true;
  float scale = 0.f;
  bool scale_by_inverse_layer = false;
  int64_t window = 0;       // > 0: sliding-window attention, refused for longer sequences
  bool score_bias = false;  // add ctx.score_bias to the scores (nn/encoder_layers.hpp)

  int64_t head_dim() const { return head_size ? head_size : dim / heads; }
  static constexpr void walk(Walker& w, const Attention* l) {
    w.begin_block();
    const int64_t hd = l ? l->head_dim() : 1;  // splits keep whole heads
    const Dims q = l ? Dims{l->heads * hd, l->dim} : Dims{};
    const Dims kv = l ? Dims{l->kv_heads * hd, l->dim} : Dims{};
    const Dims o = l ? Dims{l->dim, l->heads * hd} : Dims{};
    const float std = kTransformerInitStd;
    const bool qkv_bias = Bias && (!l || l->qkv_bias), o_bias = Bias && (!l || l->o_bias);
    auto bias = [&](const char* name, bool on, Role role, int64_t n) {
      if (on) w.param(name, role, l ? Dims{n} : Dims{}, Init::zeros, 0.f, hd);
    };
    w.param("q_proj.weight", Role::attn_q, q, Init::normal, std, hd);
    bias("q_proj.bias", qkv_bias, Role::column_bias, q.d[0]);
    w.param("k_proj.weight", Role::attn_k, kv, Init::normal, std, hd);
    bias("k_proj.bias", qkv_bias, Role::column_bias, kv.d[0]);
    w.param("v_proj.weight", Role::attn_v, kv, Init::normal, std, hd);
    bias("v_proj.bias", qkv_bias, Role::column_bias, kv.d[0]);
    w.param("o_proj.weight", Role::attn_o, o, Init::normal, std, hd);
    bias("o_proj.bias", o_bias, Role::row_bias, o.d[0]);
    w.end_block();
  }
  Tensor forward(const Params& p, const Tensor& x, Ctx& ctx) const;

 private:
  bool split_heads(const Params& p, const Ctx& ctx) const;
  Tensor project(const Params& p, const char* name, const Tensor& x) const;
  TensorList project_qkv(const Params& p, const Tensor& x) const;
  float logit_scale(const Ctx& ctx) const;
  Tensor attend(const Params& p, const Tensor& in, bool split, Ctx& ctx) const;
  Tensor attend_cached(const Params& p, const Tensor& in, bool split, Ctx& ctx) const;
};

// Key ranges for attention from an attention mask [batch, keys] (see
// Ctx::mask); nothing when the mask is undefined.
AttentionExtras key_ranges(const Tensor& mask, int64_t batch, int64_t keys, std::string_view where);

// ---- feed-forward blocks --------------------------------------------------------------------
enum class Act : uint8_t { relu, gelu, gelu_erf, silu, tanh };
Tensor activate(Act a, const Tensor& x);

// fc1 -> activation -> fc2: rule 1 makes fc1 column-parallel and fc2 row-parallel.
template <bool Bias = true>
struct MLP {
  static constexpr bool kTransparent = false;
  static constexpr std::string_view kName = "mlp";
  int64_t dim = 0, hidden = 0;
  Act act = Act::gelu;
  static constexpr void walk(Walker& w, const MLP* l) {
    w.need_whole();
    for (int i = 0; i < 2; ++i) {
      const Role role = w.next_linear_role();
      const Dims shape = !l ? Dims{} : i == 0 ? Dims{l->hidden, l->dim} : Dims{l->dim, l->hidden};
      w.param(i == 0 ? "fc1.weight" : "fc2.weight", role, shape, Init::normal, kTransformerInitStd);
      if constexpr (Bias)
        w.param(i == 0 ? "fc1.bias" : "fc2.bias", i == 0 ? Role::column_bias : Role::row_bias,
                l ? Dims{shape.d[0]} : Dims{}, Init::zeros);
    }
  }
  Tensor forward(const Params& p, const Tensor& x, Ctx& ctx) const {
    const Tensor b1 = Bias ? p["fc1.bias"] : Tensor(), b2 = Bias ? p["fc2.bias"] : Tensor();
    const Tensor& w2 = p["fc2.weight"];
    if (act != Act::gelu && act != Act::gelu_erf) {
      const Tensor h = activate(act, parallel_linear(x, p, "fc1.weight", b1, dim, hidden, ctx));
      return parallel_linear(h, p, "fc2.weight", b2, hidden, dim, ctx);
    }
    // GELU: fc1's bias, the GELU and fc2 run as one op that keeps only fc1's
    // output for backward (bias_gelu_linear); fc2's bias follows its reduction.
    const Tensor y = parallel_linear(x, p, "fc1.weight", Tensor(), dim, hidden, ctx);
    const int split2 = split_of(p, "fc2.weight", Shape{dim, hidden}, ctx);
    if (split2 == 1 && ctx.split_features)  // column fc1 -> row fc2
      return leave_parallel(bias_gelu_linear(y, b1, w2, act == Act::gelu), b2, ctx);
    if (split2 == -1 && !ctx.split_features) {  // both whole
      const Tensor z = bias_gelu_linear(y, b1, w2, act == Act::gelu);
      return b2.defined() ? add(z, b2) : z;
    }
    const Tensor h = activate(act, b1.defined() ? add(y, b1) : y);  // mixed layouts
    return parallel_linear(h, p, "fc2.weight", b2, hidden, dim, ctx);
  }
};

// down(silu(gate(x)) * up(x)) (LLaMA's SwiGLU): gate and up read the same
// input, so both are column-parallel; down is row-parallel.
struct GatedMLP {
  static constexpr bool kTransparent = false;
  static constexpr std::string_view kName = "mlp";
  int64_t dim = 0, hidden = 0;
  static constexpr void walk(Walker& w, const GatedMLP* l) {
    w.begin_block();
    const Dims in = l ? Dims{l->hidden, l->dim} : Dims{};
    w.param("gate_proj.weight", Role::column, in, Init::normal, kTransformerInitStd);
    w.param("up_proj.weight", Role::column, in, Init::normal, kTransformerInitStd);
    w.param("down_proj.weight", Role::row, l ? Dims{l->dim, l->hidden} : Dims{}, Init::normal,
            kTransformerInitStd);
    w.end_block();
  }
  Tensor forward(const Params& p, const Tensor& x, Ctx& ctx) const;
};

// ---- parameter-free layers ---------------------------------------------------------------------
struct Activation {  // elementwise: works on split features as well as whole ones
  static constexpr bool kTransparent = false;
  static constexpr std::string_view kName = "";
  Act act = Act::relu;
  static constexpr void walk(Walker&, const Activation*) {}
  Tensor forward(const Params&, const Tensor& x, Ctx&) const { return activate(act, x); }
};

// Masks depend on (seed, step, call index, element index): identical under any
// sharding (split features take their slice of the whole mask).
struct Dropout {
  static constexpr bool kTransparent = false;
  static constexpr std::string_view kName = "";
  float rate = 0.1f;
  static constexpr void walk(Walker&, const Dropout*) {}
  Tensor forward(const Params&, const Tensor& x, Ctx& ctx) const {
    return parallel_dropout(x, rate, ctx);
  }
};

// ---- images ---------------------------------------------------------------------------------
struct Conv2d {  // replicated: small image models are data-parallel
  static constexpr bool kTransparent = false;
  static constexpr std::string_view kName = "conv";
  int64_t in = 0, out = 0, kernel = 3, stride = 1, pad = 1;
  static constexpr void walk(Walker& w, const Conv2d* l) {
    w.need_whole();
    const float std = l ? 1.f / std::sqrt(float(l->in * l->kernel * l->kernel)) : 0.f;
    w.param("weight", Role::replicated, l ? Dims{l->out, l->in, l->kernel, l->kernel} : Dims{},
            Init::normal, std);
    w.param("bias", Role::replicated, l ? Dims{l->out} : Dims{}, Init::zeros);
  }
  Tensor forward(const Params& p, const Tensor& x, Ctx& ctx) const {
    const Tensor in = whole_features(x, ctx);
    Tensor y = conv2d(in, p["weight"], p["bias"], stride, pad);
    if (ctx.taps) record_tap(ctx, p, in, y, true, kernel, stride, pad);
    return y;
  }
};

struct Pool2d {
  static constexpr bool kTransparent = false;
  static constexpr std::string_view kName = "";
  int64_t kernel = 2, stride = 2;
  bool max = true;
  static constexpr void walk(Walker& w, const Pool2d*) { w.need_whole(); }
  Tensor forward(const Params&, const Tensor& x, Ctx& ctx) const {
    const Tensor in = whole_features(x, ctx);
    return max ? max_pool2d(in, kernel, stride) : avg_pool2d(in, kernel, stride);
  }
};

struct Flatten {  // [N, C, H, W] -> [N, C*H*W]
  static constexpr bool kTransparent = false;
  static constexpr std::string_view kName = "";
  static constexpr void walk(Walker& w, const Flatten*) { w.need_whole(); }
  Tensor forward(const Params&, const Tensor& x, Ctx& ctx) const {
    return flatten(whole_features(x, ctx), 1);
  }
};

}  // namespace redco::nn
