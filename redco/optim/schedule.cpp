#include "redco/optim/schedule.hpp"

#include <cmath>
#include <numbers>
#include <utility>

#include "redco/core/error.hpp"

namespace redco::optim {

Schedule::Schedule(float lr) : fn_([lr](int64_t) { return lr; }) {}

Schedule::Schedule(Fn fn) : fn_(std::move(fn)) {
  REDCO_CHECK(bool(fn_), "Schedule: the function is empty");
}

Schedule constant(float lr) { return Schedule(lr); }

Schedule linear(float from, float to, int64_t steps) {
  REDCO_CHECK(steps >= 0, "linear schedule: steps must be >= 0, got {}", steps);
  return Schedule([=](int64_t t) {
    if (t >= steps) return to;
    // Interpolate in double so long schedules do not lose the last digits of t / steps.
    const double frac = double(t) / double(steps);
    return float(double(from) + (double(to) - double(from)) * frac);
  });
}

Schedule cosine(float peak, int64_t total_steps, float final_fraction) {
  REDCO_CHECK(total_steps > 0, "cosine schedule: total_steps must be > 0, got {}", total_steps);
  REDCO_CHECK(final_fraction >= 0.f && final_fraction <= 1.f,
              "cosine schedule: final_fraction must be in [0, 1], got {}", final_fraction);
  return Schedule([=](int64_t t) {
    const double f = final_fraction;
    if (t >= total_steps) return float(double(peak) * f);
    const double c = 0.5 * (1.0 + std::cos(std::numbers::pi * double(t) / double(total_steps)));
    return float(double(peak) * (f + (1.0 - f) * c));
  });
}

Schedule warmup(int64_t n_steps, Schedule after) {
  REDCO_CHECK(n_steps >= 0, "warmup: n_steps must be >= 0, got {}", n_steps);
  if (n_steps == 0) return after;
  const float top = after(0);
  return join({linear(0.f, top, n_steps), std::move(after)}, {n_steps});
}

Schedule join(std::vector<Schedule> schedules, std::vector<int64_t> boundaries) {
  REDCO_CHECK(!schedules.empty(), "join: needs at least one schedule");
  REDCO_CHECK(boundaries.size() + 1 == schedules.size(),
              "join: {} schedules need {} boundaries, got {}", schedules.size(),
              schedules.size() - 1, boundaries.size());
  for (size_t i = 0; i < boundaries.size(); ++i) {
    const int64_t prev = i == 0 ? 0 : boundaries[i - 1];
    REDCO_CHECK(boundaries[i] > prev || (i == 0 && boundaries[i] >= 0),
                "join: boundaries must be non-negative and increasing, got {} after {}",
                boundaries[i], prev);
  }
  return Schedule([s = std::move(schedules), b = std::move(boundaries)](int64_t t) {
    size_t i = 0;
    while (i < b.size() && t >= b[i]) ++i;
    const int64_t start = i == 0 ? 0 : b[i - 1];
    return s[i](t - start);
  });
}

}  // namespace redco::optim
