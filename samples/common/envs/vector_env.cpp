// VectorEnv: one type-erased table per task, whose loops are instantiated for
// that task's struct, so the per-env work is direct calls the compiler can
// inline; the only indirect call is one per chunk of envs.
#include "envs/vector_env.hpp"

#include <tbb/blocked_range.h>
#include <tbb/parallel_for.h>

#include <cmath>

#include "redco/core/error.hpp"
#include "redco/core/philox.hpp"
#include "envs/classic_control.hpp"

namespace redco::rl {

struct VectorEnv::Task {
  EnvInfo info;
  int64_t grain;  // envs per TBB chunk: ~10-50 us of work, so chunks outweigh spawn costs
  void (*reset_one)(VectorEnv&, int64_t);
  void (*step_discrete)(VectorEnv&, const int64_t*, int64_t, int64_t);
  void (*step_continuous)(VectorEnv&, const float*, int64_t, int64_t);
  void (*observe)(const double*, float*);

  template <typename E>
  static void reset_env(VectorEnv& v, int64_t i) {
    Uniform u{v.seed_, v.stream_ + uint64_t(i), uint64_t(v.episodes_[i]++)};
    double* s = &v.state_[i * E::state_dim];
    E::reset(s, u);
    v.elapsed_[i] = 0;
    v.ep_return_[i] = 0;
    E::observe(s, &v.obs_[i * E::obs_dim]);
  }

  // Steps envs [begin, end); A is int64_t (discrete) or float (continuous).
  template <typename E, typename A>
  static void step_range(VectorEnv& v, const A* actions, int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      double* s = &v.state_[i * E::state_dim];
      Transition t;
      if constexpr (E::action_dim == 0) {
        t = E::step(s, int64_t(actions[i]));
      } else {
        t = E::step(s, actions + i * E::action_dim);
      }
      const int64_t elapsed = ++v.elapsed_[i];
      v.ep_return_[i] += t.reward;
      v.rewards_[i] = float(t.reward);
      v.terminated_[i] = t.terminated;
      v.truncated_[i] = elapsed >= E::max_episode_steps;
      if (t.terminated || elapsed >= E::max_episode_steps) {
        E::observe(s, &v.final_obs_[i * E::obs_dim]);
        v.ep_return_done_[i] = v.ep_return_[i];
        v.ep_length_done_[i] = elapsed;
        reset_env<E>(v, i);
      } else {
        E::observe(s, &v.obs_[i * E::obs_dim]);
      }
    }
  }

  template <typename E>
  static Task make(int64_t grain) {
    constexpr bool discrete = E::action_dim == 0;
    Task t{.info = {.name = E::name,
                    .state_dim = E::state_dim,
                    .obs_dim = E::obs_dim,
                    .n_actions = E::n_actions,
                    .action_dim = E::action_dim,
                    .action_low = discrete ? 0.f : -float(E::max_torque),
                    .action_high = discrete ? float(E::n_actions - 1) : float(E::max_torque),
                    .max_episode_steps = E::max_episode_steps},
           .grain = grain,
           .reset_one = &reset_env<E>,
           .step_discrete = nullptr,
           .step_continuous = nullptr,
           .observe = &E::observe};
    if constexpr (discrete) {
      t.step_discrete = &step_range<E, int64_t>;
    } else {
      t.step_continuous = &step_range<E, float>;
    }
    return t;
  }
};

namespace {

// Pendulum has max_torque; the discrete tasks get a placeholder so make<E> compiles.
struct CartPoleT : CartPole {
  static constexpr float max_torque = 0;
};
struct AcrobotT : Acrobot {
  static constexpr float max_torque = 0;
};

const VectorEnv::Task kTasks[] = {
    VectorEnv::Task::make<CartPoleT>(1024),
    VectorEnv::Task::make<AcrobotT>(128),
    VectorEnv::Task::make<Pendulum>(1024),
};

const std::vector<EnvInfo>& infos() {
  static const std::vector<EnvInfo> v = [] {
    std::vector<EnvInfo> out;
    for (const auto& t : kTasks) out.push_back(t.info);
    return out;
  }();
  return v;
}

template <typename Body>
void run_range(int64_t n, int64_t grain, Body&& body) {
  if (n <= grain) return body(int64_t{0}, n);
  tbb::parallel_for(tbb::blocked_range<int64_t>(0, n, grain),
                    [&](const tbb::blocked_range<int64_t>& r) { body(r.begin(), r.end()); });
}

}  // namespace

std::span<const EnvInfo> env_names() { return infos(); }

VectorEnv::VectorEnv(std::string_view name, int64_t n, uint64_t seed) : n_(n), seed_(seed) {
  for (const auto& t : kTasks)
    if (t.info.name == name) task_ = &t;
  if (!task_) {
    std::string known;
    for (const auto& t : kTasks) known.append(known.empty() ? "" : ", ").append(t.info.name);
    fail("rl::VectorEnv: unknown environment '{}': known ones are {}", name, known);
  }
  REDCO_CHECK(n >= 1, "rl::VectorEnv({}): the number of envs must be >= 1, got {}", name, n);
  stream_ = stream_of(name);
  const auto& in = task_->info;
  state_.assign(n * in.state_dim, 0.0);
  obs_.assign(n * in.obs_dim, 0.f);
  final_obs_.assign(n * in.obs_dim, 0.f);
  rewards_.assign(n, 0.f);
  terminated_.assign(n, 0);
  truncated_.assign(n, 0);
  elapsed_.assign(n, 0);
  episodes_.assign(n, 0);
  ep_return_.assign(n, 0.0);
  ep_return_done_.assign(n, 0.0);
  ep_length_done_.assign(n, 0);
  reset();
}

VectorEnv::~VectorEnv() = default;
VectorEnv::VectorEnv(VectorEnv&&) noexcept = default;
VectorEnv& VectorEnv::operator=(VectorEnv&&) noexcept = default;

const EnvInfo& VectorEnv::info() const { return task_->info; }

void VectorEnv::reset() {
  run_range(n_, task_->grain, [&](int64_t b, int64_t e) {
    for (int64_t i = b; i < e; ++i) task_->reset_one(*this, i);
  });
  std::fill(terminated_.begin(), terminated_.end(), 0);
  std::fill(truncated_.begin(), truncated_.end(), 0);
}

void VectorEnv::step(std::span<const int64_t> actions) {
  const auto& in = task_->info;
  REDCO_CHECK(in.action_dim == 0,
              "{}: takes {} continuous action(s) per env as floats, got int64 actions", in.name,
              in.action_dim);
  REDCO_CHECK(int64_t(actions.size()) == n_, "{}: step needs one action per env ({}), got {}",
              in.name, n_, actions.size());
  for (int64_t i = 0; i < n_; ++i)
    REDCO_CHECK(actions[i] >= 0 && actions[i] < in.n_actions,
                "{}: action {} of env {} is out of range: valid actions are 0 .. {}", in.name,
                actions[i], i, in.n_actions - 1);
  run_range(n_, task_->grain,
            [&](int64_t b, int64_t e) { task_->step_discrete(*this, actions.data(), b, e); });
}

void VectorEnv::step(std::span<const float> actions) {
  const auto& in = task_->info;
  REDCO_CHECK(in.action_dim > 0,
              "{}: takes discrete actions (int64, one per env, 0 .. {}), got float actions",
              in.name, in.n_actions - 1);
  REDCO_CHECK(int64_t(actions.size()) == n_ * in.action_dim,
              "{}: step needs {} x {} actions ([envs, action_dim]), got {}", in.name, n_,
              in.action_dim, actions.size());
  for (int64_t i = 0; i < int64_t(actions.size()); ++i)
    REDCO_CHECK(actions[i] >= in.action_low && actions[i] <= in.action_high,
                "{}: action {} of env {} is out of range: valid actions are [{}, {}] "
                "(clamp the policy's output to the range first)",
                in.name, actions[i], i / in.action_dim, in.action_low, in.action_high);
  run_range(n_, task_->grain,
            [&](int64_t b, int64_t e) { task_->step_continuous(*this, actions.data(), b, e); });
}

void VectorEnv::check_index(int64_t i) const {
  REDCO_CHECK(i >= 0 && i < n_, "{}: env index {} is out of range [0, {})", task_->info.name, i,
              n_);
}

std::span<const double> VectorEnv::state(int64_t i) const {
  check_index(i);
  const int d = task_->info.state_dim;
  return {state_.data() + i * d, size_t(d)};
}

void VectorEnv::set_state(int64_t i, std::span<const double> state, int64_t elapsed_steps) {
  check_index(i);
  const auto& in = task_->info;
  REDCO_CHECK(int64_t(state.size()) == in.state_dim, "{}: a state has {} values, got {}", in.name,
              in.state_dim, state.size());
  REDCO_CHECK(elapsed_steps >= 0 && elapsed_steps < in.max_episode_steps,
              "{}: elapsed steps must be in [0, {}), got {}", in.name, in.max_episode_steps,
              elapsed_steps);
  std::copy(state.begin(), state.end(), state_.begin() + i * in.state_dim);
  elapsed_[i] = elapsed_steps;
  ep_return_[i] = 0;
  task_->observe(&state_[i * in.state_dim], &obs_[i * in.obs_dim]);
}

}  // namespace redco::rl
