// Philox-backed distributions. Every output element is a pure function of
// (seed, stream, flat index): fills walk the 4-lane Philox blocks that cover
// [offset, offset + n) and keep only the lanes inside the range, so a shard,
// a serial fill and a tbb-parallel fill of any partition agree bit for bit.
#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <cmath>
#include <limits>
#include <numbers>

#include "redco/core/error.hpp"
#include "redco/core/philox.hpp"

namespace redco {
namespace {

// Below this many elements a fill runs on the calling thread: spawning TBB
// tasks costs more than ~16K Philox blocks.
constexpr int64_t kParallelThreshold = 1 << 16;
constexpr int64_t kGrain = 1 << 14;

PhiloxCounter block_at(uint64_t seed, uint64_t stream, uint64_t block) {
  return philox4x32_10(
      {uint32_t(block), uint32_t(block >> 32), uint32_t(stream), uint32_t(stream >> 32)},
      {uint32_t(seed), uint32_t(seed >> 32)});
}

// [0, 1) from the 24 high bits: exactly representable in float, so the
// float conversion cannot round up to 1.
inline float unit24(uint32_t bits) { return float(bits >> 8) * 0x1p-24f; }

// (0, 1) from all 32 bits in double: never 0, so log() and Phi^-1 stay finite.
inline double unit32_open(uint32_t bits) { return (double(bits) + 0.5) * 0x1p-32; }

// Calls f(j, block, lane) for every output slot j in [begin, end) of a fill
// at `offset`, where block is the Philox output covering flat index offset+j.
template <typename F>
void for_each_lane(int64_t begin, int64_t end, uint64_t seed, uint64_t stream, int64_t offset,
                   F&& f) {
  int64_t j = begin;
  while (j < end) {
    const uint64_t idx = uint64_t(offset + j);
    const PhiloxCounter blk = block_at(seed, stream, idx >> 2);
    for (unsigned lane = unsigned(idx & 3); lane < 4 && j < end; ++lane, ++j) f(j, blk, lane);
  }
}

// Runs body(begin, end) over [0, n), in parallel when n is large. Because each
// element depends only on its index, the partition cannot change the output.
template <typename Body>
void run_range(int64_t n, Body&& body) {
  if (n < kParallelThreshold) {
    body(int64_t{0}, n);
    return;
  }
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, n, kGrain),
                    [&](const tbb::blocked_range<int64_t>& r) { body(r.begin(), r.end()); });
}

void check_common(const char* op, int64_t n, int64_t offset) {
  REDCO_CHECK(n >= 0, "{}: element count must be >= 0, got {}", op, n);
  REDCO_CHECK(offset >= 0, "{}: offset must be >= 0, got {}", op, offset);
  REDCO_CHECK(n <= std::numeric_limits<int64_t>::max() - offset,
              "{}: offset {} + count {} overflows int64", op, offset, n);
}

// Standard normal CDF, accurate in both tails (erfc, not 1 - erf).
inline double phi_cdf(double x) { return 0.5 * std::erfc(-x * std::numbers::sqrt2 / 2); }

// Acklam's rational approximation of Phi^-1 (relative error < 1.2e-9) plus one
// Halley step against std::erfc, giving close to full double precision.
double phi_inv(double p) {
  if (p <= 0) return -std::numeric_limits<double>::infinity();
  if (p >= 1) return std::numeric_limits<double>::infinity();
  static constexpr double a[] = {-3.969683028665376e+01, 2.209460984245205e+02,
                                 -2.759285104469687e+02, 1.383577518672690e+02,
                                 -3.066479806614716e+01, 2.506628277459239e+00};
  static constexpr double b[] = {-5.447609879822406e+01, 1.615858368580409e+02,
                                 -1.556989798598866e+02, 6.680131188771972e+01,
                                 -1.328068155288572e+01};
  static constexpr double c[] = {-7.784894002430293e-03, -3.223964580411365e-01,
                                 -2.400758277161838e+00, -2.549732539343734e+00,
                                 4.374664141464968e+00,  2.938163982698783e+00};
  static constexpr double d[] = {7.784695709041462e-03, 3.224671290700398e-01,
                                 2.445134137142996e+00, 3.754408661907416e+00};
  constexpr double p_low = 0.02425;
  double x;
  if (p < p_low || p > 1 - p_low) {
    const double q = std::sqrt(-2 * std::log(p < p_low ? p : 1 - p));
    x = (((((c[0] * q + c[1]) * q + c[2]) * q + c[3]) * q + c[4]) * q + c[5]) /
        ((((d[0] * q + d[1]) * q + d[2]) * q + d[3]) * q + 1);
    if (p > 1 - p_low) x = -x;
  } else {
    const double q = p - 0.5, r = q * q;
    x = (((((a[0] * r + a[1]) * r + a[2]) * r + a[3]) * r + a[4]) * r + a[5]) * q /
        (((((b[0] * r + b[1]) * r + b[2]) * r + b[3]) * r + b[4]) * r + 1);
  }
  // Halley refinement: e = Phi(x) - p, u = e / phi(x).
  const double e = phi_cdf(x) - p;
  const double u = e * std::sqrt(2 * std::numbers::pi) * std::exp(x * x / 2);
  if (!std::isfinite(u))
    return x;  // exp overflows only ~38 sigma out, where x is already exact enough
  return x - u / (1 + x * u / 2);
}

}  // namespace

void philox_uniform(float* out, int64_t n, uint64_t seed, uint64_t stream, int64_t offset, float lo,
                    float hi) {
  check_common("philox_uniform", n, offset);
  REDCO_CHECK(std::isfinite(lo) && std::isfinite(hi) && lo < hi,
              "philox_uniform: need finite lo < hi, got [{}, {})", lo, hi);
  const double span = double(hi) - double(lo);
  // lo + span * u can round up to hi in float (e.g. [1, 1.5)); the largest
  // float below hi keeps the interval half-open.
  const float below_hi = std::nextafter(hi, lo);
  run_range(n, [&](int64_t begin, int64_t end) {
    for_each_lane(begin, end, seed, stream, offset,
                  [&](int64_t j, const PhiloxCounter& b, unsigned l) {
                    const float v = float(double(lo) + span * double(unit24(b[l])));
                    out[j] = v < hi ? v : below_hi;
                  });
  });
}

void philox_normal(float* out, int64_t n, uint64_t seed, uint64_t stream, int64_t offset,
                   float mean, float std) {
  check_common("philox_normal", n, offset);
  REDCO_CHECK(std::isfinite(mean) && std::isfinite(std) && std >= 0,
              "philox_normal: need finite mean and std >= 0, got mean {} std {}", mean, std);
  run_range(n, [&](int64_t begin, int64_t end) {
    for_each_lane(begin, end, seed, stream, offset,
                  [&](int64_t j, const PhiloxCounter& b, unsigned l) {
                    // Box-Muller on the lane pair (l & ~1, l | 1): the even lane takes the
                    // cosine branch, the odd one the sine, so both halves are used and each
                    // value still depends only on its own block.
                    const unsigned l0 = l & ~1u;
                    const double r = std::sqrt(-2 * std::log(unit32_open(b[l0])));
                    const double theta = 2 * std::numbers::pi * (double(b[l0 + 1]) * 0x1p-32);
                    const double z = r * ((l & 1) ? std::sin(theta) : std::cos(theta));
                    out[j] = float(double(mean) + double(std) * z);
                  });
  });
}

void philox_truncated_normal(float* out, int64_t n, uint64_t seed, uint64_t stream, int64_t offset,
                             float mean, float std, float a, float b) {
  check_common("philox_truncated_normal", n, offset);
  REDCO_CHECK(std::isfinite(mean) && std::isfinite(std) && std >= 0,
              "philox_truncated_normal: need finite mean and std >= 0, got mean {} std {}", mean,
              std);
  REDCO_CHECK(!std::isnan(a) && !std::isnan(b) && a < b,
              "philox_truncated_normal: need bounds a < b (in std units), got [{}, {}]", a, b);
  // Sample on the side of zero where Phi is small, flipping back after, so a
  // far-right window like [3, 5] does not lose its precision to 1 - tiny.
  const bool flip = a > 0;
  const double lo = flip ? -double(b) : double(a), hi = flip ? -double(a) : double(b);
  const double p_lo = phi_cdf(lo), p_span = phi_cdf(hi) - p_lo;
  // Bounds in output units, computed as a caller would, so clamping to them
  // guarantees every float lies in [mean + a*std, mean + b*std].
  const float out_lo = float(double(mean) + double(a) * double(std));
  const float out_hi = float(double(mean) + double(b) * double(std));
  run_range(n, [&](int64_t begin, int64_t end) {
    for_each_lane(begin, end, seed, stream, offset,
                  [&](int64_t j, const PhiloxCounter& blk, unsigned l) {
                    double x = phi_inv(p_lo + unit32_open(blk[l]) * p_span);
                    x = std::fmin(std::fmax(x, lo), hi);
                    const float v = float(double(mean) + double(std) * (flip ? -x : x));
                    out[j] = std::fmin(std::fmax(v, out_lo), out_hi);
                  });
  });
}

void philox_bernoulli(uint8_t* out, int64_t n, uint64_t seed, uint64_t stream, int64_t offset,
                      float p) {
  check_common("philox_bernoulli", n, offset);
  REDCO_CHECK(p >= 0 && p <= 1, "philox_bernoulli: need p in [0, 1], got {}", p);
  run_range(n, [&](int64_t begin, int64_t end) {
    for_each_lane(
        begin, end, seed, stream, offset,
        [&](int64_t j, const PhiloxCounter& b, unsigned l) { out[j] = unit24(b[l]) < p ? 1 : 0; });
  });
}

}  // namespace redco
