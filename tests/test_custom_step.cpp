// Custom training steps through Trainer::fit, each against a hand
// computation in double: FedAvg (local client steps, then the average) on 1
// and 2 replicas, DP-style per-example clipping with noise, MAML's
// second-order meta-gradient; and a custom step with per-epoch examples on dp
// x mp meshes against one device and against the default step.
#include "pipelines_fixtures.hpp"

using namespace pipelines;

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
    auto body = [&](comm::Comm* comm, int rank) {
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
      comm::ThreadsWorld w(world);
      w.run([&](comm::Comm& c) { body(&c, c.rank()); });
    }
    for (const Vec& g : got) check_vec(g, want, 2e-6);
  }
}

TEST_CASE("custom step: dp_weighted_mean weights each replica's tree", "[pipelines]") {
  // Replica r holds the value r + 1 everywhere with weight 3r + 1: the mean
  // is (1 * 1 + 2 * 4) / 5 = 1.8 on both; alone, a replica keeps its own.
  for (int world : {1, 2}) {
    std::vector<float> got(size_t(world), 0.f);
    auto body = [&](comm::Comm* comm, int rank) {
      Deployer d({.seed = 13, .quiet = true, .world = comm});
      const auto model = nn::linear(kIn, 1);
      Trainer trainer(
          d, model, collate, [](auto& m, const Batch& b, Rng) { return mse(m(b.x), b.y); },
          optim::sgd(optim::constant(1.f)));
      auto step = [&](auto& s, const Batch&, Rng) {
        ParamTree t{{"x", Tensor::full({3}, float(rank + 1))}};
        s.dp_weighted_mean(t, 3.0 * rank + 1);
        got[size_t(rank)] = t.at("x").template values<float>()[2];
        CHECK_THROWS_WITH(s.dp_weighted_mean(t, -1.0), Catch::Contains("must be finite and >= 0"));
        ParamTree g;
        for (const auto& [n, p] : s.trained()) g.emplace(n, Tensor::zeros(p.shape()));
        return StepResult{Tensor::zeros({}), g};
      };
      trainer.fit(make_points(4, 1),
                  {.global_batch_size = 2 * world, .n_epochs = 1, .max_steps = 1}, step);
    };
    if (world == 1) {
      body(nullptr, 0);
      CHECK(got[0] == 1.f);
    } else {
      comm::ThreadsWorld w(world);
      w.run([&](comm::Comm& c) { body(&c, c.rank()); });
      CHECK(got[0] == Approx(1.8f));
      CHECK(got[1] == Approx(1.8f));
    }
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
    auto body = [&](comm::Comm* comm, int rank) {
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
      comm::ThreadsWorld w(world);
      w.run([&](comm::Comm& c) { body(&c, c.rank()); });
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
