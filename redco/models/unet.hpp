#pragma once
// A small text-conditioned UNet for diffusion models on small images
// (Fashion-MNIST, 28x28), predicting the noise in x_t.
//
//   input  x [B, channels, size, size] f32 (size divisible by 4)
//          ctx.timesteps [B] f32, ctx.memory: text embeddings [B, L, text_dim]
//          (ctx.memory_mask [B, L] for padded captions, optional)
//   output [B, channels, size, size]
//
// Layout (C = base channels; skips s1..s3 concatenated along channels):
//   time_embedding: sinusoid(t) -> linear_1 -> SiLU -> linear_2       [B, 4C]
//   text_proj: text [B, L, D] -> [B, L, 2C], the keys of every cross-attention
//   conv_in                                   size     C
//   down_0 (res)                        = s1  size     C
//   downsample_0 (conv, stride 2)             size/2   C
//   down_1 (res) + down_1_attn          = s2  size/2  2C
//   downsample_1                              size/4  2C
//   down_2 (res) + down_2_attn          = s3  size/4  2C
//   mid_0 (res), mid_attn, mid_1 (res)        size/4  2C
//   up_2 (res on [h, s3]) + up_2_attn         size/4  2C
//   upsample_1 (nearest 2x, conv)             size/2  2C
//   up_1 (res on [h, s2]) + up_1_attn         size/2  2C
//   upsample_0                                size    2C
//   up_0 (res on [h, s1])                     size     C
//   norm_out, SiLU, conv_out                  size     channels
// A residual block is norm1 -> SiLU -> conv1, plus time_emb_proj(SiLU(emb))
// per channel, then norm2 -> SiLU -> conv2, plus the input (through a 1x1
// conv_shortcut when the channels change). A cross-attention block is
// x + cross_attn(group_norm(x) as [B, H*W, 2C] queries, text_proj as keys).
//
// Tensor parallelism from the two rules: the time embedding's linear_1 /
// linear_2 are a column / row pair (rule 1), and each cross-attention's
// q/k/v split by heads, o by its input (rule 2). The rules do not cover
// convolutions: they are replicated, as are group norms, text_proj and each
// block's time_emb_proj (its output is added to a replicated feature map, so
// a split would need a gather for a [C, 4C] matrix).
#include "redco/nn/ctx_inputs.hpp"
#include "redco/nn/model.hpp"

namespace redco::models {

// Designated initialisers name these fields in the order declared below (C++20 rule).
struct UNetConfig {
  int64_t channels = 1;   // image channels
  int64_t size = 28;      // image height = width; divisible by 4 (two down-samplings)
  int64_t base = 32;      // C: channels at full resolution, 2C below
  int64_t text_dim = 64;  // D of the text embeddings [B, L, D]
  int64_t heads = 4;      // cross-attention heads; divide 2C
  int64_t groups = 8;     // group-norm groups; divide C
};

// GroupNorm over channels of [N, C, ...] with a per-channel scale and shift.
struct GroupNorm {
  static constexpr bool kTransparent = false;
  static constexpr std::string_view kName = "norm";
  int64_t channels = 0, groups = 1;
  float eps = 1e-5f;
  static constexpr void walk(nn::Walker& w, const GroupNorm* l) {
    w.need_whole();
    w.param("weight", nn::Role::replicated, l ? nn::Dims{l->channels} : nn::Dims{}, nn::Init::ones);
    w.param("bias", nn::Role::replicated, l ? nn::Dims{l->channels} : nn::Dims{}, nn::Init::zeros);
  }
  Tensor forward(const nn::Params& p, const Tensor& x, nn::Ctx& ctx) const {
    return group_norm(nn::whole_features(x, ctx), groups, p["weight"], p["bias"], eps);
  }
};

// Sinusoidal features of the timesteps [B] (diffusers' get_timestep_embedding
// with flip_sin_to_cos, shift 0: [cos(t f_i), sin(t f_i)], f_i = 10000^(-i/half)),
// then linear_1 -> SiLU -> linear_2: [B] -> [B, out].
struct TimestepEmbedding {
  static constexpr bool kTransparent = false;
  static constexpr std::string_view kName = "time_embedding";
  int64_t dim = 0, out = 0;  // sinusoid size (even), embedding size
  static constexpr void walk(nn::Walker& w, const TimestepEmbedding* l) {
    for (int i = 0; i < 2; ++i) {
      const nn::Role role = w.next_linear_role();
      const int64_t in = l ? (i == 0 ? l->dim : l->out) : 0;
      w.param(i == 0 ? "linear_1.weight" : "linear_2.weight", role,
              l ? nn::Dims{l->out, in} : nn::Dims{}, nn::Init::normal,
              l ? 1.f / std::sqrt(float(in)) : 0.f);
      w.param(i == 0 ? "linear_1.bias" : "linear_2.bias",
              role == nn::Role::column ? nn::Role::column_bias : nn::Role::row_bias,
              l ? nn::Dims{l->out} : nn::Dims{}, nn::Init::zeros);
    }
  }
  Tensor forward(const nn::Params& p, const Tensor& t, nn::Ctx& ctx) const;
};
// The sinusoid alone: t [B] -> [B, dim].
Tensor timestep_sinusoid(const Tensor& t, int64_t dim);

// Residual block with the timestep added; Shortcut: in != out (a 1x1 conv).
template <bool Shortcut>
struct ResBlock {
  static constexpr bool kTransparent = false;
  static constexpr std::string_view kName = "resnet";
  int64_t in = 0, out = 0, temb = 0, groups = 1;
  static constexpr void walk(nn::Walker& w, const ResBlock* l) {
    using nn::Dims, nn::Init, nn::Role;
    w.need_whole();
    auto conv = [&](const char* weight, const char* bias, int64_t o, int64_t i, int64_t k) {
      w.param(weight, Role::replicated, l ? Dims{o, i, k, k} : Dims{}, Init::normal,
              l ? 1.f / std::sqrt(float(i * k * k)) : 0.f);
      w.param(bias, Role::replicated, l ? Dims{o} : Dims{}, Init::zeros);
    };
    w.param("norm1.weight", Role::replicated, l ? Dims{l->in} : Dims{}, Init::ones);
    w.param("norm1.bias", Role::replicated, l ? Dims{l->in} : Dims{}, Init::zeros);
    conv("conv1.weight", "conv1.bias", l ? l->out : 0, l ? l->in : 0, 3);
    w.param("time_emb_proj.weight", Role::replicated, l ? Dims{l->out, l->temb} : Dims{},
            Init::normal, l ? 1.f / std::sqrt(float(l->temb)) : 0.f);
    w.param("time_emb_proj.bias", Role::replicated, l ? Dims{l->out} : Dims{}, Init::zeros);
    w.param("norm2.weight", Role::replicated, l ? Dims{l->out} : Dims{}, Init::ones);
    w.param("norm2.bias", Role::replicated, l ? Dims{l->out} : Dims{}, Init::zeros);
    conv("conv2.weight", "conv2.bias", l ? l->out : 0, l ? l->out : 0, 3);
    if constexpr (Shortcut)
      conv("conv_shortcut.weight", "conv_shortcut.bias", l ? l->out : 0, l ? l->in : 0, 1);
  }
  // x [B, in, H, W], emb = SiLU(time embedding) [B, temb] -> [B, out, H, W].
  Tensor forward(const nn::Params& p, const Tensor& x, const Tensor& emb, nn::Ctx& ctx) const;
};

// x + cross_attn(group_norm(x)) with x's pixels as queries and ctx.memory as keys.
struct CrossAttnBlock {
  static constexpr bool kTransparent = true;
  static constexpr std::string_view kName = "";
  GroupNorm norm;
  nn::Attention<true, true> attn;
  template <typename F>
  static constexpr void for_each_child_type(F&& f) {
    f.template operator()<GroupNorm>();
    f.template operator()<nn::Attention<true, true>>();
  }
  static constexpr void walk(nn::Walker& w, const CrossAttnBlock* b) {
    w.child<GroupNorm>(b ? &b->norm : nullptr);
    w.child<nn::Attention<true, true>>(b ? &b->attn : nullptr);
    w.need_whole();
  }
  Tensor forward(const nn::Params& p, const Tensor& x, nn::Ctx& ctx) const;
};

struct UNet {
  static constexpr bool kTransparent = true;
  static constexpr std::string_view kName = "";
  template <nn::Literal N>
  using Conv = nn::Named<N, nn::Conv2d>;
  template <nn::Literal N, bool S>
  using Res = nn::Named<N, ResBlock<S>>;
  template <nn::Literal N>
  using Attn = nn::Named<N, CrossAttnBlock>;

  UNetConfig config;
  TimestepEmbedding time_embedding;
  nn::Named<"text_proj", nn::Projection> text_proj;
  Conv<"conv_in"> conv_in;
  Res<"down_0", false> down_0;
  Conv<"downsample_0"> downsample_0;
  Res<"down_1", true> down_1;
  Attn<"down_1_attn"> down_1_attn;
  Conv<"downsample_1"> downsample_1;
  Res<"down_2", false> down_2;
  Attn<"down_2_attn"> down_2_attn;
  Res<"mid_0", false> mid_0;
  Attn<"mid_attn"> mid_attn;
  Res<"mid_1", false> mid_1;
  Res<"up_2", true> up_2;
  Attn<"up_2_attn"> up_2_attn;
  Conv<"upsample_1"> upsample_1;
  Res<"up_1", true> up_1;
  Attn<"up_1_attn"> up_1_attn;
  Conv<"upsample_0"> upsample_0;
  Res<"up_0", true> up_0;
  nn::Named<"norm_out", GroupNorm> norm_out;
  Conv<"conv_out"> conv_out;

  // Calls f(member) for every child in execution order (walk, forward and
  // the child types all follow it).
  template <typename Self, typename F>
  static constexpr void children(Self* u, F&& f) {
    f(u ? &u->time_embedding : nullptr), f(u ? &u->text_proj : nullptr);
    f(u ? &u->conv_in : nullptr), f(u ? &u->down_0 : nullptr), f(u ? &u->downsample_0 : nullptr);
    f(u ? &u->down_1 : nullptr), f(u ? &u->down_1_attn : nullptr);
    f(u ? &u->downsample_1 : nullptr), f(u ? &u->down_2 : nullptr);
    f(u ? &u->down_2_attn : nullptr), f(u ? &u->mid_0 : nullptr), f(u ? &u->mid_attn : nullptr);
    f(u ? &u->mid_1 : nullptr), f(u ? &u->up_2 : nullptr), f(u ? &u->up_2_attn : nullptr);
    f(u ? &u->upsample_1 : nullptr), f(u ? &u->up_1 : nullptr), f(u ? &u->up_1_attn : nullptr);
    f(u ? &u->upsample_0 : nullptr), f(u ? &u->up_0 : nullptr), f(u ? &u->norm_out : nullptr);
    f(u ? &u->conv_out : nullptr);
  }
  template <typename F>
  static constexpr void for_each_child_type(F&& f) {
    children(static_cast<const UNet*>(nullptr),
             [&]<typename C>(const C*) { f.template operator()<C>(); });
  }
  static constexpr void walk(nn::Walker& w, const UNet* u) {
    children(u, [&]<typename C>(const C* c) { w.child<C>(c); });
  }
  Tensor forward(const nn::Params& p, const Tensor& x, nn::Ctx& ctx) const;

 private:
  void check_inputs(const Tensor& x, const nn::Ctx& ctx) const;
};

UNet unet(const UNetConfig& c);

// The UNet's noise prediction through a bound model (the `model` of a loss or
// predict function): x [B, C, H, W] at timesteps t [B] given text [B, L, D].
// A generation::Denoiser is [&](auto& x, auto& t, auto& text) { return predict_noise(model, x, t,
// text); }.
template <typename Model>
Tensor predict_noise(Model& model, const Tensor& x, const Tensor& t, const Tensor& text) {
  const nn::CallInputs<2> in(model.ctx(), {{{&nn::Ctx::timesteps, t}, {&nn::Ctx::memory, text}}});
  return model(x);
}

}  // namespace redco::models
