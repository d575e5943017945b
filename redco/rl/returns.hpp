#pragma once
// Advantages and returns of rollouts from N environments over T steps, laid
// out [T, N] row-major (step t of env i at t * N + i), as VectorEnv produces
// them step after step.
//
//   rl::gae({.rewards = r, .values = v, .next_values = nv, .ends = e, .n_envs = N},
//           {.gamma = 0.99f, .lambda = 0.95f}, advantages, returns);
//
// Generalised advantage estimation (Schulman et al. 2016):
//   delta_t = r_t + gamma * next_value_t * (1 - terminal_t) - V(s_t)
//   A_t     = delta_t + gamma * lambda * (1 - end_t) * A_{t+1}
//   return_t = A_t + V(s_t)                       (the critic's target)
// next_value_t is the value of the state reached by step t: V(s_{t+1}) while
// the episode goes on, V(final observation) where it was truncated by the
// step limit (bootstrapped, since the task itself did not end there), and
// ignored where it terminated. ends_t says the episode ended at step t
// (terminated or truncated), which cuts the recursion; terminal_t says it
// terminated. lambda = 1 gives the discounted return minus V; lambda = 0 the
// one-step TD error. Sums are accumulated in double.
#include <cstdint>
#include <span>

namespace redco::rl {

struct Rollout {
  std::span<const float> rewards;       // [T, N]
  std::span<const float> values;        // [T, N] V(s_t)
  std::span<const float> next_values;   // [T, N] value of the state step t reached (see above)
  std::span<const uint8_t> terminated;  // [T, N] the task ended the episode at step t
  std::span<const uint8_t> ends;        // [T, N] terminated or truncated at step t
  int64_t n_envs = 0;
};

// Designated initialisers name these fields in the order declared below (C++20 rule).
struct GaeOptions {
  float gamma = 0.99f;
  float lambda = 0.95f;
};

// Fills advantages and returns ([T, N] each). Sizes that do not agree, or
// gamma / lambda outside [0, 1], are a redco::Error naming them.
void gae(const Rollout& rollout, GaeOptions options, std::span<float> advantages,
         std::span<float> returns);

}  // namespace redco::rl
