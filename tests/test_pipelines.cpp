// Pipelines beyond one model and one loss: nn::parts collections with
// per-part optimizers, frozen parameters, adapter-only checkpoints and polyak
// targets; examples made per epoch (resuming bit for bit); custom steps
// computing FedAvg, DP-style per-example clipping with noise, and MAML's
// second-order meta-gradient. Every expected value is computed by hand here,
// in double, from closed-form gradients of a linear model under squared error.
#include <fmt/format.h>

#include <catch2/catch.hpp>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <random>
#include <vector>

#include "redco/dist/threads_comm.hpp"
#include "redco/io/safetensors.hpp"
#include "redco/models/gpt2.hpp"
#include "redco/train/trainer.hpp"

using namespace redco;
using namespace redco::train;
namespace fs = std::filesystem;

namespace {

// ---- a linear regression problem: y = <w*, x> + b* + noise -------------------------------

constexpr int64_t kIn = 3;

struct Point {
  std::array<float, kIn> x{};
  float y = 0;
};
struct Batch {
  Tensor x, y;  // [n, kIn], [n, 1]
};

std::vector<Point> make_points(int64_t n, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<Point> out(static_cast<size_t>(n));
  for (Point& p : out) {
    for (float& v : p.x) v = normal(rng);
    p.y = 0.5f * p.x[0] - 1.f * p.x[1] + 2.f * p.x[2] + 0.3f + 0.1f * normal(rng);
  }
  return out;
}

Batch collate(std::span<const Point> ps) {
  const auto n = int64_t(ps.size());
  Batch b{Tensor::empty({n, kIn}), Tensor::empty({n, 1})};
  for (int64_t i = 0; i < n; ++i) {
    std::copy_n(ps[size_t(i)].x.begin(), kIn, b.x.data<float>() + i * kIn);
    b.y.data<float>()[i] = ps[size_t(i)].y;
  }
  return b;
}

Tensor mse(const Tensor& pred, const Tensor& y) { return mean(square(pred - y)); }

// Weights of a Linear(kIn, 1) as doubles: w[0..kIn) then the bias.
using Vec = std::vector<double>;
Vec weights(const ParamTree& p, const std::string& prefix) {
  const float* w = p.at(prefix + "weight").data<float>();
  Vec out(w, w + kIn);
  out.push_back(p.at(prefix + "bias").data<float>()[0]);
  return out;
}

// d/dθ of mean((<w, x> + b - y)^2) over `ps`, at θ = (w, b).
Vec mse_grad(const Vec& th, std::span<const Point> ps) {
  Vec g(kIn + 1, 0.0);
  for (const Point& p : ps) {
    double r = th[kIn] - p.y;
    for (int64_t k = 0; k < kIn; ++k) r += th[size_t(k)] * p.x[size_t(k)];
    for (int64_t k = 0; k < kIn; ++k) g[size_t(k)] += 2 * r * p.x[size_t(k)] / double(ps.size());
    g[kIn] += 2 * r / double(ps.size());
  }
  return g;
}

void check_vec(const Vec& got, const Vec& want, double tol) {
  REQUIRE(got.size() == want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    INFO("element " << i << ": " << got[i] << " vs " << want[i]);
    CHECK(std::abs(got[i] - want[i]) <= tol * (1 + std::abs(want[i])));
  }
}

bool bitwise_equal(const ParamTree& a, const ParamTree& b) {
  if (a.size() != b.size()) return false;
  for (const auto& [name, t] : a) {
    const auto it = b.find(name);
    if (it == b.end() || t.shape() != it->second.shape() ||
        std::memcmp(t.raw(), it->second.raw(), t.nbytes()) != 0) {
      UNSCOPED_INFO("'" << name << "' differs");
      return false;
    }
  }
  return true;
}

ParamTree clone(const ParamTree& p) {
  ParamTree out;
  for (const auto& [n, t] : p) out.emplace(n, t.clone());
  return out;
}

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() /
           fmt::format("redco-pipelines-{}-{}", ::getpid(), std::random_device{}());
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

// Three linear parts whose outputs are summed.
const auto three = nn::parts(nn::named<"a">(nn::linear(kIn, 1)), nn::named<"b">(nn::linear(kIn, 1)),
                             nn::named<"frozen">(nn::linear(kIn, 1)));
const auto sum_loss = [](auto& m, const Batch& b, Rng) {
  return mse(part<"a">(m)(b.x) + part<"b">(m)(b.x) + part<"frozen">(m)(b.x), b.y);
};

}  // namespace

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
  run(parts.path, 7, false);
  const ParamTree resumed = run(parts.path, 0, true);
  CHECK(bitwise_equal(resumed, straight));
  const io::SafetensorsReader file(parts.path / "ckpt/step-000006" / io::kCheckpointParams);
  CHECK(file.contains("a.weight"));
  CHECK_FALSE(file.contains("frozen.weight"));
  CHECK_FALSE(file.contains("frozen.bias"));
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

// ---- FedAvg: one example is one client's data ----------------------------------------------

struct Client {
  std::vector<Point> points;
};
struct Clients {
  std::vector<Batch> data;  // one batch per client
  std::vector<std::vector<Point>> raw;
};
Clients collate_clients(std::span<const Client> cs) {
  Clients out;
  for (const Client& c : cs) out.data.push_back(collate(c.points)), out.raw.push_back(c.points);
  return out;
}
std::vector<Client> make_clients(int64_t n) {
  std::vector<Client> out;
  for (int64_t i = 0; i < n; ++i) out.push_back({make_points(6 + i % 3, 100 + uint64_t(i))});
  return out;
}

constexpr int kLocalSteps = 3;
constexpr float kLocalLr = 0.05f;

// E local SGD steps per client from the current parameters, then the mean of
// the client models: returned as the pseudo-gradient params - mean, which
// sgd at rate 1 turns into params = mean.
const auto fedavg_step = [](auto& s, const Clients& b, Rng) {
  ParamTree mean;
  double loss = 0;
  for (const Batch& c : b.data) {
    ParamTree local = clone(s.trained());
    for (int e = 0; e < kLocalSteps; ++e) {
      auto [l, g] = s.value_and_grad_at(local, [&](auto& m) { return mse(m(c.x), c.y); });
      if (e == 0) loss += double(l.item());
      for (auto& [n, t] : local) t = t - g.at(n) * kLocalLr;
    }
    for (auto& [n, t] : local)
      mean.contains(n) ? void(mean.at(n) = mean.at(n) + t) : void(mean.emplace(n, t));
  }
  ParamTree grads;
  for (const auto& [n, t] : mean)
    grads.emplace(n, s.trained().at(n) - t * (1.f / float(b.data.size())));
  return StepResult{Tensor::full({}, float(loss / double(b.data.size()))), grads};
};

// The same rounds by hand, in double.
Vec fedavg_by_hand(Vec th, const std::vector<Client>& clients, int64_t per_round, int64_t rounds) {
  for (int64_t r = 0; r < rounds; ++r) {
    Vec mean(th.size(), 0.0);
    for (int64_t c = r * per_round; c < (r + 1) * per_round; ++c) {
      Vec local = th;
      for (int e = 0; e < kLocalSteps; ++e) {
        const Vec g = mse_grad(local, clients[size_t(c)].points);
        for (size_t i = 0; i < local.size(); ++i) local[i] -= kLocalLr * g[i];
      }
      for (size_t i = 0; i < th.size(); ++i) mean[i] += local[i] / double(per_round);
    }
    th = mean;
  }
  return th;
}

}  // namespace

TEST_CASE("custom step: FedAvg equals the hand-computed average on 1 and 2 replicas",
          "[pipelines]") {
  const std::vector<Client> clients = make_clients(8);
  const auto model = nn::linear(kIn, 1);
  const Vec start = weights(nn::init_params(model, 13), "");
  const Vec want = fedavg_by_hand(start, clients, 4, 2);
  for (int world : {1, 2}) {
    INFO("replicas " << world);
    std::vector<Vec> got(static_cast<size_t>(world));
    auto body = [&](dist::Comm* comm, int rank) {
      Deployer d({.seed = 13, .quiet = true, .world = comm});
      Trainer trainer(
          d, model, collate_clients,
          [](auto& m, const Clients& b, Rng) { return mse(m(b.data[0].x), b.data[0].y); },
          optim::sgd(optim::constant(1.f)));
      trainer.fit(clients, {.global_batch_size = 4, .n_epochs = 1, .shuffle = false}, fedavg_step);
      got[size_t(rank)] = weights(trainer.params(), "");
    };
    if (world == 1) {
      body(nullptr, 0);
    } else {
      dist::ThreadsWorld w(world);
      w.run([&](dist::Comm& c) { body(&c, c.rank()); });
    }
    for (const Vec& g : got) check_vec(g, want, 2e-6);
  }
}

TEST_CASE("custom step: a wrong gradient tree is one clear error", "[pipelines]") {
  Deployer d({.seed = 13, .quiet = true});
  Trainer trainer(
      d, three, collate, sum_loss,
      ParamGroups().train("a", optim::sgd(optim::constant(0.1f))).freeze("b").freeze("frozen"));
  auto step = [](auto& s, const Batch& b, Rng) {
    auto [loss, g] = s.value_and_grad([&](auto& m) { return sum_loss(m, b, Rng{}); });
    CHECK(g.size() == 2);  // the trained part only: a.weight, a.bias
    g.emplace("frozen.bias", Tensor::zeros({1}));
    return StepResult{loss, g};
  };
  const std::vector<Point> data = make_points(4, 1);
  CHECK_THROWS_WITH(trainer.fit(data, {.global_batch_size = 4}, step),
                    Catch::Contains("gradient for 'frozen.bias', which is not a trained"));
}

TEST_CASE("custom step: DP-style per-example clipping with noise equals the reference",
          "[pipelines]") {
  constexpr float kClip = 0.5f, kSigma = 0.7f, kLr = 0.1f;
  const std::vector<Point> data = make_points(6, 21);
  const auto model = nn::linear(kIn, 1);
  std::vector<ParamTree> noise;  // what the step drew, for the reference
  // Each example's gradient on its own, clipped to norm kClip, summed, plus
  // N(0, (sigma kClip)^2) noise, divided by the batch size.
  auto step = [&](auto& s, const Batch& b, Rng rng) {
    const int64_t n = b.x.dim(0);
    ParamTree sum;
    for (const auto& [name, t] : s.trained()) sum.emplace(name, Tensor::zeros(t.shape()));
    Tensor loss = Tensor::zeros({});
    for (int64_t i = 0; i < n; ++i) {
      const Tensor x = slice(b.x, 0, i, i + 1), y = slice(b.y, 0, i, i + 1);
      auto [l, g] = s.value_and_grad([&](auto& m) { return mse(m(x), y); });
      const double norm = optim::global_norm(g);
      const float scale = float(std::min(1.0, double(kClip) / norm));
      for (auto& [name, t] : sum) t = t + g.at(name) * scale;
      loss = loss + l * (1.f / float(n));
    }
    ParamTree drawn;
    uint64_t k = 0;
    for (auto& [name, t] : sum) {
      const Tensor z = rng.split(k++).normal(t.shape(), 0.f, kSigma * kClip);
      drawn.emplace(name, z);
      t = (t + z) * (1.f / float(n));
    }
    noise.push_back(drawn);
    return StepResult{loss, sum};
  };
  Deployer d({.seed = 17, .quiet = true});
  Trainer trainer(
      d, model, collate, [](auto& m, const Batch& b, Rng) { return mse(m(b.x), b.y); },
      optim::sgd(optim::constant(kLr)));
  Vec th = weights(trainer.params(), "");
  trainer.fit(data, {.global_batch_size = 3, .n_epochs = 1, .shuffle = false}, step);
  REQUIRE(noise.size() == 2);
  for (size_t st = 0; st < 2; ++st) {
    Vec g(kIn + 1, 0.0);
    for (size_t i = 3 * st; i < 3 * st + 3; ++i) {
      const Vec gi = mse_grad(th, std::span(&data[i], 1));
      double sq = 0;
      for (double v : gi) sq += v * v;
      const double scale = std::min(1.0, double(kClip) / std::sqrt(sq));
      CHECK(scale < 1.0);  // the clipping is exercised
      for (size_t k = 0; k < g.size(); ++k) g[k] += gi[k] * scale;
    }
    for (int64_t k = 0; k < kIn; ++k) g[size_t(k)] += noise[st].at("weight").data<float>()[k];
    g[kIn] += noise[st].at("bias").data<float>()[0];
    for (size_t k = 0; k < g.size(); ++k) th[k] -= kLr * g[k] / 3.0;
  }
  check_vec(weights(trainer.params(), ""), th, 2e-6);
}

namespace {

// ---- MAML: one example is one task (a support and a query set) ------------------------------

struct Task {
  std::vector<Point> support, query;
};
struct Tasks {
  std::vector<Batch> support, query;
};
Tasks collate_tasks(std::span<const Task> ts) {
  Tasks out;
  for (const Task& t : ts)
    out.support.push_back(collate(t.support)), out.query.push_back(collate(t.query));
  return out;
}
// New tasks every epoch: a random linear target per task.
std::vector<Task> sample_tasks(int64_t epoch, int64_t n) {
  std::mt19937_64 rng(uint64_t(1000 + epoch));
  std::normal_distribution<float> normal;
  std::vector<Task> out(static_cast<size_t>(n));
  for (Task& t : out) {
    std::array<float, kIn> w{};
    for (float& v : w) v = normal(rng);
    for (auto* set : {&t.support, &t.query}) {
      for (int i = 0; i < 5; ++i) {
        Point p;
        for (float& v : p.x) v = normal(rng);
        p.y = w[0] * p.x[0] + w[1] * p.x[1] + w[2] * p.x[2];
        set->push_back(p);
      }
    }
  }
  return out;
}

constexpr float kInnerLr = 0.1f;

// The meta-gradient: d/dθ of the query loss at θ - α ∇ support_loss(θ),
// differentiated through the inner gradient (create_graph).
const auto maml_step = [](auto& s, const Tasks& b, Rng) {
  const float inv = 1.f / float(b.support.size());
  return std::apply(
      [](Tensor l, ParamTree g) {
        return StepResult{l, g};
      },
      s.value_and_grad([&](auto&, const ParamTree& theta) {
        Tensor total = Tensor::zeros({});
        for (size_t t = 0; t < b.support.size(); ++t) {
          const Batch& sup = b.support[t];
          auto [ls, g] = s.value_and_grad_at(theta, [&](auto& m) { return mse(m(sup.x), sup.y); },
                                             {.create_graph = true});
          ParamTree adapted;
          for (const auto& [n, p] : theta) adapted.emplace(n, p - g.at(n) * kInnerLr);
          auto fast = s.bind(adapted);
          total = total + mse(fast(b.query[t].x), b.query[t].y) * inv;
        }
        return total;
      }));
};

// (I - α H_s) ∇_q(θ - α ∇_s(θ)) with H_s = (2/n) X̃ᵀX̃ (X̃: inputs with a 1 column).
Vec maml_by_hand(const Vec& th, const Task& t, bool second_order) {
  const Vec gs = mse_grad(th, t.support);
  Vec adapted = th;
  for (size_t i = 0; i < th.size(); ++i) adapted[i] -= kInnerLr * gs[i];
  const Vec gq = mse_grad(adapted, t.query);
  if (!second_order) return gq;
  const size_t d = th.size();
  Vec out(d, 0.0);
  for (size_t i = 0; i < d; ++i) {
    double hv = 0;
    for (size_t j = 0; j < d; ++j) {
      double h = 0;
      for (const Point& p : t.support) {
        const double xi = i < size_t(kIn) ? p.x[i] : 1.0, xj = j < size_t(kIn) ? p.x[j] : 1.0;
        h += 2 * xi * xj / double(t.support.size());
      }
      hv += h * gq[j];
    }
    out[i] = gq[i] - kInnerLr * hv;
  }
  return out;
}

}  // namespace

TEST_CASE("custom step: MAML's second-order meta-gradient through the Trainer", "[pipelines]") {
  constexpr float kMetaLr = 0.05f;
  const auto model = nn::linear(kIn, 1);
  Deployer d({.seed = 19, .quiet = true});
  Trainer trainer(
      d, model, collate_tasks,
      [](auto& m, const Tasks& b, Rng) { return mse(m(b.query[0].x), b.query[0].y); },
      optim::sgd(optim::constant(kMetaLr)));
  const Vec th = weights(trainer.params(), "");
  trainer.fit(per_epoch(4, [](int64_t epoch) { return sample_tasks(epoch, 4); }),
              {.global_batch_size = 4, .n_epochs = 1, .shuffle = false}, maml_step);
  const std::vector<Task> tasks = sample_tasks(0, 4);
  Vec full = th, first = th;
  for (const Task& t : tasks) {
    const Vec g2 = maml_by_hand(th, t, true), g1 = maml_by_hand(th, t, false);
    for (size_t i = 0; i < th.size(); ++i)
      full[i] -= kMetaLr * g2[i] / 4, first[i] -= kMetaLr * g1[i] / 4;
  }
  const Vec got = weights(trainer.params(), "");
  check_vec(got, full, 2e-6);
  // The second-order term matters here, so a first-order step would fail the check.
  double gap = 0;
  for (size_t i = 0; i < th.size(); ++i) gap = std::max(gap, std::abs(full[i] - first[i]));
  CHECK(gap > 1e-4);
}

namespace {

// ---- a language model and its polyak target on dp x mp meshes of threads --------------------

constexpr int64_t kT = 8, kVocab = 32;
struct Seq {
  std::vector<int64_t> ids;  // kT + 1 tokens
};
struct LmBatch {
  Tensor inputs, targets;
};
std::vector<Seq> make_seqs(int64_t n) {
  std::mt19937_64 rng(5);
  std::vector<Seq> out(static_cast<size_t>(n));
  for (Seq& s : out) {
    const auto k = int64_t(rng() % 4);
    s.ids.push_back(int64_t(rng() % kVocab));
    for (int64_t t = 0; t < kT; ++t) s.ids.push_back((3 * s.ids.back() + k) % kVocab);
  }
  return out;
}
LmBatch lm_collate(std::span<const Seq> ex) {
  const auto n = int64_t(ex.size());
  LmBatch b{Tensor::empty({n, kT}, DType::i64), Tensor::empty({n, kT}, DType::i64)};
  for (int64_t i = 0; i < n; ++i) {
    std::copy_n(ex[size_t(i)].ids.begin(), kT, b.inputs.data<int64_t>() + i * kT);
    std::copy_n(ex[size_t(i)].ids.begin() + 1, kT, b.targets.data<int64_t>() + i * kT);
  }
  return b;
}

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
  auto body = [&](dist::Comm* comm, int rank) {
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
    dist::ThreadsWorld w(world);
    w.run([&](dist::Comm& c) { body(&c, c.rank()); });
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

TEST_CASE("per-epoch examples from the model and a custom step on a dp x mp mesh match one device",
          "[pipelines]") {
  const auto gpt =
      models::gpt2({.vocab = kVocab, .context = kT, .dim = 16, .layers = 2, .heads = 4});
  const auto lm_loss = [](auto& m, const LmBatch& b, Rng) {
    return cross_entropy(m(b.inputs), b.targets);
  };
  // Each epoch's sequences start at the token the model predicts after a
  // fixed prompt, offset by the epoch's Rng: the examples depend on the model.
  auto examples = [](int64_t epoch, auto& model, Rng rng) {
    std::vector<Seq> seqs = make_seqs(16);
    const LmBatch b = lm_collate(seqs);
    const Tensor next = argmax(reshape(model(b.inputs), {16 * kT, kVocab}), 1);  // whole in eval
    for (size_t i = 0; i < seqs.size(); ++i) {
      const auto k = int64_t(rng.bits(i) % 4);
      seqs[i].ids[0] = (next.data<int64_t>()[int64_t(i) * kT + kT - 1] + epoch) % kVocab;
      for (int64_t t = 1; t <= kT; ++t)
        seqs[i].ids[size_t(t)] = (3 * seqs[i].ids[size_t(t - 1)] + k) % kVocab;
    }
    return seqs;
  };
  // The default step written as a custom one, with its gradient halved and
  // the learning rate doubled: halving is exact, so the updates are the
  // default step's bit for bit.
  auto step = [&](auto& s, const LmBatch& b, Rng rng) {
    auto [loss, g] = s.value_and_grad([&](auto& m) { return lm_loss(m, b, rng); });
    for (auto& [n, t] : g) t = t * 0.5f;
    return StepResult{loss, g};
  };
  auto run = [&](int world, int mp, bool custom = true) {
    std::vector<std::vector<double>> losses(static_cast<size_t>(world));
    auto body = [&](dist::Comm* comm, int rank) {
      Deployer d({.n_model_shards = mp, .seed = 3, .quiet = true, .world = comm});
      Trainer trainer(d, gpt, lm_collate, lm_loss,
                      optim::sgd(optim::constant(custom ? 0.2f : 0.1f)));
      const FitOptions<Seq> o{
          .global_batch_size = 8, .n_epochs = 3, .on_step = [&](const StepInfo& s) {
            losses[size_t(rank)].push_back(s.loss);
          }};
      if (custom) {
        trainer.fit(per_epoch(16, examples), o, step);
      } else {
        trainer.fit(per_epoch(16, examples), o);
      }
    };
    if (world == 1) {
      body(nullptr, 0);
    } else {
      dist::ThreadsWorld w(world);
      w.run([&](dist::Comm& c) { body(&c, c.rank()); });
    }
    for (const auto& l : losses) CHECK(l == losses[0]);
    return losses[0];
  };
  const std::vector<double> one = run(1, 1);
  REQUIRE(one.size() == 6);
  CHECK(run(1, 1, false) == one);
  for (auto [world, mp] : {std::pair{2, 2}, std::pair{4, 2}}) {
    INFO("world " << world << ", n_model_shards " << mp);
    const std::vector<double> r = run(world, mp);
    REQUIRE(r.size() == one.size());
    for (size_t i = 0; i < r.size(); ++i) CHECK(std::abs(r[i] - one[i]) <= 1e-5 * std::abs(one[i]));
  }
}
