// ZeRO (Deployer zero_stage 1, 2 and 3) with parameter groups and custom steps:
// per-group optimizers and schedules, frozen parameters (no gradient, no
// state, not partitioned) and a polyak target train as the same mesh without
// ZeRO does, within 1e-6 relative over 10 steps at (dp, mp) = (2, 1) and
// (2, 2) on thread communicators, and each replica keeps about 1/dp of the
// optimizer state.
#include <catch2/catch.hpp>
#include <random>
#include <string>
#include <vector>

#include "lm_windows.hpp"
#include "redco/comm/threads_comm.hpp"
#include "redco/models/gpt2.hpp"
#include "redco/train/memory_account.hpp"
#include "redco/train/trainer.hpp"
#include "tree_checks.hpp"

using namespace redco;
using test::check_close;
using test::LmBatch;
using test::Window;

namespace {

const models::Gpt2Config kGpt{
    .vocab = 64, .context = 16, .dim = 16, .layers = 2, .heads = 4, .dropout = 0.1f};
// The LM's embedding [512, 16] is over half the trained parameters: ZeRO
// splits it among the replicas (owned parts are views the groups step).
const models::Gpt2Config kTied{
    .vocab = 512, .context = 16, .dim = 16, .layers = 2, .heads = 4, .dropout = 0.1f};

LmBatch collate(std::span<const Window> ws) { return test::collate_windows(ws); }

std::vector<Window> windows() {
  std::vector<Window> data(32);
  std::mt19937_64 rng(7);
  for (Window& w : data)
    for (int t = 0; t < 17; ++t) w.ids.push_back(int64_t(rng() % 64));
  return data;
}

// An LM and its polyak target; the biases train with SGD and momentum, the
// rest of the LM with AdamW (each with its own schedule), the position
// embedding and the target stay frozen.
train::ParamGroups groups() {
  return train::ParamGroups()
      .freeze("target")
      .freeze("positions", [](const std::string& n) { return n == "lm.wpe.weight"; })
      .train(
          "biases", [](const std::string& n) { return n.ends_with("bias"); },
          optim::sgd(optim::linear(0.05f, 0.01f, 10), {.momentum = 0.9f}))
      .train("lm", optim::adamw(optim::linear(1e-2f, 1e-3f, 10), {.max_grad_norm = 0.5f}))
      .polyak("target", "lm", 0.2f);
}

struct Run {
  int world = 2, mp = 1, zero = 0;
  bool custom = false;  // a custom step instead of the default one
  models::Gpt2Config model = kGpt;
};

struct Result {
  ParamTree params;                     // whole, after training
  std::vector<double> losses;           // per step
  std::vector<uint64_t> state_bytes;    // each rank's optimizer state
  std::vector<std::string> state_keys;  // rank 0's
};

Result fit(const Run& run) {
  const std::vector<Window> data = windows();
  const auto gpt = models::gpt2(run.model);
  const auto pair = nn::parts(nn::named<"lm">(gpt), nn::named<"target">(gpt));
  auto loss = [](auto& m, const LmBatch& b, train::Rng) {
    return cross_entropy(part<"lm">(m)(b.inputs), b.targets) +
           cross_entropy(part<"target">(m)(b.inputs), b.targets) * 0.1f;
  };
  // The default step's loss and gradients, written as a custom step.
  auto step = [&](auto& s, const LmBatch& b, train::Rng rng) {
    auto [l, g] = s.value_and_grad([&](auto& m) { return loss(m, b, rng); });
    return train::StepResult{l, g};
  };
  std::vector<Result> out(static_cast<size_t>(run.world));
  comm::ThreadsWorld w(run.world);
  w.run([&](comm::Comm& c) {
    train::Deployer d(
        {.n_model_shards = run.mp, .seed = 3, .quiet = true, .world = &c, .zero_stage = run.zero});
    train::Trainer trainer(d, pair, collate, loss, groups());
    Result& r = out[size_t(c.rank())];
    const train::FitOptions<Window> o{
        .global_batch_size = 8,
        .n_epochs = 100,
        .save_at_end = false,
        .max_steps = 10,
        .on_step = [&](const train::StepInfo& s) { r.losses.push_back(s.loss); }};
    if (run.custom) {
      trainer.fit(data, o, step);
    } else {
      trainer.fit(data, o);
    }
    r.params = trainer.whole_params();
    const ParamTree state = trainer.groups().state();
    r.state_bytes.push_back(train::tree_bytes(state));
    for (const auto& [k, t] : state) r.state_keys.push_back(k);
  });
  Result all = out[0];
  all.state_bytes.clear();
  for (const Result& r : out) {
    CHECK(r.losses == out[0].losses);
    all.state_bytes.push_back(r.state_bytes[0]);
  }
  return all;
}

void check_zero_matches_plain(bool custom, const models::Gpt2Config& model) {
  for (const auto& [world, mp] : {std::pair{2, 1}, std::pair{4, 2}}) {
    const Result plain = fit({.world = world, .mp = mp, .custom = custom, .model = model});
    REQUIRE(plain.losses.size() == 10);
    CHECK(plain.losses.back() < plain.losses.front());
    for (const int stage : {1, 2, 3}) {
      if (custom && stage == 3) continue;  // refused: a custom step reads whole parameters
      const int dp = world / mp;
      INFO("dp " << dp << ", mp " << mp << ", stage " << stage);
      const Result zero =
          fit({.world = world, .mp = mp, .zero = stage, .custom = custom, .model = model});
      check_close(zero.losses, plain.losses, 1e-6);
      check_close(zero.params, plain.params, 1e-6);
      // Frozen parameters have no optimizer state anywhere.
      for (const std::string& k : zero.state_keys) {
        INFO(k);
        CHECK_FALSE(k.ends_with(".lm.wpe.weight"));
        CHECK(k.find(".target.") == std::string::npos);
      }
      // Each replica keeps about 1/dp of its model shard's state; together
      // they hold it once, plus a step count per trained group each.
      for (int m = 0; m < mp; ++m) {
        uint64_t sum = 0;
        for (int k = 0; k < dp; ++k) {
          const uint64_t b = zero.state_bytes[size_t(k * mp + m)];
          INFO("replica " << k << " of shard " << m << ": " << b << " of "
                          << plain.state_bytes[size_t(m)] << " bytes");
          CHECK(double(b) < 1.25 * double(plain.state_bytes[size_t(m)]) / dp);
          sum += b;
        }
        CHECK(sum == plain.state_bytes[size_t(m)] + uint64_t(dp - 1) * 2 * 8);
      }
    }
  }
}

}  // namespace

TEST_CASE("ZeRO with parameter groups, frozen parameters and a polyak target", "[zero][groups]") {
  check_zero_matches_plain(false, kGpt);
  check_zero_matches_plain(false, kTied);  // the embedding split among the replicas
}

TEST_CASE("ZeRO with a custom step", "[zero][groups]") {
  check_zero_matches_plain(true, kGpt);
  check_zero_matches_plain(true, kTied);  // the embedding split among the replicas
}

TEST_CASE("ZeRO with fewer trained parameters than replicas is one clear error", "[zero][groups]") {
  const auto gpt = models::gpt2(kGpt);
  auto loss = [](auto& model, const LmBatch& b, train::Rng) {
    return cross_entropy(model(b.inputs), b.targets);
  };
  comm::ThreadsWorld w(2);
  CHECK_THROWS_WITH(w.run([&](comm::Comm& c) {
    train::Deployer d({.seed = 3, .quiet = true, .world = &c, .zero_stage = 1});
    train::Trainer t(d, gpt, collate, loss,
                     train::ParamGroups()
                         .train(
                             "one", [](const std::string& n) { return n == "ln_f.bias"; },
                             optim::sgd(optim::constant(0.1f)))
                         .freeze(""));
  }),
                    Catch::Contains("parameters cannot be shared out among 2"));
}

TEST_CASE("ZeRO-3 refuses a custom step with one clear message", "[zero][groups]") {
  CHECK_THROWS_WITH(fit({.world = 2, .zero = 3, .custom = true}),
                    Catch::Contains("custom step") && Catch::Contains("zero_stage 2"));
}
