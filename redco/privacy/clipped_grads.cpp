// Clipped per-example gradient sums from the layers' recorded inputs and
// output gradients (ghost norms, then one weighted GEMM per layer).
#include "redco/privacy/clipped_grads.hpp"

#include <set>

#include "redco/autodiff/node.hpp"
#include "redco/privacy/per_example.hpp"

namespace redco::privacy {
namespace {

// Squared norms [B] of one layer's weight (and bias) gradients per example.
Tensor layer_sq_norms(const nn::LayerTap& t, const Tensor& g) {
  const Tensor x = t.input.detach();
  const int64_t k = t.kernel;
  Tensor sq = k ? conv2d_weight_grad_sq_norms(x, g, k, k, t.stride, t.pad)
                : linear_weight_grad_sq_norms(x, g);
  if (!t.bias.empty()) sq = sq + (k ? conv2d_bias_grad_sq_norms(g) : linear_bias_grad_sq_norms(g));
  return sq;
}

}  // namespace

ClippedGrads clipped_grad_sums(const Tensor& losses, const nn::LayerTaps& taps, float max_norm) {
  REDCO_CHECK(losses.defined() && losses.rank() == 1,
              "privacy::clipped_grad_sums: the per-example losses must be [B], got {}",
              losses.defined() ? losses.shape() : Shape{});
  REDCO_CHECK(!taps.empty(),
              "privacy::clipped_grad_sums: no layer recorded its input and output; the model "
              "must contain linear or conv2d layers and run with nn::Ctx::taps set");
  REDCO_CHECK(losses.requires_grad(),
              "privacy::clipped_grad_sums: the losses do not depend on any recorded layer "
              "with a gradient to follow");
  std::set<std::string> seen;
  TensorList outputs;
  for (const nn::LayerTap& t : taps) {
    REDCO_CHECK(seen.insert(t.weight).second,
                "privacy::clipped_grad_sums: layer '{}' ran twice in one forward pass; shared "
                "weights are not supported by per-example clipping",
                t.weight);
    outputs.push_back(t.output);
  }
  const TensorList g = grad({sum(losses)}, outputs);  // d sum_b loss_b / d output, per layer
  GradModeGuard off(false);
  const int64_t B = losses.dim(0);
  ClippedGrads c;
  for (size_t i = 0; i < taps.size(); ++i) {
    REDCO_CHECK(g[i].defined() && g[i].dim(0) == B,
                "privacy::clipped_grad_sums: layer '{}' output {} does not hold the {} examples "
                "of the losses in its first dimension",
                taps[i].weight, taps[i].output.shape(), B);
    const Tensor sq = layer_sq_norms(taps[i], g[i]);
    c.sq_norms = c.sq_norms.defined() ? c.sq_norms + sq : sq;
  }
  c.factors = clip_factors(c.sq_norms, max_norm);
  for (size_t i = 0; i < taps.size(); ++i) {
    const nn::LayerTap& t = taps[i];
    const Tensor x = t.input.detach();
    const int64_t k = t.kernel;
    c.sums.emplace(t.weight,
                   k ? clipped_conv2d_weight_grad(x, g[i], c.factors, k, k, t.stride, t.pad)
                     : clipped_linear_weight_grad(x, g[i], c.factors));
    if (!t.bias.empty())
      c.sums.emplace(t.bias, k ? clipped_conv2d_bias_grad(g[i], c.factors)
                               : clipped_linear_bias_grad(g[i], c.factors));
  }
  return c;
}

nn::ParamTree noised_gradient(const ClippedGrads& c, double sigma, float max_norm,
                              int64_t global_batch, int replicas, const train::Rng& rng) {
  REDCO_CHECK(sigma >= 0 && max_norm > 0 && global_batch > 0 && replicas > 0,
              "privacy::noised_gradient: needs sigma >= 0, max_norm > 0, a positive batch and "
              "replicas; got sigma {}, max_norm {}, batch {}, replicas {}",
              sigma, max_norm, global_batch, replicas);
  GradModeGuard off(false);
  const float R = float(replicas), std = float(sigma * max_norm * std::sqrt(double(replicas)));
  nn::ParamTree out;
  uint64_t k = 0;  // parameters in name order: the same stream for the same name
  for (const auto& [name, s] : c.sums) {
    Tensor g = s * R;
    if (std > 0) g = g + rng.split(k).normal(s.shape(), 0.f, std);
    out.emplace(name, g * (1.f / float(global_batch)));
    ++k;
  }
  return out;
}

}  // namespace redco::privacy
