// Ghost per-example gradient norms against the naive loop: for each example
// b on its own, autodiff's gradient of loss_b = sum(layer(x_b) * r_b) (so the
// layer's output gradient is r_b), then its squared norm. Float32 sums in a
// different order: 1e-4 relative.
#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>

#include "gradcheck.hpp"
#include "redco/autodiff/value_and_grad.hpp"
#include "redco/core/error.hpp"
#include "redco/privacy/per_example.hpp"

using namespace redco;
using redco::test::randn;

namespace {

using LayerFn = std::function<Tensor(const Tensor& x, const Tensor& w)>;

// Naive reference: one backward pass per example; returns [B] squared norms
// of d loss_b / d w and the per-example gradients.
std::pair<std::vector<float>, TensorList> naive(const LayerFn& layer, const Tensor& x,
                                                const Tensor& w, const Tensor& r) {
  std::vector<float> norms;
  TensorList grads;
  for (int64_t b = 0; b < x.dim(0); ++b) {
    const Tensor xb = x.slice0(b, b + 1).clone(), rb = r.slice0(b, b + 1).clone();
    const ParamTree g =
        grad_of([&](const ParamTree& p) { return sum(layer(xb, p.at("w")) * rb); }, {{"w", w}});
    double s = 0;
    for (float v : g.at("w").values<float>()) s += double(v) * v;
    norms.push_back(float(s));
    grads.push_back(g.at("w"));
  }
  return {norms, grads};
}

void check_close(const Tensor& ghost, const std::vector<float>& ref) {
  const auto got = ghost.values<float>();
  REQUIRE(got.size() == ref.size());
  for (size_t b = 0; b < ref.size(); ++b) {
    INFO("example " << b << ": ghost " << got[b] << ", naive " << ref[b]);
    CHECK(std::abs(got[b] - ref[b]) <= 1e-4f * std::abs(ref[b]) + 1e-6f);
  }
}

}  // namespace

TEST_CASE("ghost norms: linear over sequences, both the Gram and the direct path", "[privacy]") {
  const LayerFn lin = [](const Tensor& x, const Tensor& w) { return linear(x, w); };
  // (B, T, in, out): 2 T^2 <= in*out takes the Gram path, the others the direct one.
  for (auto [B, T, in, out] : {std::array<int64_t, 4>{5, 7, 16, 12}, {4, 24, 6, 5}, {3, 1, 9, 4}}) {
    INFO("B " << B << " T " << T << " in " << in << " out " << out);
    const Tensor x = randn({B, T, in}, 1), r = randn({B, T, out}, 2), w = randn({out, in}, 3);
    check_close(privacy::linear_weight_grad_sq_norms(x, r), naive(lin, x, w, r).first);
  }
  // [B, in] inputs: the product of two squared norms.
  const Tensor x = randn({6, 10}, 4), r = randn({6, 3}, 5), w = randn({3, 10}, 6);
  check_close(privacy::linear_weight_grad_sq_norms(x, r), naive(lin, x, w, r).first);
}

TEST_CASE("ghost norms: linear bias", "[privacy]") {
  const Tensor r = randn({4, 6, 5}, 7), bias_w = randn({5}, 8), x = randn({4, 6, 3}, 9);
  const Tensor w = randn({5, 3}, 10);
  const LayerFn with_bias = [&](const Tensor& xb, const Tensor& b) { return linear(xb, w, b); };
  check_close(privacy::linear_bias_grad_sq_norms(r), naive(with_bias, x, bias_w, r).first);
}

TEST_CASE("ghost norms: embedding with repeated ids", "[privacy]") {
  const int64_t B = 4, T = 9, V = 6, D = 5;
  std::vector<int64_t> id(B * T);
  for (int64_t i = 0; i < B * T; ++i) id[i] = (i * 7 + i / 5) % V;  // repeats within each row
  const Tensor ids = Tensor::from<int64_t>(id, {B, T});
  const Tensor r = randn({B, T, D}, 11), table = randn({V, D}, 12);
  const LayerFn emb = [](const Tensor& idb, const Tensor& w) { return embedding(w, idb); };
  check_close(privacy::embedding_grad_sq_norms(ids, r), naive(emb, ids, table, r).first);
}

TEST_CASE("ghost norms: conv2d weight and bias, with stride and padding", "[privacy]") {
  // (N, C, H, O, k, stride, pad): few channels over many positions take the
  // direct path (2 L^2 > O C k^2), many channels over few positions the Gram one.
  for (auto [N, C, H, O, k, s, p] : {std::array<int64_t, 7>{3, 2, 6, 4, 3, 1, 1},
                                     {2, 3, 7, 5, 3, 2, 0},
                                     {2, 16, 4, 16, 3, 1, 1},
                                     {3, 12, 5, 10, 2, 2, 1}}) {
    INFO("N " << N << " C " << C << " H " << H << " O " << O << " k " << k);
    const int64_t OH = (H + 2 * p - k) / s + 1;
    const Tensor x = randn({N, C, H, H}, 13), r = randn({N, O, OH, OH}, 14);
    const Tensor w = randn({O, C, k, k}, 15), b = randn({O}, 16);
    const LayerFn conv = [&](const Tensor& xb, const Tensor& wt) {
      return conv2d(xb, wt, {}, s, p);
    };
    check_close(privacy::conv2d_weight_grad_sq_norms(x, r, k, k, s, p), naive(conv, x, w, r).first);
    const LayerFn conv_b = [&](const Tensor& xb, const Tensor& bt) {
      return conv2d(xb, w, bt, s, p);
    };
    check_close(privacy::conv2d_bias_grad_sq_norms(r), naive(conv_b, x, b, r).first);
  }
}

TEST_CASE("clipped sum: one GEMM equals the sum of clipped per-example gradients", "[privacy]") {
  const Tensor x = randn({6, 5, 8}, 17), r = randn({6, 5, 4}, 18), w = randn({4, 8}, 19);
  const auto [norms, grads] =
      naive([](const Tensor& xb, const Tensor& wt) { return linear(xb, wt); }, x, w, r);
  // The median norm as the clipping norm: about half the examples are clipped.
  std::vector<float> sorted = norms;
  std::sort(sorted.begin(), sorted.end());
  const float C = std::sqrt(sorted[sorted.size() / 2]);
  const Tensor f = privacy::clip_factors(privacy::linear_weight_grad_sq_norms(x, r), C);
  const auto fv = f.values<float>();
  int clipped = 0;
  std::vector<double> expect(4 * 8, 0.0);
  for (size_t b = 0; b < norms.size(); ++b) {
    const double n = std::sqrt(double(norms[b]));
    CHECK(fv[b] == Approx(std::min(1.0, C / n)).epsilon(1e-4));
    clipped += n > C;
    const auto g = grads[b].values<float>();
    for (size_t i = 0; i < g.size(); ++i) expect[i] += fv[b] * g[i];
  }
  CHECK(clipped >= 2);
  CHECK(clipped < int(norms.size()));  // some examples are left as they are
  const auto got = privacy::clipped_linear_weight_grad(x, r, f).values<float>();
  for (size_t i = 0; i < got.size(); ++i) CHECK(got[i] == Approx(expect[i]).margin(1e-4));
}

namespace {

// sum_b f_b * grads[b], elementwise.
std::vector<double> weighted_sum(const TensorList& grads, const std::vector<float>& f) {
  std::vector<double> out(grads[0].numel(), 0.0);
  for (size_t b = 0; b < grads.size(); ++b) {
    const auto g = grads[b].values<float>();
    for (size_t i = 0; i < g.size(); ++i) out[i] += double(f[b]) * g[i];
  }
  return out;
}

void check_sum(const Tensor& got, const Shape& shape, const std::vector<double>& expect) {
  CHECK(got.shape() == shape);
  const auto v = got.values<float>();
  REQUIRE(v.size() == expect.size());
  for (size_t i = 0; i < v.size(); ++i) CHECK(v[i] == Approx(expect[i]).margin(1e-4));
}

}  // namespace

TEST_CASE("clipped sums of conv2d and bias gradients from the same output gradients", "[privacy]") {
  const std::vector<float> fv{0.25f, 1.f, 0.6f};
  const Tensor f = Tensor::from<float>(fv, {3});
  // conv2d, stride 2, pad 1: weight [4, 3, 3, 3] and bias [4].
  const Tensor x = randn({3, 3, 7, 7}, 20), r = randn({3, 4, 4, 4}, 21);
  const Tensor w = randn({4, 3, 3, 3}, 22), bias = randn({4}, 23);
  const LayerFn conv_w = [&](const Tensor& xb, const Tensor& wt) {
    return conv2d(xb, wt, {}, 2, 1);
  };
  const LayerFn conv_b = [&](const Tensor& xb, const Tensor& bt) {
    return conv2d(xb, w, bt, 2, 1);
  };
  check_sum(privacy::clipped_conv2d_weight_grad(x, r, f, 3, 3, 2, 1), {4, 3, 3, 3},
            weighted_sum(naive(conv_w, x, w, r).second, fv));
  check_sum(privacy::clipped_conv2d_bias_grad(r, f), {4},
            weighted_sum(naive(conv_b, x, bias, r).second, fv));
  // linear bias over sequences.
  const Tensor xl = randn({3, 5, 6}, 24), rl = randn({3, 5, 2}, 25), wl = randn({2, 6}, 26);
  const LayerFn lin_b = [&](const Tensor& xb, const Tensor& bt) { return linear(xb, wl, bt); };
  check_sum(privacy::clipped_linear_bias_grad(rl, f), {2},
            weighted_sum(naive(lin_b, xl, randn({2}, 27), rl).second, fv));
}

TEST_CASE("ghost norms: shapes that do not fit are one clear error", "[privacy]") {
  using Catch::Matchers::Contains;
  CHECK_THROWS_WITH(privacy::linear_weight_grad_sq_norms(randn({2, 3, 4}, 1), randn({2, 5, 6}, 2)),
                    Contains("linear_weight_grad_sq_norms") && Contains("[2, 3, 4]"));
  CHECK_THROWS_WITH(
      privacy::conv2d_weight_grad_sq_norms(randn({2, 3, 8, 8}, 1), randn({2, 4, 7, 7}, 2), 3, 3),
      Contains("expected [2, 4, 6, 6]"));
  CHECK_THROWS_WITH(privacy::embedding_grad_sq_norms(randn({2, 3}, 1), randn({2, 3, 4}, 2)),
                    Contains("i64"));
  CHECK_THROWS_WITH(privacy::clip_factors(randn({4}, 1), 0.f), Contains("max_norm"));
  CHECK_THROWS_WITH(privacy::clipped_conv2d_bias_grad(randn({2, 3, 4, 4}, 1), randn({3}, 2)),
                    Contains("[N]"));
}
