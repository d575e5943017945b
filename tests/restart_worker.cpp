// A tiny GPT trained by the Trainer with a checkpoint after every step, on
// however many processes started it, with one injected failure, for
// tests/test_restart.sh and tests/test_netns.sh (redco-run --max-restarts,
// --hang-timeout):
//
//   redco-run -n 2 --max-restarts 1 -- restart_worker --workdir W --steps 8
//       --fail-rank 1 --fail-step 3 --fail-how kill
//
// After step --fail-step, rank --fail-rank kills itself (SIGKILL), stops
// itself (SIGSTOP), spins forever in user code (loop) or exits with status 3
// (exit) — on the first attempt only, unless --fail-always. --slow-rank
// makes that rank's step --slow-step long but healthy (--slow-ms of matrix
// products in its loss). --pid-dir lets a test kill a rank from outside.
// Rank 0 prints "restart K" once and "step S loss L"
// per step; the final parameters are in W/ckpt/step-<steps>.
#include <fmt/format.h>
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <chrono>
#include <fstream>
#include <random>
#include <thread>
#include <vector>

#include "redco/models/gpt2.hpp"
#include "redco/train/trainer.hpp"

using namespace redco;

namespace {

constexpr int64_t kT = 8, kVocab = 32;

struct Batch {
  Tensor inputs, targets;
};

// Windows of kT + 1 tokens following t + 1 = (3 t + k) mod vocab.
std::vector<std::vector<int64_t>> make_data(int64_t n) {
  std::mt19937_64 rng(5);
  std::vector<std::vector<int64_t>> out(static_cast<size_t>(n));
  for (auto& s : out) {
    const auto k = int64_t(rng() % 4);
    s.push_back(int64_t(rng() % kVocab));
    for (int64_t t = 0; t < kT; ++t) s.push_back((3 * s.back() + k) % kVocab);
  }
  return out;
}

Batch collate(std::span<const std::vector<int64_t>> ex) {
  const auto n = int64_t(ex.size());
  Batch b{Tensor::empty({n, kT}, DType::i64), Tensor::empty({n, kT}, DType::i64)};
  for (int64_t i = 0; i < n; ++i) {
    std::copy_n(ex[size_t(i)].begin(), kT, b.inputs.data<int64_t>() + i * kT);
    std::copy_n(ex[size_t(i)].begin() + 1, kT, b.targets.data<int64_t>() + i * kT);
  }
  return b;
}

struct Args {
  std::string workdir;
  int steps = 8, shards = 1;
  int fail_rank = -1, fail_step = 0;
  std::string fail_how = "kill";
  bool fail_always = false;
  int slow_rank = -1, slow_step = 0, slow_ms = 0;
  std::string pid_dir;
  int step_ms = 0;
  int64_t dim = 16, layers = 2;
};

// Says when (Unix time, to compare with the launcher's messages), then fails.
void fail_now(int rank, int step, const std::string& how) {
  const double t =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  fmt::print(stderr, "restart_worker: rank {} fails ({}) after step {} at {:.3f}\n", rank, how,
             step, t);
  std::fflush(nullptr);
  if (how == "kill") raise(SIGKILL);
  if (how == "stop") raise(SIGSTOP);
  if (how == "exit") std::_Exit(3);
  std::atomic<uint64_t> spin{0};  // an endless loop the compiler cannot remove
  for (;;) spin.fetch_add(1, std::memory_order_relaxed);
}

// Real work for `ms` milliseconds: what a long step looks like to the watchdog.
void busy_with_tensors(int ms) {
  const Tensor a = Tensor::full(Shape{128, 128}, 0.5f);
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  while (std::chrono::steady_clock::now() < until) (void)matmul(a, a);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"a tiny GPT with checkpoints every step and one injected failure"};
  Args a;
  app.add_option("--workdir", a.workdir, "checkpoints go to WORKDIR/ckpt")->required();
  app.add_option("--steps", a.steps, "optimizer steps");
  app.add_option("--shards", a.shards, "model shards");
  app.add_option("--fail-rank", a.fail_rank, "the rank that fails (-1: none)");
  app.add_option("--fail-step", a.fail_step, "after which step it fails");
  app.add_option("--fail-how", a.fail_how, "kill, stop, loop or exit")
      ->check(CLI::IsMember({"kill", "stop", "loop", "exit"}));
  app.add_flag("--fail-always", a.fail_always, "fail on restarts too");
  app.add_option("--slow-rank", a.slow_rank, "the rank with one long, healthy step");
  app.add_option("--slow-step", a.slow_step, "that step");
  app.add_option("--slow-ms", a.slow_ms, "how long it works on it");
  app.add_option("--dim", a.dim, "model width (a larger model: longer checkpoint writes)");
  app.add_option("--layers", a.layers, "transformer blocks");
  app.add_option("--step-ms", a.step_ms, "pause after each step (a floor on the run's length)");
  app.add_option("--pid-dir", a.pid_dir, "first attempt: write rank R's process id to DIR/R.pid");
  CLI11_PARSE(app, argc, argv);
  try {
    Deployer deployer({.n_model_shards = a.shards, .seed = 3, .workdir = a.workdir, .quiet = true});
    if (!a.pid_dir.empty() && deployer.restart_count() == 0)
      std::ofstream(fmt::format("{}/{}.pid", a.pid_dir, deployer.rank())) << getpid() << "\n";
    const bool failing =
        deployer.rank() == a.fail_rank && (a.fail_always || deployer.restart_count() == 0);
    std::atomic<int64_t> step{1};  // the step being taken
    auto loss = [&](auto& model, const Batch& b, Rng) {
      if (deployer.rank() == a.slow_rank && step.load() == a.slow_step)
        busy_with_tensors(a.slow_ms);
      return cross_entropy(model(b.inputs), b.targets);
    };
    const auto gpt = models::gpt2(
        {.vocab = kVocab, .context = kT, .dim = a.dim, .layers = a.layers, .heads = 4});
    Trainer trainer(deployer, gpt, collate, loss,
                    optim::adamw(optim::linear(1e-2f, 1e-3f, 10), {.max_grad_norm = 0.5f}));
    deployer.console() << fmt::format("restart {}\n", deployer.restart_count()) << std::flush;
    auto on_step = [&](const train::StepInfo& s) {
      deployer.console() << fmt::format("step {} loss {:.9g}\n", s.step, s.loss) << std::flush;
      step = s.step + 1;
      if (a.step_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(a.step_ms));
      if (failing && s.step == a.fail_step) fail_now(deployer.rank(), a.fail_step, a.fail_how);
    };
    trainer.fit(make_data(96), {.global_batch_size = 8,
                                .save_every_steps = 1,
                                .keep_last = 2,
                                .max_steps = a.steps,
                                .on_step = on_step});
    return 0;
  } catch (const std::exception& e) {
    fmt::print(stderr, "restart_worker: {}\n", e.what());
    return 1;
  }
}
