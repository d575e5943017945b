// Federated averaging (FedAvg, McMahan et al. 2017) of a small CNN over
// Fashion-MNIST split among 100 clients: every round samples some clients,
// each trains a copy of the global model on its own images for a few local
// SGD epochs, and the new global model is the mean of the client models
// weighted by their numbers of examples. IID clients get a random 1/100 of
// the training set; --non-iid clients two label-sorted shards (mostly two
// classes each). Under redco-run -n N the sampled clients of a round are
// spread over the N processes; the average joins them. --centralised trains
// the same model on the pooled data with the same SGD, for comparison (a
// "round" there is as many examples as a FedAvg round's clients hold).
//   build/samples/federated_learning/federated_learning --rounds 20 [--non-iid]
//   build/samples/federated_learning/federated_learning --rounds 20 --centralised
#include <fmt/core.h>

#include <numeric>
#include <random>

#include "redco/redco.hpp"
#include "redco_cli.hpp"

using namespace redco;

// An example is an int64: an image id (>= 0: 0.. training images, then test
// images) or a client (-1 - client).
struct Client {
  Tensor images;  // f32 [n, 1, 28, 28], in a fixed shuffled order
  Tensor labels;  // i64 [n]
};
struct Batch {
  std::vector<Client> clients;  // a round's clients (FedAvg's step)
  Tensor images, labels;        // images (evaluation, centralised training)
};
struct Options {
  int64_t clients = 100, per_round = 10, rounds = 20, local_epochs = 1, local_batch = 32,
          train_examples = 0, test_examples = 0;
  float lr = 0.1f;
  double min_accuracy = 0;
  bool non_iid = false, centralised = false;
  uint64_t seed = 42;
  std::string workdir = "fl_workdir", data_dir = data::kFashionMnistDir;
};

// Each client's training image ids. IID: a shuffled split. Non-IID: the ids
// sorted by label, cut into 2 x clients shards, two random shards per client.
std::vector<std::vector<int64_t>> partition(const Options& o, const data::FashionMnist& set,
                                            int64_t n) {
  const int64_t parts = o.non_iid ? 2 * o.clients : o.clients;
  REDCO_CHECK(parts <= n,
              "--clients {}: {} {}shards need at least as many training examples, "
              "there are {}",
              o.clients, parts, o.non_iid ? "non-IID " : "", n);
  std::mt19937_64 rng(o.seed);
  std::vector<int64_t> ids(size_t(n), 0), shard(size_t(parts), 0);
  std::iota(ids.begin(), ids.end(), 0);
  std::iota(shard.begin(), shard.end(), 0);
  if (o.non_iid)
    std::stable_sort(ids.begin(), ids.end(), [&](int64_t a, int64_t b) {
      return set.labels[size_t(a)] < set.labels[size_t(b)];
    });
  else
    std::shuffle(ids.begin(), ids.end(), rng);
  std::shuffle(shard.begin(), shard.end(), rng);
  std::vector<std::vector<int64_t>> out(size_t(o.clients));
  for (int64_t s = 0; s < parts; ++s) {
    auto& c = out[size_t(s % o.clients)];
    const int64_t k = shard[size_t(s)];
    c.insert(c.end(), ids.begin() + k * n / parts, ids.begin() + (k + 1) * n / parts);
  }
  for (auto& c : out) std::shuffle(c.begin(), c.end(), rng);  // mixed local batches
  return out;
}

int main(int argc, char** argv) try {
  cli::App app{"Federated averaging of a CNN over Fashion-MNIST clients"};
  Options o;
  app.add_option("--clients", o.clients)->check(redco::cli::at_least(1));
  app.add_option("--clients-per-round", o.per_round)->check(redco::cli::at_least(1));
  app.add_option("--rounds", o.rounds)->check(redco::cli::at_least(1));
  app.add_option("--local-epochs", o.local_epochs)->check(redco::cli::at_least(1));
  app.add_option("--local-batch-size", o.local_batch)->check(redco::cli::at_least(1));
  app.add_option("--lr", o.lr, "SGD learning rate (clients, or centralised)")
      ->check(redco::cli::positive());
  app.add_flag("--non-iid", o.non_iid, "two label-sorted shards per client");
  app.add_flag("--centralised", o.centralised, "train on the pooled data instead");
  app.add_option("--train-examples", o.train_examples, "use the first N training images (0: all)")
      ->check(redco::cli::at_least(0));
  app.add_option("--test-examples", o.test_examples, "score the first N test images (0: all)")
      ->check(redco::cli::at_least(0));
  app.add_option("--min-accuracy", o.min_accuracy, "exit 1 when the test accuracy ends below")
      ->check(redco::cli::non_negative());
  app.add_option("--seed", o.seed);
  app.add_option("--workdir", o.workdir, "checkpoints, metrics.jsonl, TensorBoard events");
  app.add_option("--data-dir", o.data_dir, "folder with the Fashion-MNIST *-ubyte.gz files");
  REDCO_CLI_PARSE(app, argc, argv);
  REDCO_CHECK(o.per_round <= o.clients, "--clients-per-round {} exceeds the {} clients",
              o.per_round, o.clients);

  const auto train_set = data::load_fashion_mnist(o.data_dir, "train");
  const auto test_set = data::load_fashion_mnist(o.data_dir, "test");
  auto first = [](int64_t n, int64_t count, const char* flag) {
    REDCO_CHECK(n <= count, "{} {}: the set has {} images", flag, n, count);
    return n > 0 ? n : count;
  };
  const int64_t n_train = first(o.train_examples, train_set.count, "--train-examples");
  const auto parts = partition(o, train_set, n_train);
  std::vector<int64_t> clients(static_cast<size_t>(o.clients)), train(static_cast<size_t>(n_train)),
      test(size_t(first(o.test_examples, test_set.count, "--test-examples")));
  std::iota(clients.begin(), clients.end(), 0);
  for (int64_t& c : clients) c = -1 - c;
  std::iota(train.begin(), train.end(), 0);
  std::iota(test.begin(), test.end(), train_set.count);
  auto label = [&](int64_t id) {
    return id < train_set.count ? train_set.labels[size_t(id)]
                                : test_set.labels[size_t(id - train_set.count)];
  };
  auto images = [&](std::span<const int64_t> ids, Tensor& x, Tensor& y) {
    const auto B = int64_t(ids.size()), pixels = int64_t(28 * 28);
    x = Tensor::empty({B, 1, 28, 28}), y = Tensor::empty({B}, DType::i64);
    for (int64_t i = 0; i < B; ++i) {
      const int64_t id = ids[size_t(i)];
      const auto& set = id < train_set.count ? train_set : test_set;
      const int64_t k = id < train_set.count ? id : id - train_set.count;
      std::copy_n(set.images.begin() + k * pixels, pixels, x.data<float>() + i * pixels);
      y.data<int64_t>()[i] = label(id);
    }
  };
  auto collate = [&](std::span<const int64_t> ids) {
    Batch b;
    if (ids[0] >= 0) return images(ids, b.images, b.labels), b;
    for (const int64_t c : ids) {
      Client& client = b.clients.emplace_back();
      images(parts[size_t(-1 - c)], client.images, client.labels);
    }
    return b;
  };
  auto loss = [](auto& model, const Batch& b, Rng) {
    return cross_entropy(model(b.images), b.labels);
  };
  auto predict = [](auto& model, const Batch& b, Rng) {
    return argmax(model(b.images), 1).template values<int64_t>();
  };
  auto accuracy = [&](std::span<const int64_t> ids, std::span<const int64_t> pred) {
    double correct = 0;
    for (size_t i = 0; i < ids.size(); ++i) correct += pred[i] == label(ids[i]);
    return train::Metrics{{"accuracy", correct / double(ids.size())}};
  };

  // One round on this process's share of the clients: local SGD from the
  // global parameters, then the example-weighted mean of the client models
  // over all processes, returned as the pseudo-gradient params - mean (SGD
  // at rate 1 then sets params = mean).
  auto fedavg = [&](auto& s, const Batch& b, Rng) {
    ParamTree sum;
    double examples = 0, loss_sum = 0;
    for (const Client& c : b.clients) {
      ParamTree local = s.trained();
      const int64_t n = c.labels.dim(0);
      for (int64_t e = 0; e < o.local_epochs; ++e)
        for (int64_t i = 0; i < n; i += o.local_batch) {
          const int64_t j = std::min(n, i + o.local_batch);
          const Tensor x = slice(c.images, 0, i, j), y = slice(c.labels, 0, i, j);
          auto [l, g] = s.value_and_grad_at(local, [&](auto& m) { return cross_entropy(m(x), y); });
          if (e == 0) loss_sum += double(l.item()) * double(j - i);
          for (auto& [name, t] : local) t = t - g.at(name) * o.lr;
        }
      for (auto& [name, t] : local)
        sum.contains(name) ? void(sum.at(name) = sum.at(name) + t * float(n))
                           : void(sum.emplace(name, t * float(n)));
      examples += double(n);
    }
    for (auto& [name, t] : sum) t = t * float(1 / examples);
    s.dp_weighted_mean(sum, examples);
    ParamTree grads;
    for (const auto& [name, t] : sum) grads.emplace(name, s.trained().at(name) - t);
    return StepResult{Tensor::full({}, float(loss_sum / examples)), grads};
  };

  const auto cnn = models::small_cnn({});
  Deployer deployer({.seed = o.seed, .workdir = o.workdir});
  Trainer trainer(deployer, cnn, collate, loss,
                  optim::sgd(optim::constant(o.centralised ? o.lr : 1.f)));
  Predictor predictor(deployer, cnn, collate, predict);
  train::FitOptions<int64_t> fit{.eval_examples = test, .evaluate = {predictor, accuracy}};
  fit.eval_per_device_batch_size = 500 / deployer.dp_size();
  fit.log_every = 1;
  if (o.centralised) {  // a round: as many local batches as a FedAvg round
    const int64_t per_round =
        std::max<int64_t>(1, n_train * o.per_round * o.local_epochs / o.clients / o.local_batch);
    fit.global_batch_size = o.local_batch, fit.eval_every_steps = per_round;
    fit.max_steps = per_round * o.rounds, fit.log_every = per_round;
    fit.n_epochs = (fit.max_steps + n_train / o.local_batch - 1) / (n_train / o.local_batch);
    trainer.fit(train, fit);
  } else {
    const int64_t per_epoch =
        o.clients / o.per_round;  // rounds in which every client takes part once
    fit.global_batch_size = o.per_round, fit.eval_every_steps = 1, fit.max_steps = o.rounds;
    fit.n_epochs = (o.rounds + per_epoch - 1) / per_epoch;
    trainer.fit(clients, fit, fedavg);
  }
  const double acc =
      accuracy(test, predictor.predict(test, 500 / deployer.dp_size(), trainer.params()))[0].second;
  deployer.console() << fmt::format(
      "test accuracy {:.4f} on {} images after {} rounds ({}, {} clients, {} per round)\n", acc,
      test.size(), o.rounds,
      o.centralised ? "centralised"
      : o.non_iid   ? "FedAvg non-IID"
                    : "FedAvg IID",
      o.clients, o.per_round);
  return acc >= o.min_accuracy ? 0 : 1;
} catch (const std::exception& e) {
  fmt::print(stderr, "federated_learning: {}\n", e.what());
  return 1;
}
