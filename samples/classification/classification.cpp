// Fashion-MNIST classification with a small CNN: redco's three functions
// (collate, loss, predict) and a Trainer that evaluates every epoch, keeps
// the best checkpoint by accuracy and can resume an interrupted run exactly.
//   build/samples/classification/classification --epochs 3 --workdir cls_workdir [--resume]
#include <fmt/core.h>

#include <numeric>

#include "redco/redco.hpp"
#include "redco_cli.hpp"

using namespace redco;

struct Batch {
  Tensor images;  // f32 [B, 1, 28, 28]
  Tensor labels;  // i64 [B]
};

int main(int argc, char** argv) try {
  cli::App app{"Train a CNN on Fashion-MNIST"};
  int64_t epochs = 3, batch = 64, max_steps = 0, eval_size = 0;
  float lr = 0.05f;
  uint64_t seed = 42;
  int n_model_shards = 1;
  bool resume = false;
  std::string workdir = "cls_workdir", data_dir = data::kFashionMnistDir;
  app.add_option("--epochs", epochs)->check(redco::cli::at_least(1));
  app.add_option("--batch-size", batch)->check(redco::cli::at_least(1));
  app.add_option("--lr", lr, "peak SGD learning rate (momentum 0.9, cosine decay)")
      ->check(redco::cli::positive());
  app.add_option("--seed", seed);
  app.add_option("--max-steps", max_steps, "stop after this many steps (0: all epochs)");
  app.add_option("--eval-size", eval_size, "evaluate on the first N test images (0: all)")
      ->check(redco::cli::between(0, 10000));
  app.add_option("--n-model-shards", n_model_shards, "tensor-parallel shards of the model")
      ->check(redco::cli::at_least(1));
  app.add_option("--workdir", workdir, "checkpoints, metrics.jsonl, TensorBoard events");
  app.add_option("--data-dir", data_dir, "folder with the Fashion-MNIST *-ubyte.gz files");
  app.add_flag("--resume", resume, "continue from the latest checkpoint in --workdir");
  REDCO_CLI_PARSE(app, argc, argv);

  const auto train_set = data::load_fashion_mnist(data_dir, "train");
  const auto test_set = data::load_fashion_mnist(data_dir, "test");
  // An example is an image id: 0..59999 the training set, 60000.. the test set.
  const int64_t n_train = train_set.count;
  std::vector<int64_t> train(static_cast<size_t>(n_train)),
      test(static_cast<size_t>(test_set.count));
  std::iota(train.begin(), train.end(), 0);
  std::iota(test.begin(), test.end(), n_train);
  if (eval_size > 0) test.resize(size_t(eval_size));
  auto image = [&](int64_t id) {
    return id < n_train ? std::pair{&train_set, id} : std::pair{&test_set, id - n_train};
  };
  auto label = [&](int64_t id) { return image(id).first->labels[size_t(image(id).second)]; };

  auto collate = [&](std::span<const int64_t> ids) {
    const auto B = int64_t(ids.size()), pixels = int64_t(28 * 28);
    Batch b{Tensor::empty({B, 1, 28, 28}), Tensor::empty({B}, DType::i64)};
    for (int64_t i = 0; i < B; ++i) {
      const auto [set, k] = image(ids[size_t(i)]);
      std::copy_n(set->images.begin() + k * pixels, pixels, b.images.data<float>() + i * pixels);
      b.labels.data<int64_t>()[i] = label(ids[size_t(i)]);
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

  const auto cnn = models::small_cnn({});
  Deployer deployer({.n_model_shards = n_model_shards, .seed = seed, .workdir = workdir});
  const auto schedule = deployer.cosine_schedule(
      {.learning_rate = lr, .n_examples = n_train, .global_batch_size = batch, .n_epochs = epochs});
  Trainer trainer(deployer, cnn, collate, loss, optim::sgd(schedule, {.momentum = 0.9f}));
  Predictor predictor(deployer, cnn, collate, predict);
  trainer.fit(train, {.global_batch_size = batch,
                      .n_epochs = epochs,
                      .eval_examples = test,
                      .evaluate = {predictor, accuracy},
                      .eval_every_steps = max_steps,  // a run cut short is evaluated at its end
                      .save_best_by = {{"accuracy", train::Mode::max}},
                      .save_every_steps = 200,
                      .keep_last = 2,
                      .resume = resume,
                      .log_every = 50,
                      .max_steps = max_steps});
} catch (const std::exception& e) {
  fmt::print(stderr, "classification: {}\n", e.what());
  return 1;
}
