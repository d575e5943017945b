// Philox-4x32-10 block function and the distributions drawn from it.
#include <tbb/global_control.h>

#include <algorithm>
#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <functional>
#include <numbers>
#include <vector>

#include "redco/core/error.hpp"
#include "redco/core/philox.hpp"

using redco::philox4x32_10;
using redco::PhiloxCounter;

// Known-answer vectors of Random123's kat_vectors for philox4x32 with 10 rounds.
// Cross-checked against randomgen 2.5.1 (Philox(number=4, width=32)) and an
// independent Python implementation written from the SC'11 paper.
static_assert(philox4x32_10({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
                            {0xa4093822, 0x299f31d0}) ==
                  PhiloxCounter{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1},
              "philox4x32_10 must be constexpr-evaluable and match Random123");
static_assert(redco::stream_of("a") != redco::stream_of("b"));

TEST_CASE("philox4x32_10 matches the Random123 known-answer vectors", "[philox]") {
  CHECK(philox4x32_10({0, 0, 0, 0}, {0, 0}) ==
        PhiloxCounter{0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8});
  CHECK(philox4x32_10({0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff}, {0xffffffff, 0xffffffff}) ==
        PhiloxCounter{0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd});
  CHECK(philox4x32_10({0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344}, {0xa4093822, 0x299f31d0}) ==
        PhiloxCounter{0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1});
}

TEST_CASE("philox_bits lays out counter = (i/4, stream), key = seed", "[philox]") {
  const uint64_t seed = 0x0123456789abcdefull, stream = 0xfedcba9876543210ull;
  const uint64_t i = (uint64_t(5) << 34) + 7;  // block index above 2^32: exercises the high word
  const uint64_t blk = i >> 2;
  const PhiloxCounter want = philox4x32_10(
      {uint32_t(blk), uint32_t(blk >> 32), 0x76543210u, 0xfedcba98u}, {0x89abcdefu, 0x01234567u});
  CHECK(redco::philox_bits(seed, stream, i) == want[3]);
}

namespace {

// One distribution under test: fill(out, n, seed, stream, offset) as raw bytes.
struct Dist {
  const char* name;
  size_t elem;
  std::function<void(void*, int64_t, uint64_t, uint64_t, int64_t)> fill;
};

std::vector<Dist> all_dists() {
  return {
      {"uniform", 4,
       [](void* o, int64_t n, uint64_t s, uint64_t st, int64_t off) {
         redco::philox_uniform(static_cast<float*>(o), n, s, st, off, -2.f, 3.f);
       }},
      {"normal", 4,
       [](void* o, int64_t n, uint64_t s, uint64_t st, int64_t off) {
         redco::philox_normal(static_cast<float*>(o), n, s, st, off, 1.f, 0.5f);
       }},
      {"truncated_normal", 4,
       [](void* o, int64_t n, uint64_t s, uint64_t st, int64_t off) {
         redco::philox_truncated_normal(static_cast<float*>(o), n, s, st, off, 0.f, 0.02f, -2.f,
                                        2.f);
       }},
      {"bernoulli", 1,
       [](void* o, int64_t n, uint64_t s, uint64_t st, int64_t off) {
         redco::philox_bernoulli(static_cast<uint8_t*>(o), n, s, st, off, 0.3f);
       }},
  };
}

std::vector<unsigned char> draw(const Dist& d, int64_t n, uint64_t seed, uint64_t stream,
                                int64_t offset) {
  std::vector<unsigned char> buf(size_t(n) * d.elem);
  d.fill(buf.data(), n, seed, stream, offset);
  return buf;
}

// Checks that filling [k, k + m) reproduces bytes [k, k + m) of the full fill.
void check_slices(const Dist& d, const std::vector<unsigned char>& full,
                  const std::vector<std::pair<int64_t, int64_t>>& slices) {
  for (auto [k, m] : slices) {
    INFO(d.name << " slice [" << k << ", " << k + m << ")");
    const auto part = draw(d, m, 42, 7, k);
    CHECK(std::memcmp(part.data(), full.data() + size_t(k) * d.elem, part.size()) == 0);
  }
}

struct Moments {
  double mean, var, kurt;
};

Moments moments(const std::vector<float>& v) {
  double s = 0;
  for (float x : v) s += x;
  const double mean = s / double(v.size());
  double m2 = 0, m4 = 0;
  for (float x : v) {
    const double d = x - mean;
    m2 += d * d;
    m4 += d * d * d * d;
  }
  m2 /= double(v.size());
  m4 /= double(v.size());
  return {mean, m2, m4 / (m2 * m2)};
}

constexpr int64_t kSamples = 1'000'000;

}  // namespace

TEST_CASE("every distribution is index-pure: a slice fill equals the slice of the full fill",
          "[philox]") {
  for (const Dist& d : all_dists()) {
    const int64_t n = 1003;
    const auto full = draw(d, n, 42, 7, 0);
    check_slices(d, full, {{0, n}, {1, 1}, {1, 6}, {3, 17}, {5, 998}, {2, 2}, {7, 400}, {1002, 1}});
  }
}

TEST_CASE("large (parallel) fills are index-pure and independent of the thread count", "[philox]") {
  const int64_t n = (1 << 20) + 3;
  for (const Dist& d : all_dists()) {
    const auto full = draw(d, n, 42, 7, 0);
    check_slices(d, full, {{12345, 500001}, {3, n - 3}});
    std::vector<unsigned char> serial;
    {
      tbb::global_control one(tbb::global_control::max_allowed_parallelism, 1);
      serial = draw(d, n, 42, 7, 0);
    }
    INFO(d.name);
    CHECK(serial == full);
  }
}

TEST_CASE("uniform is [lo, hi) with the right moments", "[philox]") {
  std::vector<float> v(kSamples);
  redco::philox_uniform(v.data(), kSamples, 1, 2, 0, 0.f, 1.f);
  const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  CHECK(*lo >= 0.f);
  CHECK(*hi < 1.f);
  const Moments m = moments(v);
  CHECK(m.mean == Approx(0.5).margin(0.0015));      // 5 sigma: 5 * 0.2887 / 1000
  CHECK(m.var == Approx(1.0 / 12).margin(0.0004));  // 5 sigma of the variance is ~3.7e-4
  // The value is the 24 high bits of philox_bits, scaled.
  CHECK(v[12] == float(redco::philox_bits(1, 2, 12) >> 8) * 0x1p-24f);
}

TEST_CASE("uniform never returns hi, even when lo + (hi - lo) * u rounds up to it", "[philox]") {
  // Index 26590058 of (seed 7, stream 0) has its 24 high bits all set (found by
  // search, confirmed with the Python reference): u = 1 - 2^-24, and in float
  // 1 + 0.5 * u rounds to 1.5.
  REQUIRE((redco::philox_bits(7, 0, 26590058) >> 8) == 0xffffffu);
  float x = 0;
  redco::philox_uniform(&x, 1, 7, 0, 26590058, 1.f, 1.5f);
  CHECK(x < 1.5f);
  CHECK(x == std::nextafter(1.5f, 0.f));
}

TEST_CASE("normal has mean, variance and kurtosis of N(mean, std^2)", "[philox]") {
  std::vector<float> v(kSamples);
  redco::philox_normal(v.data(), kSamples, 3, 4, 0, 0.f, 1.f);
  Moments m = moments(v);
  CHECK(m.mean == Approx(0).margin(0.005));  // 5 / sqrt(n)
  CHECK(m.var == Approx(1).margin(0.008));   // 5 * sqrt(2 / n) ~ 0.0071
  CHECK(m.kurt == Approx(3).margin(0.03));   // 5 * sqrt(24 / n) ~ 0.0245
  CHECK(std::all_of(v.begin(), v.end(), [](float x) { return std::isfinite(x); }));

  redco::philox_normal(v.data(), kSamples, 3, 5, 0, 2.f, 3.f);
  m = moments(v);
  CHECK(m.mean == Approx(2).margin(0.015));
  CHECK(m.var == Approx(9).margin(0.08));
}

namespace {
double std_pdf(double x) { return std::exp(-x * x / 2) / std::sqrt(2 * std::numbers::pi); }
double std_cdf(double x) { return 0.5 * std::erfc(-x / std::sqrt(2.0)); }

// Checks bounds and the analytic mean/variance of N(mean, std^2) truncated to
// [mean + a*std, mean + b*std].
void check_truncated(float mean, float sd, float a, float b) {
  INFO("mean " << mean << " std " << sd << " a " << a << " b " << b);
  std::vector<float> v(kSamples);
  redco::philox_truncated_normal(v.data(), kSamples, 9, 10, 0, mean, sd, a, b);
  const auto [lo, hi] = std::minmax_element(v.begin(), v.end());
  CHECK(*lo >= mean + a * sd);
  CHECK(*hi <= mean + b * sd);
  const double z = std_cdf(b) - std_cdf(a);
  const double mu = (std_pdf(a) - std_pdf(b)) / z;
  const double var = 1 + (a * std_pdf(a) - b * std_pdf(b)) / z - mu * mu;
  const Moments m = moments(v);
  CHECK(m.mean == Approx(mean + sd * mu).margin(5 * sd * std::sqrt(var / kSamples)));
  CHECK(m.var == Approx(sd * sd * var).epsilon(0.01));
}
}  // namespace

TEST_CASE("truncated normal stays in bounds with the analytic mean", "[philox]") {
  check_truncated(0.f, 0.02f, -2.f, 2.f);  // the usual weight init
  check_truncated(0.5f, 2.f, -1.f, 2.f);   // asymmetric window
  check_truncated(0.f, 1.f, 3.f, 5.f);     // far right tail: sampled mirrored
  check_truncated(0.f, 1.f, -6.f, -4.f);   // far left tail
}

TEST_CASE("bernoulli fires at rate p", "[philox]") {
  std::vector<uint8_t> v(kSamples);
  redco::philox_bernoulli(v.data(), kSamples, 11, 12, 0, 0.3f);
  CHECK(std::all_of(v.begin(), v.end(), [](uint8_t x) { return x <= 1; }));
  const auto ones = std::count(v.begin(), v.end(), 1);
  CHECK(double(ones) / kSamples == Approx(0.3).margin(0.0025));  // 5 * sqrt(0.21 / n)
  redco::philox_bernoulli(v.data(), 1000, 11, 12, 0, 0.f);
  CHECK(std::count(v.begin(), v.begin() + 1000, 0) == 1000);
  redco::philox_bernoulli(v.data(), 1000, 11, 12, 0, 1.f);
  CHECK(std::count(v.begin(), v.begin() + 1000, 1) == 1000);
}

TEST_CASE("different seeds and streams give different values", "[philox]") {
  const int64_t n = 4096;
  std::vector<float> base(n), other(n);
  redco::philox_uniform(base.data(), n, 1, redco::stream_of("h.0.attn.q_proj.weight"), 0, 0.f, 1.f);
  auto same = [&] {
    int64_t k = 0;
    for (int64_t i = 0; i < n; ++i) k += base[size_t(i)] == other[size_t(i)];
    return k;
  };
  redco::philox_uniform(other.data(), n, 1, redco::stream_of("h.0.attn.k_proj.weight"), 0, 0.f,
                        1.f);
  CHECK(same() < 5);  // equal 24-bit draws happen with probability 2^-24 each
  redco::philox_uniform(other.data(), n, 2, redco::stream_of("h.0.attn.q_proj.weight"), 0, 0.f,
                        1.f);
  CHECK(same() < 5);
  redco::philox_normal(base.data(), n, 1, 1, 0, 0.f, 1.f);
  redco::philox_normal(other.data(), n, 1, 2, 0, 0.f, 1.f);
  CHECK(same() < 5);
}

TEST_CASE("invalid distribution parameters throw redco::Error", "[philox]") {
  float f = 0;
  uint8_t u = 0;
  CHECK_THROWS_AS(redco::philox_uniform(&f, 1, 0, 0, 0, 1.f, 1.f), redco::Error);
  CHECK_THROWS_AS(redco::philox_uniform(&f, -1, 0, 0, 0, 0.f, 1.f), redco::Error);
  CHECK_THROWS_AS(redco::philox_normal(&f, 1, 0, 0, -3, 0.f, 1.f), redco::Error);
  CHECK_THROWS_AS(redco::philox_normal(&f, 1, 0, 0, 0, 0.f, -1.f), redco::Error);
  CHECK_THROWS_AS(redco::philox_truncated_normal(&f, 1, 0, 0, 0, 0.f, 1.f, 2.f, -2.f),
                  redco::Error);
  CHECK_THROWS_AS(redco::philox_bernoulli(&u, 1, 0, 0, 0, 1.5f), redco::Error);
}
