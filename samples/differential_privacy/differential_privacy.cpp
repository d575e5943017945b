// Differentially private training (DP-SGD, Abadi et al. 2016) of a small CNN
// on Fashion-MNIST: each example's gradient is clipped to norm C, the batch's
// clipped sum gets N(0, (sigma C)^2) noise, and the RDP accountant turns
// sigma, the sampling rate and the number of steps into the epsilon spent.
// The sample takes the privacy budget (--epsilon, --delta) and derives sigma
// from it for the steps it plans; --epsilon 0 trains the same model without
// privacy (the ordinary step), for comparison.
//   build/samples/differential_privacy/differential_privacy --epsilon 4
//   build/samples/differential_privacy/differential_privacy --epsilon 0
#include <fmt/core.h>

#include <numeric>

#include "redco/redco.hpp"
#include "redco_cli.hpp"

using namespace redco;

struct Batch {
  Tensor images;  // f32 [B, 1, 28, 28]
  Tensor labels;  // i64 [B]
  Tensor onehot;  // f32 [B, 10]
};
struct Options {
  double epsilon = 4, delta = 1e-5, min_accuracy = 0;
  float clip = 1.f, lr = 0.5f;
  int64_t epochs = 5, batch = 256, train_examples = 0, test_examples = 0;
  uint64_t seed = 42;
  std::string workdir = "dp_workdir", data_dir = data::kFashionMnistDir;
};

int main(int argc, char** argv) try {
  cli::App app{"DP-SGD training of a CNN on Fashion-MNIST at a given (epsilon, delta)"};
  Options o;
  app.add_option("--epsilon", o.epsilon, "privacy budget; 0 trains without privacy")
      ->check(redco::cli::non_negative());
  app.add_option("--delta", o.delta, "in (0, 1): usually below 1 / training examples")
      ->check(redco::cli::positive());
  app.add_option("--max-grad-norm", o.clip, "per-example clipping norm C")
      ->check(redco::cli::positive());
  app.add_option("--epochs", o.epochs)->check(redco::cli::at_least(1));
  app.add_option("--batch-size", o.batch, "global batch size")->check(redco::cli::at_least(1));
  app.add_option("--lr", o.lr, "peak SGD learning rate (momentum 0.9, cosine decay)")
      ->check(redco::cli::positive());
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

  const auto train_set = data::load_fashion_mnist(o.data_dir, "train");
  const auto test_set = data::load_fashion_mnist(o.data_dir, "test");
  auto first = [](int64_t n, int64_t count, const char* flag) {
    REDCO_CHECK(n <= count, "{} {}: the set has {} images", flag, n, count);
    return n > 0 ? n : count;
  };
  // An example is an image id: 0..n_train-1 training images, 60000.. test images.
  const int64_t n_train = first(o.train_examples, train_set.count, "--train-examples");
  std::vector<int64_t> train(size_t(n_train), 0),
      test(size_t(first(o.test_examples, test_set.count, "--test-examples")));
  std::iota(train.begin(), train.end(), 0);
  std::iota(test.begin(), test.end(), train_set.count);
  auto image = [&](int64_t id) {
    return id < train_set.count ? std::pair{&train_set, id}
                                : std::pair{&test_set, id - train_set.count};
  };
  auto label = [&](int64_t id) { return image(id).first->labels[size_t(image(id).second)]; };

  auto collate = [&](std::span<const int64_t> ids) {
    const auto B = int64_t(ids.size()), pixels = int64_t(28 * 28);
    Batch b{Tensor::empty({B, 1, 28, 28}), Tensor::empty({B}, DType::i64), Tensor::zeros({B, 10})};
    for (int64_t i = 0; i < B; ++i) {
      const auto [set, k] = image(ids[size_t(i)]);
      std::copy_n(set->images.begin() + k * pixels, pixels, b.images.data<float>() + i * pixels);
      b.labels.data<int64_t>()[i] = label(ids[size_t(i)]);
      b.onehot.data<float>()[i * 10 + label(ids[size_t(i)])] = 1.f;
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

  // The privacy budget: sigma for the planned steps, each a sample of
  // batch / n_train of the training set.
  REDCO_CHECK(o.batch <= n_train, "--batch-size {} is larger than the {} training examples",
              o.batch, n_train);
  REDCO_CHECK(o.delta < 1, "--delta {} must be below 1", o.delta);
  const double q = double(o.batch) / double(n_train);
  const int64_t steps = Deployer::steps_per_epoch(n_train, o.batch) * o.epochs;
  const bool dp = o.epsilon > 0;
  const double sigma = dp ? privacy::noise_multiplier_for(o.epsilon, q, steps, o.delta) : 0;

  // DP-SGD's step: per-example losses, their clipped gradient sums (one
  // backward pass, ghost norms), Gaussian noise, divided by the batch.
  int64_t steps_done = 0;
  auto dp_step = [&](auto& s, const Batch& b, Rng rng) {
    auto [mean_loss, clipped] = privacy::clipped_grads(
        s, [&](auto& m) { return neg(sum(log_softmax(m(b.images)) * b.onehot, {1})); }, o.clip);
    steps_done = s.step() + 1;
    return StepResult{mean_loss, privacy::noised_gradient(s, clipped, sigma, o.clip, o.batch, rng)};
  };

  const auto cnn = models::small_cnn({});
  Deployer deployer({.seed = o.seed, .workdir = o.workdir});
  deployer.console() << (dp ? fmt::format(
                                  "DP-SGD: epsilon {} at delta {} over {} steps at sampling "
                                  "rate {:.5f} needs noise multiplier sigma {:.4f} (C {})\n",
                                  o.epsilon, o.delta, steps, q, sigma, o.clip)
                            : fmt::format("non-private training, {} steps\n", steps));
  const auto schedule = deployer.cosine_schedule({.learning_rate = o.lr,
                                                  .n_examples = n_train,
                                                  .global_batch_size = o.batch,
                                                  .n_epochs = o.epochs});
  Trainer trainer(deployer, cnn, collate, loss, optim::sgd(schedule, {.momentum = 0.9f}));
  Predictor predictor(deployer, cnn, collate, predict);
  const train::FitOptions<int64_t> fit{.global_batch_size = o.batch,
                                       .n_epochs = o.epochs,
                                       .eval_examples = test,
                                       .evaluate = {predictor, accuracy},
                                       .log_every = 50};
  if (dp)
    trainer.fit(train, fit, dp_step);
  else
    trainer.fit(train, fit);

  const double acc = accuracy(test, predictor.predict(test, 256, trainer.params()))[0].second;
  std::string spent = "no privacy";
  if (dp) {
    const auto e = privacy::epsilon(
        {.noise_multiplier = sigma, .sampling_rate = q, .steps = steps_done}, o.delta);
    spent = fmt::format("epsilon {:.3f} spent at delta {} (RDP order {}, sigma {:.4f}, {} steps)",
                        e.epsilon, o.delta, e.order, sigma, steps_done);
  }
  deployer.console() << fmt::format("test accuracy {:.4f} on {} images, {}\n", acc, test.size(),
                                    spent);
  return acc >= o.min_accuracy ? 0 : 1;
} catch (const std::exception& e) {
  fmt::print(stderr, "differential_privacy: {}\n", e.what());
  return 1;
}
