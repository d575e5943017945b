// rl::VectorEnv throughput: env steps per second for each task at several
// vector sizes, on 1 thread and on all of them (oneTBB).
//
//   bench_rl_env [--steps-per-size N]   (default: 2,000,000 env steps per row)
//
// Actions are drawn up front (Philox), so the timing is the env step,
// auto-reset included, and nothing else.
#include <tbb/global_control.h>
#include <tbb/info.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "redco/core/philox.hpp"
#include "envs/vector_env.hpp"

using namespace redco;

namespace {

double steps_per_second(const rl::EnvInfo& info, int64_t n, int64_t total) {
  rl::VectorEnv env(info.name, n, 1);
  const int64_t iters = std::max<int64_t>(1, total / n);
  const int64_t per = n * std::max(1, info.action_dim);
  std::vector<int64_t> discrete(per * 64);
  std::vector<float> continuous(per * 64);
  for (int64_t i = 0; i < per * 64; ++i) {
    const uint32_t bits = philox_bits(7, 0, uint64_t(i));
    discrete[i] = int64_t(bits % uint32_t(std::max(1, info.n_actions)));
    continuous[i] = float(bits * 0x1p-32 * 4.0 - 2.0);
  }
  auto step = [&](int64_t it) {
    const int64_t off = (it % 64) * per;
    if (info.action_dim == 0)
      env.step(std::span<const int64_t>(discrete.data() + off, per));
    else
      env.step(std::span<const float>(continuous.data() + off, per));
  };
  for (int64_t it = 0; it < std::min<int64_t>(iters, 100); ++it) step(it);  // warm up
  const auto t0 = std::chrono::steady_clock::now();
  for (int64_t it = 0; it < iters; ++it) step(it);
  const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return double(iters * n) / s;
}

}  // namespace

int main(int argc, char** argv) {
  int64_t total = 2'000'000;
  for (int i = 1; i + 1 < argc; ++i)
    if (!std::strcmp(argv[i], "--steps-per-size")) total = std::atoll(argv[i + 1]);
  const int all = tbb::info::default_concurrency();
  std::printf("%-12s %6s %14s %14s   (env steps/s; %d threads available)\n", "env", "n", "1 thread",
              "all threads", all);
  for (const rl::EnvInfo& info : rl::env_names()) {
    for (int64_t n : {1, 16, 256, 4096}) {
      double one, many;
      {
        tbb::global_control c(tbb::global_control::max_allowed_parallelism, 1);
        one = steps_per_second(info, n, total);
      }
      many = steps_per_second(info, n, total);
      std::printf("%-12s %6lld %14.3g %14.3g\n", std::string(info.name).c_str(), (long long)n, one,
                  many);
    }
  }
}
