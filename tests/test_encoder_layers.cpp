// The encoder-family layers (nn/encoder_layers.hpp): T5's relative position
// buckets against values worked out from the formula, and finite-difference
// gradients of every layer with respect to its input and its parameters.
#include <catch2/catch.hpp>

#include "gradcheck.hpp"
#include "redco/nn/encoder_layers.hpp"
#include "redco/nn/model.hpp"

using namespace redco;
using test::check_gradients;
using test::randn;

namespace {

// Runs `model` on x with parameters named `names` taken from `in` (after x).
template <typename M>
Tensor run(const M& model, const std::vector<std::string>& names, const TensorList& in,
           nn::Ctx ctx = {}) {
  nn::ParamTree tree;
  for (size_t i = 0; i < names.size(); ++i) tree[names[i]] = in[i + 1];
  return nn::apply(model, tree, in[0], ctx);
}

}  // namespace

TEST_CASE("relative position buckets follow T5's formula", "[encoder_layers]") {
  // Bidirectional, 32 buckets up to 128: 16 per side, distances 0..7 exact,
  // then 8 + floor(log(n / 8) / log(16) * 8), capped at 15; keys after the
  // query use buckets 16..31.
  const auto bi = nn::relative_position_buckets(1, 201, 32, 128, true).values<int64_t>();
  CHECK(bi[0] == 0);
  CHECK(bi[1] == 16 + 1);
  CHECK(bi[7] == 16 + 7);
  CHECK(bi[20] == 16 + 10);   // log(2.5) / log(16) * 8 = 2.64
  CHECK(bi[50] == 16 + 13);   // log(6.25) / log(16) * 8 = 5.29
  CHECK(bi[200] == 16 + 15);  // beyond max_distance: the last bucket
  const auto before = nn::relative_position_buckets(21, 1, 32, 128, true).values<int64_t>();
  CHECK(before[1] == 1);    // the key one before the query
  CHECK(before[20] == 10);  // twenty before
  // Causal: keys after the query share bucket 0; 16 exact distances, then
  // 16 + floor(log(n / 16) / log(8) * 16).
  const auto causal = nn::relative_position_buckets(41, 41, 32, 128, false).values<int64_t>();
  CHECK(causal[0 * 41 + 5] == 0);
  CHECK(causal[5 * 41 + 0] == 5);
  CHECK(causal[40 * 41 + 0] == 23);  // log(2.5) / log(8) * 16 = 7.05
  CHECK_THROWS_WITH(nn::relative_position_buckets(2, 2, 2, 8, true),
                    Catch::Contains("at least 4 buckets"));
}

TEST_CASE("relative position bias: gradients through attention reach the table",
          "[encoder_layers][grad]") {
  for (bool bidirectional : {true, false}) {
    INFO("bidirectional " << bidirectional);
    nn::Attention<false> attn{.dim = 4,
                              .heads = 2,
                              .kv_heads = 2,
                              .causal = !bidirectional,
                              .head_size = 3,
                              .qkv_bias = false,
                              .o_bias = false,
                              .scale = 1.f,
                              .score_bias = true};
    const auto model = nn::relative_position_bias(2, 8, 6, bidirectional) | attn;
    const std::vector<std::string> names = {"relative_attention_bias.weight", "attn.q_proj.weight",
                                            "attn.k_proj.weight", "attn.v_proj.weight",
                                            "attn.o_proj.weight"};
    const TensorList in = {randn({2, 7, 4}, 1),    randn({8, 2}, 2), randn({6, 4}, 3, 0.5f),
                           randn({6, 4}, 4, 0.5f), randn({6, 4}, 5), randn({4, 6}, 6)};
    check_gradients([&](const TensorList& x) { return run(model, names, x); }, in, {0, 1, 2, 5});
    // Without the bias the output differs: the table is in use.
    NoGradGuard off;
    TensorList zero = in;
    zero[1] = Tensor::zeros({8, 2});
    CHECK(test::max_abs_diff(run(model, names, in), run(model, names, zero)) > 1e-2f);
  }
}

TEST_CASE("an attention with score_bias and no bias computed before it is refused",
          "[encoder_layers][errors]") {
  nn::Attention<false> attn{.dim = 4, .heads = 2, .kv_heads = 2, .score_bias = true};
  nn::ParamTree p;
  for (const char* w : {"q_proj", "k_proj", "v_proj", "o_proj"})
    p[std::string(w) + ".weight"] = randn({4, 4}, 1);
  CHECK_THROWS_WITH(nn::apply(attn, p, randn({1, 3, 4}, 2)),
                    Catch::Contains("nn::RelativePositionBias"));
}

TEST_CASE("T5's feed-forward blocks: gradients, plain and gated", "[encoder_layers][grad]") {
  const TensorList plain_in = {randn({2, 3, 4}, 1), randn({5, 4}, 2), randn({4, 5}, 3)};
  check_gradients(
      [&](const TensorList& x) {
        return run(nn::dense_act_dense(4, 5, nn::Act::gelu, false), {"wi.weight", "wo.weight"}, x);
      },
      plain_in, {0, 1, 2});
  const TensorList gated_in = {randn({2, 3, 4}, 1), randn({5, 4}, 2), randn({5, 4}, 4),
                               randn({4, 5}, 3)};
  const auto gated = nn::dense_act_dense(4, 5, nn::Act::gelu, true);
  const std::vector<std::string> names = {"wi_0.weight", "wi_1.weight", "wo.weight"};
  check_gradients([&](const TensorList& x) { return run(gated, names, x); }, gated_in,
                  {0, 1, 2, 3});
  // wo(gelu(wi_0 x) * (wi_1 x)), written out.
  NoGradGuard off;
  const Tensor want = linear(
      gelu(linear(gated_in[0], gated_in[1]), true) * linear(gated_in[0], gated_in[2]), gated_in[3]);
  CHECK(test::max_abs_diff(run(gated, names, gated_in), want) < 1e-6f);
}

TEST_CASE("a shared embedding and a scale: gradients reach the owner's table",
          "[encoder_layers][grad]") {
  // The table is used twice: by its owner and by the shared lookup after it.
  const auto model = nn::named<"enc">(nn::embedding(7, 3)) |
                     nn::named<"dec">(nn::linear_no_bias(3, 3)) | nn::scale(0.5f);
  const auto shared = nn::shared_embedding(7, "enc.weight") | nn::scale(2.f);
  const Tensor ids = Tensor::from<int64_t>(std::vector<int64_t>{1, 4, 6, 4}, Shape{2, 2});
  const TensorList in = {randn({7, 3}, 1), randn({3, 3}, 2)};
  check_gradients(
      [&](const TensorList& x) {
        nn::ParamTree tree{{"enc.weight", x[0]}, {"dec.weight", x[1]}};
        return nn::apply(model, tree, ids) + nn::apply(shared, tree, ids);
      },
      in, {0, 1});
  NoGradGuard off;
  nn::ParamTree tree{{"enc.weight", in[0]}};
  CHECK(test::max_abs_diff(nn::apply(shared, tree, ids), mul(embedding(in[0], ids), 2.f)) == 0.f);
}

TEST_CASE("a logit bias: values and gradients", "[encoder_layers][grad]") {
  // The logit bias [vocab, 1] is added to every row of the logits [.., vocab].
  const auto head = nn::linear_no_bias(4, 6) | nn::logit_bias(6);
  const TensorList in = {randn({2, 3, 4}, 2), randn({6, 4}, 3), randn({6, 1}, 4)};
  auto logits = [&](const TensorList& x) {
    return nn::apply(head, nn::ParamTree{{"fc.weight", x[1]}, {"final_logits_bias", x[2]}}, x[0]);
  };
  check_gradients(logits, in, {0, 1, 2});
  NoGradGuard off;
  CHECK(test::max_abs_diff(logits(in), linear(in[0], in[1]) + reshape(in[2], {6})) < 1e-6f);
}

TEST_CASE("token types, RoBERTa positions and the first token: values and gradients",
          "[encoder_layers][grad]") {
  const Tensor ids =
      Tensor::from<int64_t>(std::vector<int64_t>{1, 1, 5, 7, 5, 7, 9, 1}, Shape{2, 4});
  // RoBERTa (pad 1): pads keep position 1, the others count from 2.
  const auto pos = nn::padded_positions(8, 3, 1);
  const TensorList table = {randn({8, 3}, 1)};
  auto positions = [&](const TensorList& x) {
    return nn::apply(pos, nn::ParamTree{{"weight", x[0]}}, ids);
  };
  {
    NoGradGuard off;
    const Tensor want = embedding(
        table[0], Tensor::from<int64_t>(std::vector<int64_t>{1, 1, 2, 3, 2, 3, 4, 1}, Shape{2, 4}));
    CHECK(test::max_abs_diff(positions(table), want) == 0.f);
  }
  check_gradients(positions, table, {0});
  CHECK_THROWS_WITH(
      nn::apply(nn::padded_positions(5, 3, 1), nn::ParamTree{{"weight", table[0]}}, ids),
      Catch::Contains("beyond the model's 5 position rows"));
  // Token types: rows picked by ctx.token_types, row 0 without them.
  const auto tt = nn::token_type_embedding(2, 3);
  const Tensor types =
      Tensor::from<int64_t>(std::vector<int64_t>{0, 1, 1, 0, 1, 1, 0, 0}, Shape{2, 4});
  const TensorList tt_table = {randn({2, 3}, 2)};
  auto typed = [&](const TensorList& x) {
    nn::Ctx ctx;
    ctx.token_types = types;
    return nn::apply(tt, nn::ParamTree{{"weight", x[0]}}, ids, ctx);
  };
  check_gradients(typed, tt_table, {0});
  {
    NoGradGuard off;
    CHECK(test::max_abs_diff(typed(tt_table), embedding(tt_table[0], types)) == 0.f);
    const Tensor none = nn::apply(tt, nn::ParamTree{{"weight", tt_table[0]}}, ids);
    CHECK(test::max_abs_diff(none, slice(tt_table[0], 0, 0, 1)) == 0.f);
    nn::Ctx bad;
    bad.token_types = Tensor::full(Shape{2, 4}, 2.f).to(DType::i64);
    CHECK_THROWS_WITH(nn::apply(tt, nn::ParamTree{{"weight", tt_table[0]}}, ids, bad),
                      Catch::Contains("token type 2 is outside [0, 2)"));
  }
  // The first token feeding a pooler: gradients reach every position's row 0 only.
  const auto pooler = nn::first_token() | nn::linear(3, 3) | nn::tanh();
  const TensorList in = {randn({2, 4, 3}, 3), randn({3, 3}, 4), randn({3}, 5)};
  check_gradients(
      [&](const TensorList& x) {
        return nn::apply(pooler, nn::ParamTree{{"fc.weight", x[1]}, {"fc.bias", x[2]}}, x[0]);
      },
      in, {0, 1, 2});
}

TEST_CASE("a post-LN block (BART, BERT): norm(x + f(x)), values and gradients",
          "[encoder_layers][grad]") {
  // The DSL spells it residual(f) | norm: no layer of its own.
  const auto block = nn::residual(nn::linear(4, 4) | nn::gelu()) | nn::layer_norm(4);
  const TensorList in = {randn({2, 3, 4}, 1), randn({4, 4}, 2), randn({4}, 3), randn({4}, 4, 0.3f),
                         randn({4}, 5, 0.3f)};
  const std::vector<std::string> names = {"fc.weight", "fc.bias", "ln.weight", "ln.bias"};
  auto f = [&](const TensorList& x) { return run(block, names, x); };
  check_gradients(f, in, {0, 1, 2, 3, 4});
  NoGradGuard off;
  const Tensor want = layer_norm(in[0] + gelu(linear(in[0], in[1], in[2]), true), in[3], in[4]);
  CHECK(test::max_abs_diff(f(in), want) < 1e-6f);
}
