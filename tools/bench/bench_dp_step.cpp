// What DP-SGD's per-example clipping costs on models::small_cnn's layers
// (conv 1->16 | relu | pool | conv 16->32 | relu | pool | linear 1568->10, on
// 28x28 images), written with the functional ops:
//   normal:   forward + backward of the mean loss to the parameters;
//   dp 2-pass: forward, backward to the layer outputs, ghost norms of every
//             weight and bias, clip factors, a second backward of the
//             clipped-weighted loss sum to the parameters, Gaussian noise;
//   dp 1-pass: the same up to the clip factors, then the clipped sums from the
//             same output gradients (privacy::clipped_*_grad), Gaussian noise.
// Then the same CNN as a typed model (models::small_cnn), as
// samples/differential_privacy trains it:
//   normal:   nn::apply, the mean cross entropy's gradient;
//   DP-SGD:   nn::apply with nn::Ctx::taps, privacy::clipped_grad_sums (one
//             backward pass to the layer outputs), privacy::noised_gradient.
//
//   bench_dp_step [--batch B] [--reps N]
//
// Prints each step's best time and its throughput relative to the normal step.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "redco/autodiff/functional.hpp"
#include "redco/models/vision.hpp"
#include "redco/privacy/clipped_grads.hpp"
#include "redco/privacy/per_example.hpp"

using namespace redco;

namespace {

struct Params {
  Tensor w1, b1, w2, b2, wf, bf;
  TensorList all() const { return {w1, b1, w2, b2, wf, bf}; }
};

Tensor leaf(const Shape& s, uint64_t stream, float std) {
  return Tensor::normal(s, 1, stream, 0.f, std).set_requires_grad(true);
}

// Activations a step needs: the layers' inputs and outputs.
struct Forward {
  Tensor z1, a1, z2, flat, logits, loss_vec;
};

Forward forward(const Params& p, const Tensor& x, const Tensor& onehot) {
  Forward f;
  f.z1 = conv2d(x, p.w1, p.b1, 1, 1);
  f.a1 = max_pool2d(relu(f.z1), 2);
  f.z2 = conv2d(f.a1, p.w2, p.b2, 1, 1);
  f.flat = flatten(max_pool2d(relu(f.z2), 2));
  f.logits = linear(f.flat, p.wf, p.bf);
  f.loss_vec = neg(sum(log_softmax(f.logits) * onehot, {1}));  // [B] per-example losses
  return f;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// models::small_cnn through nn::apply: the default step's gradient against
// DP-SGD's (taps, clipped sums, noise), taking turns, each one's best time.
void typed_model_steps(const Tensor& x, const Tensor& onehot, int64_t reps) {
  const int64_t B = x.dim(0);
  const auto cnn = models::small_cnn({});
  nn::ParamTree tree = nn::init_params(cnn, 1);
  TensorList leaves;
  for (auto& [name, t] : tree) leaves.push_back(t.set_requires_grad(true));
  Tensor labels = Tensor::empty({B}, DType::i64);
  for (int64_t b = 0; b < B; ++b) labels.data<int64_t>()[b] = b % 10;
  auto normal = [&] {
    nn::Ctx c;
    c.train = true;
    return grad({cross_entropy(nn::apply(cnn, tree, x, c), labels)}, leaves);
  };
  auto dp = [&] {
    nn::LayerTaps taps;
    nn::Ctx c;
    c.train = true;
    c.taps = &taps;
    const Tensor losses = neg(sum(log_softmax(nn::apply(cnn, tree, x, c)) * onehot, {1}));
    const privacy::ClippedGrads g = privacy::clipped_grad_sums(losses, taps, 1.f);
    return privacy::noised_gradient(g, 1.0, 1.f, B, 1, train::Rng{1, 2, 3});
  };
  for (int i = 0; i < 3; ++i) normal(), dp();
  double t[2] = {1e30, 1e30};
  for (int64_t r = 0; r < reps; ++r) {
    auto t0 = std::chrono::steady_clock::now();
    normal();
    t[0] = std::min(t[0], seconds_since(t0));
    t0 = std::chrono::steady_clock::now();
    dp();
    t[1] = std::min(t[1], seconds_since(t0));
  }
  std::printf(
      "models::small_cnn, batch %lld: normal step %.2f ms (%.0f examples/s); DP-SGD step "
      "(taps, clipped_grad_sums, noise) %.2f ms (%.0f examples/s): %.2fx throughput\n",
      (long long)B, t[0] * 1e3, double(B) / t[0], t[1] * 1e3, double(B) / t[1], t[0] / t[1]);
}

}  // namespace

int main(int argc, char** argv) {
  int64_t B = 64, reps = 20;
  for (int i = 1; i + 1 < argc; ++i) {
    if (!std::strcmp(argv[i], "--batch")) B = std::atoll(argv[i + 1]);
    if (!std::strcmp(argv[i], "--reps")) reps = std::atoll(argv[i + 1]);
  }
  const Params p{leaf({16, 1, 3, 3}, 1, 0.3f),     leaf({16}, 2, 0.f),
                 leaf({32, 16, 3, 3}, 3, 0.1f),    leaf({32}, 4, 0.f),
                 leaf({10, 32 * 7 * 7}, 5, 0.02f), leaf({10}, 6, 0.f)};
  const Tensor x = Tensor::normal({B, 1, 28, 28}, 2, 0, 0.f, 1.f);
  Tensor onehot = Tensor::zeros({B, 10});
  for (int64_t b = 0; b < B; ++b) onehot.data<float>()[b * 10 + b % 10] = 1.f;
  GradModeGuard on(true);

  auto normal_step = [&] {
    const Forward f = forward(p, x, onehot);
    return grad({mean(f.loss_vec)}, p.all());
  };
  // Backward to the layer outputs, then every layer's squared norms and the clip factors.
  struct Norms {
    Forward f;
    TensorList g;  // d loss_sum / d (z1, z2, logits)
    Tensor factors;
  };
  auto norms = [&](bool keep_graph) {
    Norms n{forward(p, x, onehot), {}, {}};
    n.g = grad({sum(n.f.loss_vec)}, {n.f.z1, n.f.z2, n.f.logits}, {}, {.retain_graph = keep_graph});
    const Tensor a1 = n.f.a1.detach(), flat = n.f.flat.detach();
    const Tensor sq = privacy::conv2d_weight_grad_sq_norms(x, n.g[0], 3, 3, 1, 1) +
                      privacy::conv2d_bias_grad_sq_norms(n.g[0]) +
                      privacy::conv2d_weight_grad_sq_norms(a1, n.g[1], 3, 3, 1, 1) +
                      privacy::conv2d_bias_grad_sq_norms(n.g[1]) +
                      privacy::linear_weight_grad_sq_norms(flat, n.g[2]) +
                      privacy::linear_bias_grad_sq_norms(n.g[2]);
    n.factors = privacy::clip_factors(sq, 1.f);
    return n;
  };
  auto add_noise = [](TensorList grads) {
    for (size_t k = 0; k < grads.size(); ++k)
      grads[k] = grads[k] + Tensor::normal(grads[k].shape(), 3, k, 0.f, 1.f);
    return grads;
  };
  auto dp_two_pass = [&] {
    const Norms n = norms(true);
    return add_noise(grad({sum(n.f.loss_vec * n.factors)}, p.all()));
  };
  auto dp_one_pass = [&] {
    const Norms n = norms(false);
    const Tensor& f = n.factors;
    return add_noise({privacy::clipped_conv2d_weight_grad(x, n.g[0], f, 3, 3, 1, 1),
                      privacy::clipped_conv2d_bias_grad(n.g[0], f),
                      privacy::clipped_conv2d_weight_grad(n.f.a1.detach(), n.g[1], f, 3, 3, 1, 1),
                      privacy::clipped_conv2d_bias_grad(n.g[1], f),
                      privacy::clipped_linear_weight_grad(n.f.flat.detach(), n.g[2], f),
                      privacy::clipped_linear_bias_grad(n.g[2], f)});
  };

  // The two DP steps must agree (they compute the same clipped sum).
  {
    const TensorList a = dp_two_pass(), b = dp_one_pass();
    float worst = 0;
    for (size_t k = 0; k < a.size(); ++k) {
      const auto va = a[k].values<float>(), vb = b[k].values<float>();
      for (size_t i = 0; i < va.size(); ++i) worst = std::max(worst, std::abs(va[i] - vb[i]));
    }
    std::printf("one-pass vs two-pass clipped gradients: max |difference| %.2g\n", worst);
  }

  for (int i = 0; i < 3; ++i) normal_step(), dp_two_pass(), dp_one_pass();  // warm up
  double t[3] = {1e30, 1e30, 1e30};
  for (int64_t r = 0; r < reps; ++r) {  // take turns, keep each one's best
    auto t0 = std::chrono::steady_clock::now();
    normal_step();
    t[0] = std::min(t[0], seconds_since(t0));
    t0 = std::chrono::steady_clock::now();
    dp_two_pass();
    t[1] = std::min(t[1], seconds_since(t0));
    t0 = std::chrono::steady_clock::now();
    dp_one_pass();
    t[2] = std::min(t[2], seconds_since(t0));
  }
  std::printf(
      "batch %lld: normal step %.2f ms; DP-SGD 2-pass %.2f ms (%.2fx throughput), "
      "1-pass %.2f ms (%.2fx)\n",
      (long long)B, t[0] * 1e3, t[1] * 1e3, t[0] / t[1], t[2] * 1e3, t[0] / t[2]);
  typed_model_steps(x, onehot, reps);
}
