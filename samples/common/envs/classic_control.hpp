#pragma once
// The dynamics of three classic-control tasks, step for step those of
// Gymnasium 1.0's CartPole-v1, Acrobot-v1 and Pendulum-v1: same constants,
// same integrators (CartPole: explicit Euler; Acrobot: one RK4 step of
// dt = 0.2 on the "book" equations; Pendulum: semi-implicit Euler), same
// order of floating-point operations, same observation layout, reward,
// termination and episode limit. The state is float64, observations float32,
// as in Gymnasium. The sources are compiled with -ffp-contract=off so that no
// multiply-add is fused: a fused one rounds differently from NumPy.
//
// Each task is a stateless struct of static functions over a caller-owned
// state array; VectorEnv (vector_env.hpp) runs N copies of one of them.
// Reset draws come from Philox (see Uniform), not from NumPy's generator, so
// start states differ from Gymnasium's for the same seed; the dynamics from a
// given state do not.
#include <cstdint>
#include <string_view>

namespace redco::rl {

// Uniform doubles in [lo, hi) for one episode's reset: the j-th draw of episode
// `episode` of env `index` is a pure function of (seed, env name, index,
// episode, j), 53 bits from two Philox lanes.
struct Uniform {
  uint64_t seed, stream, episode;
  int next = 0;
  double operator()(double lo, double hi);
};

// What a step returns besides the new state.
struct Transition {
  double reward;
  bool terminated;
};

// Push the cart left (action 0) or right (1) with 10 N; reward 1 per step,
// including the terminating one; ends when |x| > 2.4 or |theta| > 12 degrees.
// State = observation = (x, x_dot, theta, theta_dot); reset uniform(-0.05, 0.05).
struct CartPole {
  static constexpr std::string_view name = "CartPole-v1";
  static constexpr int state_dim = 4, obs_dim = 4, n_actions = 2, action_dim = 0;
  static constexpr int64_t max_episode_steps = 500;
  static void reset(double* s, Uniform& u);
  static Transition step(double* s, int64_t action);
  static void observe(const double* s, float* obs);
};

// Torque -1, 0 or +1 (actions 0, 1, 2) on the joint between the two links;
// reward -1 per step and 0 on the step that lifts the tip above the bar
// (-cos(t1) - cos(t1 + t2) > 1), which ends the episode.
// State (theta1, theta2, dtheta1, dtheta2); observation (cos t1, sin t1,
// cos t2, sin t2, dtheta1, dtheta2); reset uniform(-0.1, 0.1) rounded to float32.
struct Acrobot {
  static constexpr std::string_view name = "Acrobot-v1";
  static constexpr int state_dim = 4, obs_dim = 6, n_actions = 3, action_dim = 0;
  static constexpr int64_t max_episode_steps = 500;
  static void reset(double* s, Uniform& u);
  static Transition step(double* s, int64_t action);
  static void observe(const double* s, float* obs);
};

// One continuous torque in [-2, 2]; reward -(angle^2 + 0.1 thdot^2 + 0.001 u^2)
// with the angle normalised to [-pi, pi); never terminates (200-step limit).
// Gymnasium clips a torque outside [-2, 2] silently; VectorEnv rejects it (a
// policy that emits one usually has a bug): clamp first for Gymnasium's behaviour.
// State (theta, theta_dot); observation (cos theta, sin theta, theta_dot);
// reset theta ~ uniform(-pi, pi), theta_dot ~ uniform(-1, 1).
struct Pendulum {
  static constexpr std::string_view name = "Pendulum-v1";
  static constexpr int state_dim = 2, obs_dim = 3, n_actions = 0, action_dim = 1;
  static constexpr int64_t max_episode_steps = 200;
  static constexpr float max_torque = 2.f;
  static void reset(double* s, Uniform& u);
  static Transition step(double* s, const float* action);
  static void observe(const double* s, float* obs);
};

}  // namespace redco::rl
