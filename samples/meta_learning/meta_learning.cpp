// MAML (Finn et al., 2017) as redco's three functions; an example is a task.
// `loss` adapts the network to each task's support set by SGD steps
// (train::adapt) and scores its query set, the Trainer differentiating through
// the steps (second order, or --first-order); `predict` adapts the same way.
// fashion: N-way K-shot, a small CNN meta-trained on the training images of
// classes 0-4, scored on the test images of held-out classes 5-9. sinusoid:
// y = A sin(x - p), A in [0.1, 5], p in [0, pi], x in [-5, 5], an MLP.
// Baselines (same inner steps): the initial weights, and for sinusoids a
// network trained on all tasks without adaptation. --help lists the flags.
#include <fmt/format.h>

#include <numbers>
#include <random>

#include "redco/data/few_shot.hpp"
#include "redco/redco.hpp"
#include "redco_cli.hpp"

using namespace redco;
namespace cli = redco::cli;

struct Task {               // the first ep.n_support points are the support set
  data::Episode ep;         // fashion: image ids (the test split's from 60000) and labels
  std::vector<float> x, y;  // sinusoid: inputs and targets
  // Of prediction p for point i: 1 if right (fashion), the squared error (sinusoid).
  double score(size_t i, float p) const {
    return y.empty() ? double(p == float(ep.labels[i])) : double((p - y[i]) * (p - y[i]));
  }
};
struct Batch {  // per task: x f32 [n, 1, 28, 28] or [n, 1], y i64 [n] or f32 [n, 1]
  std::vector<Tensor> sx, sy, qx, qy;  // support set, query set
};

int main(int argc, char** argv) try {
  cli::App app{"MAML on few-shot Fashion-MNIST classification or sinusoid regression"};
  std::string task = "fashion", workdir = "maml_workdir", data_dir = data::kFashionMnistDir;
  int64_t ways = 5, queries = 5, inner_steps = 1, meta_batch = 16, epochs = 10, steps = 100,
          n_eval = 500;
  std::optional<int64_t> shots_opt, width_opt;
  std::optional<float> inner_lr_opt;
  std::vector<int64_t> held_out = {5, 6, 7, 8, 9};
  float meta_lr = 1e-3f;
  bool first_order = false;
  uint64_t seed = 42;
  app.add_option("--task", task)->check(cli::one_of({"fashion", "sinusoid"}));
  app.add_option("--ways", ways, "classes per task")->check(cli::at_least(2));
  app.add_option("--shots", shots_opt, "per class or sinusoid (1, 10)")->check(cli::at_least(1));
  app.add_option("--queries", queries, "per class or sinusoid")->check(cli::at_least(1));
  app.add_option("--held-out", held_out, "eval classes")->delimiter(',')->check(cli::between(0, 9));
  app.add_option("--inner-steps", inner_steps)->check(cli::at_least(1));
  app.add_option("--inner-lr", inner_lr_opt, "fashion 0.4, sinusoid 0.01")->check(cli::positive());
  app.add_flag("--first-order", first_order, "first-order MAML (no second derivatives)");
  app.add_option("--meta-batch", meta_batch, "tasks per meta-step")->check(cli::at_least(1));
  app.add_option("--meta-lr", meta_lr, "Adam")->check(cli::positive());
  app.add_option("--epochs", epochs)->check(cli::at_least(1));
  app.add_option("--steps-per-epoch", steps, "meta-steps per evaluation")->check(cli::at_least(1));
  app.add_option("--eval-tasks", n_eval, "held-out tasks")->check(cli::at_least(1));
  app.add_option("--width", width_opt, "channels/units (16, 40)")->check(cli::at_least(1));
  app.add_option("--seed", seed);
  app.add_option("--workdir", workdir, "checkpoints, metrics.jsonl, TensorBoard events");
  app.add_option("--data-dir", data_dir, "folder with the Fashion-MNIST *-ubyte.gz files");
  REDCO_CLI_PARSE(app, argc, argv);
  const bool sinusoid = task == "sinusoid";
  const int64_t shots = shots_opt.value_or(sinusoid ? 10 : 1),
                width = width_opt.value_or(sinusoid ? 40 : 16);
  const float inner_lr = inner_lr_opt.value_or(sinusoid ? 0.01f : 0.4f);
  if (sinusoid) ways = 1;         // one function per task: shots and queries count its points
  std::vector<int64_t> split[2];  // meta-training classes, held-out classes
  for (int64_t c = 0; c < 10; ++c) split[std::ranges::count(held_out, c) > 0].push_back(c);
  data::FashionMnist sets[2];                  // train, test
  std::vector<std::vector<int64_t>> pool(10);  // image ids by class: test images if held out
  if (!sinusoid) {
    REDCO_CHECK(ways <= int64_t(std::min(split[0].size(), split[1].size())),
                "--ways {} is more than the {} meta-training or {} held-out classes (--held-out)",
                ways, split[0].size(), split[1].size());
    sets[0] = data::load_fashion_mnist(data_dir, "train");
    sets[1] = data::load_fashion_mnist(data_dir, "test");
    for (int64_t s = 0; s < 2; ++s)
      for (int64_t i = 0; i < sets[s].count; ++i)
        if (const int64_t c = sets[s].labels[size_t(i)]; std::ranges::count(held_out, c) == s)
          pool[size_t(c)].push_back(s * sets[0].count + i);
  }
  const data::EpisodeShape shape{.ways = ways, .shots = shots, .queries = queries};
  // n tasks from `classes` (data::FewShot), or n sinusoids, drawn from `key` alone.
  auto sample_tasks = [&](int64_t n, const std::vector<int64_t>& classes, uint64_t key) {
    std::vector<Task> tasks(static_cast<size_t>(n));
    if (!sinusoid) {
      const std::vector<data::Episode> eps = data::FewShot(pool, classes, shape).sample(n, key);
      for (size_t i = 0; i < tasks.size(); ++i) tasks[i].ep = eps[i];
      return tasks;
    }
    std::mt19937_64 rng(key);
    std::uniform_real_distribution<float> amp(0.1f, 5.f), phase(0.f, std::numbers::pi_v<float>),
        x(-5.f, 5.f);
    for (Task& t : tasks) {
      const float a = amp(rng), p = phase(rng);
      for (int64_t i = 0; i < shots + queries; ++i)
        t.x.push_back(x(rng)), t.y.push_back(a * std::sin(t.x.back() - p));
      t.ep.n_support = shots;
    }
    return tasks;
  };
  auto collate = [&](std::span<const Task> ts) {
    Batch b;
    for (const Task& t : ts) {
      const int64_t k = t.ep.n_support, n = int64_t(sinusoid ? t.x.size() : t.ep.items.size());
      Tensor x = sinusoid ? Tensor::from(std::span(t.x), {n, 1}) : Tensor::empty({n, 1, 28, 28});
      const Tensor y = sinusoid ? Tensor::from(std::span(t.y), {n, 1})
                                : Tensor::from(std::span(t.ep.labels), {n});
      for (int64_t i = 0, px = 28 * 28; i < n && !sinusoid; ++i) {
        const int64_t id = t.ep.items[size_t(i)], from = id >= sets[0].count;
        std::copy_n(sets[from].images.data() + (id - from * sets[0].count) * px, px,
                    x.data<float>() + i * px);
      }
      b.sx.push_back(slice(x, 0, 0, k)), b.sy.push_back(slice(y, 0, 0, k));
      b.qx.push_back(slice(x, 0, k, n)), b.qy.push_back(slice(y, 0, k, n));
    }
    return b;
  };
  auto task_loss = [sinusoid](const Tensor& out, const Tensor& y) {
    return sinusoid ? mean(square(out - y)) : cross_entropy(out, y);
  };
  // The parameters after `inner` SGD steps on a support set.
  auto fast = [&](auto& model, const Tensor& x, const Tensor& y, int64_t inner) {
    return adapt(model, [&](auto& m) { return task_loss(m(x), y); },
                 {.steps = inner, .lr = inner_lr, .first_order = first_order});
  };
  // Each task's query loss after `inner` steps on its support set, averaged.
  auto loss_with = [&](int64_t inner) {
    return [&, inner](auto& model, const Batch& b, Rng) {
      Tensor total = Tensor::zeros({});
      for (size_t t = 0; t < b.sx.size(); ++t) {
        const Tensor out = model.with(fast(model, b.sx[t], b.sy[t], inner))(b.qx[t]);
        total = total + task_loss(out, b.qy[t]) * (1.f / float(b.sx.size()));
      }
      return total;
    };
  };
  auto predict = [&](auto& model, const Batch& b, Rng) {
    std::vector<std::vector<float>> out;  // per task: the query set's labels or values
    for (size_t t = 0; t < b.sx.size(); ++t) {
      const Tensor o = model.with(fast(model, b.sx[t], b.sy[t], inner_steps))(b.qx[t]);
      out.push_back(sinusoid ? reshape(o, {-1}).to_vector()
                             : argmax(o, 1).to(DType::f32).to_vector());
    }
    return out;
  };
  auto metric = [&](std::span<const Task> ts, std::span<const std::vector<float>> pred) {
    double sum = 0, n = 0;
    for (size_t t = 0; t < ts.size(); ++t)
      for (size_t i = 0; i < pred[t].size(); ++i, ++n)
        sum += ts[t].score(size_t(ts[t].ep.n_support) + i, pred[t][i]);
    return train::Metrics{{sinusoid ? "mse" : "accuracy", sum / n}};
  };
  Deployer deployer({.seed = seed, .workdir = workdir});
  const std::vector<Task> eval_tasks = sample_tasks(n_eval, split[1], ~seed);
  auto run = [&](const auto& net) {
    Predictor predictor(deployer, net, collate, predict);
    auto score = [&](const ParamTree& p) {
      return metric(eval_tasks, predictor.predict(eval_tasks, meta_batch, p))[0].second;
    };
    // Meta-training (inner steps per task), or training on all tasks (0).
    auto fit = [&](Deployer& d, int64_t inner) {
      Trainer trainer(d, net, collate, loss_with(inner), optim::adam(optim::constant(meta_lr)));
      auto tasks = [&](int64_t epoch) {
        return sample_tasks(meta_batch * steps, split[0], seed * 1000003 + uint64_t(epoch));
      };
      train::FitOptions<Task> o{.global_batch_size = meta_batch, .n_epochs = epochs};
      o.eval_examples = eval_tasks, o.log_every = steps;
      o.evaluate = {predictor, metric};
      trainer.fit(per_epoch(meta_batch * steps, tasks), o);
      return score(trainer.params());
    };
    const double maml = fit(deployer, inner_steps), scratch = score(nn::init_params(net, seed));
    std::string line = fmt::format("held-out tasks ({}, {}-shot", n_eval, shots);
    bool better = maml > scratch + 0.1 && maml > 2.0 / double(ways);  // chance: 1 / ways
    if (sinusoid) {
      const auto dir = deployer.workdir() / "pretrained";
      Deployer base({.seed = seed, .workdir = dir, .world = &deployer.mesh().world()});
      const double pretrained = fit(base, 0);
      better = maml < 0.8 * pretrained && maml < 0.8 * scratch;
      line += fmt::format("): MAML mse {:.4f}, pretrained on all tasks {:.4f}", maml, pretrained);
    } else {
      line += fmt::format(", {}-way, classes {}): MAML accuracy {:.4f}", ways,
                          fmt::join(split[1], ","), maml);
    }
    line += fmt::format(", from scratch {:.4f}: {}clearly better\n", scratch, better ? "" : "NOT ");
    deployer.console() << line;
    return better ? 0 : 1;
  };
  if (sinusoid)
    return run(nn::linear(1, width) | nn::relu() | nn::linear(width, width) | nn::relu() |
               nn::linear(width, 1));
  return run(models::small_cnn({.classes = ways, .conv1 = width, .conv2 = width}));
} catch (const std::exception& e) {
  fmt::print(stderr, "meta_learning: {}\n", e.what());
  return 1;
}
