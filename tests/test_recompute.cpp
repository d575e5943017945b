// Activation recomputation: checkpoint() in autodiff, nn::checkpoint and
// Ctx::recompute in the DSL, FitOptions::recompute in the Trainer. The
// reference is the same computation without recomputation: gradients (and
// trained parameters) must be equal bit for bit, dropout included, while the
// bytes held between forward and backward fall.
#include <catch2/catch.hpp>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <vector>

#include "lm_windows.hpp"
#include "redco/comm/threads_comm.hpp"
#include "redco/core/allocator.hpp"
#include "redco/io/json.hpp"
#include "redco/models/gpt2.hpp"
#include "redco/plan/planner.hpp"
#include "redco/train/auto_mesh.hpp"
#include "redco/train/trainer.hpp"

using namespace redco;

namespace {

Tensor randn(Shape s, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  Tensor t = Tensor::empty(s);
  for (int64_t i = 0; i < t.numel(); ++i) t.data<float>()[i] = normal(rng);
  return t;
}

bool same_bits(const Tensor& a, const Tensor& b) {
  return a.shape() == b.shape() && a.dtype() == b.dtype() &&
         std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0;
}

void check_bitwise(const ParamTree& got, const ParamTree& want) {
  REQUIRE(got.size() == want.size());
  for (const auto& [name, t] : want) {
    INFO("'" << name << "'");
    CHECK(same_bits(got.at(name), t));
  }
}

}  // namespace

TEST_CASE("checkpoint: gradients equal the plain run's, captured tensors included", "[recompute]") {
  const ParamTree p = {{"w", randn({6, 5}, 1)}, {"b", randn({5}, 2)}, {"x", randn({4, 6}, 3)}};
  // x -> tanh(x W + b) * (x W): x and W are read twice, b is captured by the block.
  auto block = [](const ParamTree& q, const Tensor& h) {
    const Tensor y = matmul(h, q.at("w"));
    return mul(tanh(add(y, q.at("b"))), y);
  };
  auto loss = [&](const ParamTree& q, bool recompute) {
    const Tensor h = sigmoid(q.at("x"));
    const Tensor y = recompute ? checkpoint([=] { return block(q, h); }) : block(q, h);
    return sum(mul(y, add(y, h.dim(0) == 4 ? 1.f : 0.f)));
  };
  const auto [l0, g0] = value_and_grad([&](const ParamTree& q) { return loss(q, false); }, p);
  const auto [l1, g1] = value_and_grad([&](const ParamTree& q) { return loss(q, true); }, p);
  CHECK(same_bits(l1, l0));
  check_bitwise(g1, g0);

  SECTION("nested checkpoints") {
    // Two evaluations of the block: one checkpointed twice over, one once.
    auto two = [&](const ParamTree& q, bool recompute) {
      const Tensor h = sigmoid(q.at("x"));
      const Tensor a = recompute
                           ? checkpoint([=] { return checkpoint([=] { return block(q, h); }); })
                           : block(q, h);
      const Tensor b = recompute ? checkpoint([=] { return block(q, h); }) : block(q, h);
      return sum(mul(a, add(b, 1.f)));
    };
    const auto [l2, g2] = value_and_grad([&](const ParamTree& q) { return two(q, false); }, p);
    const auto [l3, g3] = value_and_grad([&](const ParamTree& q) { return two(q, true); }, p);
    CHECK(same_bits(l3, l2));
    check_bitwise(g3, g2);
  }
  SECTION("gradients of gradients are refused with a clear message") {
    CHECK_THROWS_WITH(value_and_grad([&](const ParamTree& q) { return loss(q, true); }, p,
                                     {.create_graph = true}),
                      Catch::Contains("create_graph") && Catch::Contains("nn::checkpoint"));
  }
}

TEST_CASE("checkpoint: without grad mode the block just runs", "[recompute]") {
  const Tensor x = randn({3}, 4).set_requires_grad(true);
  NoGradGuard off;
  const Tensor y = checkpoint([&] { return exp(x); });
  CHECK(!y.requires_grad());
  CHECK(same_bits(y, exp(x.detach())));
}

namespace {

const models::Gpt2Config kGpt{
    .vocab = 64, .context = 16, .dim = 32, .layers = 3, .heads = 4, .dropout = 0.1f};

Tensor token_ids(int64_t b, int64_t t, uint64_t seed) {
  std::mt19937_64 rng(seed);
  Tensor ids = Tensor::empty({b, t}, DType::i64);
  for (int64_t i = 0; i < ids.numel(); ++i) ids.data<int64_t>()[i] = int64_t(rng() % 64);
  return ids;
}

// Loss and gradients of one dropout training step; activation_bytes receives
// what the allocator holds at the end of forward beyond what it held before.
template <typename Model>
std::pair<Tensor, ParamTree> gpt_step(const Model& model, const ParamTree& params, bool recompute,
                                      size_t* activation_bytes = nullptr) {
  const Tensor ids = token_ids(4, 16, 7), targets = token_ids(4, 16, 8);
  return value_and_grad(
      [&](const ParamTree& p) {
        const size_t before = CachingAllocator::cpu().stats().bytes_in_use;
        nn::Ctx ctx{.train = true, .seed = 11, .step = 5};
        ctx.recompute = recompute;
        Tensor l = cross_entropy(nn::apply(model, p, ids, ctx), targets);
        if (activation_bytes)
          *activation_bytes = CachingAllocator::cpu().stats().bytes_in_use - before;
        return l;
      },
      params);
}

}  // namespace

TEST_CASE("GPT-2 with dropout: recomputed blocks give the plain gradients bit for bit",
          "[recompute]") {
  const auto gpt = models::gpt2(kGpt);
  const ParamTree params = nn::init_params(gpt, 3);
  size_t plain_bytes = 0, recomputed_bytes = 0;
  const auto [l0, g0] = gpt_step(gpt, params, false, &plain_bytes);
  const auto [l1, g1] = gpt_step(gpt, params, true, &recomputed_bytes);
  CHECK(same_bits(l1, l0));
  check_bitwise(g1, g0);
  // Each block keeps its input [4, 16, 32] instead of its activations.
  INFO("plain " << plain_bytes << " B, recomputed " << recomputed_bytes << " B");
  CHECK(recomputed_bytes < plain_bytes / 2);

  SECTION("bf16 mixed precision too") {
    PrecisionGuard mixed(Precision::bf16);
    const auto [b0, h0] = gpt_step(gpt, params, false);
    const auto [b1, h1] = gpt_step(gpt, params, true);
    CHECK(!same_bits(b0, l0));  // bf16 did change the computation
    CHECK(same_bits(b1, b0));
    check_bitwise(h1, h0);
  }
  SECTION("dropout draws differ without the replay (the test can fail)") {
    nn::Ctx a{.train = true, .seed = 11, .step = 5}, b = a;
    b.dropout_calls = 1;
    const Tensor ids = token_ids(4, 16, 7);
    NoGradGuard off;
    CHECK(!same_bits(nn::apply(gpt, params, ids, a), nn::apply(gpt, params, ids, b)));
  }
  SECTION("nn::checkpoint around a single residual of a hand-built model") {
    const int64_t d = kGpt.dim;
    auto block = [&](auto attn_or_mlp) {
      return nn::residual(nn::layer_norm(d) | std::move(attn_or_mlp) | nn::dropout(0.1f));
    };
    auto build = [&](auto wrap) {
      return (nn::embedding(64, d) + nn::positions(16, d)) | nn::dropout(0.1f) |
             nn::repeat(3, wrap(block(nn::causal_attention(d, 4))) | block(nn::mlp(d, 4 * d))) |
             nn::named<"ln_f">(nn::layer_norm(d)) | nn::tied_lm_head(64);
    };
    const auto plain = build([](auto b) { return b; });
    const auto ckpt = build([](auto b) { return nn::checkpoint(std::move(b)); });
    const ParamTree p = nn::init_params(plain, 4);
    REQUIRE(nn::param_entries(ckpt).size() == p.size());  // the same names: transparent
    const auto [m0, h0] = gpt_step(plain, p, false);
    const auto [m1, h1] = gpt_step(ckpt, p, false);
    CHECK(same_bits(m1, m0));
    check_bitwise(h1, h0);
  }
}

namespace {

using test::LmBatch;
using test::Window;
LmBatch collate(std::span<const Window> ws) { return test::collate_windows(ws); }

// Whole trained parameters and step losses on a (world, mp) mesh of threads;
// with a workdir, metrics.jsonl is written there.
std::pair<ParamTree, std::vector<double>> fit(int world, int mp, bool recompute,
                                              const std::filesystem::path& workdir = {}) {
  std::vector<Window> data(32);
  std::mt19937_64 rng(5);
  for (Window& w : data)
    for (int t = 0; t < 17; ++t) w.ids.push_back(int64_t(rng() % 64));
  const auto gpt = models::gpt2(kGpt);
  std::vector<std::pair<ParamTree, std::vector<double>>> out(static_cast<size_t>(world));
  auto rank = [&](comm::Comm* c) {
    train::Deployer d(
        {.n_model_shards = mp, .seed = 3, .workdir = workdir, .quiet = true, .world = c});
    train::Trainer trainer(
        d, gpt, collate,
        [](auto& model, const LmBatch& b, train::Rng) {
          return cross_entropy(model(b.inputs), b.targets);
        },
        optim::adamw(optim::constant(1e-2f)));
    auto& r = out[size_t(c ? c->rank() : 0)];
    trainer.fit(data, {.global_batch_size = 8,
                       .n_epochs = 1,
                       .save_at_end = false,
                       .on_step = [&](const train::StepInfo& s) { r.second.push_back(s.loss); },
                       .recompute = recompute});
    r.first = trainer.whole_params();
  };
  if (world == 1) {
    rank(nullptr);
    return out[0];
  }
  comm::ThreadsWorld w(world);
  w.run([&](comm::Comm& c) { rank(&c); });
  return out[0];
}

}  // namespace

TEST_CASE("Trainer: FitOptions::recompute trains bit for bit as without it", "[recompute]") {
  for (const auto& [world, mp] : {std::pair{1, 1}, std::pair{2, 2}}) {
    INFO("world " << world << ", n_model_shards " << mp);
    const auto [p0, l0] = fit(world, mp, false);
    const auto [p1, l1] = fit(world, mp, true);
    REQUIRE(l0.size() == 4);
    CHECK(l1 == l0);
    check_bitwise(p1, p0);
  }
}

namespace {

struct TempDir {
  std::filesystem::path path = std::filesystem::temp_directory_path() /
                               ("redco-recompute-" + std::to_string(std::random_device{}()));
  TempDir() { std::filesystem::create_directories(path); }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

// The "memory" line of a run's metrics.jsonl.
io::Json memory_line(const std::filesystem::path& workdir) {
  std::ifstream f(workdir / "metrics.jsonl");
  std::string line;
  while (std::getline(f, line)) {
    io::Json j = io::Json::parse(line);
    if (j.at("split").as_string() == "memory") return j;
  }
  FAIL("no memory line in " << (workdir / "metrics.jsonl").string());
  return {};
}

}  // namespace

TEST_CASE("fit logs every rank's memory after its second step", "[recompute]") {
  const auto gpt = models::gpt2(kGpt);
  const double params_mib = double(nn::count_parameters(nn::init_params(gpt, 0))) * 4 / 1048576.0;
  TempDir plain, recomputed, mesh;
  fit(1, 1, false, plain.path);
  fit(1, 1, true, recomputed.path);
  const io::Json a = memory_line(plain.path), b = memory_line(recomputed.path);
  CHECK(a.at("step").as_int() == 2);  // the second step: the optimizer's state held throughout
  CHECK(a.at("rank0.params_mib").as_double() == Approx(params_mib).epsilon(1e-9));
  CHECK(a.at("rank0.grads_mib").as_double() == Approx(params_mib).epsilon(1e-9));
  // AdamW: two moments per parameter (plus a step counter or two).
  CHECK(a.at("rank0.opt_state_mib").as_double() == Approx(2 * params_mib).epsilon(1e-3));
  CHECK(a.at("rank0.slack_mib").as_double() >= 0);
  const double act_plain = a.at("rank0.activations_mib").as_double();
  const double act_recomputed = b.at("rank0.activations_mib").as_double();
  INFO("activations: plain " << act_plain << " MiB, recomputed " << act_recomputed << " MiB");
  CHECK(act_plain > 0);
  CHECK(act_recomputed < act_plain / 2);
  // The step's high-water mark holds the parameters, the optimizer's state
  // and the activations at once (forward's end), and recomputation lowers it.
  for (const io::Json* m : {&a, &b})
    CHECK(m->at("rank0.peak_mib").as_double() >= m->at("rank0.params_mib").as_double() +
                                                     m->at("rank0.opt_state_mib").as_double() +
                                                     m->at("rank0.activations_mib").as_double());
  CHECK(b.at("rank0.peak_mib").as_double() < a.at("rank0.peak_mib").as_double());

  // 2 model shards x 2 replicas: each rank holds about half of the parameters
  // (norms and biases of row-parallel layers stay whole) and logs its own.
  fit(4, 2, false, mesh.path);
  const io::Json m = memory_line(mesh.path);
  for (int r = 0; r < 4; ++r) {
    INFO("rank " << r);
    const double p = m.at("rank" + std::to_string(r) + ".params_mib").as_double();
    CHECK(p > 0.45 * params_mib);
    CHECK(p < 0.6 * params_mib);
    CHECK(m.at("rank" + std::to_string(r) + ".opt_state_mib").as_double() ==
          Approx(2 * p).epsilon(1e-3));
  }
}

TEST_CASE("DeployerConfig::auto_mesh: the planner cuts the run, fit follows", "[recompute]") {
  const train::AutoMesh mesh{
      plan::model_shape(models::hf::Config(models::gpt2_hf_config(kGpt), "kGpt")),
      {.seq_len = 16, .global_batch = 8}};
  std::vector<Window> data(32);
  std::mt19937_64 rng(5);
  for (Window& w : data)
    for (int t = 0; t < 17; ++t) w.ids.push_back(int64_t(rng() % 64));
  const auto gpt = models::gpt2(kGpt);
  // Budgets per rank: room for anything; the plain cut's need less a byte
  // (the planner must cut further: ZeRO, recomputation or a smaller
  // micro-batch); a tenth of the optimizer's state (nothing fits).
  const plan::Candidate plain =
      *plan::best({.model = mesh.model,
                   .cluster = {.device = plan::device_preset("cpu"), .devices = 2},
                   .seq_len = 16,
                   .global_batch = 8,
                   .zero = 0,
                   .recompute = false,
                   .micro_batch = 4});
  for (const uint64_t budget : {uint64_t(1) << 30, plain.needed - 1}) {
    INFO("budget " << budget << " bytes per rank; one shard, no ZeRO, 4 rows: " << plain.needed);
    train::AutoMesh m = mesh;
    m.options.memory_per_device = budget;
    comm::ThreadsWorld w(2);
    std::vector<std::vector<double>> losses(2);
    w.run([&](comm::Comm& c) {
      train::Deployer d({.quiet = true, .world = &c, .auto_mesh = &m});
      const train::MeshChoice& choice = *d.mesh_choice();
      CHECK(d.n_model_shards() == choice.n_model_shards);
      CHECK(d.zero_stage() == choice.zero_stage);
      CHECK(choice.plan.needed <= budget);
      if (budget < plain.needed)  // the plain cut did not fit: something else was chosen
        CHECK((choice.n_model_shards > 1 || choice.zero_stage > 0 || choice.recompute ||
               choice.micro_batch < 4));
      train::Trainer trainer(
          d, gpt, collate,
          [](auto& model, const LmBatch& b, train::Rng) {
            return cross_entropy(model(b.inputs), b.targets);
          },
          optim::adamw(optim::constant(1e-2f)));
      trainer.fit(data, {.global_batch_size = 8,
                         .n_epochs = 1,
                         .save_at_end = false,
                         .on_step = [&](const train::StepInfo& s) {
                           losses[size_t(c.rank())].push_back(s.loss);
                         }});
    });
    CHECK(losses[0].size() == 4);
    CHECK(losses[0] == losses[1]);
  }
  // Too little for the optimizer's state: the Deployer refuses, naming the need.
  train::AutoMesh tiny = mesh;
  tiny.options.memory_per_device = plain.memory.opt_state / 10;
  comm::ThreadsWorld w(2);
  w.run([&](comm::Comm& c) {
    CHECK_THROWS_WITH(
        train::Deployer({.quiet = true, .world = &c, .auto_mesh = &tiny}),
        Catch::Contains("does not fit 2 device(s)") && Catch::Contains("optimizer state"));
  });
}
