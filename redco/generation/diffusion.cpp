// Noise schedules, the training loss and DDIM sampling (see diffusion.hpp).
#include "redco/generation/diffusion.hpp"

#include <cmath>
#include <numbers>

#include "redco/core/error.hpp"

namespace redco::generation {

NoiseSchedule noise_schedule(const NoiseScheduleConfig& c) {
  REDCO_CHECK(c.steps >= 2, "noise_schedule: need at least 2 timesteps, got {}", c.steps);
  NoiseSchedule s;
  const int64_t T = c.steps;
  s.betas.resize(size_t(T));
  if (c.kind == BetaSchedule::linear) {
    REDCO_CHECK(c.beta_start > 0 && c.beta_end < 1 && c.beta_start <= c.beta_end,
                "noise_schedule: need 0 < beta_start <= beta_end < 1, got {} and {}", c.beta_start,
                c.beta_end);
    for (int64_t i = 0; i < T; ++i)
      s.betas[size_t(i)] = c.beta_start + (c.beta_end - c.beta_start) * double(i) / double(T - 1);
  } else {
    auto alpha_bar = [](double t) {
      const double v = std::cos((t + 0.008) / 1.008 * std::numbers::pi / 2);
      return v * v;
    };
    for (int64_t i = 0; i < T; ++i)
      s.betas[size_t(i)] = std::min(
          1.0 - alpha_bar(double(i + 1) / double(T)) / alpha_bar(double(i) / double(T)), 0.999);
  }
  s.alphas_cumprod.resize(size_t(T));
  double a = 1.0;
  for (int64_t i = 0; i < T; ++i) s.alphas_cumprod[size_t(i)] = a *= 1.0 - s.betas[size_t(i)];
  return s;
}

namespace {
// Per-row coefficients [B, 1, ...] of x's rank, from timesteps t [B].
std::pair<Tensor, Tensor> noise_coefficients(const NoiseSchedule& s, const Tensor& t,
                                             const Tensor& x) {
  REDCO_CHECK(t.rank() == 1 && x.rank() >= 1 && t.dim(0) == x.dim(0),
              "diffusion: expected timesteps [{}] for x {}, got {}", x.rank() ? x.dim(0) : 0,
              x.shape(), t.shape());
  const int64_t B = x.dim(0);
  const std::vector<float> ts = t.to(DType::f32).to_vector();
  std::vector<float> signal(static_cast<size_t>(B)), noise(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) {
    const auto ti = int64_t(std::llround(ts[size_t(b)]));
    REDCO_CHECK(ti >= 0 && ti < s.steps(), "diffusion: timestep {} is outside [0, {})", ti,
                s.steps());
    signal[size_t(b)] = float(std::sqrt(s.alphas_cumprod[size_t(ti)]));
    noise[size_t(b)] = float(std::sqrt(1.0 - s.alphas_cumprod[size_t(ti)]));
  }
  std::vector<int64_t> dims(size_t(x.rank()), 1);
  dims[0] = B;
  const Shape per_row{std::span<const int64_t>(dims)};
  return {Tensor::from<float>(signal, per_row).to(x.device()),
          Tensor::from<float>(noise, per_row).to(x.device())};
}
}  // namespace

Tensor add_noise(const NoiseSchedule& s, const Tensor& x0, const Tensor& noise, const Tensor& t) {
  REDCO_CHECK(noise.shape() == x0.shape(), "add_noise: noise {} must have x0's shape {}",
              noise.shape(), x0.shape());
  auto [signal, sigma] = noise_coefficients(s, t, x0);
  return x0 * signal + noise * sigma;
}

Tensor noise_prediction_loss(const NoiseSchedule& s, const Tensor& x0, const Tensor& text,
                             const NoiseDraw& d, const Denoiser& denoise) {
  REDCO_CHECK(text.rank() == 3 && text.dim(0) == x0.dim(0),
              "noise_prediction_loss: expected text embeddings [{}, L, D], got {}", x0.dim(0),
              text.shape());
  const Tensor x_t = add_noise(s, x0, d.noise, d.t);
  const Tensor eps = denoise(x_t, d.t, text * d.keep);
  REDCO_CHECK(eps.shape() == x0.shape(),
              "noise_prediction_loss: the denoiser returned {} for images {}", eps.shape(),
              x0.shape());
  return mean(square(eps - d.noise));
}

std::vector<int64_t> ddim_timesteps(int64_t train_steps, int64_t n) {
  REDCO_CHECK(n >= 1 && n <= train_steps, "ddim: {} sampling steps must be in [1, {}]", n,
              train_steps);
  const int64_t ratio = train_steps / n;
  std::vector<int64_t> ts(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) ts[size_t(i)] = (n - 1 - i) * ratio;
  return ts;
}

Tensor ddim_step(const NoiseSchedule& s, const Tensor& x, const Tensor& eps, int64_t t,
                 int64_t prev_t, float clip) {
  REDCO_CHECK(t >= 0 && t < s.steps() && prev_t < t, "ddim_step: bad timesteps {} -> {}", t,
              prev_t);
  const double a_t = s.alphas_cumprod[size_t(t)];
  const double a_prev = prev_t >= 0 ? s.alphas_cumprod[size_t(prev_t)] : 1.0;
  Tensor x0 = (x - eps * float(std::sqrt(1.0 - a_t))) * float(1.0 / std::sqrt(a_t));
  if (clip > 0.f)  // a sampling step: the clip records no gradient
    x0 = kernels::binary_scalar(BinaryOp::min, kernels::binary_scalar(BinaryOp::max, x0, -clip),
                                clip);
  return x0 * float(std::sqrt(a_prev)) + eps * float(std::sqrt(1.0 - a_prev));
}

Tensor ddim_sample(const NoiseSchedule& s, const Denoiser& denoise, const Tensor& x_T,
                   const Tensor& text, const DdimOptions& o) {
  REDCO_CHECK(text.rank() == 3 && x_T.rank() >= 1 && text.dim(0) == x_T.dim(0),
              "ddim_sample: expected text embeddings [{}, L, D] for the noise {}, got {}",
              x_T.rank() ? x_T.dim(0) : 0, x_T.shape(), text.shape());
  NoGradGuard no_grad;
  const int64_t B = x_T.dim(0);
  const bool guided = o.guidance != 1.f;
  // Guided: one batch of 2B rows, unconditional (zero text) first.
  const Tensor texts = guided ? concat({text * 0.f, text}, 0) : text;
  const std::vector<int64_t> ts = ddim_timesteps(s.steps(), o.steps);
  Tensor x = x_T;
  for (size_t i = 0; i < ts.size(); ++i) {
    const int64_t t = ts[i], prev = i + 1 < ts.size() ? ts[i + 1] : -1;
    const int64_t rows = guided ? 2 * B : B;
    const Tensor tt = Tensor::full({rows}, float(t)).to(x.device());
    Tensor eps = denoise(guided ? concat({x, x}, 0) : x, tt, texts);
    if (guided) {
      const Tensor uncond = slice(eps, 0, 0, B), cond = slice(eps, 0, B, 2 * B);
      eps = uncond + (cond - uncond) * o.guidance;
    }
    x = ddim_step(s, x, eps, t, prev, o.clip);
  }
  return x;
}

}  // namespace redco::generation
