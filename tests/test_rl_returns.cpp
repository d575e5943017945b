// rl::gae against two references: a hand calculation on one env, and the
// forward sum A_t = sum_k (gamma lambda)^k delta_{t+k} (up to the step that
// ends the episode) on random rollouts of several envs, a different way of
// computing the same quantity than the backward recursion under test.
#include <catch2/catch.hpp>
#include <cmath>
#include <vector>

#include "redco/core/error.hpp"
#include "redco/core/philox.hpp"
#include "redco/rl/returns.hpp"

using namespace redco;

TEST_CASE("gae by hand: one env, a termination and a truncation", "[rl]") {
  // Steps 0-1 one episode that terminates at 1; steps 2-3 one truncated at 3.
  const std::vector<float> r{1, 2, 3, 4}, v{0.5f, 1, 1.5f, 2}, nv{1, 9, 2, 5};
  const std::vector<uint8_t> term{0, 1, 0, 0}, ends{0, 1, 0, 1};
  std::vector<float> adv(4), ret(4);
  rl::gae({r, v, nv, term, ends, 1}, {.gamma = 0.5f, .lambda = 0.5f}, adv, ret);
  // delta: 1 + .5*1 - .5 = 1;  2 + 0 - 1 = 1;  3 + .5*2 - 1.5 = 2.5;  4 + .5*5 - 2 = 4.5
  // A_3 = 4.5; A_2 = 2.5 + .25*4.5 = 3.625; A_1 = 1; A_0 = 1 + .25*1 = 1.25
  CHECK(adv == std::vector<float>{1.25f, 1.f, 3.625f, 4.5f});
  CHECK(ret == std::vector<float>{1.75f, 2.f, 5.125f, 6.5f});
}

TEST_CASE("gae equals the forward sum of discounted TD errors", "[rl]") {
  constexpr int64_t T = 37, N = 5;
  std::vector<float> r(T * N), v(T * N), nv(T * N);
  std::vector<uint8_t> term(T * N), ends(T * N);
  for (int64_t k = 0; k < T * N; ++k) {
    const auto u = [&](int j) {
      return float(philox_bits(7, uint64_t(j), uint64_t(k))) * 0x1p-32f;
    };
    r[k] = 2 * u(0) - 1, v[k] = 3 * u(1), nv[k] = 3 * u(2);
    ends[k] = u(3) < 0.1f;
    term[k] = ends[k] && u(4) < 0.5f;
  }
  for (const auto& [gamma, lambda] : {std::pair{0.99f, 0.95f}, {0.9f, 1.f}, {0.8f, 0.f}}) {
    std::vector<float> adv(T * N), ret(T * N);
    rl::gae({r, v, nv, term, ends, N}, {.gamma = gamma, .lambda = lambda}, adv, ret);
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t i = 0; i < N; ++i) {
        double want = 0, weight = 1;
        for (int64_t s = t; s < T; ++s) {
          const int64_t k = s * N + i;
          const double delta = r[k] + (term[k] ? 0.0 : double(gamma) * nv[k]) - v[k];
          want += weight * delta;
          if (ends[k]) break;
          weight *= double(gamma) * double(lambda);
        }
        INFO("gamma " << gamma << " lambda " << lambda << " t " << t << " env " << i);
        CHECK(adv[t * N + i] == Approx(want).margin(1e-6));
        CHECK(ret[t * N + i] == Approx(want + v[t * N + i]).margin(1e-6));
      }
    }
  }
}

TEST_CASE("gae: sizes and rates that do not fit are one clear error", "[rl]") {
  std::vector<float> r(6), v(6), nv(6), adv(6), ret(6), short_v(5);
  std::vector<uint8_t> e(6);
  CHECK_THROWS_WITH(rl::gae({r, v, nv, e, e, 4}, {}, adv, ret),
                    Catch::Contains("6 rewards do not make whole steps of n_envs = 4"));
  CHECK_THROWS_WITH(rl::gae({r, short_v, nv, e, e, 2}, {}, adv, ret),
                    Catch::Contains("must all be [T, N] = 6 long"));
  CHECK_THROWS_WITH(rl::gae({r, v, nv, e, e, 2}, {.gamma = 1.5f}, adv, ret),
                    Catch::Contains("gamma = 1.5"));
}
