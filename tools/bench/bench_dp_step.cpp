// What DP-SGD's per-example clipping costs on models::small_cnn's layers
// (conv 1->16 | relu | pool | conv 16->32 | relu | pool | linear 1568->10, on
// 28x28 images), written with the functional ops:
//   normal: forward + backward of the mean loss;
//   dp:     forward, backward to the layer outputs, ghost norms of every
//           weight and bias, clip factors, backward of the clipped-weighted
//           loss sum to the parameters, Gaussian noise (two-pass ghost clipping).
//
//   bench_dp_step [--batch B] [--reps N]
//
// Prints the time of each and their throughput ratio (normal / dp).
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "redco/autodiff/functional.hpp"
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
  auto dp_step = [&] {
    const Forward f = forward(p, x, onehot);
    const TensorList g =
        grad({sum(f.loss_vec)}, {f.z1, f.z2, f.logits}, {}, {.retain_graph = true});
    Tensor sq = privacy::conv2d_weight_grad_sq_norms(x, g[0], 3, 3, 1, 1) +
                privacy::conv2d_bias_grad_sq_norms(g[0]) +
                privacy::conv2d_weight_grad_sq_norms(f.a1.detach(), g[1], 3, 3, 1, 1) +
                privacy::conv2d_bias_grad_sq_norms(g[1]) +
                privacy::linear_weight_grad_sq_norms(f.flat.detach(), g[2]) +
                privacy::linear_bias_grad_sq_norms(g[2]);
    const Tensor factors = privacy::clip_factors(sq, 1.f);
    TensorList grads = grad({sum(f.loss_vec * factors)}, p.all());
    for (size_t k = 0; k < grads.size(); ++k)
      grads[k] = grads[k] + Tensor::normal(grads[k].shape(), 3, k, 0.f, 1.f);
    return grads;
  };

  for (int i = 0; i < 3; ++i) normal_step(), dp_step();  // warm up caches and allocator
  double t_normal = 1e30, t_dp = 1e30;
  for (int64_t r = 0; r < reps; ++r) {  // alternate, keep each one's best
    auto t0 = std::chrono::steady_clock::now();
    normal_step();
    t_normal = std::min(t_normal, seconds_since(t0));
    t0 = std::chrono::steady_clock::now();
    dp_step();
    t_dp = std::min(t_dp, seconds_since(t0));
  }
  std::printf(
      "batch %lld: normal step %.2f ms, DP-SGD step (ghost clipping) %.2f ms, "
      "throughput ratio %.2f\n",
      (long long)B, t_normal * 1e3, t_dp * 1e3, t_normal / t_dp);
}
