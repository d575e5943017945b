#pragma once
// Learning-rate schedules, counted in optimizer steps: `s(t)` is the rate used
// by the optimizer step that takes the step count from t to t + 1 (so the
// first step uses s(0)). With gradient accumulation a step is one optimizer
// update, not one micro-batch.
//
//   auto s = optim::warmup(100, optim::cosine(3e-4f, 900, 0.1f));
//   s(0) == 0, s(50) == 1.5e-4, s(100) == 3e-4, s(550) == 1.65e-4, s(>= 1000) == 3e-5
//
// Steps before 0 evaluate as step 0. Schedules are cheap value types (a shared
// function inside) and are safe to call from several threads.
#include <cstdint>
#include <functional>
#include <vector>

namespace redco::optim {

class Schedule {
 public:
  using Fn = std::function<float(int64_t step)>;
  // A constant rate. Implicit, so an optimizer factory takes a plain float too:
  // optim::adamw(3e-4f, {...}).
  Schedule(float lr);  // NOLINT(google-explicit-constructor)
  explicit Schedule(Fn fn);

  float operator()(int64_t step) const { return fn_(step < 0 ? 0 : step); }

 private:
  Fn fn_;
};

// lr at every step.
Schedule constant(float lr);

// `from` at step 0, straight line to `to` at step `steps`, `to` afterwards.
// steps == 0 gives `to` everywhere.
Schedule linear(float from, float to, int64_t steps);

// Half-cosine decay from `peak` at step 0 to `peak * final_fraction` at
// `total_steps`, constant afterwards:
//   s(t) = peak * (f + (1 - f) * (1 + cos(pi * t / total_steps)) / 2).
Schedule cosine(float peak, int64_t total_steps, float final_fraction = 0.f);

// Linear warmup over the first `n_steps` steps, then `after`, restarted:
//   s(t) = after(0) * t / n_steps   for t < n_steps  (so s(0) == 0: the first
//                                                     step only fills optimizer moments)
//   s(t) = after(t - n_steps)       for t >= n_steps.
// The same convention as optax.linear_schedule + join_schedules and Hugging
// Face's get_*_schedule_with_warmup. `after` counts from the end of the
// warmup, so cosine(peak, total - n_steps) ends exactly at step `total`.
Schedule warmup(int64_t n_steps, Schedule after);

// Piecewise: schedules[0] before boundaries[0], schedules[i] from
// boundaries[i - 1] on, each evaluated at (t - its start boundary) like optax's
// join_schedules. Needs boundaries.size() == schedules.size() - 1, increasing.
Schedule join(std::vector<Schedule> schedules, std::vector<int64_t> boundaries);

}  // namespace redco::optim
