// The UNet's forward pass (layout and sharding in unet.hpp).
#include "redco/models/unet.hpp"

#include <cmath>

namespace redco::models {

Tensor timestep_sinusoid(const Tensor& t, int64_t dim) {
  REDCO_CHECK(t.rank() == 1 && dim >= 2 && dim % 2 == 0,
              "timestep embedding: expected timesteps [B] and an even size, got {} and {}",
              t.shape(), dim);
  const int64_t B = t.dim(0), half = dim / 2;
  const std::vector<float> ts = t.to(DType::f32).to_vector();
  Tensor out = Tensor::empty({B, dim});  // [B, cos | sin]
  float* o = out.data<float>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t i = 0; i < half; ++i) {
      const double angle =
          double(ts[size_t(b)]) * std::exp(-std::log(10000.0) * double(i) / double(half));
      o[b * dim + i] = float(std::cos(angle));
      o[b * dim + half + i] = float(std::sin(angle));
    }
  return out.to(t.device());
}

Tensor TimestepEmbedding::forward(const nn::Params& p, const Tensor& t, nn::Ctx& ctx) const {
  const Tensor h = parallel_linear(timestep_sinusoid(t, dim), p, "linear_1.weight",
                                   p["linear_1.bias"], dim, out, ctx);
  return parallel_linear(silu(h), p, "linear_2.weight", p["linear_2.bias"], out, out, ctx);
}

template <bool Shortcut>
Tensor ResBlock<Shortcut>::forward(const nn::Params& p, const Tensor& x_in, const Tensor& emb,
                                   nn::Ctx& ctx) const {
  const Tensor x = nn::whole_features(x_in, ctx);
  REDCO_CHECK(x.rank() == 4 && x.dim(1) == in, "{}: expected [B, {}, H, W], got {}",
              p.path().view(), in, x.shape());
  Tensor h = conv2d(silu(group_norm(x, groups, p["norm1.weight"], p["norm1.bias"])),
                    p["conv1.weight"], p["conv1.bias"], 1, 1);
  const Tensor t = linear(emb, p["time_emb_proj.weight"], p["time_emb_proj.bias"]);  // [B, out]
  h = h + reshape(t, {x.dim(0), out, 1, 1});
  h = conv2d(silu(group_norm(h, groups, p["norm2.weight"], p["norm2.bias"])), p["conv2.weight"],
             p["conv2.bias"], 1, 1);
  if constexpr (Shortcut) return conv2d(x, p["conv_shortcut.weight"], p["conv_shortcut.bias"]) + h;
  return x + h;
}
template struct ResBlock<false>;
template struct ResBlock<true>;

Tensor CrossAttnBlock::forward(const nn::Params& p, const Tensor& x_in, nn::Ctx& ctx) const {
  const Tensor x = nn::whole_features(x_in, ctx);
  const int64_t B = x.dim(0), C = x.dim(1), H = x.dim(2), W = x.dim(3);
  Tensor h = nn::apply_child(norm, p, x, ctx);
  h = transpose(reshape(h, {B, C, H * W}), 1, 2);  // [B, H*W, C]: one query per pixel
  h = nn::whole_features(nn::apply_child(attn, p, h, ctx), ctx);
  return x + reshape(transpose(h, 1, 2), {B, C, H, W});
}

void UNet::check_inputs(const Tensor& x, const nn::Ctx& ctx) const {
  const UNetConfig& c = config;
  REDCO_CHECK(x.rank() == 4 && x.dim(1) == c.channels && x.dim(2) == c.size && x.dim(3) == c.size,
              "unet: expected images [B, {}, {}, {}], got {}", c.channels, c.size, c.size,
              x.shape());
  REDCO_CHECK(ctx.timesteps.defined() && ctx.timesteps.shape() == Shape{x.dim(0)},
              "unet: set ctx.timesteps to the [{}] timesteps of the batch (got {})", x.dim(0),
              ctx.timesteps.defined() ? ctx.timesteps.shape().str() : "none");
  REDCO_CHECK(ctx.memory.defined() && ctx.memory.rank() == 3 && ctx.memory.dim(0) == x.dim(0) &&
                  ctx.memory.dim(2) == c.text_dim,
              "unet: set ctx.memory to the text embeddings [{}, L, {}] (got {}); an "
              "unconditional batch passes zeros",
              x.dim(0), c.text_dim, ctx.memory.defined() ? ctx.memory.shape().str() : "none");
}

namespace {
template <typename C>
Tensor run(const C& child, const nn::Params& p, const Tensor& x, nn::Ctx& ctx) {
  return nn::apply_child(child, p, x, ctx);
}
template <nn::Literal N, bool S>
Tensor run(const nn::Named<N, ResBlock<S>>& res, const nn::Params& p, const Tensor& x,
           const Tensor& emb, nn::Ctx& ctx) {
  return p.template child<nn::Named<N, ResBlock<S>>>([&](const nn::Params& q) {
    return res.inner.forward(q.template content<ResBlock<S>>(), x, emb, ctx);
  });
}
}  // namespace

// Children run in the order UNet::children lists them: Params names them by position.
Tensor UNet::forward(const nn::Params& p, const Tensor& x, nn::Ctx& ctx) const {
  check_inputs(x, ctx);
  const Tensor text = ctx.memory;
  const Tensor emb = silu(p.child<TimestepEmbedding>([&](const nn::Params& q) {
    return time_embedding.forward(q, ctx.timesteps, ctx);
  }));                                        // [B, 4C], as every block reads it
  ctx.memory = run(text_proj, p, text, ctx);  // [B, L, 2C]
  Tensor h = run(conv_in, p, x, ctx);
  const Tensor s1 = run(down_0, p, h, emb, ctx);
  h = run(downsample_0, p, s1, ctx);
  const Tensor s2 = run(down_1_attn, p, run(down_1, p, h, emb, ctx), ctx);
  h = run(downsample_1, p, s2, ctx);
  const Tensor s3 = run(down_2_attn, p, run(down_2, p, h, emb, ctx), ctx);
  h = run(mid_0, p, s3, emb, ctx);
  h = run(mid_attn, p, h, ctx);
  h = run(mid_1, p, h, emb, ctx);
  h = run(up_2_attn, p, run(up_2, p, concat({h, s3}, 1), emb, ctx), ctx);
  h = run(upsample_1, p, upsample_nearest2d(h, 2), ctx);
  h = run(up_1_attn, p, run(up_1, p, concat({h, s2}, 1), emb, ctx), ctx);
  h = run(upsample_0, p, upsample_nearest2d(h, 2), ctx);
  h = run(up_0, p, concat({h, s1}, 1), emb, ctx);
  h = run(conv_out, p, silu(run(norm_out, p, h, ctx)), ctx);
  ctx.memory = text;
  return h;
}

UNet unet(const UNetConfig& c) {
  REDCO_CHECK(c.size % 4 == 0 && c.size >= 4, "unet: image size {} must be a multiple of 4",
              c.size);
  REDCO_CHECK(c.base > 0 && c.groups > 0 && c.base % c.groups == 0,
              "unet: base channels {} must divide by the group-norm groups {}", c.base, c.groups);
  REDCO_CHECK(c.heads > 0 && (2 * c.base) % c.heads == 0,
              "unet: {} heads must divide the attention width 2 * base = {}", c.heads, 2 * c.base);
  REDCO_CHECK(c.channels > 0 && c.text_dim > 0, "unet: channels and text_dim must be positive");
  const int64_t C = c.base, C2 = 2 * C, T = 4 * C, G = c.groups;
  auto conv = [](int64_t in, int64_t out, int64_t stride = 1) {
    return nn::Conv2d{.in = in, .out = out, .kernel = 3, .stride = stride, .pad = 1};
  };
  auto res = [&](int64_t in, int64_t out) { return std::pair{in, out}; };
  auto attn = [&] {
    return CrossAttnBlock{
        .norm = {.channels = C2, .groups = G},
        .attn = {.dim = C2, .heads = c.heads, .kv_heads = c.heads, .causal = false}};
  };
  auto block = [&]<bool S>(std::pair<int64_t, int64_t> io) {
    return ResBlock<S>{.in = io.first, .out = io.second, .temb = T, .groups = G};
  };
  UNet u;
  u.config = c;
  u.time_embedding = {.dim = C, .out = T};
  u.text_proj = {{.in = c.text_dim, .out = C2}};
  u.conv_in = {conv(c.channels, C)};
  u.down_0 = {block.template operator()<false>(res(C, C))};
  u.downsample_0 = {conv(C, C, 2)};
  u.down_1 = {block.template operator()<true>(res(C, C2))};
  u.down_1_attn = {attn()};
  u.downsample_1 = {conv(C2, C2, 2)};
  u.down_2 = {block.template operator()<false>(res(C2, C2))};
  u.down_2_attn = {attn()};
  u.mid_0 = {block.template operator()<false>(res(C2, C2))};
  u.mid_attn = {attn()};
  u.mid_1 = {block.template operator()<false>(res(C2, C2))};
  u.up_2 = {block.template operator()<true>(res(2 * C2, C2))};
  u.up_2_attn = {attn()};
  u.upsample_1 = {conv(C2, C2)};
  u.up_1 = {block.template operator()<true>(res(2 * C2, C2))};
  u.up_1_attn = {attn()};
  u.upsample_0 = {conv(C2, C2)};
  u.up_0 = {block.template operator()<true>(res(C2 + C, C))};
  u.norm_out = {{.channels = C, .groups = G}};
  u.conv_out = {conv(C, c.channels)};
  return u;
}

}  // namespace redco::models
