// dist_train_main: a tiny GPT trained data-parallel over however many
// processes started it, for tests/test_netns.sh (two "hosts" joined by a
// network) and by hand:
//
//   redco-run -n 2 -- ./build/tests/dist_train_main --steps 20
//   ./build/tests/dist_train_main --steps 20          # the 1-process reference
//
// It uses the launcher's environment (detect_launch_env), a rendezvous and
// UCX directly, without a Deployer: every rank takes its rows of the same
// global batch, gradients are averaged by DataParallel in buckets started
// during backward, and SGD steps. Rank 0 prints one line per step,
//   step K loss L
// with L the global batch's mean loss (%.9g), so the lines of a run on any
// number of processes can be compared with the 1-process run's.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <thread>

#include "redco/autodiff/value_and_grad.hpp"
#include "redco/comm/launch_env.hpp"
#include "redco/comm/mesh.hpp"
#include "redco/comm/threads_comm.hpp"
#include "redco/comm/ucx_comm.hpp"
#include "redco/models/gpt2.hpp"
#include "redco/optim/optimizer.hpp"
#include "redco/train/data_parallel.hpp"
#include "redco/train/parallel.hpp"

using namespace redco;

namespace {

constexpr int64_t kVocab = 32, kLen = 16;

// [rows, kLen] token ids, the same on every rank for a given (batch, stream);
// two batches alternate, so the loss can fall.
Tensor tokens(int64_t rows, uint64_t step, uint64_t stream) {
  std::vector<int64_t> ids(size_t(rows * kLen));
  for (size_t i = 0; i < ids.size(); ++i)
    ids[i] = int64_t(philox_bits(17, step * 2 + stream, i) % uint64_t(kVocab));
  return Tensor::from<int64_t>(std::span<const int64_t>(ids), Shape{rows, kLen});
}

std::unique_ptr<comm::Comm> connect(const comm::LaunchEnv& env) {
  return comm::connect_ucx(comm::ucx_options(env));
}

void run_training(comm::Comm& world, int steps, int64_t batch, int step_ms) {
  const models::Gpt2Config cfg{
      .vocab = kVocab, .context = kLen, .dim = 32, .layers = 2, .heads = 4, .dropout = 0.f};
  const auto model = models::gpt2(cfg);
  const auto order = train::param_order(shard::resolve(model, 1));
  comm::Mesh mesh(world, 1);
  train::DataParallel data(mesh.dp_comm(), 16 << 10);  // several buckets per step
  ParamTree params = nn::init_params(model, 7);
  optim::Optimizer opt = optim::sgd(0.5f, {.momentum = 0.9f});
  for (int step = 0; step < steps; ++step) {
    const Tensor ids = data.local_batch(tokens(batch, uint64_t(step % 2), 0));
    const Tensor labels = data.local_batch(tokens(batch, uint64_t(step % 2), 1));
    auto [loss, grads] = value_and_grad(
        [&](const ParamTree& p) {
          return cross_entropy(nn::apply(model, data.watch(p, order), ids), labels);
        },
        params);
    data.finish(grads);
    opt.step(params, grads);
    Tensor global = loss.detach().clone();  // [] f32: this replica's mean loss
    sched::sync_wait(mesh.dp_comm().all_reduce(global, comm::ReduceOp::mean));
    if (world.rank() == 0) std::printf("step %d loss %.9g\n", step, double(global.item()));
    std::fflush(stdout);
    if (step_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(step_ms));
  }
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"a tiny GPT trained data-parallel over the processes of a redco-run job"};
  int steps = 20, step_ms = 0;
  int64_t batch = 8;
  std::string pid_file;
  app.add_option("--steps", steps, "training steps");
  app.add_option("--batch", batch, "global batch (rows), split across the ranks");
  app.add_option("--step-ms", step_ms, "pause after each step (to stop a rank mid-run)");
  app.add_option("--pid-file", pid_file, "write this process's id there");
  CLI11_PARSE(app, argc, argv);
  try {
    if (!pid_file.empty()) std::ofstream(pid_file) << ::getpid() << "\n";
    const comm::LaunchEnv env = comm::detect_launch_env();
    if (env.world_size > 1) {
      std::unique_ptr<comm::Comm> world = connect(env);
      run_training(*world, steps, batch, step_ms);
      sched::sync_wait(world->barrier());
    } else {
      comm::ThreadsWorld alone(1);
      run_training(alone.comm(0), steps, batch, step_ms);
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "dist_train_main: %s\n", e.what());
    return 1;
  }
  return 0;
}
