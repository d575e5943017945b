// The diffusion UNet (redco/models/unet.hpp): shapes and names, the plan the
// two sharding rules give it, gradients against finite differences on a tiny
// configuration, and tensor parallelism (2 ranks) against one rank.
#include <cmath>

#include "gradcheck.hpp"
#include "redco/autodiff/value_and_grad.hpp"
#include "redco/comm/threads_comm.hpp"
#include "redco/models/unet.hpp"
#include "redco/nn/shard_plan.hpp"
#include "redco/train/parallel.hpp"

using namespace redco;
using redco::test::max_abs_diff;
using redco::test::randn;

namespace {
// 8x8 images, C = 4 (8 below), 2 heads of 4, text [B, 3, 6].
models::UNetConfig tiny() {
  return {.channels = 1, .size = 8, .base = 4, .text_dim = 6, .heads = 2, .groups = 2};
}
struct Inputs {
  Tensor x, t, text;
};
Inputs inputs(int64_t B) {
  std::vector<float> t(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) t[size_t(b)] = float(37 * b + 5);
  return {randn({B, 1, 8, 8}, 71), Tensor::from<float>(t, {B}), randn({B, 3, 6}, 72)};
}
Tensor run(const models::UNet& m, const nn::ParamTree& p, const Inputs& in, nn::Ctx& ctx) {
  ctx.timesteps = in.t;
  ctx.memory = in.text;
  return nn::apply(m, p, in.x, ctx);
}
}  // namespace

TEST_CASE("unet: output shape, parameter names and the compile-time plan", "[unet]") {
  const auto model = models::unet(tiny());
  const nn::ParamTree params = nn::init_params(model, 3);
  for (const char* name :
       {"time_embedding.linear_1.weight", "time_embedding.linear_2.bias", "text_proj.weight",
        "conv_in.weight", "down_0.conv1.weight", "down_1.conv_shortcut.weight",
        "down_1_attn.norm.weight", "down_1_attn.cross_attn.q_proj.weight",
        "down_1_attn.cross_attn.o_proj.bias", "mid_attn.cross_attn.k_proj.weight",
        "up_0.time_emb_proj.weight", "upsample_0.weight", "norm_out.bias", "conv_out.weight"}) {
    INFO(name);
    CHECK(params.count(name) == 1);
  }
  CHECK(params.at("down_1.conv_shortcut.weight").shape() == Shape{8, 4, 1, 1});
  CHECK(params.at("up_0.conv1.weight").shape() == Shape{4, 12, 3, 3});  // [h, s1]: 8 + 4 in
  CHECK(params.at("down_1_attn.cross_attn.k_proj.weight").shape() == Shape{8, 8});
  nn::Ctx ctx;
  const Inputs in = inputs(2);
  CHECK(run(model, params, in, ctx).shape() == Shape{2, 1, 8, 8});
  CHECK(ctx.memory.shape() == in.text.shape());  // the caller's text is left in place

  // The plan: rule 1 on the time MLP, rule 2 on each cross-attention, the rest replicated.
  constexpr auto plan = shard::plan_v<models::UNet>;
  static_assert(plan.split("time_embedding.linear_1.weight") == 0);
  static_assert(plan.split("time_embedding.linear_2.weight") == 1);
  static_assert(plan.split("mid_attn.cross_attn.q_proj.weight") == 0);
  static_assert(plan.split("mid_attn.cross_attn.o_proj.weight") == 1);
  static_assert(plan.split("down_0.conv1.weight") == -1);
  static_assert(plan.split("down_0.time_emb_proj.weight") == -1);
  static_assert(plan.split("text_proj.weight") == -1);
  CHECK(plan.params.size() == params.size());
}

TEST_CASE("unet: bad inputs name what is wrong", "[unet]") {
  const auto model = models::unet(tiny());
  const nn::ParamTree params = nn::init_params(model, 3);
  Inputs in = inputs(2);
  nn::Ctx ctx;
  CHECK_THROWS_WITH(nn::apply(model, params, in.x, ctx), Catch::Contains("ctx.timesteps"));
  ctx.timesteps = in.t;
  CHECK_THROWS_WITH(nn::apply(model, params, in.x, ctx), Catch::Contains("ctx.memory"));
  ctx.memory = in.text;
  CHECK_THROWS_WITH(nn::apply(model, params, randn({2, 1, 6, 6}, 1), ctx),
                    Catch::Contains("expected images [B, 1, 8, 8]"));
  CHECK_THROWS_WITH(models::unet({.size = 30}), Catch::Contains("multiple of 4"));
  CHECK_THROWS_WITH(models::unet({.base = 32, .heads = 5}), Catch::Contains("5 heads"));
}

TEST_CASE("unet: gradients match finite differences", "[unet]") {
  const auto model = models::unet(tiny());
  const nn::ParamTree init = nn::init_params(model, 3);
  const Inputs in = inputs(2);
  const Tensor r = randn({2, 1, 8, 8}, 73);
  // Every parameter: a few of its elements, perturbed in place.
  nn::ParamTree params;
  for (const auto& [k, v] : init) params[k] = v.clone().set_requires_grad(true);
  auto loss = [&](const nn::ParamTree& p) {
    nn::Ctx ctx;
    return sum(run(model, p, in, ctx) * r);
  };
  TensorList leaves;
  for (const auto& [k, v] : params) leaves.push_back(v);
  const TensorList g = grad({loss(params)}, leaves);
  size_t i = 0;
  for (auto& [name, v] : params) {
    const int64_t n = v.numel();
    for (int64_t j : {int64_t(0), n / 2, n - 1}) {
      float* p = v.data<float>();
      const float orig = p[j], eps = 1e-2f;
      double up, down;
      {
        NoGradGuard off;
        p[j] = orig + eps;
        up = loss(params).item();
        p[j] = orig - eps;
        down = loss(params).item();
        p[j] = orig;
      }
      test::expect_close(g[i].data<float>()[j], (up - down) / (2.0 * eps), 3e-3, 2e-2,
                         name + "[" + std::to_string(j) + "]");
    }
    ++i;
  }
}

TEST_CASE("unet: 2 tensor-parallel ranks equal one rank, loss and gradients", "[unet]") {
  const auto model = models::unet(tiny());
  const Inputs in = inputs(2);
  const Tensor target = randn({2, 1, 8, 8}, 74);
  auto loss_of = [&](const nn::ParamTree& p, comm::Comm* comm) {
    nn::Ctx ctx{.train = true, .seed = 3};
    ctx.mp = comm;
    return mean(square(run(model, p, in, ctx) - target));
  };
  auto [want_loss, want] = value_and_grad(
      [&](const nn::ParamTree& p) { return loss_of(p, nullptr); }, nn::init_params(model, 5));
  const int mp = 2;
  const auto plan = shard::resolve(model, mp);
  size_t split = 0;
  for (const shard::ParamSplit& s : plan) split += s.split_dim >= 0;
  CHECK(split == 3 + 5 * 7);  // linear_1 (weight, bias), linear_2; q, k, v (weight, bias), o x 5
  std::vector<float> losses(mp);
  std::vector<nn::ParamTree> grads(mp);
  comm::ThreadsWorld(mp).run([&](comm::Comm& comm) {
    const nn::ParamTree shard =
        train::init_shard(nn::param_entries(model), plan, 5, comm.rank(), mp);
    auto [l, g] = value_and_grad([&](const nn::ParamTree& p) { return loss_of(p, &comm); }, shard);
    losses[size_t(comm.rank())] = l.item();
    grads[size_t(comm.rank())] = std::move(g);
  });
  for (int r = 0; r < mp; ++r) {
    INFO("rank " << r);
    CHECK(std::abs(losses[size_t(r)] - want_loss.item()) <= 1e-5f * std::abs(want_loss.item()));
    for (const shard::ParamSplit& s : plan) {
      INFO(s.name << " split " << s.split_dim);
      const Tensor slice = train::slice_shard(want.at(s.name), s, r, mp);
      CHECK(max_abs_diff(grads[size_t(r)].at(s.name), slice) <= 1e-5f);
    }
  }
}
