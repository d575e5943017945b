#pragma once
// Privacy accounting for DP-SGD: Rényi differential privacy (RDP) of the
// Poisson-sampled Gaussian mechanism (Mironov, Talwar & Zhang 2019, "Rényi
// Differential Privacy of the Sampled Gaussian Mechanism"), composed over
// steps, and converted to (epsilon, delta).
//
//   auto e = privacy::epsilon({.noise_multiplier = 1.1, .sampling_rate = 256.0 / 60000,
//                              .steps = 14062}, /*delta=*/1e-5);   // e.epsilon, e.order
//   double sigma = privacy::noise_multiplier_for(/*epsilon=*/4, 256.0 / 60000, 14062, 1e-5);
//
// One step adds to each example's gradient sum N(0, (sigma * C)^2) noise,
// where C is the clipping norm and each example joins the batch independently
// with probability q (the sampling rate). Integer orders use the exact binomial
// expansion of A_alpha; fractional orders its two-sided series (Section 3.3 of
// the paper), both summed in log space, as TF-Privacy, dp-accounting and
// Opacus do, so the numbers agree with theirs to rounding.
#include <cstdint>
#include <span>
#include <vector>

namespace redco::privacy {

// 1.1, 1.2, ..., 10.9, 11, 12, ..., 63, 128, 256, 512, 1024: dp-accounting's
// default orders (Opacus stops at 63 and omits 11).
std::span<const double> default_orders();

// RDP of one step at order alpha > 1 (sampling rate q in [0, 1], sigma > 0).
double rdp_sampled_gaussian(double q, double sigma, double alpha);

// RDP at each order after `steps` steps (RDP composes additively).
std::vector<double> rdp_sampled_gaussian(double q, double sigma, int64_t steps,
                                         std::span<const double> orders);

// How an RDP curve becomes (epsilon, delta):
//  - improved: eps = rdp + log1p(-1/a) - log(delta * a) / (a - 1) (Balle et al.
//    2020, "Hypothesis testing interpretations and Rényi DP", Theorem 21;
//    Asoodeh et al. 2020). What TF-Privacy, dp-accounting and Opacus use now.
//  - classic: eps = rdp - log(delta) / (a - 1) (Mironov 2017, Proposition 3),
//    always larger; the one behind older published figures (e.g. TF-Privacy's
//    MNIST tutorial table).
enum class Conversion { improved, classic };

struct Epsilon {
  double epsilon;  // the smallest over the orders (never below 0)
  double order;    // the order that gave it
};
Epsilon epsilon_from_rdp(std::span<const double> orders, std::span<const double> rdp, double delta,
                         Conversion conversion = Conversion::improved);

struct SampledGaussian {
  double noise_multiplier;  // sigma: noise std / clipping norm
  double sampling_rate;     // q: expected batch size / dataset size
  int64_t steps;
};

// Epsilon spent by `m` at `delta`.
Epsilon epsilon(const SampledGaussian& m, double delta,
                std::span<const double> orders = default_orders(),
                Conversion conversion = Conversion::improved);

// The smallest noise multiplier whose epsilon is <= target_epsilon (bisection
// to a relative 1e-6 in sigma). A target that no sigma can reach with these
// orders (below the floor epsilon has even as sigma -> infinity, where the
// RDP vanishes) is a redco::Error saying the smallest reachable epsilon.
double noise_multiplier_for(double target_epsilon, double sampling_rate, int64_t steps,
                            double delta, std::span<const double> orders = default_orders(),
                            Conversion conversion = Conversion::improved);

}  // namespace redco::privacy
