// The autograd engine: accumulation, grad modes, graph lifetime, function
// transforms, and higher-order gradients (Hessian-vector products, a MAML
// step) checked against finite differences.
#include "gradcheck.hpp"
#include "redco/autodiff/value_and_grad.hpp"
#include "redco/core/allocator.hpp"
#include "redco/ops/backend.hpp"

using namespace redco;
using redco::test::randn;

namespace {
// A two-layer MLP with a smooth activation: loss = mean((tanh(x W1^T + b1) W2^T - y)^2).
Tensor mlp_loss(const ParamTree& p, const Tensor& x, const Tensor& y) {
  Tensor h = tanh(linear(x, p.at("fc1.weight"), p.at("fc1.bias")));
  return mean(square(linear(h, p.at("fc2.weight"), p.at("fc2.bias")) - y));
}
ParamTree mlp_params() {
  return {{"fc1.weight", randn({6, 4}, 1, 0.5f)},
          {"fc1.bias", randn({6}, 2, 0.1f)},
          {"fc2.weight", randn({3, 6}, 3, 0.5f)},
          {"fc2.bias", randn({3}, 4, 0.1f)}};
}
}  // namespace

TEST_CASE("backward accumulates into leaves' grad buffers", "[autodiff]") {
  Tensor w = Tensor::from({1.f, 2.f, 3.f}, {3});
  w.set_requires_grad(true);
  backward(sum(w * w));
  CHECK(w.grad().to_vector() == std::vector<float>{2.f, 4.f, 6.f});
  const void* buffer = w.grad().raw();
  backward(sum(w * 3.f));  // accumulates in place: same buffer, summed values
  CHECK(w.grad().to_vector() == std::vector<float>{5.f, 7.f, 9.f});
  CHECK(w.grad().raw() == buffer);
  w.zero_grad();
  CHECK_FALSE(w.grad().defined());
}

TEST_CASE("a shared subexpression receives the sum of its uses", "[autodiff]") {
  Tensor x = Tensor::from({2.f}, {1});
  x.set_requires_grad(true);
  Tensor y = x * x;                     // y = x^2
  Tensor z = y * 3.f + exp(y) + y * y;  // dz/dx = (3 + e^y + 2y) 2x
  const float expect = (3.f + std::exp(4.f) + 8.f) * 4.f;
  CHECK(grad({sum(z)}, {x})[0].item() == Approx(expect).epsilon(1e-5));
}

TEST_CASE("no-grad scopes and detach record nothing", "[autodiff]") {
  Tensor w = randn({3}, 5);
  w.set_requires_grad(true);
  {
    NoGradGuard off;
    Tensor y = w * 2.f;
    CHECK_FALSE(y.requires_grad());
    CHECK_FALSE(bool(grad_fn_of(y)));
  }
  Tensor y = w.detach() * 2.f;
  CHECK_FALSE(y.requires_grad());
  Tensor z = sum(w * w.detach());  // the detached factor is a constant
  CHECK(grad({z}, {w})[0].to_vector() == w.to_vector());
}

TEST_CASE("graph lifetime and errors name the fix", "[autodiff]") {
  Tensor w = randn({3}, 6);
  w.set_requires_grad(true);
  Tensor loss = sum(exp(w));
  backward(loss);
  CHECK_THROWS_WITH(backward(loss), Catch::Contains("retain_graph"));
  Tensor loss2 = sum(exp(w));
  backward(loss2, {}, {.retain_graph = true});
  backward(loss2);  // allowed once more: the graph was retained
  Tensor v = randn({3}, 7);
  v.set_requires_grad(true);
  CHECK_THROWS_WITH(grad({sum(w * 2.f)}, {v}), Catch::Contains("allow_unused"));
  CHECK_FALSE(grad({sum(w * 2.f)}, {v}, {}, {.allow_unused = true})[0].defined());
  CHECK_THROWS_WITH(grad({w * 2.f}, {w}), Catch::Contains("grad_outputs"));
  Tensor c = randn({3}, 8);
  CHECK_THROWS_WITH(grad({sum(c)}, {w}), Catch::Contains("does not require grad"));
}

TEST_CASE("the gradient with respect to an intermediate leaves the graph usable", "[autodiff]") {
  Tensor w = randn({4}, 9);
  w.set_requires_grad(true);
  Tensor h = tanh(w);
  Tensor loss = sum(h * h);
  Tensor dh = grad({loss}, {h}, {}, {.retain_graph = true})[0];
  CHECK(dh.to_vector() == (h.detach() * 2.f).to_vector());
  backward(loss);  // the part of the graph below h was not consumed
  Tensor expect = h.detach() * 2.f * (1.f - square(h.detach()));
  auto a = w.grad().to_vector(), b = expect.to_vector();
  for (size_t i = 0; i < a.size(); ++i) CHECK(a[i] == Approx(b[i]).epsilon(1e-5));
}

TEST_CASE("value_and_grad over a parameter tree matches finite differences", "[autodiff]") {
  ParamTree params = mlp_params();
  Tensor x = randn({5, 4}, 10), y = randn({5, 3}, 11);
  auto f = [&](const ParamTree& p) { return mlp_loss(p, x, y); };
  auto [loss, grads] = value_and_grad(f, params);
  CHECK_FALSE(loss.requires_grad());
  CHECK(grads.size() == params.size());
  CHECK_FALSE(params.at("fc1.weight").requires_grad());  // the caller's tensors are untouched
  for (auto& [name, p] : params) {
    INFO(name);
    REQUIRE(grads.at(name).shape() == p.shape());
    float* v = p.data<float>();
    for (int64_t j = 0; j < p.numel(); ++j) {
      const float orig = v[j];
      v[j] = orig + 1e-2f;
      const double up = f(params).item();
      v[j] = orig - 1e-2f;
      const double down = f(params).item();
      v[j] = orig;
      test::expect_close(grads.at(name).data<float>()[j], (up - down) / 2e-2, 1e-4, 1e-2, name);
    }
  }
}

TEST_CASE("Hessian-vector product of an MLP matches finite differences", "[autodiff]") {
  ParamTree params = mlp_params();
  Tensor x = randn({5, 4}, 12), y = randn({5, 3}, 13);
  // v: a random direction in parameter space.
  ParamTree v;
  for (auto& [name, p] : params) v.emplace(name, randn(p.shape(), 100 + p.numel()));
  // Hv = d/dp <grad L(p), v>, with the inner gradient recorded (create_graph).
  auto grad_dot_v = [&](const ParamTree& p) {
    ParamTree g =
        grad_of([&](const ParamTree& q) { return mlp_loss(q, x, y); }, p, {.create_graph = true});
    Tensor dot = Tensor::scalar(0.f);
    for (auto& [name, gi] : g) dot = dot + sum(gi * v.at(name));
    return dot;
  };
  ParamTree hv = grad_of(grad_dot_v, params);
  // Finite differences of the gradient along v: (g(p + eps v) - g(p - eps v)) / 2 eps.
  const float eps = 1e-2f;
  auto shifted = [&](float s) {
    ParamTree q;
    for (auto& [name, p] : params) q.emplace(name, p + v.at(name) * s);
    return grad_of([&](const ParamTree& t) { return mlp_loss(t, x, y); }, q);
  };
  ParamTree up = shifted(eps), down = shifted(-eps);
  for (auto& [name, h] : hv) {
    auto a = h.to_vector(), u = up.at(name).to_vector(), d = down.at(name).to_vector();
    for (size_t j = 0; j < a.size(); ++j)
      test::expect_close(a[j], (u[j] - d[j]) / (2 * eps), 2e-3, 2e-2, name);
  }
}

TEST_CASE("a MAML step differentiates through the inner update", "[autodiff]") {
  ParamTree params = mlp_params();
  Tensor xs = randn({4, 4}, 14), ys = randn({4, 3}, 15);  // support set
  Tensor xq = randn({4, 4}, 16), yq = randn({4, 3}, 17);  // query set
  const float lr = 0.3f;
  // meta_loss(p) = L_query(p - lr * grad L_support(p))
  auto meta_loss = [&](const ParamTree& p) {
    ParamTree g =
        grad_of([&](const ParamTree& q) { return mlp_loss(q, xs, ys); }, p, {.create_graph = true});
    ParamTree adapted;
    for (auto& [name, w] : p) adapted.emplace(name, w - g.at(name) * lr);
    return mlp_loss(adapted, xq, yq);
  };
  ParamTree g = grad_of(meta_loss, params);
  // First-order MAML (dropping the second-order term) must differ: the test
  // would not notice a missing create_graph otherwise.
  double diff_from_first_order = 0;
  for (auto& [name, p] : params) {
    float* w = p.data<float>();
    for (int64_t j = 0; j < p.numel(); j += 3) {
      const float orig = w[j];
      w[j] = orig + 1e-2f;
      const double up = meta_loss(params).item();
      w[j] = orig - 1e-2f;
      const double down = meta_loss(params).item();
      w[j] = orig;
      test::expect_close(g.at(name).data<float>()[j], (up - down) / 2e-2, 2e-4, 2e-2, name);
    }
  }
  ParamTree first_order;
  {
    ParamTree gs = grad_of([&](const ParamTree& q) { return mlp_loss(q, xs, ys); }, params);
    ParamTree adapted;
    for (auto& [name, w] : params) adapted.emplace(name, w - gs.at(name) * lr);
    first_order = grad_of([&](const ParamTree& q) { return mlp_loss(q, xq, yq); }, adapted);
  }
  for (auto& [name, gi] : g) {
    auto a = gi.to_vector(), b = first_order.at(name).to_vector();
    for (size_t j = 0; j < a.size(); ++j) diff_from_first_order += std::abs(a[j] - b[j]);
  }
  CHECK(diff_from_first_order > 1e-3);
}

TEST_CASE("a training step allocates nothing new after the first", "[autodiff][memory]") {
  ParamTree params = mlp_params();
  params.emplace("fc0.weight", randn({4, 300}, 18, 0.05f));  // a block over 1 MiB of activations
  Tensor x = randn({512, 300}, 19), y = randn({512, 3}, 20);
  auto step = [&] {
    auto [loss, grads] = value_and_grad(
        [&](const ParamTree& p) { return mlp_loss(p, linear(x, p.at("fc0.weight")), y); }, params);
    NoGradGuard off;
    for (auto& [name, p] : params) p.copy_from(p - grads.at(name) * 0.1f);
    return loss.item();
  };
  const float first = step();
  step();
  const size_t allocs = CachingAllocator::cpu().stats().system_allocs;
  float last = 0;
  for (int i = 0; i < 5; ++i) last = step();
  CHECK(CachingAllocator::cpu().stats().system_allocs == allocs);
  CHECK(last < first);
}

TEST_CASE("a matmul's backward runs in the precision its forward ran under", "[autodiff][bf16]") {
  const Tensor x = randn({3, 5, 8}, 11, 1.f), w = randn({6, 8}, 12, 1.f);
  auto loss = [&](const ParamTree& p) { return sum(matmul(x, p.at("w"), false, true)); };
  const ParamTree params{{"w", w}};
  ParamTree mixed;
  {
    PrecisionGuard bf16(Precision::bf16);
    mixed = grad_of(loss, params);  // the forward runs under the guard
  }
  const ParamTree full = grad_of(loss, params);
  // d sum(x w^T) / dw = 1^T x: in bf16 the ones are exact and x is rounded,
  // so the gradient is the column sums of rounded x (accumulated in f32).
  const Tensor xr = x.to(DType::bf16).to(DType::f32);
  const Tensor want = matmul(Tensor::ones({6, 15}), reshape(xr, {15, 8}));
  const auto got = mixed.at("w").to_vector(), ref = want.to_vector();
  const auto f32 = full.at("w").to_vector();
  float diff_from_f32 = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    CHECK(got[i] == Approx(ref[i]).margin(1e-5));
    diff_from_f32 = std::max(diff_from_f32, std::abs(got[i] - f32[i]));
  }
  CHECK(diff_from_f32 > 1e-4f);  // the rounding did happen in the backward
  CHECK(diff_from_f32 < 0.2f);
}

TEST_CASE("attention under bf16 computes on rounded q, k, v and keeps them as bf16",
          "[autodiff][bf16]") {
  // [B, H, T, D]: GQA (4 query heads, 2 kv heads), causal; power-of-two
  // sizes, so the allocator's rounding does not blur the bytes counted below.
  const Tensor q = randn({2, 4, 512, 64}, 21, 1.f), k = randn({2, 2, 512, 64}, 22, 1.f),
               v = randn({2, 2, 512, 64}, 23, 1.f);
  const Tensor dir = randn({2, 512, 256}, 24, 1.f);  // the loss's direction
  auto loss = [&](const ParamTree& p) {
    return sum(attention_merged_heads(p.at("q"), p.at("k"), p.at("v"), true) * dir);
  };
  ParamTree mixed;
  {
    PrecisionGuard bf16(Precision::bf16);
    mixed = grad_of(loss, {{"q", q}, {"k", k}, {"v", v}});
  }
  // The same as f32 attention on the rounded inputs, bit for bit: the kernel
  // widens the kept bf16 exactly.
  auto rounded = [](const Tensor& t) { return t.to(DType::bf16).to(DType::f32); };
  const ParamTree want = grad_of(loss, {{"q", rounded(q)}, {"k", rounded(k)}, {"v", rounded(v)}});
  const ParamTree full = grad_of(loss, {{"q", q}, {"k", k}, {"v", v}});
  for (const char* n : {"q", "k", "v"}) {
    INFO(n);
    CHECK(mixed.at(n).to_vector() == want.at(n).to_vector());
    CHECK(mixed.at(n).to_vector() != full.at(n).to_vector());  // the rounding did happen
  }
  // What the node keeps past forward: q, k, v in bf16 (half their f32 bytes)
  // and the output; under f32 the f32 inputs themselves.
  auto kept_bytes = [&](Precision p) {
    PrecisionGuard guard(p);
    Tensor y;
    int64_t before = 0;
    {
      const Tensor qi = q.clone().set_requires_grad(true), ki = k.clone().set_requires_grad(true),
                   vi = v.clone().set_requires_grad(true);
      before = int64_t(CachingAllocator::cpu().stats().bytes_in_use);
      y = attention_merged_heads(qi, ki, vi, true);
    }  // the caller's q, k, v are gone; the graph keeps what backward needs
    return int64_t(CachingAllocator::cpu().stats().bytes_in_use) - before;
  };
  const int64_t f32_kept = kept_bytes(Precision::f32), bf16_kept = kept_bytes(Precision::bf16);
  INFO("kept past forward: f32 " << f32_kept << " bytes, bf16 " << bf16_kept);
  // Half of q, k and v's f32 bytes: 2 x 512 x 64 x (4 + 2 + 2) x 2 = 1 MiB.
  CHECK(f32_kept - bf16_kept == int64_t(q.nbytes() + k.nbytes() + v.nbytes()) / 2);
}

TEST_CASE("the op profiler attributes time to nested scopes only while enabled", "[autodiff]") {
  const Tensor x = randn({4, 8}, 13, 1.f);
  auto loss = [&](const ParamTree& p) { return sum(matmul(x, p.at("w"), false, true)); };
  const ParamTree params{{"w", randn({5, 8}, 14, 1.f)}};
  profile::reset();
  grad_of(loss, params);  // off by default: nothing recorded
  CHECK(profile::report().empty());
  profile::enable(true);
  grad_of(loss, params);
  profile::enable(false);
  const auto entries = profile::report();
  auto find = [&](const std::string& path) {
    for (const auto& e : entries)
      if (e.path == path) return e;
    return profile::Entry{};
  };
  CHECK(find("matmul > gemm NT 4x5x8").calls == 1);  // the forward GEMM, keyed by shape
  CHECK(find("matmul.backward > matmul > gemm TN 5x8x4").calls == 1);  // dW (x needs none)
  CHECK(find("matmul.backward").calls == 1);            // the rule's own (exclusive) time
  for (const auto& e : entries) CHECK(e.seconds >= 0);  // nested time is not counted twice
  profile::reset();
  CHECK(profile::report().empty());
}

TEST_CASE("the op profiler names the scope where memory in use peaked", "[autodiff]") {
  profile::reset();
  CachingAllocator::cpu().reset_peak();
  profile::enable(true);
  {
    profile::Scope outer("outer");
    Tensor small = Tensor::zeros({1000});
    {
      profile::Scope inner("inner");
      Tensor big = Tensor::zeros({8 << 20});  // 32 MiB, freed at once
    }
    Tensor after = Tensor::zeros({1000});  // below the mark: moves nothing
  }
  profile::enable(false);
  const profile::MemoryPeak peak = profile::memory_peak();
  CHECK(peak.path == "outer > inner");
  CHECK(peak.bytes >= (size_t(32) << 20));
  profile::reset();
  CHECK(profile::memory_peak().path.empty());
}
