// Rotary position embedding (RoPE) on the CPU, "rotate half" convention.
#include "redco/ops/cpu/rotary.hpp"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "redco/core/error.hpp"

namespace redco::cpu {
namespace {

// Each parallel task should touch at least this many floats, so that a single
// decode step (T = 1) stays on the calling thread.
constexpr int64_t kGrainFloats = 16 * 1024;

// cos_t / sin_t: [T, D/2] tables for positions pos_offset .. pos_offset+T-1.
// Angles are formed and evaluated in double: p * theta_i in float loses the
// fractional part of the angle once p reaches ~1e4-1e5 (float spacing near
// 1e5 is 0.008 rad), which would corrupt exactly the long contexts RoPE is for.
// The table costs T*D/2 sincos per call, negligible next to the B*H*T*D apply.
void fill_tables(std::vector<float>& cos_t, std::vector<float>& sin_t, int64_t T, int64_t D,
                 int64_t pos_offset, float base, bool inverse) {
  const int64_t half = D / 2;
  std::vector<double> inv_freq(static_cast<size_t>(half));  // [D/2] base^(-2i/D)
  for (int64_t i = 0; i < half; ++i) {
    inv_freq[i] =
        std::pow(static_cast<double>(base), -2.0 * static_cast<double>(i) / static_cast<double>(D));
  }
  cos_t.resize(static_cast<size_t>(T * half));
  sin_t.resize(static_cast<size_t>(T * half));
  const double sign = inverse ? -1.0 : 1.0;  // the inverse rotates by -angle
  const int64_t grain = std::max<int64_t>(1, 1024 / half);
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, T, grain), [&](const auto& r) {
    for (int64_t t = r.begin(); t < r.end(); ++t) {
      const auto p = static_cast<double>(pos_offset + t);
      for (int64_t i = 0; i < half; ++i) {
        const double a = p * inv_freq[i];
        cos_t[t * half + i] = static_cast<float>(std::cos(a));
        sin_t[t * half + i] = static_cast<float>(sign * std::sin(a));
      }
    }
  });
}

}  // namespace

void rotary_apply(const float* x, float* y, int64_t B, int64_t H, int64_t T, int64_t D,
                  int64_t pos_offset, float base, bool inverse) {
  REDCO_CHECK(B >= 0 && H >= 0 && T >= 0 && D >= 0,
              "rotary_apply: negative shape [B={}, H={}, T={}, D={}]", B, H, T, D);
  REDCO_CHECK(D % 2 == 0, "rotary_apply: head dim D={} must be even (pairs i, i + D/2)", D);
  REDCO_CHECK(base > 0.f && std::isfinite(base), "rotary_apply: base must be positive, got {}",
              base);
  const int64_t rows = B * H * T;
  if (rows == 0 || D == 0) return;
  const int64_t half = D / 2;
  std::vector<float> cos_t, sin_t;  // [T, D/2] each
  fill_tables(cos_t, sin_t, T, D, pos_offset, base, inverse);

  const int64_t grain = std::max<int64_t>(1, kGrainFloats / D);
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, rows, grain), [&](const auto& r) {
    for (int64_t row = r.begin(); row < r.end(); ++row) {
      const float* c = cos_t.data() + (row % T) * half;  // [D/2]
      const float* s = sin_t.data() + (row % T) * half;  // [D/2]
      const float* xr = x + row * D;                     // [D]
      float* yr = y + row * D;                           // [D], may be xr
      for (int64_t i = 0; i < half; ++i) {
        // Both halves are read before either is written, so y may alias x.
        const float x1 = xr[i], x2 = xr[i + half];
        yr[i] = x1 * c[i] - x2 * s[i];
        yr[i + half] = x2 * c[i] + x1 * s[i];
      }
    }
  });
}

}  // namespace redco::cpu
