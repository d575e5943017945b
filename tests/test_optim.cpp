// Optimizers, schedules, clipping and gradient accumulation, checked against
// values worked out by hand (or by the scalar formulas of the torch.optim
// docs, in double), plus the steady-state "no new allocations" property.
#include <catch2/catch.hpp>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "redco/autodiff/functional.hpp"
#include "redco/core/allocator.hpp"
#include "redco/optim/optimizer.hpp"

using namespace redco;

namespace {

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

Tensor vec(std::initializer_list<float> v) { return Tensor::from(v, {int64_t(v.size())}); }

// Checks t's values against `want` to float precision.
void check_values(const Tensor& t, const std::vector<double>& want, double eps = 1e-6) {
  const std::vector<float> got = t.to_vector();
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i)
    CHECK(got[i] == Approx(want[i]).epsilon(eps).margin(1e-7));
}

void check_close(const Tensor& got, const Tensor& want, double eps = 1e-6) {
  const std::vector<float> w = want.to_vector();
  check_values(got, std::vector<double>(w.begin(), w.end()), eps);
}

ParamTree clone_tree(const ParamTree& t) {
  ParamTree out;
  for (const auto& [k, v] : t) out.emplace(k, v.clone());
  return out;
}

// AdamW as written in the torch.optim.AdamW docs, one scalar at a time, in double.
std::vector<double> adamw_reference(std::vector<double> p,
                                    const std::vector<std::vector<double>>& gs, double lr,
                                    double wd) {
  const double b1 = 0.9, b2 = 0.999, eps = 1e-8;
  std::vector<double> m(p.size(), 0.0), v(p.size(), 0.0);
  for (size_t t = 1; t <= gs.size(); ++t) {
    for (size_t i = 0; i < p.size(); ++i) {
      const double g = gs[t - 1][i];
      p[i] -= lr * wd * p[i];
      m[i] = b1 * m[i] + (1 - b1) * g;
      v[i] = b2 * v[i] + (1 - b2) * g * g;
      const double mhat = m[i] / (1 - std::pow(b1, double(t)));
      const double vhat = v[i] / (1 - std::pow(b2, double(t)));
      p[i] -= lr * mhat / (std::sqrt(vhat) + eps);
    }
  }
  return p;
}

}  // namespace

// ---- schedules ---------------------------------------------------------------

TEST_CASE("schedules: constant, linear and cosine at key steps", "[optim][schedule]") {
  const optim::Schedule c = optim::constant(0.5f);
  CHECK(c(0) == 0.5f);
  CHECK(c(123456) == 0.5f);

  const optim::Schedule lin = optim::linear(1.f, 0.f, 4);
  CHECK(lin(0) == 1.f);
  CHECK(lin(1) == 0.75f);
  CHECK(lin(2) == 0.5f);
  CHECK(lin(4) == 0.f);  // the end value, and it stays there
  CHECK(lin(9) == 0.f);
  CHECK(lin(-3) == 1.f);  // steps before 0 read as step 0

  // cosine(2, 100, 0.1): 2 * (0.1 + 0.9 * (1 + cos(pi t / 100)) / 2)
  const optim::Schedule cos = optim::cosine(2.f, 100, 0.1f);
  CHECK(cos(0) == Approx(2.0));
  CHECK(cos(25) == Approx(2.0 * (0.1 + 0.45 * (1.0 + std::sqrt(0.5)))));  // 1.7363961
  CHECK(cos(50) == Approx(1.1));                                          // midpoint: halfway
  CHECK(cos(100) == Approx(0.2));                                         // end: peak * fraction
  CHECK(cos(5000) == Approx(0.2));
  CHECK(optim::cosine(1.f, 10)(10) == 0.f);
}

TEST_CASE("schedules: warmup ramps from 0 and restarts the schedule after it",
          "[optim][schedule]") {
  const optim::Schedule w = optim::warmup(10, optim::constant(1.f));
  CHECK(w(0) == 0.f);  // the documented convention: step 0 runs at rate 0
  CHECK(w(1) == Approx(0.1));
  CHECK(w(5) == Approx(0.5));
  CHECK(w(9) == Approx(0.9));
  CHECK(w(10) == 1.f);
  CHECK(w(1000) == 1.f);

  // The header's example: 100 warmup steps, then a 900-step cosine to 10%.
  const optim::Schedule s = optim::warmup(100, optim::cosine(3e-4f, 900, 0.1f));
  CHECK(s(50) == Approx(1.5e-4));
  CHECK(s(100) == Approx(3e-4));
  CHECK(s(550) == Approx(3e-4 * 0.55));  // cosine midpoint: 0.1 + 0.9 / 2
  CHECK(s(1000) == Approx(3e-5));
  CHECK(optim::warmup(0, optim::constant(2.f))(0) == 2.f);

  const optim::Schedule j = optim::join({optim::constant(1.f), optim::linear(4.f, 0.f, 4)}, {3});
  CHECK(j(2) == 1.f);
  CHECK(j(3) == 4.f);  // the second piece starts at its own step 0
  CHECK(j(5) == 2.f);
  CHECK_THAT(error_of([] { optim::join({optim::constant(1.f)}, {3}); }),
             Catch::Contains("1 schedules need 0 boundaries, got 1"));
  CHECK_THAT(error_of([] { optim::cosine(1.f, 0); }), Catch::Contains("total_steps must be > 0"));
}

// ---- AdamW / Adam ------------------------------------------------------------

TEST_CASE("AdamW matches hand-computed values for three steps", "[optim][adamw]") {
  // A rank-2 weight, so the default mask decays it.
  ParamTree params{{"fc.weight", Tensor::from({1.f, -2.f, 0.5f}, {3, 1})}};
  const std::vector<std::vector<double>> gs = {
      {0.1, -0.2, 0.3}, {0.2, 0.1, -0.1}, {-0.3, 0.4, 0.05}};
  auto opt = optim::adamw(0.1f, {.weight_decay = 0.1f});

  // Step 1 by hand: m_hat = g and v_hat = g^2, so the Adam part is lr * sign(g)
  // (eps is negligible), after the decoupled decay p *= 1 - lr * wd = 0.99:
  //   1 * 0.99 - 0.1 = 0.89,  -2 * 0.99 + 0.1 = -1.88,  0.5 * 0.99 - 0.1 = 0.395.
  opt.step(params, {{"fc.weight", Tensor::from({0.1f, -0.2f, 0.3f}, {3, 1})}});
  check_values(params.at("fc.weight"), {0.89, -1.88, 0.395});
  CHECK(opt.steps() == 1);

  // Step 2, element 0 by hand: p = 0.89 * 0.99 = 0.8811; m = 0.9 * 0.01 + 0.1 * 0.2 = 0.029;
  // v = 0.999 * 1e-5 + 0.001 * 0.04 = 4.999e-5; m_hat = 0.029 / 0.19 = 0.15263158;
  // v_hat = 4.999e-5 / 0.001999 = 0.02500750, sqrt = 0.15813761;
  // p = 0.8811 - 0.1 * 0.15263158 / 0.15813761 = 0.78458181.
  opt.step(params, {{"fc.weight", Tensor::from({0.2f, 0.1f, -0.1f}, {3, 1})}});
  check_values(params.at("fc.weight"), {0.784581813, -1.834566303, 0.351028148});

  opt.step(params, {{"fc.weight", Tensor::from({-0.3f, 0.4f, 0.05f}, {3, 1})}});
  const std::vector<double> want = adamw_reference({1.0, -2.0, 0.5}, gs, 0.1, 0.1);
  check_values(params.at("fc.weight"), want);
  check_values(params.at("fc.weight"), {0.783395897, -1.861953817, 0.306975328});
  CHECK(opt.steps() == 3);
}

TEST_CASE("AdamW's default mask skips biases and norms", "[optim][adamw]") {
  using optim::default_decay_mask;
  CHECK(default_decay_mask("h.3.attn.q_proj.weight", Shape{8, 8}));
  CHECK(default_decay_mask("wte.weight", Shape{100, 8}));
  CHECK(default_decay_mask("conv1.weight", Shape{4, 3, 3, 3}));
  CHECK(default_decay_mask("lnk.weight", Shape{4, 4}));                 // "lnk" is not a norm name
  CHECK_FALSE(default_decay_mask("h.3.mlp.fc.bias", Shape{8}));         // rank 1
  CHECK_FALSE(default_decay_mask("h.0.ln_1.weight", Shape{8}));         // rank 1
  CHECK_FALSE(default_decay_mask("scale", Shape{}));                    // rank 0
  CHECK_FALSE(default_decay_mask("h.0.ln_1.weight", Shape{1, 8}));      // named like a norm
  CHECK_FALSE(default_decay_mask("blocks.0.norm1.gain", Shape{2, 4}));  // contains "norm"
  CHECK_FALSE(default_decay_mask("enc.ln2.w", Shape{2, 4}));
  CHECK_FALSE(default_decay_mask("head.bias", Shape{1, 4}));

  // One step with zero gradients: the Adam part is exactly 0 (m = 0), so only
  // the decay moves anything: the weight shrinks by lr * wd = 0.5, the bias and
  // the norm gain do not move.
  ParamTree params{{"fc.weight", Tensor::from({2.f, -4.f}, {1, 2})},
                   {"fc.bias", vec({2.f, -4.f})},
                   {"ln_f.weight", Tensor::from({2.f, -4.f}, {1, 2})}};
  ParamTree grads;
  for (const auto& [k, v] : params) grads.emplace(k, Tensor::zeros(v.shape()));
  auto opt = optim::adamw(1.f, {.weight_decay = 0.5f});
  opt.step(params, grads);
  check_values(params.at("fc.weight"), {1.0, -2.0});
  check_values(params.at("fc.bias"), {2.0, -4.0});
  check_values(params.at("ln_f.weight"), {2.0, -4.0});

  // A custom mask decays everything.
  auto all = optim::adamw(1.f, {.weight_decay = 0.5f, .mask = [](auto&, auto&) { return true; }});
  all.step(params, grads);
  check_values(params.at("fc.bias"), {1.0, -2.0});
}

TEST_CASE("Adam's weight decay is L2 in the gradient, AdamW's is decoupled", "[optim][adam]") {
  // Two parameters 100x apart, zero loss gradient, lr 0.1, wd 0.1.
  // Adam: g = wd * p, and the first step moves by lr * sign(g) = 0.1 whatever
  // the size of p (the L2 term is normalised away).
  // AdamW: the Adam part is 0 and p *= 1 - lr * wd = 0.99 (proportional to p).
  ParamTree pa{{"w", Tensor::from({2.f, 200.f}, {1, 2})}};
  ParamTree pw = clone_tree(pa);
  const ParamTree grads{{"w", Tensor::zeros({1, 2})}};
  auto adam = optim::adam(0.1f, {.weight_decay = 0.1f});
  auto adamw = optim::adamw(0.1f, {.weight_decay = 0.1f});
  adam.step(pa, grads);
  adamw.step(pw, grads);
  check_values(pa.at("w"), {1.9, 199.9});
  check_values(pw.at("w"), {1.98, 198.0});

  // Without decay both are plain Adam and agree exactly.
  ParamTree qa{{"w", Tensor::from({1.f, -1.f}, {1, 2})}};
  ParamTree qw = clone_tree(qa);
  auto a = optim::adam(0.01f);
  auto w = optim::adamw(0.01f, {.weight_decay = 0.f});
  for (int s = 0; s < 3; ++s) {
    const ParamTree g{{"w", Tensor::from({0.3f * float(s + 1), -0.5f}, {1, 2})}};
    a.step(qa, g);
    w.step(qw, g);
  }
  CHECK(qa.at("w").to_vector() == qw.at("w").to_vector());
}

// ---- SGD ---------------------------------------------------------------------

TEST_CASE("SGD with momentum and Nesterov matches hand-computed values", "[optim][sgd]") {
  // lr 0.1, momentum 0.9; gradients g1 = (1, 2), g2 = (0.5, -1), g3 = (0, 1).
  // The momentum buffer starts at g1 (torch.optim.SGD), then b = 0.9 b + g.
  const std::vector<Tensor> gs = {vec({1.f, 2.f}), vec({0.5f, -1.f}), vec({0.f, 1.f})};
  SECTION("heavy ball") {
    // b: (1, 2), (1.4, 0.8), (1.26, 1.72); p -= 0.1 b.
    ParamTree p{{"w", vec({1.f, -1.f})}};
    auto opt = optim::sgd(0.1f, {.momentum = 0.9f});
    const std::vector<std::vector<double>> want = {{0.9, -1.2}, {0.76, -1.28}, {0.634, -1.452}};
    for (int s = 0; s < 3; ++s) {
      opt.step(p, {{"w", gs[size_t(s)]}});
      check_values(p.at("w"), want[size_t(s)]);
    }
  }
  SECTION("Nesterov") {
    // Same buffers; the step uses g + 0.9 b: (1.9, 3.8), (1.76, -0.28), (1.134, 2.548).
    ParamTree p{{"w", vec({1.f, -1.f})}};
    auto opt = optim::sgd(0.1f, {.momentum = 0.9f, .nesterov = true});
    const std::vector<std::vector<double>> want = {
        {0.81, -1.38}, {0.634, -1.352}, {0.5206, -1.6068}};
    for (int s = 0; s < 3; ++s) {
      opt.step(p, {{"w", gs[size_t(s)]}});
      check_values(p.at("w"), want[size_t(s)]);
    }
  }
  SECTION("plain, with L2 weight decay and dampening") {
    // No momentum: p -= lr (g + wd p) = 1 - 0.1 (1 + 0.5) = 0.85; -1 - 0.1 (2 - 0.5) = -1.15.
    ParamTree p{{"w", vec({1.f, -1.f})}};
    auto plain = optim::sgd(0.1f, {.weight_decay = 0.5f});
    plain.step(p, {{"w", gs[0]}});
    check_values(p.at("w"), {0.85, -1.15});
    CHECK(plain.state().size() == 1);  // just "step": no buffers without momentum
    // Dampening 0.5: b = g1 = (1, 2) first (undamped), then 0.9 b + 0.5 g2 = (1.15, 1.3).
    ParamTree q{{"w", vec({0.f, 0.f})}};
    auto damp = optim::sgd(1.f, {.momentum = 0.9f, .dampening = 0.5f});
    damp.step(q, {{"w", gs[0]}});
    damp.step(q, {{"w", gs[1]}});
    check_values(q.at("w"), {-2.15, -3.3});
  }
  CHECK_THAT(error_of([] { optim::sgd(0.1f, {.nesterov = true}); }),
             Catch::Contains("Nesterov momentum needs momentum > 0"));
}

// ---- clipping ------------------------------------------------------------------

TEST_CASE("clip_by_global_norm scales to the max norm and reports the norm before",
          "[optim][clip]") {
  // |(3, 4)|^2 + |12|^2 = 169: the global norm is 13.
  ParamTree g{{"a", vec({3.f, 4.f})}, {"b", vec({12.f})}};
  CHECK(optim::global_norm(g) == Approx(13.0));
  CHECK(optim::clip_by_global_norm(g, 20.f) == Approx(13.f));  // below: untouched
  check_values(g.at("a"), {3.0, 4.0});
  CHECK(optim::clip_by_global_norm(g, 6.5f) == Approx(13.f));  // scale 0.5
  check_values(g.at("a"), {1.5, 2.0});
  check_values(g.at("b"), {6.0});
  CHECK(optim::global_norm(g) == Approx(6.5));

  // A large tensor (the parallel path) sums the same way: 300000 ones -> sqrt(300000).
  ParamTree big{{"x", Tensor::ones({300000})}};
  CHECK(optim::clip_by_global_norm(big, 1.f) == Approx(std::sqrt(300000.0)));
  CHECK(optim::global_norm(big) == Approx(1.0));
}

TEST_CASE("a non-finite gradient stops with a message naming the parameter", "[optim][clip]") {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  ParamTree g{
      {"a.weight", vec({1.f, 2.f})}, {"b.weight", vec({1.f, nan, 3.f})}, {"c.weight", vec({inf})}};
  const std::string msg = error_of([&] { optim::clip_by_global_norm(g, 1.f); });
  CHECK_THAT(msg, Catch::Contains("gradient of 'b.weight'"));  // the first one, in key order
  CHECK_THAT(msg, Catch::Contains("element 1 is nan"));
  check_values(g.at("a.weight"), {1.0, 2.0});  // nothing was scaled

  // In an optimizer step: parameters, state and step count stay as they were.
  ParamTree p{
      {"a.weight", vec({0.f, 0.f})}, {"b.weight", vec({0.f, 0.f, 0.f})}, {"c.weight", vec({5.f})}};
  g.at("b.weight").fill(1.f);
  auto opt = optim::adam(0.1f);
  CHECK_THAT(error_of([&] { opt.step(p, g); }), Catch::Contains("'c.weight'"));
  CHECK_THAT(error_of([&] { opt.step(p, g); }), Catch::Contains("element 0 is inf"));
  CHECK(opt.steps() == 0);
  check_values(p.at("c.weight"), {5.0});
  check_values(p.at("a.weight"), {0.0, 0.0});
}

TEST_CASE("the optimizer's clip option scales the update, not the caller's gradients",
          "[optim][clip]") {
  // SGD lr 1: the update is the clipped gradient. Norm 13, clipped to 6.5.
  ParamTree p{{"a", vec({0.f, 0.f})}, {"b", vec({0.f})}};
  const ParamTree g{{"a", vec({3.f, 4.f})}, {"b", vec({12.f})}};
  auto opt = optim::sgd(1.f, {.max_grad_norm = 6.5f});
  opt.step(p, g);
  check_values(p.at("a"), {-1.5, -2.0});
  check_values(p.at("b"), {-6.0});
  CHECK(opt.last_grad_norm() == Approx(13.f));
  check_values(g.at("a"), {3.0, 4.0});
}

// ---- gradient accumulation ---------------------------------------------------------

TEST_CASE("accumulating k micro-batches equals one step on their mean", "[optim][accum]") {
  // A schedule that changes every step shows it advances once per optimizer step.
  const optim::Schedule lr = optim::linear(0.1f, 0.05f, 2);
  auto acc_opt = optim::adamw(lr, {.weight_decay = 0.1f});
  auto ref_opt = optim::adamw(lr, {.weight_decay = 0.1f});
  ParamTree p{{"w", Tensor::from({1.f, -1.f, 2.f, 0.5f}, {2, 2})}, {"b", vec({0.25f})}};
  ParamTree q = clone_tree(p);
  optim::GradAccumulator acc(3);
  for (int group = 0; group < 2; ++group) {
    std::vector<ParamTree> micro;
    for (int k = 0; k < 3; ++k) {
      const float s = float(group * 3 + k + 1);
      micro.push_back({{"w", Tensor::from({s, -0.5f * s, 1.f / s, 2.f - s}, {2, 2})},
                       {"b", vec({0.1f * s * s})}});
    }
    for (int k = 0; k < 3; ++k) {
      CHECK(acc_opt.steps() == group);  // no step until the k-th micro-batch
      CHECK(acc.pending() == k);
      CHECK(acc.step(acc_opt, p, micro[size_t(k)]) == (k == 2));
    }
    // The mean, formed directly.
    ParamTree mean;
    for (const char* name : {"w", "b"})
      mean.emplace(name, (micro[0].at(name) + micro[1].at(name) + micro[2].at(name)) / 3.f);
    check_close(acc.mean().at("w"), mean.at("w"));
    check_close(acc.mean().at("b"), mean.at("b"));
    ref_opt.step(q, mean);
    CHECK(acc_opt.steps() == group + 1);
    CHECK(acc_opt.lr() == ref_opt.lr());
  }
  check_close(p.at("w"), q.at("w"), 1e-5);
  check_close(p.at("b"), q.at("b"), 1e-5);
  CHECK(acc_opt.lr() == 0.05f);  // two optimizer steps: the linear schedule is at its end
  CHECK_THAT(error_of([&] {
               acc.add({{"w", Tensor::zeros({4})}, {"b", vec({0.f})}});
             }),
             Catch::Contains("'w' has shape [4] but had shape [2, 2]"));
}

// ---- checkpoint state --------------------------------------------------------------

TEST_CASE("optimizer state round-trips through state() and load_state()", "[optim][state]") {
  const ParamTree p0{{"fc.weight", Tensor::from({0.5f, -1.f, 2.f, 0.f}, {2, 2})},
                     {"fc.bias", vec({0.1f, -0.1f})}};
  auto grads_at = [](int s) {
    const float f = float(s + 1);
    return ParamTree{{"fc.weight", Tensor::from({f, -f, 0.5f, 1.f / f}, {2, 2})},
                     {"fc.bias", vec({0.2f * f, -1.f})}};
  };
  auto make = [](bool sgd) {
    const optim::Schedule s = optim::warmup(2, optim::cosine(0.1f, 10));
    return sgd ? optim::sgd(s, {.momentum = 0.9f, .nesterov = true})
               : optim::adamw(s, {.weight_decay = 0.1f});
  };
  for (bool sgd : {false, true}) {
    auto a = make(sgd);
    ParamTree pa = clone_tree(p0);
    for (int s = 0; s < 3; ++s) a.step(pa, grads_at(s));
    const ParamTree st = a.state();
    const std::string kind = sgd ? "sgd" : "adamw";
    CHECK(st.size() == (sgd ? 3u : 5u));
    CHECK(st.at("step").values<int64_t>() == std::vector<int64_t>{3});
    CHECK(st.count(kind + (sgd ? ".momentum.fc.bias" : ".v.fc.weight")) == 1);

    // A fresh optimizer, fresh parameters holding the same values, then the same next steps.
    auto b = make(sgd);
    b.load_state(clone_tree(st));
    CHECK(b.steps() == 3);
    CHECK(b.lr() == a.lr());
    ParamTree pb = clone_tree(pa);
    for (int s = 3; s < 5; ++s) {
      a.step(pa, grads_at(s));
      b.step(pb, grads_at(s));
    }
    for (const auto& [name, t] : pa) CHECK(t.to_vector() == pb.at(name).to_vector());
  }

  auto adam = optim::adam(0.1f);
  auto sgd = optim::sgd(0.1f, {.momentum = 0.5f});
  ParamTree p = clone_tree(p0);
  sgd.step(p, grads_at(0));
  CHECK_THAT(error_of([&] { adam.load_state(sgd.state()); }),
             Catch::Contains("'sgd.momentum.fc.bias' is not state of an adam optimizer"));
  CHECK_THAT(error_of([&] { adam.load_state({}); }), Catch::Contains("no scalar 'step'"));
  ParamTree half = {{"step", Tensor::from<int64_t>(std::vector<int64_t>{1}, Shape{})},
                    {"adam.m.w", Tensor::zeros({2})}};
  CHECK_THAT(error_of([&] { adam.load_state(half); }), Catch::Contains("'adam.v.w' is missing"));
  // State for a parameter of another shape is caught at the next step.
  half.emplace("adam.v.w", Tensor::zeros({2}));
  adam.load_state(half);
  ParamTree w{{"w", vec({1.f, 2.f, 3.f})}};
  CHECK_THAT(error_of([&] {
               adam.step(w, {{"w", vec({1.f, 1.f, 1.f})}});
             }),
             Catch::Contains("'adam.m.w' has shape [2] but the parameter has shape [3]"));
}

// ---- errors ----------------------------------------------------------------------------

TEST_CASE("mismatched parameter and gradient trees name the parameter", "[optim][errors]") {
  ParamTree p{{"a.weight", Tensor::zeros({2, 3})}, {"a.bias", Tensor::zeros({3})}};
  auto opt = optim::adamw(0.1f);
  CHECK_THAT(error_of([&] {
               opt.step(p, {{"a.weight", Tensor::zeros({3, 2})}, {"a.bias", Tensor::zeros({3})}});
             }),
             Catch::Contains("parameter 'a.weight' has shape [2, 3] but its gradient has shape "
                             "[3, 2]"));
  CHECK_THAT(error_of([&] {
               opt.step(p, {{"a.weight", Tensor::zeros({2, 3})},
                            {"a.bias", Tensor::zeros({3})},
                            {"b.bias", Tensor::zeros({4})}});
             }),
             Catch::Contains("gradient 'b.bias' (shape [4]) has no parameter"));
  CHECK_THAT(error_of([&] {
               opt.step(p, {{"a.weight", Tensor::zeros({2, 3})}});
             }),
             Catch::Contains("parameter 'a.bias' (shape [3]) has no gradient"));
  CHECK(opt.steps() == 0);
}

// ---- steady state: no new memory after the first step -------------------------------------

TEST_CASE("a step allocates nothing after the first", "[optim][alloc]") {
  // Big enough to take the parallel paths, plus small tensors.
  ParamTree p{{"big.weight", Tensor::normal({400, 500}, 1, 0, 0.f, 1.f)},
              {"big.bias", Tensor::zeros({500})},
              {"ln.weight", Tensor::ones({500})}};
  ParamTree g;
  for (const auto& [k, v] : p) g.emplace(k, Tensor::normal(v.shape(), 2, 0, 0.f, 0.1f));
  for (int kind = 0; kind < 3; ++kind) {
    optim::Optimizer opt =
        kind == 0   ? optim::sgd(optim::warmup(3, optim::cosine(0.1f, 10)), {.momentum = 0.9f})
        : kind == 1 ? optim::adam(0.01f, {.max_grad_norm = 1.f})
                    : optim::adamw(optim::linear(0.01f, 0.f, 10), {.max_grad_norm = 1.f});
    optim::GradAccumulator acc(2);
    acc.step(opt, p, g);
    acc.step(opt, p, g);  // first optimizer step: creates the state buffers
    REQUIRE(opt.steps() == 1);
    const AllocatorStats before = CachingAllocator::cpu().stats();
    for (int s = 0; s < 6; ++s) acc.step(opt, p, g);
    opt.step(p, g);
    const AllocatorStats after = CachingAllocator::cpu().stats();
    CHECK(opt.steps() == 5);
    CHECK(after.system_allocs == before.system_allocs);
    CHECK(after.cache_hits == before.cache_hits);  // not even a cached temporary
    CHECK(after.bytes_in_use == before.bytes_in_use);
  }
}

// ---- end to end: minimise a quadratic -------------------------------------------------

TEST_CASE("each optimizer minimises a quadratic", "[optim][e2e]") {
  // loss = sum(c * (w - t)^2) over two parameters with curvatures 0.5 .. 2.
  const Tensor t = Tensor::from({1.f, -2.f, 0.5f, 3.f}, {2, 2});
  const Tensor c = Tensor::from({0.5f, 1.f, 2.f, 1.5f}, {2, 2});
  const Tensor tb = vec({-1.f, 0.25f});
  auto loss = [&](const ParamTree& p) {
    return sum(c * square(p.at("w") - t)) + sum(square(p.at("b") - tb));
  };
  struct Case {
    const char* name;
    optim::Optimizer opt;
    int steps;
  };
  std::vector<Case> cases;
  cases.push_back({"sgd", optim::sgd(0.2f), 100});
  cases.push_back({"momentum", optim::sgd(0.05f, {.momentum = 0.9f}), 300});
  cases.push_back({"nesterov", optim::sgd(0.05f, {.momentum = 0.9f, .nesterov = true}), 200});
  cases.push_back({"adam", optim::adam(optim::cosine(0.1f, 500)), 500});
  cases.push_back({"adamw",
                   optim::adamw(optim::warmup(20, optim::cosine(0.1f, 480)), {.weight_decay = 0.f}),
                   500});
  for (auto& [name, opt, steps] : cases) {
    INFO(name);
    ParamTree p{{"w", Tensor::zeros({2, 2})}, {"b", Tensor::zeros({2})}};
    const float start = loss(p).item();
    for (int s = 0; s < steps; ++s) opt.step(p, grad_of(loss, p));
    CHECK(start > 10.f);
    CHECK(loss(p).item() < 1e-5f);
    check_values(p.at("w"), {1.0, -2.0, 0.5, 3.0}, 2e-3);
  }
}
