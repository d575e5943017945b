// Pipelines beyond one model and one loss: nn::parts collections with
// per-part optimizers, frozen parameters, adapter-only checkpoints and polyak
// targets, also on dp x mp meshes; examples made per epoch (resuming bit for
// bit). Expected values are computed by hand in double from closed-form
// gradients of a linear model (tests/pipelines_fixtures.hpp).
#include <fstream>
#include <map>
#include <string>

#include "pipelines_fixtures.hpp"
#include "redco/io/json.hpp"

using namespace pipelines;

// The compile-time plan of a collection: each part's own alternation.
using ActorCritic = decltype(nn::parts(
    nn::named<"actor">(nn::linear(4, 8) | nn::relu() | nn::linear(8, 2)),
    nn::named<"critic">(nn::linear(4, 8) | nn::relu() | nn::linear(8, 8) | nn::linear(8, 1))));
constexpr auto ac_plan = shard::plan_v<ActorCritic>;
static_assert(ac_plan.split("actor.fc_1.weight") == 0 && ac_plan.split("actor.fc_2.weight") == 1);
static_assert(ac_plan.split("critic.fc_1.weight") == 0 &&
              ac_plan.split("critic.fc_2.weight") == 1 && ac_plan.split("critic.fc_3.weight") == 0);

TEST_CASE("parts: names under each part, per-part plans from the two rules", "[pipelines]") {
  const auto ac = nn::parts(nn::named<"actor">(nn::linear(4, 8) | nn::relu() | nn::linear(8, 2)),
                            nn::named<"critic">(nn::linear(4, 8) | nn::relu() | nn::linear(8, 1)));
  const ParamTree p = nn::init_params(ac, 1);
  CHECK(p.contains("actor.fc_1.weight"));
  CHECK(p.contains("critic.fc_2.bias"));
  CHECK(p.size() == 8);
  // Each part alone would split column then row; in the collection it does too.
  for (const shard::ParamSplit& s : shard::resolve(ac, 2)) {
    INFO(s.name);
    if (s.name.ends_with("fc_1.weight")) CHECK(s.split_dim == 0);
    if (s.name.ends_with("fc_2.weight")) CHECK(s.split_dim == 1);
  }
  // A part runs like the model alone with the same parameters.
  const auto actor = nn::linear(4, 8) | nn::relu() | nn::linear(8, 2);
  ParamTree alone;
  for (const auto& [n, t] : p)
    if (n.starts_with("actor.")) alone.emplace(n.substr(6), t);
  const Tensor x = Tensor::normal({5, 4}, 3, 1, 0.f, 1.f);
  nn::Ctx ctx;
  const Tensor y1 = nn::apply_part<"actor">(ac, p, x, ctx);
  const Tensor y2 = nn::apply(actor, alone, x);
  CHECK(std::memcmp(y1.raw(), y2.raw(), y1.nbytes()) == 0);
}

TEST_CASE("frozen parameters stay bitwise; per-part learning rates give the SGD update",
          "[pipelines]") {
  const std::vector<Point> data = make_points(8, 1);
  Deployer d({.seed = 5, .quiet = true});
  Trainer trainer(d, three, collate, sum_loss,
                  ParamGroups()
                      .train("a", optim::sgd(optim::constant(0.1f)))
                      .train("b", optim::sgd(optim::constant(0.01f)))
                      .freeze("frozen"));
  const ParamTree before = clone(trainer.params());
  trainer.fit(data, {.global_batch_size = 8, .n_epochs = 1, .shuffle = false});
  const ParamTree& after = trainer.params();
  // The prediction is the sum of the three parts, so every part's gradient is
  // the gradient of mse with respect to a linear model with the summed weights.
  Vec sum(kIn + 1, 0.0);
  for (const char* part : {"a.", "b.", "frozen."}) {
    const Vec w = weights(before, part);
    for (size_t i = 0; i < sum.size(); ++i) sum[i] += w[i];
  }
  const Vec g = mse_grad(sum, data);
  for (auto [part, lr] : {std::pair{"a.", 0.1}, std::pair{"b.", 0.01}}) {
    INFO("part " << part);
    Vec want = weights(before, part);
    for (size_t i = 0; i < want.size(); ++i) want[i] -= lr * g[i];
    check_vec(weights(after, part), want, 1e-6);
  }
  for (const char* n : {"frozen.weight", "frozen.bias"})
    CHECK(std::memcmp(after.at(n).raw(), before.at(n).raw(), after.at(n).nbytes()) == 0);
  // No optimizer state for them, and one step count per trained group.
  const ParamTree state = trainer.groups().state();
  for (const auto& [key, t] : state) CHECK(key.find("frozen") == std::string::npos);
  CHECK(state.contains("step.a"));
  CHECK(state.contains("step.b"));
  CHECK(trainer.groups().optimizer("b").lr() == 0.01f);
}

TEST_CASE("parameter groups: a clear error for an unclaimed parameter or an unknown part",
          "[pipelines]") {
  Deployer d({.seed = 5, .quiet = true});
  auto unclaimed = [&] {
    Trainer t(d, three, collate, sum_loss,
              ParamGroups().train("a", optim::sgd(optim::constant(0.1f))).freeze("frozen"));
  };
  CHECK_THROWS_WITH(unclaimed(), Catch::Contains("no parameter group claims the parameter 'b."));
  auto unknown = [&] {
    Trainer t(d, three, collate, sum_loss,
              ParamGroups().train("actor", optim::sgd(optim::constant(0.1f))).freeze(""));
  };
  CHECK_THROWS_WITH(unknown(), Catch::Contains("'actor' claims no parameter"));
  auto all_frozen = [&] { Trainer t(d, three, collate, sum_loss, ParamGroups().freeze("")); };
  CHECK_THROWS_WITH(all_frozen(), Catch::Contains("every parameter group is frozen"));
}

TEST_CASE("adapter-only checkpoints leave the frozen part out and resume bit for bit",
          "[pipelines]") {
  const std::vector<Point> data = make_points(32, 2);
  auto groups = [] {
    return ParamGroups()
        .freeze("frozen", {.checkpoint = false})
        .train("", optim::adam(optim::constant(0.05f)));
  };
  auto run = [&](const fs::path& dir, int64_t max_steps, bool resume) {
    Deployer d({.seed = 7, .workdir = dir, .quiet = true});
    Trainer trainer(d, three, collate, sum_loss, groups());
    trainer.fit(data, {.global_batch_size = 4,
                       .n_epochs = 2,
                       .save_every_steps = 3,
                       .resume = resume,
                       .max_steps = max_steps});
    return clone(trainer.params());
  };
  TempDir whole, parts;
  const ParamTree straight = run(whole.path, 0, false);
  // The first step's memory line counts the trained parameters' gradients
  // and Adam buffers only (the frozen part has neither).
  double trained_bytes = 0;
  for (const auto& [name, t] : straight)
    if (!name.starts_with("frozen.")) trained_bytes += double(t.nbytes());
  int memory_lines = 0;
  std::ifstream metrics(whole.path / "metrics.jsonl");
  for (std::string line; std::getline(metrics, line);) {
    const io::Json j = io::Json::parse(line);
    if (j.at("split").as_string() != "memory") continue;
    ++memory_lines;
    const double mib = 1024.0 * 1024.0;
    CHECK(j.at("rank0.grads_mib").as_double() * mib == Approx(trained_bytes).epsilon(1e-6));
    CHECK(j.at("rank0.opt_state_mib").as_double() * mib >= 2 * trained_bytes);
    CHECK(j.at("rank0.opt_state_mib").as_double() * mib < 2 * trained_bytes + 64);
  }
  CHECK(memory_lines == 1);
  run(parts.path, 7, false);
  const ParamTree resumed = run(parts.path, 0, true);
  CHECK(bitwise_equal(resumed, straight));
  const io::SafetensorsReader file(parts.path / "ckpt/step-000006" / io::kCheckpointParams);
  CHECK(file.contains("a.weight"));
  CHECK_FALSE(file.contains("frozen.weight"));
  CHECK_FALSE(file.contains("frozen.bias"));
}

TEST_CASE("a polyak target starts as a copy of its source; given parameters are kept",
          "[pipelines]") {
  const auto net = nn::linear(kIn, 4) | nn::tanh() | nn::linear(4, 1);
  const auto pair = nn::parts(nn::named<"online">(net), nn::named<"target">(net));
  auto groups = [] {
    return ParamGroups()
        .train("online", optim::sgd(optim::constant(0.1f)))
        .freeze("target")
        .polyak("target", "online", 0.5f);
  };
  const auto loss = [](auto& m, const Batch& b, Rng) { return mse(part<"online">(m)(b.x), b.y); };
  Deployer d({.seed = 4, .quiet = true});
  const ParamTree init = nn::init_params(pair, 4);
  // Initialised apart (each parameter has its own stream), then copied.
  CHECK_FALSE(bitwise_equal(ParamTree{{"w", init.at("online.fc_1.weight")}},
                            ParamTree{{"w", init.at("target.fc_1.weight")}}));
  Trainer fresh(d, pair, collate, loss, groups());
  for (const auto& [n, t] : fresh.params()) {
    INFO(n);
    const std::string twin = n.starts_with("target.") ? "online" + n.substr(6) : n;
    CHECK(std::memcmp(t.raw(), fresh.params().at(twin).raw(), t.nbytes()) == 0);
    CHECK(std::memcmp(t.raw(), init.at(twin).raw(), t.nbytes()) == 0);  // the source's own init
  }
  Trainer given(d, pair, collate, loss, groups(), clone(init));
  CHECK(bitwise_equal(given.params(), init));
}

TEST_CASE("a polyak target is the tau-mix of its source after every step", "[pipelines]") {
  const std::vector<Point> data = make_points(16, 3);
  const auto net = nn::linear(kIn, 4) | nn::tanh() | nn::linear(4, 1);
  const auto pair = nn::parts(nn::named<"online">(net), nn::named<"target">(net));
  const auto loss = [](auto& m, const Batch& b, Rng) {
    // The target enters the loss (as a TD target would) but gets no gradient.
    return mse(part<"online">(m)(b.x), b.y) + 0.1f * mean(part<"target">(m)(b.x));
  };
  Deployer d({.seed = 9, .quiet = true});
  constexpr float tau = 0.25f;
  Trainer trainer(d, pair, collate, loss,
                  ParamGroups()
                      .train("online", optim::adam(optim::constant(0.05f)))
                      .freeze("target")
                      .polyak("target", "online", tau));
  ParamTree want;  // the target by hand, parameter by parameter
  for (const auto& [n, t] : trainer.params())
    if (n.starts_with("target.")) want.emplace(n, t.clone());
  REQUIRE(want.size() == 4);
  trainer.fit(data, {.global_batch_size = 4, .n_epochs = 1, .on_step = [&](const StepInfo&) {
                       for (auto& [n, t] : want) {
                         const Tensor& s = trainer.params().at("online" + n.substr(6));
                         for (int64_t i = 0; i < t.numel(); ++i)
                           t.data<float>()[i] = float((1.0 - tau) * t.data<float>()[i] +
                                                      tau * double(s.data<float>()[i]));
                       }
                     }});
  for (const auto& [n, t] : want) {
    INFO(n);
    const Tensor& got = trainer.params().at(n);
    for (int64_t i = 0; i < t.numel(); ++i)
      CHECK(std::abs(got.data<float>()[i] - t.data<float>()[i]) <= 1e-6f);
  }
  // It moved: the online network trained and the target followed part way.
  CHECK(std::abs(want.at("target.fc_1.weight").data<float>()[0] -
                 trainer.params().at("online.fc_1.weight").data<float>()[0]) > 1e-5f);
}

TEST_CASE("per-epoch examples from the current model resume bit for bit", "[pipelines]") {
  // Each epoch's targets are the model's own predictions on fixed inputs plus
  // noise from the epoch's Rng (a policy's rollouts, in miniature), so they
  // depend on the parameters the epoch started with.
  const auto net = nn::linear(kIn, 8) | nn::tanh() | nn::linear(8, 1);
  const std::vector<Point> inputs = make_points(12, 4);
  std::vector<int64_t> calls;
  auto examples = [&](int64_t epoch, auto& model, Rng rng) {
    calls.push_back(epoch);
    const Batch b = collate(inputs);
    const Tensor pred = model(b.x);  // [12, 1]
    const Tensor noise = rng.normal({12});
    std::vector<Point> out = inputs;
    for (size_t i = 0; i < out.size(); ++i)
      out[i].y = 0.5f * pred.data<float>()[i] + out[i].y + noise.data<float>()[i];
    return out;
  };
  auto run = [&](const fs::path& dir, int64_t max_steps, bool resume) {
    calls.clear();
    Deployer d({.seed = 11, .workdir = dir, .quiet = true});
    Trainer trainer(
        d, net, collate, [](auto& m, const Batch& b, Rng) { return mse(m(b.x), b.y); },
        optim::adam(optim::constant(0.02f)));
    trainer.fit(per_epoch(12, examples), {.global_batch_size = 4,
                                          .n_epochs = 4,
                                          .save_every_steps = 2,
                                          .resume = resume,
                                          .max_steps = max_steps});
    return clone(trainer.params());
  };
  TempDir a, b;
  const ParamTree straight = run(a.path, 0, false);
  CHECK(calls == std::vector<int64_t>{0, 1, 2, 3});
  run(b.path, 7, false);  // stops after step 2 of epoch 2 (3 steps an epoch)
  const ParamTree resumed = run(b.path, 0, true);
  CHECK(calls == std::vector<int64_t>{2, 3});  // epoch 2 rebuilt from its starting parameters
  CHECK(bitwise_equal(resumed, straight));
}

TEST_CASE("per-epoch examples with passes: each pass a fresh order of the same examples",
          "[pipelines]") {
  // Example i of epoch e has y = 100 e + i, so the loss sees which one it got.
  std::vector<int64_t> calls;
  auto examples = [&](int64_t epoch) {
    calls.push_back(epoch);
    std::vector<Point> out = make_points(6, 2);
    for (size_t i = 0; i < out.size(); ++i) out[i].y = float(100 * epoch + int64_t(i));
    return out;
  };
  std::vector<int64_t> seen;  // the examples in the order the steps used them
  auto loss = [&](auto& m, const Batch& b, Rng) {
    for (int64_t i = 0; i < b.y.numel(); ++i) seen.push_back(int64_t(b.y.data<float>()[i]));
    return mse(m(b.x), b.y);
  };
  Deployer d({.seed = 3, .quiet = true});
  Trainer trainer(d, nn::linear(kIn, 1), collate, loss, optim::sgd(optim::constant(0.f)));
  int64_t steps = 0;
  trainer.fit(
      per_epoch(6, examples, {.passes = 3}),
      {.global_batch_size = 4, .n_epochs = 2, .on_step = [&](const StepInfo&) { ++steps; }});
  CHECK(calls == std::vector<int64_t>{0, 1});  // made once per epoch
  CHECK(steps == 8);                           // floor(3 x 6 / 4) a epoch
  std::vector<int64_t> want;
  for (int64_t e = 0; e < 2; ++e) {
    std::vector<int64_t> epoch;  // the three passes' orders, the last partial batch dropped
    for (int64_t p = 0; p < 3; ++p)
      for (const int64_t i : d.epoch_order(e * 3 + p, 6)) epoch.push_back(100 * e + i);
    want.insert(want.end(), epoch.begin(), epoch.begin() + 16);
  }
  CHECK(seen == want);
  CHECK(d.epoch_order(0, 6) != d.epoch_order(1, 6));  // the passes do differ
  CHECK_THROWS_WITH(trainer.fit(per_epoch(6, examples, {.passes = 0}), {.global_batch_size = 4}),
                    Catch::Contains("needs passes >= 1"));
}

TEST_CASE("per-replica examples: each replica trains on its own, gradients averaged",
          "[pipelines]") {
  // Replica r's example i of epoch e has y = 1000 r + 100 e + i (r from its Rng's stream).
  constexpr int kReplicas = 2;
  std::vector<std::vector<int64_t>> counts(kReplicas), seen(kReplicas);
  std::vector<uint64_t> streams(kReplicas);
  std::vector<ParamTree> finals(kReplicas);
  auto body = [&](comm::Comm& c) {
    const int r = c.rank();
    auto examples = [&](int64_t epoch, auto&, Rng rng, int64_t count) {
      counts[size_t(r)].push_back(count);
      streams[size_t(r)] = rng.stream;
      std::vector<Point> out = make_points(count, uint64_t(r));
      for (size_t i = 0; i < out.size(); ++i) out[i].y = float(1000 * r + 100 * epoch + int64_t(i));
      return out;
    };
    auto loss = [&](auto& m, const Batch& b, Rng) {
      for (int64_t i = 0; i < b.y.numel(); ++i)
        seen[size_t(r)].push_back(int64_t(b.y.data<float>()[i]));
      return mse(m(b.x), b.y * 0.001f);
    };
    Deployer d({.seed = 8, .quiet = true, .world = &c});
    Trainer trainer(d, nn::linear(kIn, 1), collate, loss, optim::sgd(optim::constant(0.1f)));
    trainer.fit(per_epoch(12, examples, {.passes = 2, .per_replica = true}),
                {.global_batch_size = 4, .n_epochs = 2});
    finals[size_t(r)] = clone(trainer.params());
  };
  comm::ThreadsWorld w(kReplicas);
  w.run(body);
  CHECK(streams[0] != streams[1]);  // the replicas draw differently
  for (int r = 0; r < kReplicas; ++r) {
    INFO("replica " << r);
    CHECK(counts[size_t(r)] == std::vector<int64_t>{6, 6});  // 12 / 2 each epoch
    // 6 steps an epoch (2 x 12 / 4), each taking 2 of this replica's own examples:
    // both passes over its 6, every one twice.
    REQUIRE(seen[size_t(r)].size() == 24);
    std::map<int64_t, int> visits;
    for (const int64_t y : seen[size_t(r)]) ++visits[y];
    CHECK(visits.size() == 12);
    for (const auto& [y, k] : visits) {
      CHECK(y / 1000 == r);
      CHECK(k == 2);
    }
  }
  CHECK(bitwise_equal(finals[0], finals[1]));  // one model: the averaged gradients
  // What cannot work is one clear error (messages kept per rank: Catch checks on one thread).
  std::vector<std::string> errors(2 * kReplicas);
  comm::ThreadsWorld w2(kReplicas);
  w2.run([&](comm::Comm& c) {
    Deployer d({.seed = 8, .quiet = true, .world = &c});
    Trainer trainer(
        d, nn::linear(kIn, 1), collate,
        [](auto& m, const Batch& b, Rng) { return mse(m(b.x), b.y); },
        optim::sgd(optim::constant(0.1f)));
    auto counted = [](int64_t, auto&, Rng, int64_t count) { return make_points(count, 1); };
    auto three = [](int64_t, auto&, Rng) { return make_points(4, 1); };
    try {
      trainer.fit(per_epoch(7, counted, {.per_replica = true}), {.global_batch_size = 2});
    } catch (const Error& e) {
      errors[size_t(2 * c.rank())] = e.what();
    }
    try {
      trainer.fit(per_epoch(8, three, {.per_replica = true}), {.global_batch_size = 2});
    } catch (const Error& e) {
      errors[size_t(2 * c.rank() + 1)] = e.what();
    }
  });
  for (int r = 0; r < kReplicas; ++r) {
    CHECK_THAT(errors[size_t(2 * r)], Catch::Contains("n must be a multiple of the replicas"));
    CHECK_THAT(errors[size_t(2 * r + 1)],
               Catch::Contains("needs fn(int64_t epoch, model&, Rng, int64_t count)"));
  }
}

TEST_CASE("per-epoch examples: a wrong count is one clear error", "[pipelines]") {
  Deployer d({.seed = 11, .quiet = true});
  Trainer trainer(
      d, nn::linear(kIn, 1), collate, [](auto& m, const Batch& b, Rng) { return mse(m(b.x), b.y); },
      optim::sgd(optim::constant(0.1f)));
  auto fit = [&] {
    trainer.fit(per_epoch(8, [](int64_t epoch) { return make_points(epoch == 0 ? 8 : 6, 1); }),
                {.global_batch_size = 4, .n_epochs = 2});
  };
  CHECK_THROWS_WITH(fit(), Catch::Contains("epoch 1 are 6, but per_epoch(n, ...) said n = 8"));
}

namespace {

struct MeshResult {
  std::vector<double> losses;
  ParamTree params;
};

MeshResult run_lm_pair(int world, int mp) {
  const auto gpt =
      models::gpt2({.vocab = kVocab, .context = kT, .dim = 16, .layers = 2, .heads = 4});
  const auto pair = nn::parts(nn::named<"lm">(gpt), nn::named<"target">(gpt));
  const auto loss = [](auto& m, const LmBatch& b, Rng) {
    return cross_entropy(part<"lm">(m)(b.inputs), b.targets) +
           cross_entropy(part<"target">(m)(b.inputs), b.targets) * 0.1f;
  };
  const std::vector<Seq> data = make_seqs(64);
  std::vector<MeshResult> per_rank(static_cast<size_t>(world));
  auto body = [&](comm::Comm* comm, int rank) {
    Deployer d({.n_model_shards = mp, .seed = 3, .quiet = true, .world = comm});
    Trainer trainer(
        d, pair, lm_collate, loss,
        ParamGroups()
            .freeze("target")
            .freeze("positions", [](const std::string& n) { return n == "lm.wpe.weight"; })
            .train("lm", optim::adamw(optim::constant(1e-2f), {.max_grad_norm = 0.5f}))
            .polyak("target", "lm", 0.2f));
    MeshResult& r = per_rank[size_t(rank)];
    trainer.fit(data, {.global_batch_size = 8,
                       .n_epochs = 1,
                       .max_steps = 5,
                       .on_step = [&](const StepInfo& s) { r.losses.push_back(s.loss); }});
    r.params = trainer.whole_params();
  };
  if (world == 1) {
    body(nullptr, 0);
  } else {
    comm::ThreadsWorld w(world);
    w.run([&](comm::Comm& c) { body(&c, c.rank()); });
  }
  for (const MeshResult& r : per_rank) CHECK(bitwise_equal(r.params, per_rank[0].params));
  return per_rank[0];
}

}  // namespace

TEST_CASE("parts, groups and polyak on every dp x mp mesh match one device", "[pipelines]") {
  const MeshResult one = run_lm_pair(1, 1);
  REQUIRE(one.losses.size() == 5);
  CHECK(one.losses.back() < one.losses.front());
  const ParamTree init = nn::init_params(
      nn::parts(nn::named<"lm">(
          models::gpt2({.vocab = kVocab, .context = kT, .dim = 16, .layers = 2, .heads = 4}))),
      3);
  CHECK(std::memcmp(one.params.at("lm.wpe.weight").raw(), init.at("lm.wpe.weight").raw(),
                    init.at("lm.wpe.weight").nbytes()) == 0);
  for (auto [world, mp] : {std::pair{2, 1}, std::pair{2, 2}, std::pair{4, 2}}) {
    INFO("world " << world << ", n_model_shards " << mp);
    const MeshResult r = run_lm_pair(world, mp);
    REQUIRE(r.losses.size() == one.losses.size());
    for (size_t i = 0; i < r.losses.size(); ++i)
      CHECK(std::abs(r.losses[i] - one.losses[i]) <= 1e-5 * std::abs(one.losses[i]));
    CHECK(std::memcmp(r.params.at("lm.wpe.weight").raw(), init.at("lm.wpe.weight").raw(),
                      init.at("lm.wpe.weight").nbytes()) == 0);
    for (const auto& [name, t] : one.params) {
      INFO(name);
      const Tensor& u = r.params.at(name);
      double worst = 0;
      for (int64_t i = 0; i < t.numel(); ++i)
        worst = std::max(worst, double(std::abs(u.data<float>()[i] - t.data<float>()[i])));
      CHECK(worst <= 1e-4);
    }
  }
}
