// Training steps of any family the planner models, built from a Hugging Face
// config (a folder or a config.json: no weights are read, the Trainer
// initialises them), fed random token ids of fixed lengths: what each rank's
// caching allocator reaches against what the memory model
// (plan/memory_model.hpp) says for the same cut, and the step times.
//
//   bench_train_hf CONFIG --seq-len T [--source-len S] [--batch B] [--steps N]
//                  [--warmup W] [--dtype f32|bf16] [--recompute] [--zero Z]
//                  [--n-model-shards K|auto] [--memory-per-device 10GB] [--workdir DIR]
//
// Under a launcher (redco-run -n N) every rank prints
//   memory rank R (model shard .., replica .., zero ..): params .. MiB, optimizer
//   state .. MiB, allocator peak .. MiB (modelled ..), peak RSS .. MiB
// (the format tools/bench/bench_memory_model.sh reads) and rank 0 a RESULT
// line. --n-model-shards auto asks the planner for the cut
// (DeployerConfig::auto_mesh) within --memory-per-device; a pinned cut with
// --memory-per-device is checked against it the same way, so a run the
// planner says does not fit stops before its first step with the planner's
// breakdown instead of running out of memory.
#include <fmt/core.h>
#include <sys/resource.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <numeric>
#include <random>
#include <sstream>

#include "cli11_conventions.hpp"
#include "redco/models/bart.hpp"
#include "redco/models/causal_lm.hpp"
#include "redco/models/pretrained.hpp"
#include "redco/models/t5.hpp"
#include "redco/plan/memory_model.hpp"
#include "redco/redco.hpp"
#include "redco/train/auto_mesh.hpp"
#include "redco/train/seq2seq.hpp"

using namespace redco;
namespace fs = std::filesystem;

namespace {

struct Run {
  int64_t seq = 0, source = 0, batch = 1, steps = 2, warmup = 1;
  Precision precision = Precision::f32;
};

models::hf::Config read_config(const std::string& path) {
  REDCO_CHECK(fs::exists(path), "'{}' does not exist; give a Hugging Face folder or a config.json",
              path);
  if (fs::is_directory(path)) return models::hf::Config(path);
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return models::hf::Config(io::Json::parse(text.str(), path), path);
}

// i64 [rows, len] of ids in [first, vocab): random, the same on every rank.
Tensor random_ids(int64_t rows, int64_t len, int64_t vocab, uint64_t seed, int64_t first = 0) {
  std::mt19937_64 rng(seed);
  Tensor t = Tensor::empty({rows, len}, DType::i64);
  for (int64_t i = 0; i < rows * len; ++i)
    t.data<int64_t>()[i] = first + int64_t(rng() % uint64_t(vocab - first));
  return t;
}

// One step's batch from example ids (a step's first id seeds it).
data::Seq2SeqBatch seq2seq_batch(std::span<const int64_t> ids, const Run& r, int64_t vocab) {
  const auto rows = int64_t(ids.size());
  const uint64_t seed = uint64_t(ids.front());
  data::Seq2SeqBatch b{.source = random_ids(rows, r.source, vocab, 3 * seed + 1, 3),
                       .source_mask = Tensor::empty({rows, r.source}, DType::i64),
                       .decoder_in = random_ids(rows, r.seq, vocab, 3 * seed + 2, 3),
                       .labels = random_ids(rows, r.seq, vocab, 3 * seed + 3, 3)};
  std::fill_n(b.source_mask.data<int64_t>(), rows * r.source, int64_t{1});
  return b;
}

struct Timed {
  std::vector<double> ms;
  double loss = 0;
  uint64_t params = 0, state = 0;  // this rank's, after the run
};

// Trains `model` (M: CausalLM, T5 or Bart) for warmup + steps steps.
template <typename M>
Timed train_steps(train::Deployer& d, const M& model, int64_t vocab, const Run& r, bool recompute) {
  std::vector<int64_t> examples(size_t((r.warmup + r.steps) * r.batch * d.dp_size()));
  std::iota(examples.begin(), examples.end(), int64_t{0});
  const Precision precision = r.precision;
  auto collate = [&](std::span<const int64_t> ids) { return seq2seq_batch(ids, r, vocab); };
  auto loss = [precision](auto& m, const data::Seq2SeqBatch& b, train::Rng) {
    PrecisionGuard mixed(precision);
    if constexpr (std::is_same_v<M, models::CausalLM>)
      return cross_entropy(m(b.decoder_in), b.labels);
    else
      return cross_entropy(train::seq2seq_logits(m, b), b.labels);
  };
  train::Trainer trainer(d, model, collate, loss, optim::adamw(optim::constant(1e-4f)));
  Timed t;
  auto t0 = std::chrono::steady_clock::now();
  trainer.fit(examples,
              {.per_device_batch_size = d.mesh_choice() ? 0 : r.batch,
               .global_batch_size = r.batch * d.dp_size(),
               .shuffle = false,
               .save_at_end = false,
               .log_every = 1 << 30,
               .on_step =
                   [&](const train::StepInfo& info) {
                     const auto t1 = std::chrono::steady_clock::now();
                     t.ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
                     t.loss = info.loss, t0 = t1;
                   },
               .recompute = recompute});
  t.params = train::tree_bytes(trainer.kept_params());
  t.state = train::tree_bytes(trainer.groups().state());
  return t;
}

}  // namespace

int main(int argc, char** argv) try {
  CLI::App app{"Training steps of a Hugging Face config's model: memory per rank and step times"};
  std::string config_path, shards = "1", dtype = "f32", memory, workdir;
  Run r;
  int zero = 0;
  bool recompute = false;
  app.add_option("config", config_path, "a Hugging Face folder or config.json")->required();
  app.add_option("--seq-len", r.seq, "tokens a row (the decoder's)")->required();
  app.add_option("--source-len", r.source, "an encoder-decoder's source tokens (default: seq-len)");
  app.add_option("--batch", r.batch, "rows per replica")->check(redco::cli11::at_least(1));
  app.add_option("--steps", r.steps, "timed steps")->check(redco::cli11::at_least(1));
  app.add_option("--warmup", r.warmup)->check(redco::cli11::at_least(0));
  bool where_peak = false;
  app.add_flag(
      "--where-peak", where_peak,
      "profile the run and name the op in which the allocator's high-water mark rose last");
  app.add_option("--dtype", dtype)->check(CLI::IsMember({"f32", "bf16"}));
  app.add_flag("--recompute", recompute, "every block as nn::checkpoint");
  app.add_option("--zero", zero)->check(CLI::Range(0, 3));
  app.add_option("--n-model-shards", shards, "a number, or auto");
  app.add_option("--memory-per-device", memory, "each rank's budget (16GB)");
  app.add_option("--workdir", workdir, "metrics.jsonl with each rank's first-step memory");
  REDCO_CLI11_PARSE(app, argc, argv);
  if (where_peak) profile::enable(true);
  if (r.source == 0) r.source = r.seq;
  r.precision = dtype == "bf16" ? Precision::bf16 : Precision::f32;

  const models::hf::Config file = read_config(config_path);
  const plan::ModelShape shape = plan::model_shape(file);
  // Auto, or a pinned cut checked against a budget: both through the planner.
  std::optional<train::AutoMesh> mesh;
  const bool pinned = shards != "auto";
  if (!pinned || !memory.empty()) {
    mesh =
        train::AutoMesh{shape,
                        {.seq_len = r.seq,
                         .source_len = r.source,
                         .global_batch = 0,
                         .precision = r.precision,
                         .memory_per_device =
                             memory.empty() ? 0 : plan::parse_size(memory, "--memory-per-device")}};
    if (pinned) {
      mesh->options.n_model_shards = std::stoi(shards), mesh->options.zero_stage = zero;
      mesh->options.recompute = recompute;
    }
  }
  train::Deployer d({.n_model_shards = pinned ? std::stoi(shards) : 1,
                     .workdir = workdir,
                     .quiet = true,
                     .zero_stage = zero,
                     .auto_mesh = mesh ? &*mesh : nullptr});
  int64_t micro = r.batch, accumulation = 1;  // what the model is asked about
  if (const train::MeshChoice* c = d.mesh_choice()) {
    d.console() << c->why << "\n";
    micro = c->micro_batch, accumulation = c->plan.work.accumulation;
    r.batch = micro * accumulation, recompute = c->recompute, zero = c->zero_stage;
  }
  // Every causal family is one type (models::CausalLM); T5 and BART their own.
  const Timed t = shape.encoder_decoder
                      ? models::with_family<models::T5, models::Bart>(
                            file.model_type(), file.source(),
                            [&]<typename M>() {
                              return train_steps(
                                  d, models::HfFamily<M>::build(models::HfFamily<M>::config(file)),
                                  shape.vocab, r, recompute);
                            })
                      : train_steps(d, models::causal_lm(file), shape.vocab, r, recompute);
  const plan::MemoryBreakdown want = plan::training_memory(shape,
                                                           {.seq_len = r.seq,
                                                            .source_len = r.source,
                                                            .micro_batch = micro,
                                                            .accumulation = accumulation,
                                                            .precision = r.precision},
                                                           {.dp = d.dp_size(),
                                                            .mp = d.n_model_shards(),
                                                            .zero = zero,
                                                            .recompute = recompute,
                                                            .bucket_bytes = d.grad_bucket_bytes()});
  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  fmt::print(
      "memory rank {} (model shard {}, replica {}, zero {}): params {:.1f} MiB, "
      "optimizer state {:.1f} MiB, allocator peak {:.1f} MiB (modelled {:.1f}), peak RSS "
      "{:.1f} MiB\n",
      d.rank(), d.mp_rank(), d.dp_rank(), zero, double(t.params) / 1048576.0,
      double(t.state) / 1048576.0,
      double(CachingAllocator::cpu().stats().peak_bytes_in_use) / 1048576.0,
      double(want.peak()) / 1048576.0, double(ru.ru_maxrss) / 1024.0);
  if (d.is_main()) fmt::print("modelled: {}\n", plan::describe(want));
  if (where_peak)
    fmt::print("rank {}: peak {:.1f} MiB reached in {}\n", d.rank(),
               double(profile::memory_peak().bytes) / 1048576.0, profile::memory_peak().path);
  std::fflush(stdout);
  d.barrier();
  std::vector<double> timed(t.ms.begin() + std::min<int64_t>(r.warmup, int64_t(t.ms.size())),
                            t.ms.end());
  std::sort(timed.begin(), timed.end());
  if (d.is_main() && !timed.empty())
    fmt::print("RESULT step_ms_median={:.1f} final_loss={:.6f} rows_per_replica={} recompute={}\n",
               timed[timed.size() / 2], t.loss, r.batch, int(recompute));
  return 0;
} catch (const std::exception& e) {
  fmt::print(stderr, "bench_train_hf: {}\n", e.what());
  return 1;
}
