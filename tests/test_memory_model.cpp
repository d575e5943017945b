// The memory model (plan/memory_model.hpp) against the caching allocator:
// every family it models, trained one step on small shapes with and without
// recomputation, in f32 and under Precision::bf16. Parameters, gradients and
// optimizer state must be exact; the activations forward keeps and the
// step's high-water mark within 10%.
#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <random>
#include <utility>

#include "redco/core/allocator.hpp"
#include "redco/models/bart.hpp"
#include "redco/models/bert.hpp"
#include "redco/models/gpt2.hpp"
#include "redco/models/gpt_neox.hpp"
#include "redco/models/gptj.hpp"
#include "redco/models/llama.hpp"
#include "redco/models/opt.hpp"
#include "redco/models/t5.hpp"
#include "redco/optim/optimizer.hpp"
#include "redco/plan/planner.hpp"
#include "redco/plan/time_model.hpp"
#include "redco/train/auto_mesh.hpp"
#include "redco/train/memory_account.hpp"

using namespace redco;

namespace {

constexpr int64_t kRows = 4, kLen = 96, kVocab = 1000;

Tensor random_ids(int64_t rows, int64_t len, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Tensor t = Tensor::empty({rows, len}, DType::i64);
  for (int64_t i = 0; i < rows * len; ++i) t.data<int64_t>()[i] = int64_t(rng() % kVocab);
  return t;
}

struct Measured {
  uint64_t params = 0, grads = 0, opt_state = 0, activations = 0, peak = 0;
};

// Two AdamW steps (the first makes the optimizer's state); the second is measured.
// A classifier (shape.classes > 0) takes one label per row, an LM one per token.
template <typename M>
Measured measure(const M& model, const plan::ModelShape& shape, bool recompute,
                 Precision precision) {
  CachingAllocator& alloc = CachingAllocator::cpu();
  alloc.empty_cache();
  Measured m;
  ParamTree params = nn::init_params(model, 7);
  optim::Optimizer opt = optim::adamw(optim::constant(1e-4f));
  const bool seq2seq = shape.encoder_decoder;
  const Tensor ids = random_ids(kRows, kLen, 1), source = random_ids(kRows, kLen, 3);
  Tensor labels = random_ids(kRows, kLen, 2);
  if (shape.classes > 0) {
    labels = Tensor::empty({kRows}, DType::i64);
    for (int64_t r = 0; r < kRows; ++r) labels.data<int64_t>()[r] = r % shape.classes;
  }
  for (int step = 0; step < 2; ++step) {
    alloc.reset_peak();
    uint64_t kept = 0;
    auto loss = [&](const ParamTree& p) {
      PrecisionGuard mixed(precision);
      nn::Ctx ctx;
      ctx.train = true;
      ctx.recompute = recompute;
      if (seq2seq) ctx.source = source;
      const train::AllocatorDelta forward;
      Tensor l = cross_entropy(nn::apply(model, p, ids, ctx), labels);
      kept = forward.bytes();
      return l;
    };
    auto [l, grads] = value_and_grad(loss, params);
    opt.step(params, grads);
    m.grads = train::tree_bytes(grads);
    m.activations = kept;
  }
  m.peak = alloc.stats().peak_bytes_in_use;
  m.params = train::tree_bytes(params);
  m.opt_state = train::tree_bytes(opt.state());
  return m;
}

template <typename M>
plan::ModelShape shape_of(const typename models::HfFamily<M>::Config& c) {
  return plan::model_shape(
      models::hf::Config(models::HfFamily<M>::to_json(c, io::Json::object()), "test config"));
}

template <typename M>
void check_family(const std::string& name, const typename models::HfFamily<M>::Config& c) {
  // The model as its config.json builds it, which is what the planner reads.
  const models::hf::Config file(models::HfFamily<M>::to_json(c, io::Json::object()), "test config");
  const plan::ModelShape shape = plan::model_shape(file);
  const M model = models::HfFamily<M>::build(models::HfFamily<M>::config(file));
  for (const Precision precision : {Precision::f32, Precision::bf16})
    for (const bool recompute : {false, true}) {
      const Measured got = measure(model, shape, recompute, precision);
      const plan::MemoryBreakdown want = plan::training_memory(
          shape, {.seq_len = kLen, .micro_batch = kRows, .precision = precision},
          {.recompute = recompute});
      INFO(fmt::format("{} {} recompute {}: measured activations {} peak {}; modelled {} / {}",
                       name, precision == Precision::bf16 ? "bf16" : "f32", recompute,
                       got.activations, got.peak, want.activations, want.peak()));
      fmt::print(
          "{:<9} {:<4} recompute {:d}: activations {:7.2f} MiB modelled {:7.2f} ({:+5.1f}%), "
          "peak {:7.2f} MiB modelled {:7.2f} ({:+5.1f}%)\n",
          name, precision == Precision::bf16 ? "bf16" : "f32", recompute,
          got.activations / 1048576.0, want.activations / 1048576.0,
          100.0 * (double(want.activations) / double(got.activations) - 1), got.peak / 1048576.0,
          want.peak() / 1048576.0, 100.0 * (double(want.peak()) / double(got.peak) - 1));
      CHECK(want.params == got.params);
      CHECK(want.grads == got.grads);
      CHECK(double(want.opt_state) ==
            Approx(double(got.opt_state)).epsilon(1e-3));  // + step counters
      CHECK(double(want.activations) == Approx(double(got.activations)).epsilon(0.10));
      CHECK(double(want.peak()) == Approx(double(got.peak)).epsilon(0.10));
    }
}

}  // namespace

TEST_CASE("memory model: decoder-only families against the allocator", "[plan]") {
  check_family<models::Gpt2>(
      "gpt2",
      {.vocab = kVocab, .context = 128, .dim = 128, .layers = 4, .heads = 4, .dropout = 0.1f});
  check_family<models::Llama>(
      "llama",
      {.vocab = kVocab, .dim = 128, .layers = 4, .heads = 4, .kv_heads = 2, .hidden = 352});
  check_family<models::Opt>(
      "opt", {.vocab = kVocab, .context = 128, .dim = 128, .layers = 4, .heads = 4, .ffn = 512});
  check_family<models::Gptj>(
      "gptj",
      {.vocab = kVocab, .context = 128, .dim = 128, .layers = 4, .heads = 4, .rotary_dim = 16});
  check_family<models::GptNeox>("gpt_neox", {.vocab = kVocab,
                                             .dim = 128,
                                             .layers = 4,
                                             .heads = 4,
                                             .hidden = 512,
                                             .rotary_dim = 8,
                                             .context = 128});
}

TEST_CASE("memory model: encoder-decoder families against the allocator", "[plan]") {
  check_family<models::T5>("t5", {.vocab = kVocab,
                                  .dim = 128,
                                  .heads = 4,
                                  .hidden = 512,
                                  .encoder_layers = 3,
                                  .decoder_layers = 3,
                                  .dropout = 0.1f});
  check_family<models::Bart>("bart", {.vocab = kVocab,
                                      .dim = 128,
                                      .encoder_layers = 3,
                                      .decoder_layers = 3,
                                      .encoder_heads = 4,
                                      .decoder_heads = 4,
                                      .encoder_ffn = 512,
                                      .decoder_ffn = 512,
                                      .context = 128,
                                      .dropout = 0.1f});
}

TEST_CASE("memory model: sequence classifiers against the allocator", "[plan]") {
  const models::BertConfig c{.vocab = kVocab,
                             .dim = 128,
                             .layers = 4,
                             .heads = 4,
                             .hidden = 512,
                             .context = 128,
                             .labels = 5,
                             .dropout = 0.1f};
  check_family<models::Bert>("bert", c);
  check_family<models::Roberta>("roberta", c);
}

TEST_CASE("planner: the search, ZeRO's savings and the longest sequence", "[plan]") {
  // GPT-2 large on two 10 GB cards (RedCoast's Table 1, first row).
  const plan::ModelShape shape = plan::model_shape(models::hf::Config(
      models::gpt2_hf_config(
          {.vocab = 50257, .context = 1024, .dim = 1280, .layers = 36, .heads = 20}),
      "gpt2-large"));
  CHECK(shape.n_params() == 774030080);  // transformers' count for gpt2-large
  plan::Cluster c{.device = plan::device_preset("1080ti"),
                  .devices = 2,
                  .intra = plan::link_preset("pcie3"),
                  .inter = plan::link_preset("ib-hdr")};
  c.device.memory = uint64_t(10e9);
  plan::Request r{.model = shape, .cluster = c, .seq_len = 512};
  const std::vector<plan::Candidate> all = plan::search(r);
  REQUIRE(!all.empty());
  REQUIRE(all.front().fits);
  bool misses = false;
  for (size_t i = 0; i < all.size(); ++i) {
    const plan::Candidate& k = all[i];
    CHECK(k.par.dp * k.par.mp == 2);
    CHECK(k.fits == (k.needed + c.device.reserved <= c.device.memory));
    CHECK((!misses || !k.fits));  // the fitting ones first
    misses = misses || !k.fits;
    if (i > 0 && k.fits) CHECK(k.time.tokens_per_s <= all[i - 1].time.tokens_per_s);
  }
  // Two replicas: ZeRO-1 halves the optimizer's state per rank, ZeRO-2 the gradients too.
  auto at = [&](int zero) {
    for (const plan::Candidate& k : all)
      if (k.par.dp == 2 && k.par.zero == zero && !k.par.recompute) return k.memory;
    FAIL("no candidate with ZeRO-" << zero);
    return plan::MemoryBreakdown{};
  };
  CHECK(at(1).opt_state == at(0).opt_state / 2);
  CHECK(at(1).grads == at(0).grads);
  // ... but the tied head's table gradient, made whole in forward, is held
  // whole until the embedding finishes it at backward's end.
  const uint64_t table = uint64_t(50257) * 1280 * 4;
  CHECK(shape.tied_head());
  CHECK(at(2).grads == at(0).grads / 2 + (table - table / 2));
  CHECK(at(2).peak() < at(1).peak());
  CHECK(at(1).peak() < at(0).peak());
  // The longest sequence: it fits, 64 tokens more do not (or the position table ends there).
  r.zero = 0, r.recompute = false;
  const int64_t longest = plan::max_seq_len(r);
  REQUIRE(longest >= 512);
  r.seq_len = longest;
  CHECK(plan::best(r).has_value());
  r.seq_len = longest + 64;
  if (longest < shape.context) CHECK_FALSE(plan::best(r).has_value());
  // Recomputation keeps one block input per block: it reaches further.
  r.recompute = true;
  CHECK(plan::max_seq_len(r) >= longest);
  // OPT-66B does not fit two 10 GB cards however it is cut.
  const plan::ModelShape opt = plan::model_shape(models::hf::Config(
      models::opt_hf_config({.vocab = 50272, .dim = 9216, .layers = 64, .heads = 72, .ffn = 36864}),
      "opt-66b"));
  CHECK_FALSE(plan::best({.model = opt, .cluster = c, .seq_len = 512, .max_zero = 3}).has_value());
}

TEST_CASE("memory model: buckets and ZeRO-3's gathered blocks on a small untied model", "[plan]") {
  // LLaMA, 2 layers of width 128, an untied head: its gradients (one
  // replica's share 1/2) are far smaller than two 25 MiB buckets.
  const plan::ModelShape shape = plan::model_shape(models::hf::Config(
      models::llama_hf_config(
          {.vocab = kVocab, .dim = 128, .layers = 2, .heads = 4, .kv_heads = 2, .hidden = 256}),
      "llama"));
  REQUIRE_FALSE(shape.tied_head());
  const plan::Workload w{.seq_len = 64, .micro_batch = 2};
  const plan::MemoryBreakdown z2 = plan::training_memory(shape, w, {.dp = 2, .zero = 2});
  const plan::MemoryBreakdown z0 = plan::training_memory(shape, w, {.dp = 2, .zero = 0});
  const uint64_t p = z0.params;
  CHECK(z2.buckets == p - p / 2);  // the other owner's share: all there is to send
  CHECK(z0.buckets == p);          // an all-reduce's receive buffer, at most the whole
  // Two gathered blocks: the parameters less both vocabulary tables, over the 2 layers.
  const plan::MemoryBreakdown z3 = plan::training_memory(shape, w, {.dp = 2, .zero = 3});
  const uint64_t tables = 2 * uint64_t(kVocab) * 128 * 4;
  CHECK(z3.gathered == 2 * ((p - tables) / 2));
}

TEST_CASE("time model: the steps measured where the wire is the bottleneck", "[plan]") {
  // Golden values from tools/bench/wire_bound.sh (docs/performance.md, "Over a
  // slow wire"): GPT-2 small, 2 rows x 128 tokens a replica, two hosts joined
  // by a 1 Gbit/s link, one rank each. Per round: the step alone on one host
  // (ms), then the two-host steps under ZeRO-0, 2 and 3. The device rate is
  // set so that the model's compute is the one-host step; the link is tcp1.
  const plan::ModelShape gpt2 = plan::model_shape(models::hf::Config(
      models::gpt2_hf_config(
          {.vocab = 50257, .context = 1024, .dim = 768, .layers = 12, .heads = 12}),
      "gpt2"));
  struct Round {
    double alone, zero0, zero2, zero3;
  };
  const Round rounds[] = {
      {3222, 7038, 6659, 8064}, {2894, 6863, 6158, 8001}, {2951, 6781, 6421, 8014}};
  const plan::Workload w{.seq_len = 128, .micro_batch = 2};
  for (const Round& r : rounds) {
    plan::Cluster c{.device = plan::device_preset("cpu"),
                    .devices = 2,
                    .hosts = 2,
                    .intra = plan::link_preset("shm"),
                    .inter = plan::link_preset("tcp1"),
                    .overlap = plan::overlap_of(false, 2)};
    const double flops = plan::step_time(gpt2, w, {.dp = 2}, c).flops;
    c.device.f32_flops = flops / (r.alone / 1e3);
    for (const auto& [zero, measured] : {std::pair{0, r.zero0}, {2, r.zero2}, {3, r.zero3}}) {
      const plan::StepTime t = plan::step_time(gpt2, w, {.dp = 2, .zero = zero}, c);
      INFO("one host " << r.alone << " ms, ZeRO-" << zero << ": measured " << measured
                       << " ms, modelled " << t.seconds * 1e3 << " ms");
      CHECK(t.compute * 1e3 == Approx(r.alone));
      CHECK(t.seconds * 1e3 / measured == Approx(1.0).margin(0.15));
    }
  }
  // A CPU hides no communication inside a host; accelerators hide all they can.
  CHECK(plan::overlap_of(false, 1) == 0.0);
  CHECK(plan::overlap_of(true, 1) == 1.0);
}

TEST_CASE("n_model_shards = auto: the planner's choice, or a clear refusal", "[plan]") {
  const plan::ModelShape gpt2_large = plan::model_shape(models::hf::Config(
      models::gpt2_hf_config(
          {.vocab = 50257, .context = 1024, .dim = 1280, .layers = 36, .heads = 20}),
      "gpt2-large"));
  // Two 10 GB ranks: one shard with the optimizer's state whole does not fit
  // (params 2.9 + AdamW 5.8 GiB before any activation): the planner cuts.
  const train::MeshChoice c = train::choose_mesh(
      gpt2_large,
      {.seq_len = 512, .global_batch = 2, .memory_per_device = uint64_t(10e9), .world_size = 2});
  INFO(c.why);
  CHECK(c.plan.fits);
  CHECK(c.plan.needed <= uint64_t(10e9));
  CHECK((c.n_model_shards == 2 || c.zero_stage >= 1));
  CHECK(c.why.find("auto: ") == 0);
  // A user's pins are kept: one shard, ZeRO-2.
  const train::MeshChoice z = train::choose_mesh(gpt2_large, {.seq_len = 512,
                                                              .global_batch = 2,
                                                              .memory_per_device = uint64_t(10e9),
                                                              .n_model_shards = 1,
                                                              .zero_stage = 2,
                                                              .world_size = 2});
  CHECK(z.n_model_shards == 1);
  CHECK(z.zero_stage == 2);
  // Pinned to a cut that does not fit (one shard, ZeRO-0, no recomputation):
  // refused, naming a cut the planner would take instead.
  try {
    train::choose_mesh(gpt2_large, {.seq_len = 512,
                                    .global_batch = 2,
                                    .memory_per_device = uint64_t(10e9),
                                    .n_model_shards = 1,
                                    .zero_stage = 0,
                                    .recompute = false,
                                    .world_size = 2});
    FAIL("choose_mesh accepted ZeRO-0 without recomputation for GPT-2 large on 10 GB");
  } catch (const Error& e) {
    const std::string m = e.what();
    INFO(m);
    CHECK(m.find("does not fit 2 device(s)") != std::string::npos);
    CHECK(m.find("given are what does not fit") != std::string::npos);
    CHECK(m.find("--n-model-shards auto") != std::string::npos);
  }
  // 3 GB each: nothing fits, said before anything is allocated, with the need.
  try {
    train::choose_mesh(
        gpt2_large,
        {.seq_len = 512, .global_batch = 2, .memory_per_device = uint64_t(3e9), .world_size = 2});
    FAIL("choose_mesh accepted 3 GB per rank for GPT-2 large");
  } catch (const Error& e) {
    const std::string m = e.what();
    INFO(m);
    CHECK(m.find("does not fit 2 device(s) of 2.79 GiB") != std::string::npos);
    CHECK(m.find("optimizer state") != std::string::npos);
    CHECK(m.find("redco-plan") != std::string::npos);
  }
}
