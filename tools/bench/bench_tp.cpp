// bench_tp: tensor-parallel training throughput of a GPT-2-small-shaped model.
//
//   ./build/tools/bench/bench_tp --threads 2                          # mp = 1
//   redco-run -n 2 ./build/tools/bench/bench_tp --threads 1           # mp = 2
//
// Forward + backward (no optimizer) of one batch, the parameters split over
// the processes of the job by the model's shard plan (shard::resolve,
// train::init_shard) and every layer's collectives over ctx.mp. Width and
// heads are GPT-2 small's (d 768, 12 heads); layers, sequence length and
// vocabulary are options, smaller by default to keep a run short. Rank 0
// prints the median step time and tokens/s (the batch's tokens per step:
// all ranks of the mp group work on the same batch).
#include <tbb/global_control.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <vector>

#include "cli11_conventions.hpp"
#include "redco/autodiff/value_and_grad.hpp"
#include "redco/comm/launch_env.hpp"
#include "redco/comm/threads_comm.hpp"
#include "redco/comm/ucx_comm.hpp"
#include "redco/core/error.hpp"
#include "redco/models/gpt2.hpp"
#include "redco/train/parallel.hpp"

using namespace redco;
using Clock = std::chrono::steady_clock;

namespace {

struct Setup {
  int64_t dim = 768, layers = 2, heads = 12, vocab = 8192, len = 128, batch = 2;
  int steps = 3, threads = 1;
};

// [rows, len] token ids, the same on every rank.
Tensor tokens(const Setup& s, uint64_t stream) {
  std::vector<int64_t> ids(size_t(s.batch * s.len));
  for (size_t i = 0; i < ids.size(); ++i)
    ids[i] = int64_t(philox_bits(9, stream, i) % uint64_t(s.vocab));
  return Tensor::from<int64_t>(std::span<const int64_t>(ids), Shape{s.batch, s.len});
}

void run(comm::Comm& mp, const Setup& s) {
  const models::Gpt2Config cfg{.vocab = s.vocab,
                               .context = s.len,
                               .dim = s.dim,
                               .layers = s.layers,
                               .heads = s.heads,
                               .dropout = 0.f};
  const auto model = models::gpt2(cfg);
  const auto plan = shard::resolve(model, mp.size());
  const ParamTree shard =
      train::init_shard(nn::param_entries(model), plan, 1, mp.rank(), mp.size());
  const Tensor ids = tokens(s, 0), labels = tokens(s, 1);
  std::vector<double> times;
  for (int i = -1; i < s.steps; ++i) {  // step -1 warms up
    sched::sync_wait(mp.barrier());
    const Clock::time_point t0 = Clock::now();
    auto [loss, grads] = value_and_grad(
        [&](const ParamTree& p) {
          nn::Ctx ctx{.train = true, .mp = &mp};
          return cross_entropy(nn::apply(model, p, ids, ctx), labels);  // vocab-parallel loss
        },
        shard);
    if (i >= 0) times.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  std::sort(times.begin(), times.end());
  const double t = times[times.size() / 2];
  if (mp.rank() == 0) {
    std::printf(
        "tp mp=%d threads/rank=%d gpt d=%lld heads=%lld layers=%lld vocab=%lld len=%lld "
        "batch=%lld: step %.1f ms, %.0f tokens/s (median of %d)\n",
        mp.size(), s.threads, (long long)s.dim, (long long)s.heads, (long long)s.layers,
        (long long)s.vocab, (long long)s.len, (long long)s.batch, t * 1e3,
        double(s.batch * s.len) / t, s.steps);
    std::fflush(stdout);
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"tensor-parallel GPT throughput (mp = the number of processes)"};
  Setup s;
  app.add_option("--layers", s.layers);
  app.add_option("--vocab", s.vocab);
  app.add_option("--len", s.len, "sequence length");
  app.add_option("--batch", s.batch, "rows per step");
  app.add_option("--steps", s.steps, "timed steps");
  app.add_option("--threads", s.threads, "compute threads per process");
  REDCO_CLI11_PARSE(app, argc, argv);
  tbb::global_control threads(tbb::global_control::max_allowed_parallelism, size_t(s.threads));
  try {
    const comm::LaunchEnv env = comm::detect_launch_env();
    if (env.world_size == 1) {
      comm::ThreadsWorld alone(1);
      run(alone.comm(0), s);
      return 0;
    }
    std::unique_ptr<comm::Comm> comm = comm::connect_ucx(comm::ucx_options(env));
    run(*comm, s);
    sched::sync_wait(comm->barrier());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_tp: %s\n", e.what());
    return 1;
  }
  return 0;
}
