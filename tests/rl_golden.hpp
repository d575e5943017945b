#pragma once
// Replays Gymnasium trajectories (written by tests/python/make_env_goldens.py)
// through rl::VectorEnv and measures how far redco's steps are from them.
//
// Two replays per recorded window:
//  - one-step: before every step the env is placed at Gymnasium's state, so
//    each step is compared on its own (any error is that step's rounding);
//  - free-running: placed once at the window's start, then stepped with the
//    recorded actions, so errors accumulate as they would in use.
#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "envs/vector_env.hpp"

namespace rl_golden {

namespace fs = std::filesystem;

struct Step {
  double action;
  std::vector<double> state;  // after the step
  std::vector<float> obs;
  double reward;
  bool terminated, truncated;
};
struct Window {
  std::string env;
  int64_t elapsed;
  std::vector<double> start;
  std::vector<Step> steps;
};

inline std::vector<Window> parse(const fs::path& path) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path.string());
  std::vector<Window> out;
  std::string line, env, word;
  while (std::getline(in, line)) {
    std::istringstream ss(line);
    ss >> word;
    if (word == "env") {
      ss >> env;
    } else if (word == "start") {
      Window w{env, 0, {}, {}};
      ss >> w.elapsed;
      for (double v; ss >> v;) w.start.push_back(v);
      out.push_back(std::move(w));
    } else if (word == "step") {
      Step s{};
      ss >> s.action;
      while (ss >> word && word != "|") s.state.push_back(std::stod(word));
      while (ss >> word && word != "|") s.obs.push_back(std::stof(word));
      int term = 0, trunc = 0;
      ss >> s.reward >> term >> trunc;
      s.terminated = term, s.truncated = trunc;
      if (!ss || out.empty()) throw std::runtime_error("bad golden line: " + line);
      out.back().steps.push_back(std::move(s));
    }
  }
  return out;
}

// Largest deviations seen, and the count of flag mismatches.
struct Report {
  double state = 0;                      // relative to max(1, |value|)
  double obs_ulps = 0, reward_ulps = 0;  // in units of the float32 spacing at the value
  int64_t flag_mismatches = 0, steps = 0;
  std::string first_flag_mismatch;
};

inline double rel(double a, double b) { return std::abs(a - b) / std::max(1.0, std::abs(b)); }

inline double ulps(float a, float b) {
  const float spacing = std::nextafter(std::abs(b), INFINITY) - std::abs(b);
  return std::abs(double(a) - double(b)) / double(spacing);
}

inline void step_once(redco::rl::VectorEnv& env, double action) {
  if (env.info().action_dim == 0) {
    const int64_t a = int64_t(action);
    env.step(std::span<const int64_t>(&a, 1));
  } else {
    const float a = float(action);
    env.step(std::span<const float>(&a, 1));
  }
}

inline void compare(const redco::rl::VectorEnv& env, const Step& g, const std::string& where,
                    Report& r) {
  const bool done = g.terminated || g.truncated;
  // After an episode ends the env has already reset: its last observation is
  // in final_observations() and its state is gone.
  const auto obs = done ? env.final_observations() : env.observations();
  for (size_t k = 0; k < g.obs.size(); ++k)
    r.obs_ulps = std::max(r.obs_ulps, ulps(obs[k], g.obs[k]));
  if (!done) {
    const auto s = env.state(0);
    for (size_t k = 0; k < g.state.size(); ++k) r.state = std::max(r.state, rel(s[k], g.state[k]));
  }
  r.reward_ulps = std::max(r.reward_ulps, ulps(env.rewards()[0], float(g.reward)));
  if (bool(env.terminated()[0]) != g.terminated || bool(env.truncated()[0]) != g.truncated) {
    if (!r.flag_mismatches++)
      r.first_flag_mismatch = where + ": terminated/truncated " +
                              std::to_string(env.terminated()[0]) + "/" +
                              std::to_string(env.truncated()[0]) + ", Gymnasium " +
                              std::to_string(g.terminated) + "/" + std::to_string(g.truncated);
  }
  ++r.steps;
}

// Replays every window of `name` in the file; one_step picks the mode.
inline Report replay(const std::vector<Window>& windows, const std::string& name, bool one_step) {
  Report r;
  redco::rl::VectorEnv env(name, 1, 0);
  for (const Window& w : windows) {
    if (w.env != name) continue;
    env.set_state(0, w.start, w.elapsed);
    for (size_t t = 0; t < w.steps.size(); ++t) {
      if (one_step && t > 0) env.set_state(0, w.steps[t - 1].state, w.elapsed + int64_t(t));
      step_once(env, w.steps[t].action);
      compare(env, w.steps[t], name + " step " + std::to_string(w.elapsed + int64_t(t) + 1), r);
      if (w.steps[t].terminated || w.steps[t].truncated) break;
    }
  }
  return r;
}

// tests/goldens/... from the source tree: via this header's path, else
// upwards from the working directory (meson runs tests inside build/).
inline fs::path source_root() {
  std::error_code ec;
  for (fs::path start : {fs::path(__FILE__).parent_path().parent_path(), fs::current_path()}) {
    for (fs::path p = fs::absolute(start, ec); !p.empty(); p = p.parent_path()) {
      if (fs::exists(p / "tests/goldens/rl_envs.txt", ec)) return p;
      if (p == p.parent_path()) break;
    }
  }
  throw std::runtime_error("cannot find tests/goldens/rl_envs.txt above " +
                           fs::current_path().string());
}

}  // namespace rl_golden
