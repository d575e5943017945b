#pragma once
// What the PPO and DDPG samples share: the episode returns of a run (logged
// to metrics.jsonl and TensorBoard after every epoch's rollouts, drawn as
// workdir/returns.svg at the end) and the evaluation of a policy over fresh
// episodes.
#include <fmt/core.h>

#include <deque>
#include <numeric>
#include <string>
#include <vector>

#include "envs/vector_env.hpp"
#include "svg_plot.hpp"
#include "redco/redco.hpp"

namespace rl_sample {
using namespace redco;

class Returns {
 public:
  // The episode that env i of `envs` finished in its last step, if it did.
  void collect(const rl::VectorEnv& envs) {
    for (int64_t i = 0; i < envs.size(); ++i)
      if (envs.done(i)) epoch_.push_back(envs.episode_returns()[size_t(i)]);
  }
  // After an epoch's rollouts: the mean return of the last 100 episodes,
  // logged at the optimizer step the epoch starts at, and printed every
  // `print_every` epochs.
  void epoch_done(Deployer& deployer, int64_t epoch, int64_t step, int64_t env_steps,
                  int64_t print_every) {
    for (const double r : epoch_) {
      recent_.push_back(r);
      if (recent_.size() > 100) recent_.pop_front();
    }
    episodes_ += int64_t(epoch_.size());
    epoch_.clear();
    if (recent_.empty()) return;
    const double mean =
        std::accumulate(recent_.begin(), recent_.end(), 0.0) / double(recent_.size());
    curve_.x.push_back(double(env_steps));
    curve_.y.push_back(mean);
    deployer.log(step, "rollout",
                 {{"episode_return_mean100", mean},
                  {"episodes", double(episodes_)},
                  {"env_steps", double(env_steps)}});
    if (epoch % print_every == 0)
      deployer.console() << fmt::format("epoch {}: {} env steps, {} episodes, mean return {:.1f}\n",
                                        epoch, env_steps, episodes_, mean);
  }
  // workdir/returns.svg (nothing without a workdir or off the main rank).
  void plot(const Deployer& deployer, const std::string& title) const {
    if (deployer.workdir().empty() || !deployer.is_main() || curve_.x.empty()) return;
    io::write_line_plot(deployer.workdir() / "returns.svg", {curve_},
                        {.title = title,
                         .x_label = "environment steps",
                         .y_label = "episode return (mean of the last 100)"});
  }

 private:
  std::vector<double> epoch_;
  std::deque<double> recent_;
  int64_t episodes_ = 0;
  io::PlotSeries curve_{.name = "training episodes (mean of the last 100)"};
};

// The mean return of `act` over n fresh episodes (one per env of a new
// VectorEnv): act(observations [n, obs_dim]) -> one action (or action_dim) per env.
template <typename Act>
double evaluate(const std::string& env_name, int64_t n, uint64_t seed, Act act) {
  rl::VectorEnv envs(env_name, n, seed);
  std::vector<double> returns(static_cast<size_t>(n));
  std::vector<uint8_t> finished(static_cast<size_t>(n));
  for (int64_t left = n; left > 0;) {
    envs.step(act(envs.observations()));
    for (int64_t i = 0; i < n; ++i)
      if (envs.done(i) && !finished[size_t(i)])
        finished[size_t(i)] = 1, returns[size_t(i)] = envs.episode_returns()[size_t(i)], --left;
  }
  return std::accumulate(returns.begin(), returns.end(), 0.0) / double(n);
}

// The trained policy, run through the Predictor on n fresh episodes: its mean
// return, printed and logged at `step`; the exit status says whether it
// reached min_return. Transition has an `obs` array the observations fill.
template <typename Transition, typename Trainer, typename Predictor>
int evaluate_policy(Deployer& deployer, Trainer& trainer, Predictor& predictor,
                    const std::string& env_name, int64_t n, uint64_t seed, int64_t step,
                    const std::string& kind, double min_return) {
  const auto D = int64_t(rl::VectorEnv(env_name, 1, seed).info().obs_dim);
  const double mean = evaluate(env_name, n, seed, [&](std::span<const float> o) {
    std::vector<Transition> ts(o.size() / size_t(D));
    for (size_t i = 0; i < ts.size(); ++i)
      std::copy_n(o.begin() + int64_t(i) * D, D, ts[i].obs.begin());
    return predictor.predict(ts, int64_t(ts.size()), trainer.params());
  });
  deployer.console() << fmt::format("evaluation: mean return {:.2f} over {} {} episodes of {}\n",
                                    mean, n, kind, env_name);
  deployer.log(step, "eval", {{"episode_return_mean", mean}});
  return mean >= min_return ? 0 : 1;
}

}  // namespace rl_sample
