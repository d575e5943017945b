#pragma once
// The ZeRO tests' common run (test_zero.cpp, test_zero3.cpp): a tiny GPT-2
// trained for a few steps on a dp x mp mesh of threads with a given ZeRO
// stage; the whole parameters, losses and each rank's optimizer state after.
#include <catch2/catch.hpp>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "lm_windows.hpp"
#include "redco/comm/threads_comm.hpp"
#include "redco/core/allocator.hpp"
#include "redco/io/json.hpp"
#include "redco/models/gpt2.hpp"
#include "redco/nn/param_read_hook.hpp"
#include "redco/train/memory_account.hpp"
#include "redco/train/trainer.hpp"

namespace zero_fit {

using namespace redco;
namespace fs = std::filesystem;

const models::Gpt2Config kGpt{
    .vocab = 64, .context = 16, .dim = 32, .layers = 2, .heads = 4, .dropout = 0.1f};
// The tied embedding [512, 32] is ~40% of the parameters: more than half a
// replica's share at dp 2 and 4, so ZeRO splits it among the owners.
const models::Gpt2Config kTied{
    .vocab = 512, .context = 16, .dim = 32, .layers = 2, .heads = 4, .dropout = 0.1f};

// Whether ZeRO splits some parameter of `model` on a dp x mp mesh.
inline bool splits_some(const models::Gpt2Config& model, int dp, int mp) {
  const train::ZeroPartition zero(shard::resolve(models::gpt2(model), mp), dp, 0);
  for (const auto& s : shard::resolve(models::gpt2(model), mp))
    if (zero.split(s.name)) return true;
  return false;
}

using test::LmBatch;
using test::Window;
inline LmBatch collate(std::span<const Window> ws) { return test::collate_windows(ws); }

inline std::vector<Window> windows() {
  std::vector<Window> data(32);
  std::mt19937_64 rng(5);
  for (Window& w : data)
    for (int t = 0; t < 17; ++t) w.ids.push_back(int64_t(rng() % 64));  // within both vocabularies
  return data;
}

struct Run {
  int world = 1, mp = 1, zero = 0;
  int64_t max_steps = 10;
  fs::path workdir = {};
  bool resume = false;
  int64_t save_every = 0;
  models::Gpt2Config model = kGpt;
  int64_t batch = 8;                 // global
  size_t bucket = size_t(25) << 20;  // DeployerConfig::grad_bucket_bytes
  bool overlap = true;               // DeployerConfig::zero_overlap
  bool recompute = false;            // FitOptions::recompute
  bool eval = false;                 // Result::eval_loss after training
  bool save_at_end = false;          // FitOptions::save_at_end
};

struct Result {
  ParamTree params;                   // whole, after training
  std::vector<double> losses;         // per step
  std::vector<uint64_t> state_bytes;  // each rank's optimizer state
  // Per step: whether parameters were still on their way after it (the
  // next forward would wait for them as it reads them).
  std::vector<bool> in_flight;
  double eval_loss = 0;  // over the training windows, after training (Run::eval)
  // The process's bytes in use (all thread ranks) once every rank has
  // returned from fit().
  size_t bytes_after_fit = 0;
};

inline Result fit(const Run& run) {
  const std::vector<Window> data = windows();
  const auto gpt = models::gpt2(run.model);
  std::vector<Result> out(static_cast<size_t>(run.world));
  auto rank = [&](comm::Comm* c) {
    train::Deployer d({.n_model_shards = run.mp,
                       .seed = 3,
                       .workdir = run.workdir,
                       .quiet = true,
                       .world = c,
                       .zero_stage = run.zero,
                       .zero_overlap = run.overlap,
                       .grad_bucket_bytes = run.bucket});
    train::Trainer trainer(
        d, gpt, collate,
        [](auto& model, const LmBatch& b, train::Rng) {
          return cross_entropy(model(b.inputs), b.targets);
        },
        optim::adamw(optim::linear(1e-2f, 1e-3f, 10), {.max_grad_norm = 0.5f}));
    Result& r = out[size_t(c ? c->rank() : 0)];
    trainer.fit(data, {.global_batch_size = run.batch,
                       .n_epochs = 100,
                       .save_every_steps = run.save_every,
                       .save_at_end = run.save_at_end,
                       .resume = run.resume,
                       .max_steps = run.max_steps,
                       .on_step =
                           [&](const train::StepInfo& s) {
                             r.losses.push_back(s.loss);
                             r.in_flight.push_back(nn::param_read_hook() != nullptr);
                           },
                       .recompute = run.recompute});
    d.barrier();
    if (!c || c->rank() == 0) r.bytes_after_fit = CachingAllocator::cpu().stats().bytes_in_use;
    d.barrier();
    if (run.eval) r.eval_loss = trainer.eval_loss(data, 4);
    r.params = trainer.whole_params();
    r.state_bytes.push_back(train::tree_bytes(trainer.optimizer().state()));
  };
  if (run.world == 1) {
    rank(nullptr);
    return out[0];
  }
  comm::ThreadsWorld w(run.world);
  w.run([&](comm::Comm& c) { rank(&c); });
  Result all = out[0];  // bytes_after_fit: rank 0 measured for all
  all.state_bytes.clear();
  for (const Result& r : out) {
    CHECK(r.losses == out[0].losses);
    CHECK(r.in_flight == out[0].in_flight);
    all.state_bytes.push_back(r.state_bytes[0]);
  }
  return all;
}

struct TempDir {
  fs::path path =
      fs::temp_directory_path() / ("redco-zero-" + std::to_string(std::random_device{}()));
  TempDir() { fs::create_directories(path); }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

// The memory line of a run's metrics.jsonl.
inline io::Json memory_line(const fs::path& workdir) {
  std::ifstream f(workdir / "metrics.jsonl");
  std::string line;
  io::Json m;
  while (std::getline(f, line))
    if (io::Json j = io::Json::parse(line); j.at("split").as_string() == "memory") m = j;
  return m;
}

// Five steps on 2 replicas with ZeRO stage `first`, saved; then a run
// resumed from that checkpoint to step 10 with stage `then` on `world` ranks
// of `mp` shards: the resumed run's result (its five losses).
inline Result save_then_resume(int first, int then, const models::Gpt2Config& model, int world = 2,
                               int mp = 1) {
  TempDir dir;
  fit({.world = 2,
       .zero = first,
       .max_steps = 5,
       .workdir = dir.path,
       .save_every = 5,
       .model = model});
  return fit({.world = world,
              .mp = mp,
              .zero = then,
              .max_steps = 10,
              .workdir = dir.path,
              .resume = true,
              .model = model});
}

}  // namespace zero_fit
