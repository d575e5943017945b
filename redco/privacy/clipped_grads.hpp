#pragma once
// DP-SGD's gradient for models of linear and conv2d layers, from one forward
// and one backward pass: the model runs with nn::Ctx::taps set, so each layer
// records its input and output; the backward pass goes to the layer outputs
// only; each example's squared gradient norm is summed over the layers by the
// ghost identities of per_example.hpp, turned into clip factors
// c_b = min(1, C / ||g_b||), and the clipped sums sum_b c_b g_b are formed
// from the same output gradients (one GEMM per layer). No per-example
// gradient is ever held whole.
//
//   auto step = [&](train::StepContext<M>& s, const Batch& b, train::Rng rng) {
//     auto [loss, c] = privacy::clipped_grads(s, [&](auto& m) { return per_example_loss(m, b); },
//                                             /*max_norm=*/1.f);
//     return train::StepResult{loss, privacy::noised_gradient(s, c, sigma, 1.f, batch, rng)};
//   };
#include "redco/nn/walk.hpp"
#include "redco/train/custom_step.hpp"
#include "redco/train/rng.hpp"

namespace redco::privacy {

struct ClippedGrads {
  nn::ParamTree sums;  // sum_b c_b * d loss_b / d p, for every recorded layer's parameters
  Tensor sq_norms;     // [B] each example's squared gradient norm over those parameters
  Tensor factors;      // [B] c_b = min(1, max_norm / norm_b)
};

// losses [B]: per-example losses computed through layers that recorded into
// `taps` (with a gradient to follow). A layer recorded twice (shared weights)
// or none recorded is one redco::Error.
ClippedGrads clipped_grad_sums(const Tensor& losses, const nn::LayerTaps& taps, float max_norm);

// In a custom step: per_example_losses(model) -> [B] at the trained
// parameters, then their clipped gradient sums. Returns the batch's mean loss
// (for the log) and the sums; every trained parameter must belong to a linear
// or conv2d layer (freeze the others), else one redco::Error names it.
template <nn::Layer L, typename F>
std::pair<Tensor, ClippedGrads> clipped_grads(train::StepContext<L>& s, F&& per_example_losses,
                                              float max_norm) {
  nn::LayerTaps taps;
  nn::ParamTree leaves;  // the trained parameters as leaves, so the layer outputs carry a gradient
  for (const auto& [name, t] : s.trained()) {
    Tensor leaf = t.detach();
    leaf.set_requires_grad(true);
    leaves.emplace(name, leaf);
  }
  GradModeGuard on(true);
  auto model = s.bind(leaves);
  model.ctx().taps = &taps;
  const Tensor losses = per_example_losses(model);
  model.ctx().taps = nullptr;
  ClippedGrads c = clipped_grad_sums(losses, taps, max_norm);
  for (const auto& [name, t] : s.trained())
    REDCO_CHECK(c.sums.contains(name),
                "privacy::clipped_grads: the trained parameter '{}' is not in a linear or conv2d "
                "layer, the layers per-example clipping covers; freeze it (ParamGroups)",
                name);
  GradModeGuard off(false);
  return {mean(losses.detach()), std::move(c)};
}

// This replica's DP-SGD gradient from its clipped sums: (R * sums + z) / batch
// with z ~ N(0, R (sigma C)^2) drawn from `rng` (independent per replica), R
// the data-parallel replicas and batch the global batch size. The Trainer's
// mean over the replicas is then (all replicas' sums + N(0, (sigma C)^2)) /
// batch: DP-SGD's noisy mean, whatever R.
nn::ParamTree noised_gradient(const ClippedGrads& c, double sigma, float max_norm,
                              int64_t global_batch, int replicas, const train::Rng& rng);

template <nn::Layer L>
nn::ParamTree noised_gradient(const train::StepContext<L>& s, const ClippedGrads& c, double sigma,
                              float max_norm, int64_t global_batch, const train::Rng& rng) {
  return noised_gradient(c, sigma, max_norm, global_batch, s.dp_size(), rng);
}

}  // namespace redco::privacy
