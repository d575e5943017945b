// privacy::clipped_grads / noised_gradient inside a custom step, on a small
// CNN (conv2d | relu | max_pool | flatten | linear): the clipped sums against
// per-example gradients taken one example at a time (value_and_grad per
// row), the noise's spread against sigma * C, two replicas against one, and
// the errors a user can cause.
#include <catch2/catch.hpp>
#include <cmath>

#include "redco/comm/threads_comm.hpp"
#include "redco/optim/optimizer.hpp"
#include "redco/privacy/clipped_grads.hpp"
#include "redco/train/trainer.hpp"

using namespace redco;
using namespace redco::train;

namespace {

struct Images {
  Tensor x;       // f32 [B, 1, 6, 6]
  Tensor onehot;  // f32 [B, 3]
};
Images collate(std::span<const int64_t> ids) {
  const auto B = int64_t(ids.size());
  Images b{Tensor::empty({B, 1, 6, 6}), Tensor::zeros({B, 3})};
  for (int64_t i = 0; i < B; ++i) {
    const Tensor x = Tensor::normal({36}, 7, uint64_t(ids[size_t(i)]), 0.f, 1.f);
    std::copy_n(x.data<float>(), 36, b.x.data<float>() + i * 36);
    b.onehot.data<float>()[i * 3 + ids[size_t(i)] % 3] = 1.f;
  }
  return b;
}
Tensor per_example_loss(const Tensor& logits, const Tensor& onehot) {  // [B]
  return neg(sum(log_softmax(logits) * onehot, {1}));
}
const auto cnn =
    nn::conv2d(1, 4) | nn::relu() | nn::max_pool() | nn::flatten() | nn::linear(4 * 3 * 3, 3);
const auto mean_loss = [](auto& m, const Images& b, Rng) {
  return mean(per_example_loss(m(b.x), b.onehot));
};

// sum_b min(1, C / ||g_b||) g_b with g_b from one backward pass per example.
ParamTree clipped_by_rows(StepContext<std::remove_cvref_t<decltype(cnn)>>& s, const Images& b,
                          float C, std::vector<double>& norms) {
  ParamTree out;
  for (int64_t i = 0; i < b.x.dim(0); ++i) {
    const Tensor x = slice(b.x, 0, i, i + 1), y = slice(b.onehot, 0, i, i + 1);
    auto [l, g] = s.value_and_grad([&](auto& m) { return sum(per_example_loss(m(x), y)); });
    const double norm = optim::global_norm(g);
    norms.push_back(norm);
    const float f = float(std::min(1.0, C / (norm + 1e-6)));
    for (auto& [n, t] : g)
      out.contains(n) ? void(out.at(n) = out.at(n) + t * f) : void(out.emplace(n, t * f));
  }
  return out;
}

double max_diff(const Tensor& a, const Tensor& b) {
  double d = 0;
  const auto va = a.values<float>(), vb = b.values<float>();
  for (size_t i = 0; i < va.size(); ++i) d = std::max(d, double(std::abs(va[i] - vb[i])));
  return d;
}

std::vector<int64_t> ids(int64_t n) {
  std::vector<int64_t> v(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) v[size_t(i)] = i;
  return v;
}

}  // namespace

TEST_CASE("dp_sgd: ghost-clipped sums equal per-example gradients clipped one by one", "[dp_sgd]") {
  constexpr float kClip = 0.3f;
  Deployer d({.seed = 3, .quiet = true});
  Trainer trainer(d, cnn, collate, mean_loss, optim::sgd(optim::constant(0.1f)));
  int checked = 0;
  auto step = [&](auto& s, const Images& b, Rng rng) {
    auto [loss, c] = privacy::clipped_grads(
        s, [&](auto& m) { return per_example_loss(m(b.x), b.onehot); }, kClip);
    std::vector<double> norms;
    const ParamTree want = clipped_by_rows(s, b, kClip, norms);
    REQUIRE(c.sums.size() == 4);  // conv weight, bias; fc weight, bias
    int clipped = 0;
    for (size_t i = 0; i < norms.size(); ++i) {
      CHECK(std::sqrt(double(c.sq_norms.template values<float>()[i])) ==
            Approx(norms[i]).epsilon(1e-4));
      clipped += norms[i] > kClip;
    }
    CHECK(clipped > 0);  // the clipping is exercised
    for (const auto& [n, t] : want) CHECK(max_diff(c.sums.at(n), t) < 1e-5);
    auto m = s.model();
    CHECK(loss.item() == Approx(mean_loss(m, b, rng).item()).epsilon(1e-5));
    ++checked;
    return StepResult{loss, privacy::noised_gradient(s, c, 0.0, kClip, 8, rng)};
  };
  trainer.fit(ids(16), {.global_batch_size = 8, .n_epochs = 1, .shuffle = false}, step);
  CHECK(checked == 2);
}

TEST_CASE("dp_sgd: two replicas step like one, and the noise has std sigma C / batch", "[dp_sgd]") {
  constexpr float kClip = 0.5f;
  std::vector<float> one, two;
  for (int world : {1, 2}) {
    auto body = [&](comm::Comm* comm, int rank) {
      Deployer d({.seed = 5, .quiet = true, .world = comm});
      Trainer trainer(d, cnn, collate, mean_loss, optim::sgd(optim::constant(0.5f)));
      auto step = [&](auto& s, const Images& b, Rng rng) {
        auto [loss, c] = privacy::clipped_grads(
            s, [&](auto& m) { return per_example_loss(m(b.x), b.onehot); }, kClip);
        return StepResult{loss, privacy::noised_gradient(s, c, 0.0, kClip, 8, rng)};
      };
      trainer.fit(ids(16), {.global_batch_size = 8, .n_epochs = 1, .shuffle = false}, step);
      if (rank == 0) (world == 1 ? one : two) = trainer.params().at("fc.weight").values<float>();
    };
    if (world == 1) {
      body(nullptr, 0);
    } else {
      comm::ThreadsWorld w(world);
      w.run([&](comm::Comm& c) { body(&c, c.rank()); });
    }
  }
  REQUIRE(one.size() == two.size());
  for (size_t i = 0; i < one.size(); ++i) CHECK(one[i] == Approx(two[i]).margin(1e-5));

  // The noise alone: zero sums, 2 replicas, sigma 2, C 0.5, batch 4 ->
  // each replica's noise std 2 * 0.5 * sqrt(2) / 4, their mean's 2 * 0.5 / 4.
  privacy::ClippedGrads zero;
  zero.sums.emplace("w", Tensor::zeros({100, 100}));
  const ParamTree a = privacy::noised_gradient(zero, 2.0, 0.5f, 4, 2, Rng{1, 2, 3});
  const ParamTree b = privacy::noised_gradient(zero, 2.0, 0.5f, 4, 2, Rng{1, 2, 4});
  double sq = 0;
  const auto va = a.at("w").values<float>(), vb = b.at("w").values<float>();
  for (size_t i = 0; i < va.size(); ++i) sq += std::pow((va[i] + vb[i]) / 2.0, 2);
  CHECK(std::sqrt(sq / double(va.size())) == Approx(0.25).epsilon(0.03));
}

TEST_CASE("dp_sgd: what per-example clipping cannot take is one clear error", "[dp_sgd]") {
  CHECK_THROWS_WITH(privacy::clipped_grad_sums(Tensor::zeros({4}), {}, 1.f),
                    Catch::Contains("no layer recorded"));
  CHECK_THROWS_WITH(privacy::clipped_grad_sums(Tensor::zeros({}), {}, 1.f),
                    Catch::Contains("must be [B]"));
  // A layer applied twice (shared weights).
  const auto fc = nn::linear(3, 3);
  Deployer d({.seed = 3, .quiet = true});
  Trainer trainer(
      d, fc, collate, [](auto& m, const Images& b, Rng) { return mean(m(flatten(b.x))); },
      optim::sgd(optim::constant(0.1f)));
  auto twice = [&](auto& s, const Images& b, Rng) {
    auto [loss, c] = privacy::clipped_grads(
        s, [&](auto& m) { return sum(m(m(slice(flatten(b.x), 1, 0, 3))), {1}); }, 1.f);
    return StepResult{loss, c.sums};
  };
  CHECK_THROWS_WITH(trainer.fit(ids(4), {.global_batch_size = 4}, twice),
                    Catch::Contains("ran twice"));
}
