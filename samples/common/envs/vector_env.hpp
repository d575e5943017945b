#pragma once
// N copies of one classic-control task (classic_control.hpp) stepping
// together on oneTBB, with auto-reset: an env whose episode ends in a step
// starts its next episode within that same step.
//
//   rl::VectorEnv envs("CartPole-v1", 16, /*seed=*/42);   // reset: observations() filled
//   for (...) {
//     envs.step(actions);                                  // span<const int64_t>, [16]
//     envs.observations();  // [16, 4]  first obs of the new episode where done()
//     envs.rewards(); envs.terminated(); envs.truncated(); // [16] each
//     envs.final_observations();  // [16, 4] last obs of the finished episode, where done()
//     envs.episode_returns(); envs.episode_lengths();      // of the finished episode, where done()
//   }
//
// "Same-step" auto-reset, unlike Gymnasium 1.0's vector envs (which return
// the reset observation one step later with reward 0): every step is a real
// transition, and the true last observation of a truncated episode is in
// final_observations() for bootstrapping. truncated means the 500/500/200
// step limit was reached (it can coincide with terminated, as in
// Gymnasium's TimeLimit).
//
// All outputs live in buffers allocated once and overwritten by each step:
// a step allocates nothing. Copy what must outlive the next step.
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace redco::rl {

struct EnvInfo {
  std::string_view name;
  int state_dim, obs_dim;
  int n_actions;   // discrete tasks: actions 0 .. n_actions - 1; 0 for continuous ones
  int action_dim;  // continuous tasks: floats per env in [action_low, action_high]; 0 for discrete
  float action_low, action_high;
  int64_t max_episode_steps;
};

// The tasks VectorEnv knows; an unknown name is a redco::Error listing these.
std::span<const EnvInfo> env_names();

class VectorEnv {
 public:
  // n copies of `name`, each reset with its own Philox draws under `seed`.
  VectorEnv(std::string_view name, int64_t n, uint64_t seed);
  ~VectorEnv();
  VectorEnv(VectorEnv&&) noexcept;
  VectorEnv& operator=(VectorEnv&&) noexcept;

  const EnvInfo& info() const;
  int64_t size() const { return n_; }

  // Starts a new episode in every env (fresh draws: never a repeat of an
  // earlier episode's start).
  void reset();
  // One step of every env. Discrete tasks take one action per env, continuous
  // ones action_dim floats per env ([n, action_dim] row-major). Every action is
  // checked before any env moves: an action out of range (or NaN) is a
  // redco::Error naming the env, the index, the action and the valid range.
  void step(std::span<const int64_t> actions);
  void step(std::span<const float> actions);

  std::span<const float> observations() const { return obs_; }              // [n, obs_dim]
  std::span<const float> final_observations() const { return final_obs_; }  // [n, obs_dim]
  std::span<const float> rewards() const { return rewards_; }               // [n]
  std::span<const uint8_t> terminated() const { return terminated_; }       // [n]
  std::span<const uint8_t> truncated() const { return truncated_; }         // [n]
  bool done(int64_t i) const { return terminated_[i] || truncated_[i]; }
  std::span<const double> episode_returns() const { return ep_return_done_; }   // [n]
  std::span<const int64_t> episode_lengths() const { return ep_length_done_; }  // [n]

  // The raw float64 state of env i and its step count in the episode. set_state
  // places env i at a given state (the observation is recomputed): how tests
  // start C++ and Gymnasium from the same point.
  std::span<const double> state(int64_t i) const;
  int64_t elapsed_steps(int64_t i) const { return elapsed_[i]; }
  void set_state(int64_t i, std::span<const double> state, int64_t elapsed_steps = 0);

  // The per-task step and reset loops (vector_env.cpp); as a nested class it
  // reads the buffers directly.
  struct Task;

 private:
  void check_index(int64_t i) const;
  void reset_env(int64_t i);

  const Task* task_ = nullptr;
  int64_t n_ = 0;
  uint64_t seed_ = 0, stream_ = 0;
  std::vector<double> state_;                       // [n, state_dim]
  std::vector<float> obs_, final_obs_;              // [n, obs_dim]
  std::vector<float> rewards_;                      // [n]
  std::vector<uint8_t> terminated_, truncated_;     // [n]
  std::vector<int64_t> elapsed_, episodes_;         // [n] steps in episode, episodes started
  std::vector<double> ep_return_, ep_return_done_;  // [n] running / finished
  std::vector<int64_t> ep_length_done_;             // [n]
};

}  // namespace redco::rl
