// Live comparison with Gymnasium: runs tests/python/make_env_goldens.py with a
// seed other than the committed goldens' (new start states and actions) in
// the repository's .venv (or $REDCO_VENV), then replays the trajectories it
// wrote through rl::VectorEnv with the tolerances of test_rl_env.cpp.
// Exits 77 (Meson: SKIP) when there is no venv with gymnasium.
//   test_rl_gymnasium [goldens.txt]   replays that file instead (prints the deviations)
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>

#include "rl_golden.hpp"

namespace fs = std::filesystem;

namespace {

bool report(const std::vector<rl_golden::Window>& windows) {
  bool ok = true;
  for (const char* name : {"CartPole-v1", "Acrobot-v1", "Pendulum-v1"}) {
    for (bool one_step : {true, false}) {
      const auto r = rl_golden::replay(windows, name, one_step);
      const double tol = one_step ? 1e-14 : std::string(name) == "Acrobot-v1" ? 1e-8 : 1e-12;
      const bool pass = r.steps > 50 && r.state <= tol && r.obs_ulps <= 1 && r.reward_ulps <= 1 &&
                        r.flag_mismatches == 0;
      std::printf(
          "%s %-12s %-12s %4lld steps: state %.3g (tol %.0e), obs %.0f ulp, reward %.0f ulp%s%s\n",
          pass ? "ok  " : "FAIL", name, one_step ? "one-step" : "free-running", (long long)r.steps,
          r.state, tol, r.obs_ulps, r.reward_ulps, r.flag_mismatches ? ", flags: " : "",
          r.first_flag_mismatch.c_str());
      ok = ok && pass;
    }
  }
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc > 1) return report(rl_golden::parse(argv[1])) ? 0 : 1;
  const fs::path root = rl_golden::source_root();
  const char* env = std::getenv("REDCO_VENV");
  const fs::path python = (env && *env ? fs::path(env) : root / ".venv") / "bin" / "python";
  const std::string probe = "'" + python.string() + "' -c 'import gymnasium' 2>/dev/null";
  if (!fs::exists(python) || std::system(probe.c_str()) != 0) {
    std::printf("SKIP: no Python with gymnasium at %s (tools/setup test makes .venv)\n",
                python.c_str());
    return 77;
  }
  const fs::path out = fs::temp_directory_path() / ("redco_rl_live_" + std::to_string(getpid()));
  const std::string cmd = "'" + python.string() + "' '" +
                          (root / "tests/python/make_env_goldens.py").string() +
                          "' --seed 20261125 --out '" + out.string() + "'";
  const int rc = std::system(cmd.c_str());
  if (!WIFEXITED(rc) || WEXITSTATUS(rc) != 0) {
    std::printf("FAIL: %s exited with %d\n", cmd.c_str(), rc);
    return 1;
  }
  const auto windows = rl_golden::parse(out);
  fs::remove(out);
  return report(windows) ? 0 : 1;
}
