#pragma once
// Denoising diffusion: DDPM noise schedules, the noise-prediction training
// loss, and DDIM sampling with classifier-free guidance.
//
//   auto sched = generation::noise_schedule({.kind = generation::BetaSchedule::cosine});
//   // loss(model, batch, rng): t and noise drawn from the trainer's rng
//   auto eps = [&](const Tensor& x, const Tensor& t, const Tensor& text) {
//     return models::predict_noise(model, x, t, text);
//   };
//   Tensor loss = generation::noise_prediction_loss(sched, b.images, b.text, rng, eps,
//                                                   /*drop_text=*/0.1f);
//   // predict(model, batch, rng): 50 DDIM steps, guidance 3
//   Tensor images = generation::ddim_sample(sched, eps, rng.normal(shape), b.text,
//                                           {.steps = 50, .guidance = 3.f});
//
// The schedules follow Hugging Face diffusers' DDPMScheduler / DDIMScheduler
// (beta_schedule "linear" and "squaredcos_cap_v2"; DDIM's "leading" timestep
// spacing, set_alpha_to_one, eta = 0): tests/goldens/diffusion.txt holds
// diffusers' numbers (tests/python/make_diffusion_goldens.py).
#include <cstdint>
#include <functional>
#include <vector>

#include "redco/autodiff/functional.hpp"

namespace redco::generation {

enum class BetaSchedule : uint8_t {
  linear,  // betas evenly spaced from beta_start to beta_end
  cosine,  // alpha_bar(t) = cos^2((t + 0.008) / 1.008 * pi / 2) (Nichol & Dhariwal), betas <= 0.999
};

// Designated initialisers name these fields in the order declared below (C++20 rule).
struct NoiseScheduleConfig {
  BetaSchedule kind = BetaSchedule::linear;
  int64_t steps = 1000;                       // training timesteps T
  double beta_start = 1e-4, beta_end = 0.02;  // linear only
};

struct NoiseSchedule {
  std::vector<double> betas;           // [T]
  std::vector<double> alphas_cumprod;  // [T]: alpha_bar_t = prod_{s <= t} (1 - beta_s)
  int64_t steps() const { return int64_t(betas.size()); }
};
NoiseSchedule noise_schedule(const NoiseScheduleConfig& c);

// x_t = sqrt(alpha_bar_t) x0 + sqrt(1 - alpha_bar_t) noise, one t per row of x0 [B, ...];
// t [B] (f32 or i64 holding whole timesteps).
Tensor add_noise(const NoiseSchedule& s, const Tensor& x0, const Tensor& noise, const Tensor& t);

// The noise predictor: (x_t [B, ...], t [B] f32, text [B, L, D]) -> predicted noise [B, ...].
using Denoiser = std::function<Tensor(const Tensor& x, const Tensor& t, const Tensor& text)>;

// What one noise-prediction step draws: per row a timestep uniform in
// [0, T), the noise, and whether its text is dropped (replaced by zeros,
// the unconditional input classifier-free guidance needs).
struct NoiseDraw {
  Tensor t;      // [B] f32
  Tensor noise;  // x0's shape
  Tensor keep;   // [B, 1, 1] f32: 1 keeps the row's text, 0 drops it
};
// Rng: train::Rng (uniform01(i), split(i), normal(shape)): the draws depend
// only on its (seed, step, stream).
template <typename Rng>
NoiseDraw draw_noise(const NoiseSchedule& s, const Tensor& x0, Rng rng, float drop_text) {
  const int64_t B = x0.dim(0);
  std::vector<float> t(static_cast<size_t>(B)), keep(static_cast<size_t>(B));
  const Rng drops = rng.split(2);
  for (int64_t b = 0; b < B; ++b) {
    t[size_t(b)] = float(
        std::min<int64_t>(int64_t(rng.uniform01(uint64_t(b)) * double(s.steps())), s.steps() - 1));
    keep[size_t(b)] = drops.uniform01(uint64_t(b)) < double(drop_text) ? 0.f : 1.f;
  }
  return {Tensor::from<float>(t, {B}).to(x0.device()),
          rng.split(1).normal(x0.shape()).to(x0.device()),
          Tensor::from<float>(keep, {B, 1, 1}).to(x0.device())};
}
// mean((denoise(x_t, t, text) - noise)^2) for the draws above (DDPM's simple loss).
Tensor noise_prediction_loss(const NoiseSchedule& s, const Tensor& x0, const Tensor& text,
                             const NoiseDraw& draw, const Denoiser& denoise);
template <typename Rng>
Tensor noise_prediction_loss(const NoiseSchedule& s, const Tensor& x0, const Tensor& text, Rng rng,
                             const Denoiser& denoise, float drop_text = 0.f) {
  return noise_prediction_loss(s, x0, text, draw_noise(s, x0, rng, drop_text), denoise);
}

// DDIM's timesteps, first to last: (n-1, ..., 1, 0) * (T / n) ("leading" spacing).
std::vector<int64_t> ddim_timesteps(int64_t train_steps, int64_t n);

// One deterministic DDIM step (eta = 0) from timestep t to prev_t (< 0: to
// the clean image, alpha_bar = 1): x0_hat = (x - sqrt(1 - a_t) eps) / sqrt(a_t),
// clipped to [-clip, clip] when clip > 0 (not differentiable), then sqrt(a_prev) x0_hat + sqrt(1 -
// a_prev) eps.
Tensor ddim_step(const NoiseSchedule& s, const Tensor& x, const Tensor& eps, int64_t t,
                 int64_t prev_t, float clip = 0.f);

// Designated initialisers name these fields in the order declared below (C++20 rule).
struct DdimOptions {
  int64_t steps = 50;    // sampling steps (divides nothing: T / steps is rounded down)
  float guidance = 1.f;  // classifier-free guidance scale: eps_u + g (eps_c - eps_u); 1: text only
  float clip = 1.f;      // clip the predicted x0 to [-clip, clip] (images in [-1, 1]); 0: off
};

// Samples from x_T (noise, [B, ...]) conditioned on text [B, L, D]. With
// guidance != 1 the denoiser runs once per step on 2B rows: zeros as text for
// the unconditional half, `text` for the other. No gradient is recorded.
Tensor ddim_sample(const NoiseSchedule& s, const Denoiser& denoise, const Tensor& x_T,
                   const Tensor& text, const DdimOptions& o = {});

}  // namespace redco::generation
