// rl::VectorEnv against Gymnasium 1.0 trajectories committed in
// tests/goldens/rl_envs.txt (tests/python/make_env_goldens.py), plus the
// vector bookkeeping: auto-reset, reset draws, determinism under oneTBB, and
// the errors a caller can cause.
//
// Tolerances. The float64 state is compared relative to max(1, |x|):
//  - one step from Gymnasium's own state: 1e-14. The arithmetic is the same
//    operations in the same order without fused multiply-adds, so only sin/cos
//    can differ (NumPy's vs glibc's, both within 1 ulp); measured: 2e-16
//    (CartPole, Pendulum), 9e-16 (Acrobot).
//  - free-running windows (up to 40 steps, so rounding differences compound):
//    1e-12 for CartPole and Pendulum (measured 4e-16, 4e-15); Acrobot is
//    chaotic on its fast-spin windows (an ulp grows about tenfold per step),
//    so 1e-8 (measured 3e-14 here, 7e-12 on the live test's trajectories).
// Observations and rewards are float32: at most 1 ulp apart (a float64 value
// within 1e-14 of a rounding midpoint may round the other way; measured 0).
// Terminated and truncated must match exactly.
#include <catch2/catch.hpp>
#include <cmath>
#include <map>
#include <set>

#include "redco/core/error.hpp"
#include "redco/core/philox.hpp"
#include "envs/classic_control.hpp"
#include "envs/vector_env.hpp"
#include "rl_golden.hpp"

using namespace redco;
using namespace redco::rl;

namespace {

const std::vector<rl_golden::Window>& goldens() {
  static const auto w = rl_golden::parse(rl_golden::source_root() / "tests/goldens/rl_envs.txt");
  return w;
}

void check_replay(const std::string& name, bool one_step, double state_tol) {
  const rl_golden::Report r = rl_golden::replay(goldens(), name, one_step);
  INFO(name << (one_step ? " one-step" : " free-running") << ": " << r.steps << " steps, state "
            << r.state << ", obs " << r.obs_ulps << " ulp, reward " << r.reward_ulps << " ulp");
  CHECK(r.steps > 50);
  CHECK(r.state <= state_tol);
  CHECK(r.obs_ulps <= 1);
  CHECK(r.reward_ulps <= 1);
  CHECK(r.flag_mismatches == 0);
  if (r.flag_mismatches) FAIL(r.first_flag_mismatch);
}

}  // namespace

TEST_CASE("rl goldens: every step matches Gymnasium from Gymnasium's state", "[rl]") {
  for (const char* name : {"CartPole-v1", "Acrobot-v1", "Pendulum-v1"})
    check_replay(name, /*one_step=*/true, 1e-14);
}

TEST_CASE("rl goldens: free-running windows follow Gymnasium's trajectories", "[rl]") {
  check_replay("CartPole-v1", false, 1e-12);
  check_replay("Pendulum-v1", false, 1e-12);
  check_replay("Acrobot-v1", false, 1e-8);
}

TEST_CASE("rl goldens cover termination, truncation and the edge cases", "[rl]") {
  std::map<std::string, std::pair<int, int>> ends;  // env -> (terminated, truncated) windows
  for (const auto& w : goldens())
    for (const auto& s : w.steps) {
      ends[w.env].first += s.terminated;
      ends[w.env].second += s.truncated;
    }
  CHECK(ends["CartPole-v1"].first >= 2);
  CHECK(ends["CartPole-v1"].second == 1);
  CHECK(ends["Acrobot-v1"].first >= 1);
  CHECK(ends["Acrobot-v1"].second == 1);
  CHECK(ends["Pendulum-v1"].second == 1);
}

// Each env of a vector must be exactly a lone copy of the task driven by hand
// with the documented reset stream (seed, stream_of(name) + index, episode).
template <typename E, typename Action>
void check_against_manual(int64_t n, int64_t steps, Action&& action_of) {
  const uint64_t seed = 1234;
  VectorEnv env(E::name, n, seed);
  std::vector<std::array<double, 4>> s(n);
  std::vector<int64_t> episode(n, 0), elapsed(n, 0);
  auto manual_reset = [&](int64_t i) {
    Uniform u{seed, stream_of(E::name) + uint64_t(i), uint64_t(episode[i]++)};
    E::reset(s[i].data(), u);
    elapsed[i] = 0;
  };
  for (int64_t i = 0; i < n; ++i) manual_reset(i);
  using A = std::invoke_result_t<Action, int64_t, int64_t>;
  std::vector<A> actions(n * std::max(1, E::action_dim));
  int64_t resets = 0;
  for (int64_t t = 0; t < steps; ++t) {
    for (int64_t i = 0; i < int64_t(actions.size()); ++i) actions[i] = action_of(t, i);
    env.step(std::span<const A>(actions));
    for (int64_t i = 0; i < n; ++i) {
      Transition tr;
      if constexpr (E::action_dim == 0)
        tr = E::step(s[i].data(), actions[i]);
      else
        tr = E::step(s[i].data(), &actions[i]);
      const bool trunc = ++elapsed[i] >= E::max_episode_steps;
      REQUIRE(env.rewards()[i] == float(tr.reward));
      REQUIRE(bool(env.terminated()[i]) == tr.terminated);
      REQUIRE(bool(env.truncated()[i]) == trunc);
      if (tr.terminated || trunc) {
        float fin[6];
        E::observe(s[i].data(), fin);
        for (int k = 0; k < E::obs_dim; ++k)
          REQUIRE(env.final_observations()[i * E::obs_dim + k] == fin[k]);
        REQUIRE(env.episode_lengths()[i] == elapsed[i]);
        manual_reset(i);
        ++resets;
      }
      const auto st = env.state(i);
      for (int k = 0; k < E::state_dim; ++k) REQUIRE(st[k] == s[i][k]);
      REQUIRE(env.elapsed_steps(i) == elapsed[i]);
    }
  }
  CHECK(resets > 0);
}

TEST_CASE("VectorEnv: each env is a lone env with its own reset stream (TBB, auto-reset)", "[rl]") {
  // Sizes above each task's grain, so the steps run in parallel chunks.
  check_against_manual<CartPole>(
      3000, 60, [](int64_t t, int64_t i) { return int64_t(philox_bits(1, t, uint64_t(i)) & 1); });
  check_against_manual<Acrobot>(
      300, 520, [](int64_t t, int64_t i) { return int64_t(philox_bits(2, t, uint64_t(i)) % 3); });
  check_against_manual<Pendulum>(2000, 210, [](int64_t t, int64_t i) {
    return float(philox_bits(3, t, uint64_t(i)) * 0x1p-32 * 4.0 - 2.0);
  });
}

TEST_CASE("VectorEnv: reset draws follow Gymnasium's distributions and never repeat", "[rl]") {
  VectorEnv cp("CartPole-v1", 4000, 7), ac("Acrobot-v1", 4000, 7), pe("Pendulum-v1", 4000, 7);
  double mean = 0, lo = 1, hi = -1;
  std::set<double> seen;
  for (int64_t i = 0; i < 4000; ++i) {
    for (double v : cp.state(i)) mean += v, lo = std::min(lo, v), hi = std::max(hi, v);
    seen.insert(cp.state(i)[0]);
    for (double v : ac.state(i)) {
      CHECK(std::abs(v) <= 0.1);
      CHECK(double(float(v)) == v);  // Gymnasium rounds Acrobot's start to float32
    }
    CHECK(std::abs(pe.state(i)[0]) <= M_PI);
    CHECK(std::abs(pe.state(i)[1]) <= 1.0);
  }
  CHECK(std::abs(mean / 16000) < 0.002);  // sd of the mean: 0.0289 / sqrt(16000) = 2.3e-4
  CHECK(lo >= -0.05);
  CHECK(hi < 0.05);
  CHECK(lo < -0.049);
  CHECK(hi > 0.049);
  cp.reset();
  for (int64_t i = 0; i < 4000; ++i) seen.insert(cp.state(i)[0]);
  CHECK(seen.size() == 8000);
  // The same seed gives the same starts; another seed other ones.
  VectorEnv again("CartPole-v1", 4, 7), other("CartPole-v1", 4, 8);
  VectorEnv fresh("CartPole-v1", 4, 7);
  CHECK(again.state(3)[2] == fresh.state(3)[2]);
  CHECK(other.state(3)[2] != fresh.state(3)[2]);
}

TEST_CASE("VectorEnv: buffers are reused across steps", "[rl]") {
  VectorEnv env("Acrobot-v1", 256, 3);
  const float* obs = env.observations().data();
  const float* rew = env.rewards().data();
  std::vector<int64_t> a(256, 1);
  for (int t = 0; t < 10; ++t) env.step(std::span<const int64_t>(a));
  CHECK(env.observations().data() == obs);
  CHECK(env.rewards().data() == rew);
  CHECK(env.observations().size() == 256 * 6);
}

TEST_CASE("VectorEnv: bad actions and names are one clear error, before any env moves", "[rl]") {
  using Catch::Matchers::Contains;
  VectorEnv cp("CartPole-v1", 3, 0);
  const std::vector<double> before(cp.state(1).begin(), cp.state(1).end());
  std::vector<int64_t> bad{0, 1, 2};
  CHECK_THROWS_WITH(cp.step(std::span<const int64_t>(bad)),
                    Contains("CartPole-v1") && Contains("action 2 of env 2") && Contains("0 .. 1"));
  CHECK(std::vector<double>(cp.state(1).begin(), cp.state(1).end()) == before);
  CHECK(cp.elapsed_steps(1) == 0);
  bad = {0, -1, 0};
  CHECK_THROWS_WITH(cp.step(std::span<const int64_t>(bad)), Contains("action -1 of env 1"));
  std::vector<int64_t> short_{0, 1};
  CHECK_THROWS_WITH(cp.step(std::span<const int64_t>(short_)), Contains("one action per env (3)"));
  std::vector<float> f{0.f, 1.f, 0.f};
  CHECK_THROWS_WITH(cp.step(std::span<const float>(f)), Contains("discrete actions"));

  VectorEnv pe("Pendulum-v1", 2, 0);
  std::vector<float> torque{0.5f, 2.5f};
  CHECK_THROWS_WITH(pe.step(std::span<const float>(torque)), Contains("Pendulum-v1") &&
                                                                 Contains("action 2.5 of env 1") &&
                                                                 Contains("[-2, 2]"));
  torque = {NAN, 0.f};
  CHECK_THROWS_WITH(pe.step(std::span<const float>(torque)), Contains("action nan of env 0"));
  std::vector<int64_t> ia{0, 1};
  CHECK_THROWS_WITH(pe.step(std::span<const int64_t>(ia)), Contains("continuous"));
  torque = {-2.f, 2.f};  // the bounds themselves are valid
  CHECK_NOTHROW(pe.step(std::span<const float>(torque)));

  CHECK_THROWS_WITH(VectorEnv("MountainCar-v0", 2, 0),
                    Contains("unknown environment 'MountainCar-v0'") && Contains("Acrobot-v1"));
  CHECK_THROWS_WITH(VectorEnv("CartPole-v1", 0, 0), Contains(">= 1"));
  const std::vector<double> three{0, 0, 0};
  CHECK_THROWS_WITH(cp.set_state(0, three), Contains("4 values"));
  CHECK_THROWS_AS(cp.state(3), Error);
}
