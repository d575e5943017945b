// The DSL pieces the OPT, GPT-J and GPT-NeoX checkpoints need: learned
// positions with an offset, an LM head with a logit bias, a replicated
// projection, pre-/post-norm residuals, the parallel residual and optional
// layers. Each one's gradient against central finite differences, its value
// against the combinators it stands for, and the compile-time plans of the
// three families built from them.
#include <algorithm>
#include <catch2/catch.hpp>

#include "gradcheck.hpp"
#include "redco/models/gpt_neox.hpp"
#include "redco/models/gptj.hpp"
#include "redco/models/opt.hpp"
#include "redco/nn/shard_plan.hpp"

using namespace redco;
using test::max_abs_diff;
using test::randn;

namespace {

// The gradient of a layer's output with respect to its input (when floating)
// and every one of its parameters, drawn at random.
template <typename M>
void check_layer(const M& model, const Tensor& x) {
  const auto entries = nn::param_entries(model);
  TensorList in{x};
  std::vector<size_t> wrt;
  if (is_floating(x.dtype())) wrt.push_back(0);
  for (const nn::ParamEntry& e : entries) {
    wrt.push_back(in.size());
    in.push_back(randn(e.shape.shape(), 10 + in.size(), 0.7f));
  }
  const test::Fn f = [&](const TensorList& t) {
    nn::ParamTree p;
    for (size_t i = 0; i < entries.size(); ++i)
      p.emplace(std::string(entries[i].name.view()), t[i + 1]);
    return nn::apply(model, p, t[0]);
  };
  test::check_gradients(f, in, wrt);
}

Tensor ids(std::vector<int64_t> v, const Shape& s) {
  return Tensor::from<int64_t>(std::span<const int64_t>(v), s);
}

nn::ParamTree random_params(const std::vector<nn::ParamEntry>& entries) {
  nn::ParamTree p;
  uint64_t stream = 40;
  for (const nn::ParamEntry& e : entries)
    p.emplace(std::string(e.name.view()), randn(e.shape.shape(), stream++, 0.7f));
  return p;
}

std::vector<std::string> sorted_names(const std::vector<nn::ParamEntry>& entries) {
  std::vector<std::string> names;
  for (const nn::ParamEntry& e : entries) names.emplace_back(e.name.view());
  std::sort(names.begin(), names.end());
  return names;
}

// Two models with the same parameters (names, maybe in another order) give
// the same output.
template <typename A, typename B>
float value_gap(const A& a, const B& b, const Tensor& x) {
  const auto ea = nn::param_entries(a);
  REQUIRE(sorted_names(ea) == sorted_names(nn::param_entries(b)));
  const nn::ParamTree p = random_params(ea);
  return max_abs_diff(nn::apply(a, p, x), nn::apply(b, p, x));
}

auto tanh_mlp() { return nn::mlp(4, 6, nn::Act::tanh); }

}  // namespace

TEST_CASE("learned positions with an offset read rows offset .. offset + T - 1", "[blocks]") {
  const auto pos = nn::positions(6, 4, 2);
  check_layer(pos, ids({1, 2, 3, 4, 5, 0}, {2, 3}));
  const Tensor table = randn({6, 4}, 3);
  const Tensor out = nn::apply(pos, {{"weight", table}}, ids({0, 0, 0}, {1, 3}));
  CHECK(max_abs_diff(out, slice(table, 0, 2, 5)) == 0.f);
  CHECK_THROWS_WITH(nn::apply(pos, {{"weight", table}}, ids({0, 0, 0, 0, 0}, {1, 5})),
                    Catch::Matchers::Contains("exceeds the model's maximum 4"));
}

TEST_CASE("an LM head with a logit bias", "[blocks]") {
  const nn::BiasedLMHead head = nn::biased_lm_head(4, 5);
  check_layer(head, randn({2, 3, 4}, 1));
  const Tensor x = randn({2, 3, 4}, 2), w = randn({5, 4}, 3), b = randn({5}, 4);
  const Tensor want = matmul(x, w, false, true) + b;
  CHECK(max_abs_diff(nn::apply(head, {{"weight", w}, {"bias", b}}, x), want) < 1e-6f);
}

TEST_CASE("a projection between feature sizes", "[blocks]") {
  check_layer(nn::projection(4, 3), randn({2, 3, 4}, 1));
}

TEST_CASE("pre- and post-norm residuals", "[blocks]") {
  const Tensor x = randn({2, 3, 4}, 1);
  for (bool pre : {true, false}) {
    INFO((pre ? "pre" : "post") << "-norm");
    const auto block = nn::normed_residual(nn::layer_norm(4), tanh_mlp(), pre);
    check_layer(block, x);
    const auto names = nn::param_entries(block);
    CHECK(names.front().name.view() == "ln.weight");  // the norm first, whatever runs first
  }
  // x + b(ln(x)) and ln(x + b(x)), as the plain combinators write them.
  CHECK(value_gap(nn::normed_residual(nn::layer_norm(4), tanh_mlp(), true),
                  nn::residual(nn::layer_norm(4) | tanh_mlp()), x) == 0.f);
  CHECK(value_gap(nn::normed_residual(nn::layer_norm(4), tanh_mlp(), false),
                  nn::residual(tanh_mlp()) | nn::layer_norm(4), x) == 0.f);
}

TEST_CASE("parallel and sequential residuals", "[blocks]") {
  const Tensor x = randn({2, 3, 4}, 1);
  auto a = [] { return nn::layer_norm(4) | tanh_mlp(); };
  for (bool parallel : {true, false}) {
    INFO((parallel ? "parallel" : "sequential"));
    check_layer(nn::parallel_residual(a(), a(), parallel), x);
  }
  // x + a(x) + b(x), and h = x + a(x); h + b(h).
  CHECK(value_gap(nn::parallel_residual(a(), a(), true), nn::residual(a() + a()), x) < 1e-6f);
  CHECK(value_gap(nn::parallel_residual(a(), a(), false), nn::residual(a()) | nn::residual(a()),
                  x) == 0.f);
}

TEST_CASE("an optional layer is the layer or the identity", "[blocks]") {
  const Tensor x = randn({2, 3, 4}, 1);
  // In a sequence, as in a model (a lone layer's parameters have no prefix).
  const auto on = nn::dropout(0.f) | nn::maybe(nn::named<"final">(nn::layer_norm(4)), true);
  check_layer(on, x);
  CHECK(nn::param_entries(on).front().name.view() == "final.weight");
  const auto off = nn::dropout(0.f) | nn::maybe(nn::named<"final">(nn::layer_norm(4)), false);
  CHECK(nn::param_entries(off).empty());
  CHECK(max_abs_diff(nn::apply(off, {}, x), x) == 0.f);
}

// ---- the families' compile-time plans -------------------------------------------------------
namespace {
using shard::Role;
constexpr auto opt_plan = shard::plan_v<models::Opt>;
static_assert(opt_plan.role("embed_tokens.weight") == Role::vocab);
static_assert(opt_plan.split("project_in.weight") == -1);  // replicated: see nn::Projection
static_assert(opt_plan.split("project_out.weight") == -1);
static_assert(opt_plan.split("embed_positions.weight") == -1);
static_assert(opt_plan.split("layers.*.self_attn.q_proj.weight") == 0);
static_assert(opt_plan.split("layers.*.self_attn.o_proj.weight") == 1);
static_assert(opt_plan.split("layers.*.mlp.fc1.weight") == 0);
static_assert(opt_plan.split("layers.*.mlp.fc2.weight") == 1);
static_assert(opt_plan.split("layers.*.final_layer_norm.weight") == -1);
static_assert(opt_plan.split("final_layer_norm.weight") == -1);
// The tied head's table: listed (as the compile-time walk sees no object),
// absent at run time, where the head reads embed_tokens.
static_assert(opt_plan.role("lm_head.weight") == Role::vocab);
static_assert(opt_plan.count(nn::Collective::all_gather) == 0);

constexpr auto gptj_plan = shard::plan_v<models::Gptj>;
static_assert(gptj_plan.split("h.*.attn.q_proj.weight") == 0);
static_assert(!gptj_plan.has("h.*.attn.q_proj.bias"));
static_assert(gptj_plan.split("h.*.attn.o_proj.weight") == 1);
static_assert(gptj_plan.split("h.*.mlp.fc1.weight") == 0);
static_assert(gptj_plan.split("h.*.mlp.fc2.weight") == 1);
static_assert(gptj_plan.role("lm_head.bias") == Role::vocab);  // split with the head's rows
static_assert(gptj_plan.count(nn::Collective::all_gather) == 0);

constexpr auto neox_plan = shard::plan_v<models::GptNeox>;
static_assert(neox_plan.role("embed_in.weight") == Role::vocab);
static_assert(neox_plan.role("embed_out.weight") == Role::vocab);
static_assert(neox_plan.split("layers.*.attention.q_proj.bias") == 0);
static_assert(neox_plan.split("layers.*.attention.o_proj.weight") == 1);
static_assert(neox_plan.split("layers.*.attention.o_proj.bias") == -1);
static_assert(neox_plan.split("layers.*.mlp.fc1.weight") == 0);
static_assert(neox_plan.split("layers.*.post_attention_layernorm.weight") == -1);
// Attention and MLP each leave with one all-reduce, plus the embedding's.
static_assert(neox_plan.count(nn::Collective::all_reduce) == 3);
static_assert(neox_plan.count(nn::Collective::all_gather) == 0);
}  // namespace

TEST_CASE("the families' run-time plans follow the compile-time ones", "[blocks][plan]") {
  const auto o = models::opt({.vocab = 16,
                              .context = 8,
                              .dim = 8,
                              .layers = 2,
                              .heads = 2,
                              .ffn = 12,
                              .embed_dim = 4,
                              .pre_norm = false,
                              .final_norm = false});
  const auto plan = shard::resolve(o, 2);
  std::vector<std::string> names;
  for (const auto& s : plan) names.push_back(s.name);
  CHECK(names.front() == "embed_tokens.weight");
  CHECK(names[1] == "project_in.weight");
  CHECK(names.back() == "project_out.weight");  // no final norm post-LN
  CHECK(std::count(names.begin(), names.end(), "final_layer_norm.weight") == 0);
  for (const auto& s : plan) {
    INFO(s.name);
    std::string pattern = s.name;
    if (pattern.rfind("layers.", 0) == 0)
      pattern = "layers.*" + pattern.substr(pattern.find('.', 7));
    CHECK(s.split_dim == opt_plan.split(pattern));
  }
}
