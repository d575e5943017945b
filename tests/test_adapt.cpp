// train::adapt, MAML's inner loop inside the three functions: the Trainer's
// default step differentiates the query loss through 1 or 2 inner SGD steps
// (second order, and first order), on 1 and 2 data-parallel replicas; predict
// and the evaluation loss adapt without a graph; a part adapts alone. The
// references are computed by hand in double for a linear model, whose
// support-loss Hessian H is constant: K inner steps give the meta-gradient
// (I - a H)^K g_q(theta_K) (tests/pipelines_fixtures.hpp).
#include "pipelines_fixtures.hpp"
#include "redco/models/vision.hpp"
#include "redco/train/adapt.hpp"

using namespace pipelines;

namespace {

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
// A random linear target per task, new every epoch.
std::vector<Task> sample_tasks(int64_t epoch, int64_t n) {
  std::mt19937_64 rng(uint64_t(2000 + epoch));
  std::normal_distribution<float> normal;
  std::vector<Task> out(static_cast<size_t>(n));
  for (Task& t : out) {
    std::array<float, kIn + 1> w{};
    for (float& v : w) v = normal(rng);
    for (auto* set : {&t.support, &t.query}) {
      for (int i = 0; i < 5; ++i) {
        Point p;
        for (float& v : p.x) v = normal(rng);
        p.y = w[0] * p.x[0] + w[1] * p.x[1] + w[2] * p.x[2] + w[3];
        set->push_back(p);
      }
    }
  }
  return out;
}

constexpr float kInnerLr = 0.1f, kMetaLr = 0.05f;

// The loss of the sample: mean over the tasks of the query loss after
// adapting on the support set.
auto maml_loss(AdaptOptions o) {
  return [o](auto& model, const Tasks& b, Rng) {
    Tensor total = Tensor::zeros({});
    for (size_t t = 0; t < b.support.size(); ++t) {
      const Batch& s = b.support[t];
      const ParamTree fast = adapt(
          model, [&](auto& m) { return mse(m(s.x), s.y); }, o);
      auto adapted = model.with(fast);
      total = total + mse(adapted(b.query[t].x), b.query[t].y) * (1.f / float(b.support.size()));
    }
    return total;
  };
}

// theta after `steps` inner SGD steps on the support set, in double.
Vec adapted_by_hand(Vec th, const Task& t, int steps) {
  for (int k = 0; k < steps; ++k) {
    const Vec g = mse_grad(th, t.support);
    for (size_t i = 0; i < th.size(); ++i) th[i] -= kInnerLr * g[i];
  }
  return th;
}

// (I - a H)^K g_q(theta_K), H = (2/n) X'X with X the support inputs and a 1 column.
Vec meta_grad_by_hand(const Vec& th, const Task& t, int steps, bool second_order) {
  Vec g = mse_grad(adapted_by_hand(th, t, steps), t.query);
  if (!second_order) return g;
  const size_t d = th.size();
  auto x = [](const Point& p, size_t i) { return i < size_t(kIn) ? double(p.x[i]) : 1.0; };
  for (int k = 0; k < steps; ++k) {
    Vec next(d, 0.0);
    for (size_t i = 0; i < d; ++i) {
      double hg = 0;
      for (size_t j = 0; j < d; ++j) {
        double h = 0;
        for (const Point& p : t.support) h += 2 * x(p, i) * x(p, j) / double(t.support.size());
        hg += h * g[j];
      }
      next[i] = g[i] - kInnerLr * hg;
    }
    g = next;
  }
  return g;
}

// One epoch of 2 meta-steps of 4 tasks with SGD, on `world` replicas.
Vec train_maml(int world, AdaptOptions o, Vec* start) {
  const auto model = nn::linear(kIn, 1);
  std::vector<Vec> got(static_cast<size_t>(world));
  auto body = [&](comm::Comm* comm, int rank) {
    Deployer d({.seed = 23, .quiet = true, .world = comm});
    Trainer trainer(d, model, collate_tasks, maml_loss(o), optim::sgd(optim::constant(kMetaLr)));
    if (start) *start = weights(trainer.params(), "");
    trainer.fit(per_epoch(8, [](int64_t epoch) { return sample_tasks(epoch, 8); }),
                {.global_batch_size = 4, .n_epochs = 1, .shuffle = false});
    got[size_t(rank)] = weights(trainer.params(), "");
  };
  if (world == 1) {
    body(nullptr, 0);
  } else {
    comm::ThreadsWorld w(world);
    w.run([&](comm::Comm& c) { body(&c, c.rank()); });
  }
  for (const Vec& g : got) check_vec(g, got[0], 0);
  return got[0];
}

Vec train_by_hand(Vec th, int steps, bool second_order) {
  const std::vector<Task> tasks = sample_tasks(0, 8);
  for (size_t step = 0; step < 2; ++step) {
    Vec g(th.size(), 0.0);
    for (size_t t = 4 * step; t < 4 * step + 4; ++t) {
      const Vec gt = meta_grad_by_hand(th, tasks[t], steps, second_order);
      for (size_t i = 0; i < g.size(); ++i) g[i] += gt[i] / 4;
    }
    for (size_t i = 0; i < th.size(); ++i) th[i] -= kMetaLr * g[i];
  }
  return th;
}

}  // namespace

TEST_CASE("adapt in the loss: second- and first-order meta-gradients by the default step",
          "[adapt]") {
  for (int steps : {1, 2}) {
    INFO("inner steps " << steps);
    Vec start;
    const Vec second = train_maml(1, {.steps = steps, .lr = kInnerLr}, &start);
    const Vec first = train_maml(1, {.steps = steps, .lr = kInnerLr, .first_order = true}, nullptr);
    check_vec(second, train_by_hand(start, steps, true), 2e-6);
    check_vec(first, train_by_hand(start, steps, false), 2e-6);
    // The second-order term is large enough here that either check fails the other.
    double gap = 0;
    for (size_t i = 0; i < start.size(); ++i) gap = std::max(gap, std::abs(second[i] - first[i]));
    CHECK(gap > 1e-3);
  }
}

TEST_CASE("adapt in the loss: tasks spread over 2 replicas give the same meta-step", "[adapt]") {
  Vec start;
  const Vec one = train_maml(1, {.steps = 2, .lr = kInnerLr}, &start);
  const Vec two = train_maml(2, {.steps = 2, .lr = kInnerLr}, nullptr);
  check_vec(two, one, 2e-6);
  check_vec(two, train_by_hand(start, 2, true), 2e-6);
  const Vec two_first = train_maml(2, {.steps = 2, .lr = kInnerLr, .first_order = true}, nullptr);
  check_vec(two_first, train_by_hand(start, 2, false), 2e-6);
}

TEST_CASE("adapt in predict and in the evaluation loss: the adapted model, no graph", "[adapt]") {
  const auto model = nn::linear(kIn, 1);
  const std::vector<Task> tasks = sample_tasks(3, 4);
  Deployer d({.seed = 29, .quiet = true});
  // Each task's prediction is the adapted model's output on its first query point.
  auto predict = [](auto& m, const Tasks& b, Rng) {
    std::vector<float> out;
    for (size_t t = 0; t < b.support.size(); ++t) {
      const Batch& s = b.support[t];
      const ParamTree fast =
          adapt(m, [&](auto& mm) { return mse(mm(s.x), s.y); }, {.steps = 2, .lr = kInnerLr});
      for (const auto& [name, p] : fast) CHECK_FALSE(p.requires_grad());
      auto adapted = m.with(fast);
      out.push_back(adapted(b.query[t].x).template data<float>()[0]);
    }
    return out;
  };
  Predictor predictor(d, model, collate_tasks, predict);
  const ParamTree params = nn::init_params(model, 29);
  const std::vector<float> got = predictor.predict(tasks, 3, params);
  REQUIRE(got.size() == tasks.size());
  double want_loss = 0;
  for (size_t t = 0; t < tasks.size(); ++t) {
    const Vec th = adapted_by_hand(weights(params, ""), tasks[t], 2);
    const Point& q = tasks[t].query[0];
    const double y = th[0] * q.x[0] + th[1] * q.x[1] + th[2] * q.x[2] + th[3];
    CHECK(std::abs(double(got[t]) - y) <= 1e-5 * (1 + std::abs(y)));
    for (const Point& p : tasks[t].query) {
      const double r = th[0] * p.x[0] + th[1] * p.x[1] + th[2] * p.x[2] + th[3] - p.y;
      want_loss += r * r / double(tasks[t].query.size() * tasks.size());
    }
  }
  // The evaluation loss (no grad mode) adapts the same way.
  Trainer trainer(d, model, collate_tasks, maml_loss({.steps = 2, .lr = kInnerLr}),
                  optim::sgd(optim::constant(kMetaLr)), params);
  CHECK(trainer.eval_loss(tasks, 1) == Approx(want_loss).epsilon(1e-5));
}

TEST_CASE("adapt on a part adapts that part only; bad options are one clear error", "[adapt]") {
  const auto pair =
      nn::parts(nn::named<"learner">(nn::linear(kIn, 1)), nn::named<"prior">(nn::linear(kIn, 1)));
  const ParamTree params = nn::init_params(pair, 31);
  const Batch b = collate(make_points(6, 5));
  BoundModel m(pair, params, nn::Ctx{});
  auto learner = part<"learner">(m);
  auto task_loss = [&](auto& mm) { return mse(mm(b.x), b.y); };
  const ParamTree fast = adapt(learner, task_loss, {.steps = 1, .lr = kInnerLr});
  REQUIRE(fast.size() == params.size());
  for (const char* n : {"prior.weight", "prior.bias"})
    CHECK(fast.at(n).raw() == params.at(n).raw());  // the same tensor, untouched
  Vec th = weights(params, "learner.");
  const Vec g = mse_grad(th, make_points(6, 5));
  for (size_t i = 0; i < th.size(); ++i) th[i] -= kInnerLr * g[i];
  check_vec(weights(fast, "learner."), th, 1e-6);
  // The adapted part runs through the part's own with().
  auto adapted = learner.with(fast);
  const Tensor y = adapted(b.x);
  CHECK(y.data<float>()[0] == Approx(th[0] * b.x.data<float>()[0] + th[1] * b.x.data<float>()[1] +
                                     th[2] * b.x.data<float>()[2] + th[3])
                                  .epsilon(1e-5));
  CHECK_THROWS_WITH(adapt(learner, task_loss, {.steps = -1}),
                    Catch::Contains("adapt: steps must be >= 0, got -1"));
  CHECK_THROWS_WITH(adapt(learner, task_loss, {.steps = 1, .lr = 0.f}),
                    Catch::Contains("adapt: the inner learning rate must be > 0, got 0"));
}

TEST_CASE("adapt, first order, on a CNN: the query gradient at the adapted parameters", "[adapt]") {
  const auto cnn = models::small_cnn({.size = 8, .classes = 3, .conv1 = 4, .conv2 = 4});
  const ParamTree theta = nn::init_params(cnn, 3);
  const Tensor sx = Tensor::normal({3, 1, 8, 8}, 1, 1, 0.f, 1.f);
  const Tensor qx = Tensor::normal({6, 1, 8, 8}, 2, 1, 0.f, 1.f);
  const std::vector<int64_t> s_labels{0, 1, 2}, q_labels{2, 1, 0, 0, 1, 2};
  const Tensor sy = Tensor::from(std::span<const int64_t>(s_labels), {3});
  const Tensor qy = Tensor::from(std::span<const int64_t>(q_labels), {6});
  for (bool first_order : {true, false}) {
    INFO("first order " << first_order);
    const ParamTree got = grad_of(
        [&](const ParamTree& p) {
          BoundModel m(cnn, p, nn::Ctx{});
          const ParamTree fast = adapt(m, [&](auto& mm) { return cross_entropy(mm(sx), sy); },
                                       {.steps = 1, .lr = 0.4f, .first_order = first_order});
          return cross_entropy(m.with(fast)(qx), qy);
        },
        theta);
    // By hand: the support gradient as a constant, then the query gradient there.
    const ParamTree g = grad_of(
        [&](const ParamTree& p) { return cross_entropy(nn::apply(cnn, p, sx), sy); }, theta);
    ParamTree adapted;
    for (const auto& [n, t] : theta) adapted.emplace(n, t - g.at(n) * 0.4f);
    const ParamTree want = grad_of(
        [&](const ParamTree& p) { return cross_entropy(nn::apply(cnn, p, qx), qy); }, adapted);
    double worst = 0, size = 0;
    for (const auto& [n, t] : want)
      for (int64_t i = 0; i < t.numel(); ++i) {
        worst = std::max(worst, double(std::abs(got.at(n).data<float>()[i] - t.data<float>()[i])));
        size = std::max(size, double(std::abs(t.data<float>()[i])));
      }
    REQUIRE(size > 1e-3);
    // First order: equal; second order: the Hessian term makes a difference.
    if (first_order) CHECK(worst <= 1e-5 * (1 + size));
    if (!first_order) CHECK(worst > 1e-4 * size);
  }
}
