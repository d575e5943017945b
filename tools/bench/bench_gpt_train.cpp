// GPT-2 training-step benchmark: tokens per second, step times, final loss and
// peak memory of full training steps (forward, backward, AdamW) on the CPU,
// written the way a user would write the loop: value_and_grad over a
// ParamTree, then an optimizer step.
//
//   bench_gpt_train --config S|M|L --steps N --warmup W --tokens FILE
//                   [--dtype f32|bf16] [--init FILE.safetensors]
//                   [--save-init FILE.safetensors] [--losses FILE] [--lr 3e-4] [--profile]
//                   [--trainer] [--recompute] [--n-model-shards K] [--zero 0|1|2|3]
//                   [--workdir DIR] [--device cpu|cuda|test] [--seq-len T] [--batch B]
//
// --trainer runs the same steps through Trainer::fit (one example per window,
// batches of B per replica in order, no shuffling) instead of the hand-written
// loop: the library's default step path, timed from one on_step call to the
// next. Under a launcher (redco-run -n N) the trainer path runs on every rank
// with K model shards (--n-model-shards) and N / K data-parallel replicas,
// each taking B windows per step, ZeRO stage --zero over the replicas; each
// rank prints its memory line (parameters, optimizer state, peak RSS) and
// rank 0 the RESULT line, with tokens_per_s counting every replica's tokens.
// --workdir writes metrics.jsonl there, with the Trainer's memory accounting
// of the first step for every rank (split "memory"). Config L (GPT-2 large,
// ~774M parameters) needs ~12 GB per rank in f32 AdamW on one rank, less
// with model shards, ZeRO and --recompute.
//
// W untimed warmup steps run first, then N timed steps (W + N in all). FILE
// holds little-endian int32 token ids; step s (0-based, warmup included), row b
// reads the window starting at ((s*B + b)*(T+1)) mod (n - T - 1): inputs are
// its first T tokens, targets the T after the first. The last stdout line is
//   RESULT tokens_per_s=.. step_ms_median=.. step_ms_min=.. step_ms_max=..
//          final_loss=.. peak_rss_mb=.. activation_mb=.. step_peak_mb=..
// with tokens_per_s from the median timed step and peak RSS from getrusage;
// activation_mb is what the caching allocator holds at the end of forward
// beyond what it held when forward began (what backward will read: the
// activations), step_peak_mb its peak during a step beyond what it held
// before the step (activations plus backward's transient buffers and the
// gradients), both the medians over the timed steps. --recompute runs every
// block as nn::checkpoint (Ctx::recompute).
#include <fmt/core.h>
#include <fmt/format.h>
#include <fmt/os.h>
#include <sys/resource.h>
#include <time.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <numeric>
#include <optional>
#include <vector>

#include "cli11_conventions.hpp"
#include "redco/core/device_memory.hpp"
#include "redco/core/threads.hpp"
#include "redco/ops/backend.hpp"  // profile::
#include "redco/plan/memory_model.hpp"
#include "redco/redco.hpp"

using namespace redco;

namespace {

struct BenchConfig {
  models::Gpt2Config model;
  int64_t batch = 0, seq = 0;
};

BenchConfig config_named(const std::string& name) {
  if (name == "S")
    return {{.vocab = 8192, .context = 256, .dim = 256, .layers = 4, .heads = 4}, 8, 256};
  if (name == "G")  // GPT-2 small at its full context, a GPU-sized batch
    return {{.vocab = 50257, .context = 1024, .dim = 768, .layers = 12, .heads = 12}, 16, 1024};
  if (name == "L")  // GPT-2 large (its 1024 positions), one window of 512 per replica
    return {{.vocab = 50257, .context = 1024, .dim = 1280, .layers = 36, .heads = 20}, 1, 512};
  return {{.vocab = 50257, .context = 512, .dim = 768, .layers = 12, .heads = 12}, 4, 512};
}

// Parameters of the model, counted from its entries (nothing allocated).
template <typename Model>
double count_params(const Model& model) {
  double n = 0;
  for (const auto& e : nn::param_entries(model)) n += double(e.shape.shape().numel());
  return n;
}

std::vector<int32_t> read_tokens(const std::string& path, int64_t seq) {
  std::ifstream in(path, std::ios::binary | std::ios::ate);
  REDCO_CHECK(in.good(), "--tokens {}: cannot open the file; pass a file of int32 token ids", path);
  const auto bytes = int64_t(in.tellg());
  REDCO_CHECK(bytes % 4 == 0, "--tokens {}: {} bytes is not a whole number of int32 token ids",
              path, bytes);
  std::vector<int32_t> tokens(size_t(bytes / 4));
  in.seekg(0);
  in.read(reinterpret_cast<char*>(tokens.data()), bytes);
  REDCO_CHECK(int64_t(tokens.size()) > seq + 1,
              "--tokens {}: {} tokens is too few for windows of {} + 1; pass a longer file", path,
              tokens.size(), seq);
  return tokens;
}

// inputs, targets: i64 [B, T] for step s (see the header comment).
std::pair<Tensor, Tensor> batch_for(const std::vector<int32_t>& tok, int64_t s, int64_t B,
                                    int64_t T, int64_t vocab) {
  Tensor inputs = Tensor::empty({B, T}, DType::i64), targets = Tensor::empty({B, T}, DType::i64);
  const int64_t span = int64_t(tok.size()) - T - 1;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t start = ((s * B + b) * (T + 1)) % span;
    for (int64_t t = 0; t < T; ++t) {
      const int32_t x = tok[size_t(start + t)], y = tok[size_t(start + t + 1)];
      REDCO_CHECK(x >= 0 && x < vocab && y >= 0 && y < vocab,
                  "--tokens: token id {} at position {} is outside the vocabulary [0, {})",
                  x < 0 || x >= vocab ? x : y, start + t, vocab);
      inputs.data<int64_t>()[b * T + t] = x;
      targets.data<int64_t>()[b * T + t] = y;
    }
  }
  return {inputs, targets};
}

// CPU time of the whole process (every thread), in ms: on a shared machine it
// tracks the work a step does better than wall time does.
double process_cpu_ms() {
  timespec ts{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
  return 1e3 * double(ts.tv_sec) + 1e-6 * double(ts.tv_nsec);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

void print_profile(int64_t steps) {
  const std::vector<profile::Entry> entries = profile::report();
  double total = 0;
  for (const auto& e : entries) total += e.seconds;
  fmt::print("per-op time over {} timed steps (exclusive; ms per step, share, calls per step):\n",
             steps);
  for (const auto& e : entries)
    fmt::print("  {:9.2f} ms {:5.1f}%  {:6.1f}  {}\n", 1e3 * e.seconds / double(steps),
               100 * e.seconds / total, double(e.calls) / double(steps), e.path);
  fmt::print("  {:9.2f} ms in profiled scopes per step\n", 1e3 * total / double(steps));
  const profile::MemoryPeak peak = profile::memory_peak();
  if (!peak.path.empty())
    fmt::print("peak memory in use {:.1f} MB, reached in {}\n", double(peak.bytes) / 1e6,
               peak.path);
}

// The steps through Trainer::fit: example i is window i (step i / B, row i % B).
struct TrainerRun {
  std::vector<double> ms, cpu_ms;
  float last_loss = 0;
  uint64_t param_bytes = 0, state_bytes = 0;  // this rank's, after the run
  std::vector<size_t> device_allocs;          // off the CPU: system allocations after each step
  size_t device_peak = 0;                     // and the peak bytes in use
};
template <typename Model>
TrainerRun run_trainer(Deployer& deployer, const Model& model, std::optional<ParamTree> params,
                       optim::Optimizer opt, const std::vector<int32_t>& tok, int64_t B, int64_t T,
                       int64_t vocab, int64_t warmup, int64_t total, Precision precision,
                       bool recompute, fmt::ostream* losses) {
  // Every replica takes B windows a step: global step s covers windows
  // [s B dp, (s + 1) B dp), replica r the r-th B of them.
  std::vector<int64_t> windows(size_t(total * B * deployer.dp_size()));
  std::iota(windows.begin(), windows.end(), int64_t{0});
  auto collate = [&](std::span<const int64_t> ids) {
    // Window i is row i % B of step i / B, as batch_for lays them out.
    const int64_t s = ids.front() / B;
    return batch_for(tok, s, int64_t(ids.size()), T, vocab);
  };
  auto loss = [precision](auto& m, const std::pair<Tensor, Tensor>& b, train::Rng) {
    PrecisionGuard mixed(precision);
    return cross_entropy(m(b.first), b.second);
  };
  Trainer trainer(deployer, model, collate, loss, std::move(opt), std::move(params));
  TrainerRun r;
  auto t0 = std::chrono::steady_clock::now();
  double cpu0 = process_cpu_ms();
  trainer.fit(windows,
              {.per_device_batch_size = B,
               .n_epochs = 1,
               .shuffle = false,
               .save_at_end = false,
               .log_every = 1 << 30,
               .on_step =
                   [&](const train::StepInfo& info) {
                     const auto t1 = std::chrono::steady_clock::now();
                     const double cpu1 = process_cpu_ms();
                     r.ms.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
                     r.cpu_ms.push_back(cpu1 - cpu0);
                     r.last_loss = float(info.loss);
                     if (losses)
                       losses->print("step {} loss {:.6f} ms {:.3f}\n", r.ms.size() - 1, info.loss,
                                     r.ms.back());
                     // The profile covers the timed steps only, as on the plain path.
                     if (profile::enabled() && int64_t(r.ms.size()) == warmup) profile::reset();
                     if (!deployer.device().is_cpu()) {
                       const AllocatorStats st =
                           device_memory(deployer.device()).stats(deployer.device().index);
                       r.device_allocs.push_back(st.system_allocs);
                       r.device_peak = st.peak_bytes_in_use;
                     }
                     t0 = t1, cpu0 = cpu1;
                   },
               .recompute = recompute});
  r.param_bytes = train::tree_bytes(trainer.kept_params());  // ZeRO-3: this rank's parts
  r.state_bytes = train::tree_bytes(trainer.groups().state());
  return r;
}

}  // namespace

int main(int argc, char** argv) try {
  CLI::App app{"GPT-2 training-step throughput on the CPU"};
  std::string config = "S", tokens_path, dtype = "f32", init, save_init, losses_path, workdir;
  int64_t steps = 10, warmup = 2, seq_override = 0, batch_override = 0;
  int n_model_shards = 1, zero_stage = 0, threads = 0;
  float lr = 3e-4f;
  bool profiling = false, formed_logits = false, through_trainer = false, recompute = false,
       zero_wait = false;
  app.add_option(
         "--config", config,
         "S: 4x256, seq 256, batch 8; M: GPT-2 small, seq 512, batch 4; G: GPT-2 small, seq "
         "1024, batch 16; L: GPT-2 large, seq 512, batch 1 (per replica)")
      ->check(CLI::IsMember({"S", "M", "G", "L"}));
  app.add_option("--seq-len", seq_override,
                 "tokens per row instead of the config's (the position table grows to fit)")
      ->check(redco::cli11::at_least(1));
  app.add_option("--batch", batch_override, "rows per replica instead of the config's")
      ->check(redco::cli11::at_least(1));
  app.add_option("--steps", steps, "timed steps")->check(redco::cli11::at_least(1));
  app.add_option("--warmup", warmup, "untimed steps before them")->check(redco::cli11::at_least(0));
  app.add_option("--tokens", tokens_path, "little-endian int32 token ids")->required();
  app.add_option("--dtype", dtype, "f32, or bf16 mixed precision")
      ->check(CLI::IsMember({"f32", "bf16"}));
  app.add_option("--init", init, "initial parameters (safetensors, redco's names)");
  app.add_option("--save-init", save_init, "write the initial parameters here");
  app.add_option("--losses", losses_path, "write 'step S loss L ms T' lines here");
  app.add_option("--lr", lr, "constant AdamW learning rate")->check(redco::cli11::positive());
  app.add_flag("--profile", profiling, "print per-op time totals of the timed steps");
  app.add_flag("--formed-logits", formed_logits,
               "form the LM head's logits whole (the default defers them to the loss)");
  app.add_flag("--trainer", through_trainer, "run the steps through Trainer::fit");
  app.add_flag("--recompute", recompute,
               "keep only each block's input for backward and recompute the block there");
  app.add_option("--n-model-shards", n_model_shards,
                 "model shards (trainer path; the ranks of redco-run -n N split into N / K "
                 "replicas of K shards)")
      ->check(redco::cli11::at_least(1));
  app.add_option("--zero", zero_stage,
                 "ZeRO stage over the data-parallel replicas (trainer path): 0 off, 1 optimizer "
                 "state, 2 gradients too, 3 parameters too")
      ->check(CLI::Range(0, 3));
  app.add_flag("--zero-wait", zero_wait,
               "ZeRO: wait for every updated parameter after the step (the default overlaps "
               "their broadcast with the next forward)");
  app.add_option("--workdir", workdir,
                 "trainer path: write metrics.jsonl here (the first step's memory per rank)");
  app.add_option("--threads", threads, "compute threads (0: every core)")
      ->check(redco::cli11::at_least(0));
  REDCO_CLI11_PARSE(app, argc, argv);
  set_num_threads(threads);

  Deployer deployer({.n_model_shards = n_model_shards,
                     .seed = 0,
                     .workdir = workdir,
                     .quiet = true,
                     .zero_stage = zero_stage,
                     .zero_overlap = !zero_wait});
  // Several ranks, model shards and ZeRO exist only on the trainer path.
  const bool distributed = deployer.n_devices() > 1 || n_model_shards > 1 || zero_stage > 0;
  REDCO_CHECK(through_trainer || !distributed,
              "several ranks ({} here), --n-model-shards (given {}) and --zero (given {}) run "
              "through Trainer::fit; add --trainer",
              deployer.n_devices(), n_model_shards, zero_stage);
  REDCO_CHECK(through_trainer || deployer.device().is_cpu(),
              "--device other than cpu runs through Trainer::fit; add --trainer");
  REDCO_CHECK(through_trainer || workdir.empty(),
              "--workdir holds the trainer path's metrics; add --trainer");
  BenchConfig cfg = config_named(config);
  if (seq_override) cfg.seq = seq_override;
  if (batch_override) cfg.batch = batch_override;
  cfg.model.context = std::max(cfg.model.context, cfg.seq);
  const int64_t B = cfg.batch, T = cfg.seq;
  const std::vector<int32_t> tokens = read_tokens(tokens_path, T);
  const auto model = models::gpt2(cfg.model);
  const double n_params = count_params(model);
  // The trainer initialises its own shards (the same values) unless given
  // whole parameters: config L's whole tree is 3 GB on every rank.
  const bool whole = !through_trainer || !init.empty() || !save_init.empty();
  ParamTree params = whole ? nn::init_params(model, 0) : ParamTree{};
  if (!init.empty()) io::load_safetensors_into(init, params);
  if (!save_init.empty() && deployer.is_main()) io::save_safetensors(save_init, params);

  // Weight decay on every tensor of rank >= 2 (wte, wpe, weight matrices), never
  // on biases or norm parameters.
  auto opt = optim::adamw(optim::constant(lr),
                          {.b1 = 0.9f,
                           .b2 = 0.999f,
                           .eps = 1e-8f,
                           .weight_decay = 0.1f,
                           .mask = [](const std::string&, const Shape& s) { return s.rank() >= 2; },
                           .max_grad_norm = 0.f});
  const Precision precision = dtype == "bf16" ? Precision::bf16 : Precision::f32;

  std::unique_ptr<fmt::ostream> losses;
  if (!losses_path.empty() && deployer.is_main())  // one file, rank 0's losses
    losses = std::make_unique<fmt::ostream>(fmt::output_file(losses_path));
  std::vector<double> timed_ms, timed_cpu_ms, activation_mb, step_peak_mb;
  float last_loss = 0;
  size_t allocs_after[2] = {0, 0};  // system allocations after steps 0 and 1
  if (through_trainer) {
    if (profiling) profile::enable(true);  // reset once the warm-up steps are done
    const TrainerRun r = run_trainer(
        deployer, model, whole ? std::optional<ParamTree>(std::move(params)) : std::nullopt,
        std::move(opt), tokens, B, T, cfg.model.vocab, warmup, warmup + steps, precision, recompute,
        losses.get());
    if (profiling) print_profile(steps);
    timed_ms.assign(r.ms.begin() + warmup, r.ms.end());
    timed_cpu_ms.assign(r.cpu_ms.begin() + warmup, r.cpu_ms.end());
    last_loss = r.last_loss;
    if (!r.device_allocs.empty())
      fmt::print("{} allocator: system allocations after each step {}, peak in use {:.1f} MB\n",
                 deployer.device().str(), fmt::join(r.device_allocs, " "),
                 double(r.device_peak) / 1e6);
    rusage ru{};
    getrusage(RUSAGE_SELF, &ru);
    // What the planner's memory model (plan/memory_model.hpp) says this rank needs.
    const plan::MemoryBreakdown planned = plan::training_memory(
        plan::model_shape(models::hf::Config(models::gpt2_hf_config(cfg.model), "bench config")),
        {.seq_len = T, .micro_batch = B, .precision = precision},
        {.dp = deployer.dp_size(),
         .mp = n_model_shards,
         .zero = zero_stage,
         .recompute = recompute,
         .bucket_bytes = deployer.grad_bucket_bytes()});
    // Every rank its own line (stdout, not the Deployer's console: that is rank 0's only).
    fmt::print(
        "memory rank {} (model shard {}, replica {}, zero {}): params {:.1f} MiB, "
        "optimizer state {:.1f} MiB, allocator peak {:.1f} MiB (modelled {:.1f}), peak RSS "
        "{:.1f} MiB\n",
        deployer.rank(), deployer.mp_rank(), deployer.dp_rank(), zero_stage,
        double(r.param_bytes) / 1048576.0, double(r.state_bytes) / 1048576.0,
        double(CachingAllocator::cpu().stats().peak_bytes_in_use) / 1048576.0,
        double(planned.peak()) / 1048576.0, double(ru.ru_maxrss) / 1024.0);
    std::fflush(stdout);
    deployer.barrier();
    if (!deployer.is_main()) return 0;
  }
  for (int64_t s = 0; !through_trainer && s < warmup + steps; ++s) {
    if (s == warmup && profiling) {
      profile::enable(true);
      CachingAllocator::cpu().reset_peak();  // so the timed steps' peak can be placed
    }
    const size_t held_before_step = CachingAllocator::cpu().stats().bytes_in_use;
    if (!profiling) CachingAllocator::cpu().reset_peak();
    size_t activations = 0;
    const auto t0 = std::chrono::steady_clock::now();
    const double cpu0 = process_cpu_ms();
    // Not a structured binding: clang 14 cannot capture those in a lambda.
    const std::pair<Tensor, Tensor> batch = batch_for(tokens, s, B, T, cfg.model.vocab);
    const Tensor& inputs = batch.first;
    const Tensor& targets = batch.second;
    auto loss_fn = [&](const ParamTree& p) {
      PrecisionGuard mixed(precision);
      // A training step as the Trainer runs it (dropout is 0 in both configs).
      nn::Ctx ctx{.train = true};
      ctx.recompute = recompute;
      if (formed_logits) ctx.split_output = nn::Ctx::SplitOutput::never;
      const size_t held = CachingAllocator::cpu().stats().bytes_in_use;
      Tensor l = cross_entropy(nn::apply(model, p, inputs, ctx), targets);
      activations = CachingAllocator::cpu().stats().bytes_in_use - held;
      return l;
    };
    auto [loss, grads] = value_and_grad(loss_fn, params);
    opt.step(params, grads);
    last_loss = loss.item();
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
    if (s >= warmup) {
      timed_ms.push_back(ms);
      timed_cpu_ms.push_back(process_cpu_ms() - cpu0);
      activation_mb.push_back(double(activations) / 1e6);
      if (!profiling)
        step_peak_mb.push_back(
            double(CachingAllocator::cpu().stats().peak_bytes_in_use - held_before_step) / 1e6);
    }
    if (s < 2) allocs_after[s] = CachingAllocator::cpu().stats().system_allocs;
    if (losses) losses->print("step {} loss {:.6f} ms {:.3f}\n", s, last_loss, ms);
  }
  profile::enable(false);
  if (losses) losses->close();

  rusage ru{};
  getrusage(RUSAGE_SELF, &ru);
  const double med = median(timed_ms);
  // Every replica's tokens (one replica on the loop path).
  const double tokens_per_s = double(B * T * deployer.dp_size()) / (med / 1e3);
  if (profiling && !through_trainer) print_profile(steps);
  const double flops_per_token = 6 * n_params + 12.0 * double(cfg.model.layers * cfg.model.dim * T);
  fmt::print(
      "model {} parameters; {:.1f} GFLOP/s at 6N + 12*L*d*T flops per token; "
      "{:.1f} CPU-ms per step (median, all threads)\n",
      int64_t(n_params), tokens_per_s * flops_per_token / 1e9, median(timed_cpu_ms));
  const AllocatorStats mem = CachingAllocator::cpu().stats();
  fmt::print(
      "allocator: {} system allocations after step 0, {} after step 1, {} at the end; "
      "peak in use {:.1f} MB, held at the end {:.1f} MB (in use + cached)\n",
      allocs_after[0], allocs_after[1], mem.system_allocs, double(mem.peak_bytes_in_use) / 1e6,
      double(mem.bytes_in_use + mem.bytes_cached) / 1e6);
  fmt::print(
      "RESULT tokens_per_s={:.2f} step_ms_median={:.3f} step_ms_min={:.3f} "
      "step_ms_max={:.3f} final_loss={:.6f} peak_rss_mb={:.1f} activation_mb={:.1f} "
      "step_peak_mb={:.1f}\n",
      tokens_per_s, med, *std::min_element(timed_ms.begin(), timed_ms.end()),
      *std::max_element(timed_ms.begin(), timed_ms.end()), last_loss, double(ru.ru_maxrss) / 1024.0,
      activation_mb.empty() ? 0.0 : median(activation_mb),
      step_peak_mb.empty() ? 0.0 : median(step_peak_mb));
  return 0;
} catch (const std::exception& e) {
  fmt::print(stderr, "bench_gpt_train: {}\n", e.what());
  return 1;
}
