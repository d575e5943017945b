// RDP accountant of the Poisson-sampled Gaussian mechanism. Everything is
// summed in log space: A_alpha reaches exp(alpha^2 / (2 sigma^2)), far beyond
// double range, for the large orders.
#include "redco/privacy/accountant.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numbers>

#include "redco/core/error.hpp"

namespace redco::privacy {
namespace {

constexpr double inf = std::numeric_limits<double>::infinity();

// log(exp(a) + exp(b)) without overflow.
double log_add(double a, double b) {
  const double lo = std::min(a, b), hi = std::max(a, b);
  if (lo == -inf) return hi;
  return std::log1p(std::exp(lo - hi)) + hi;
}

// log(exp(a) - exp(b)) for a >= b. The signed series below stays positive in
// exact arithmetic; a difference that rounds below zero means the series has
// lost all precision, which is reported rather than hidden.
double log_sub(double a, double b, double alpha) {
  if (b == -inf) return a;
  REDCO_CHECK(a >= b,
              "privacy: the RDP series at order {} lost precision (a partial sum fell below 0)",
              alpha);
  if (a == b) return -inf;
  return std::log(std::expm1(a - b)) + b;
}

// log |binomial(n, k)| for real n; for non-integer n the sign is
// (-1)^max(0, k - floor(n) - 1): one negative factor n - m per m > n.
double log_comb(double n, double k) {
  return std::lgamma(n + 1) - std::lgamma(k + 1) - std::lgamma(n - k + 1);
}

// log(erfc(x)), accurate where erfc(x) underflows: past x = 25 the asymptotic
// expansion erfc(x) = exp(-x^2) / (x sqrt(pi)) * sum_n (-1)^n (2n-1)!! / (2x^2)^n,
// whose 8th term is below 1e-18 there.
double log_erfc(double x) {
  if (x < 25) return std::log(std::erfc(x));
  const double r = 1 / (2 * x * x);
  double term = 1, sum = 1;
  for (int n = 1; n <= 8; ++n) {
    term *= -(2 * n - 1) * r;
    sum += term;
  }
  return -x * x - std::log(x) - 0.5 * std::log(std::numbers::pi) + std::log(sum);
}

// log(A_alpha) for integer alpha: sum_i C(alpha, i) q^i (1-q)^(alpha-i) exp((i^2 - i) / (2
// sigma^2)).
double log_a_int(double q, double sigma, int64_t alpha) {
  const double log_q = std::log(q), log_1mq = std::log1p(-q);
  double log_a = -inf;
  for (int64_t i = 0; i <= alpha; ++i) {
    const double di = double(i);
    const double log_coef = log_comb(double(alpha), di) + di * log_q + double(alpha - i) * log_1mq;
    log_a = log_add(log_a, log_coef + (di * di - di) / (2 * sigma * sigma));
  }
  return log_a;
}

// log(A_alpha) for fractional alpha: the integrals over (-inf, z0] and
// [z0, inf), z0 = sigma^2 log(1/q - 1) + 1/2, each expanded in the generalised
// binomial series (Section 3.3 of the paper), summed with the coefficients'
// signs until both terms are below e^-30. (As Opacus does; TF-Privacy and
// dp-accounting add the terms' magnitudes, an upper bound that is looser at
// fractional orders when q is large: e.g. 0.138 against the exact 0.065 at
// order 1.1, q = 0.5, sigma = 1.5.)
double log_a_frac(double q, double sigma, double alpha) {
  const double log_q = std::log(q), log_1mq = std::log1p(-q);
  const double z0 = sigma * sigma * std::log(1 / q - 1) + 0.5;
  const double scale = std::numbers::sqrt2 * sigma, log_half = std::log(0.5);
  double log_a0 = -inf, log_a1 = -inf;
  for (int64_t n = 0;; ++n) {
    REDCO_CHECK(n < 10'000'000,
                "privacy: the RDP series at order {} (q = {}, sigma = {}) does not converge", alpha,
                q, sigma);
    const double i = double(n), j = alpha - i;
    const double log_coef = log_comb(alpha, i);
    const double log_t0 = log_coef + i * log_q + j * log_1mq;
    const double log_t1 = log_coef + j * log_q + i * log_1mq;
    const double log_e0 = log_half + log_erfc((i - z0) / scale);
    const double log_e1 = log_half + log_erfc((z0 - j) / scale);
    const double log_s0 = log_t0 + (i * i - i) / (2 * sigma * sigma) + log_e0;
    const double log_s1 = log_t1 + (j * j - j) / (2 * sigma * sigma) + log_e1;
    if (n <= int64_t(std::floor(alpha)) + 1 || (n - int64_t(std::floor(alpha))) % 2 == 1) {
      log_a0 = log_add(log_a0, log_s0);
      log_a1 = log_add(log_a1, log_s1);
    } else {
      log_a0 = log_sub(log_a0, log_s0, alpha);
      log_a1 = log_sub(log_a1, log_s1, alpha);
    }
    if (std::max(log_s0, log_s1) < -30) break;
  }
  return log_add(log_a0, log_a1);
}

void check_mechanism(double q, double sigma) {
  REDCO_CHECK(q >= 0 && q <= 1, "privacy: the sampling rate must be in [0, 1], got {}", q);
  REDCO_CHECK(sigma > 0 && std::isfinite(sigma),
              "privacy: the noise multiplier must be > 0 and finite, got {}", sigma);
}

}  // namespace

std::span<const double> default_orders() {
  static const std::vector<double> orders = [] {
    std::vector<double> v;
    for (int x = 1; x < 100; ++x) v.push_back(1 + x / 10.0);
    for (int a = 11; a < 64; ++a) v.push_back(a);
    for (int a : {128, 256, 512, 1024}) v.push_back(a);
    return v;
  }();
  return orders;
}

double rdp_sampled_gaussian(double q, double sigma, double alpha) {
  check_mechanism(q, sigma);
  REDCO_CHECK(alpha > 1 && std::isfinite(alpha), "privacy: an RDP order must be > 1, got {}",
              alpha);
  if (q == 0) return 0;
  if (q == 1) return alpha / (2 * sigma * sigma);  // the plain Gaussian mechanism
  const double log_a = alpha == std::floor(alpha) ? log_a_int(q, sigma, int64_t(alpha))
                                                  : log_a_frac(q, sigma, alpha);
  return log_a / (alpha - 1);
}

std::vector<double> rdp_sampled_gaussian(double q, double sigma, int64_t steps,
                                         std::span<const double> orders) {
  REDCO_CHECK(steps >= 0, "privacy: the number of steps must be >= 0, got {}", steps);
  std::vector<double> rdp;
  rdp.reserve(orders.size());
  for (double a : orders) rdp.push_back(double(steps) * rdp_sampled_gaussian(q, sigma, a));
  return rdp;
}

Epsilon epsilon_from_rdp(std::span<const double> orders, std::span<const double> rdp, double delta,
                         Conversion conversion) {
  REDCO_CHECK(delta > 0 && delta < 1, "privacy: delta must be in (0, 1), got {}", delta);
  REDCO_CHECK(!orders.empty() && orders.size() == rdp.size(),
              "privacy: {} orders but {} RDP values (one per order, at least one)", orders.size(),
              rdp.size());
  Epsilon best{inf, orders[0]};
  for (size_t k = 0; k < orders.size(); ++k) {
    const double a = orders[k], r = rdp[k];
    REDCO_CHECK(a > 1, "privacy: an RDP order must be > 1, got {}", a);
    double eps;
    if (conversion == Conversion::classic) {
      eps = r - std::log(delta) / (a - 1);
    } else if (delta * delta + std::expm1(-r) > 0) {
      eps = 0;  // delta >= sqrt(1 - exp(-KL)) and RDP at any order bounds KL
    } else {
      eps = r + std::log1p(-1 / a) - std::log(delta * a) / (a - 1);
    }
    if (eps < best.epsilon) best = {eps, a};
  }
  best.epsilon = std::max(0.0, best.epsilon);
  return best;
}

Epsilon epsilon(const SampledGaussian& m, double delta, std::span<const double> orders,
                Conversion conversion) {
  const auto rdp = rdp_sampled_gaussian(m.sampling_rate, m.noise_multiplier, m.steps, orders);
  return epsilon_from_rdp(orders, rdp, delta, conversion);
}

double noise_multiplier_for(double target_epsilon, double sampling_rate, int64_t steps,
                            double delta, std::span<const double> orders, Conversion conversion) {
  REDCO_CHECK(target_epsilon > 0 && std::isfinite(target_epsilon),
              "privacy: the target epsilon must be > 0 and finite, got {}", target_epsilon);
  auto eps = [&](double sigma) {
    return epsilon({sigma, sampling_rate, steps}, delta, orders, conversion).epsilon;
  };
  // epsilon falls as sigma grows: bracket the target, then bisect.
  constexpr double sigma_max = 1e6;
  double hi = 1;
  while (eps(hi) > target_epsilon) {
    if (hi >= sigma_max)
      fail(
          "privacy: epsilon = {} at delta = {} cannot be met (q = {}, {} steps): even sigma = {} "
          "gives epsilon = {}; raise the target or delta, or lower q or the steps",
          target_epsilon, delta, sampling_rate, steps, hi, eps(hi));
    hi *= 2;
  }
  double lo = hi / 2;
  while (eps(lo) <= target_epsilon) {
    hi = lo;
    if (lo < 1e-6) return hi;  // any noise at all meets the target
    lo /= 2;
  }
  while (hi - lo > 1e-6 * hi) {
    const double mid = 0.5 * (lo + hi);
    (eps(mid) > target_epsilon ? lo : hi) = mid;
  }
  return hi;
}

}  // namespace redco::privacy
