// The backward GAE recursion over each env's column of a [T, N] rollout.
#include "redco/rl/returns.hpp"

#include <vector>

#include "redco/core/error.hpp"

namespace redco::rl {

void gae(const Rollout& r, GaeOptions o, std::span<float> advantages, std::span<float> returns) {
  const int64_t N = r.n_envs, size = int64_t(r.rewards.size());
  REDCO_CHECK(N > 0 && size % N == 0,
              "rl::gae: {} rewards do not make whole steps of n_envs = {} environments", size, N);
  REDCO_CHECK(int64_t(r.values.size()) == size && int64_t(r.next_values.size()) == size &&
                  int64_t(r.terminated.size()) == size && int64_t(r.ends.size()) == size &&
                  int64_t(advantages.size()) == size && int64_t(returns.size()) == size,
              "rl::gae: rewards, values, next_values, terminated, ends, advantages and returns "
              "must all be [T, N] = {} long, got {}, {}, {}, {}, {}, {}, {}",
              size, r.rewards.size(), r.values.size(), r.next_values.size(), r.terminated.size(),
              r.ends.size(), advantages.size(), returns.size());
  REDCO_CHECK(o.gamma >= 0.f && o.gamma <= 1.f && o.lambda >= 0.f && o.lambda <= 1.f,
              "rl::gae: gamma and lambda must be in [0, 1], got gamma = {}, lambda = {}", o.gamma,
              o.lambda);
  const int64_t T = size / N;
  const double gamma = o.gamma, gl = double(o.gamma) * double(o.lambda);
  std::vector<double> next_adv(size_t(N), 0.0);  // [N] A_{t+1}, 0 past the last step
  for (int64_t t = T - 1; t >= 0; --t) {
    for (int64_t i = 0; i < N; ++i) {
      const int64_t k = t * N + i;
      const double bootstrap = r.terminated[size_t(k)] ? 0.0 : gamma * r.next_values[size_t(k)];
      const double delta = double(r.rewards[size_t(k)]) + bootstrap - double(r.values[size_t(k)]);
      const double a = delta + (r.ends[size_t(k)] ? 0.0 : gl * next_adv[size_t(i)]);
      next_adv[size_t(i)] = a;
      advantages[size_t(k)] = float(a);
      returns[size_t(k)] = float(a + double(r.values[size_t(k)]));
    }
  }
}

}  // namespace redco::rl
