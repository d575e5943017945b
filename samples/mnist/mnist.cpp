// Fashion-MNIST with a small CNN built from redco's layers, trained with
// value_and_grad and SGD: the loss falls within the first few hundred steps.
//   build/samples/mnist/mnist --epochs 1 --batch-size 64 --lr 0.05
#include <fmt/core.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <numeric>
#include <random>

#include "redco/redco.hpp"

using namespace redco;

// conv(1->16) relu pool | conv(16->32) relu pool | linear(32*7*7 -> 10)
const auto cnn = nn::conv2d(1, 16) | nn::relu() | nn::max_pool() | nn::conv2d(16, 32) | nn::relu() |
                 nn::max_pool() | nn::flatten() | nn::linear(32 * 7 * 7, 10);

// Copies examples order[begin, begin + B) into the (reused) batch tensors.
void collate(const data::FashionMnist& d, std::span<const int64_t> idx, Tensor& x, Tensor& y) {
  float* xp = x.data<float>();
  int64_t* yp = y.data<int64_t>();
  const int64_t pixels = d.rows * d.cols;
  for (size_t i = 0; i < idx.size(); ++i) {
    std::copy_n(d.images.begin() + idx[i] * pixels, pixels, xp + int64_t(i) * pixels);
    yp[i] = d.labels[size_t(idx[i])];
  }
}

double accuracy(const ParamTree& p, const data::FashionMnist& test, int64_t batch) {
  NoGradGuard off;
  int64_t correct = 0;
  std::vector<int64_t> idx(size_t(test.count));
  std::iota(idx.begin(), idx.end(), 0);
  for (int64_t b = 0; b + batch <= test.count; b += batch) {
    Tensor x = Tensor::empty({batch, 1, 28, 28}), y = Tensor::empty({batch}, DType::i64);
    collate(test, std::span(idx).subspan(size_t(b), size_t(batch)), x, y);
    auto pred = argmax(nn::apply(cnn, p, x), 1).values<int64_t>();
    for (int64_t i = 0; i < batch; ++i) correct += pred[size_t(i)] == y.data<int64_t>()[i];
  }
  return double(correct) / double(test.count - test.count % batch);
}

int main(int argc, char** argv) try {
  CLI::App app{"Train a small CNN on Fashion-MNIST"};
  int epochs = 1, batch = 64, log_every = 100;
  float lr = 0.05f, momentum = 0.9f;
  uint64_t seed = 42;
  std::string dir = data::kFashionMnistDir;
  app.add_option("--epochs", epochs)->check(CLI::PositiveNumber);
  app.add_option("--batch-size", batch)->check(CLI::PositiveNumber);
  app.add_option("--lr", lr)->check(CLI::PositiveNumber);
  app.add_option("--momentum", momentum)->check(CLI::Range(0.f, 1.f));
  app.add_option("--seed", seed);
  app.add_option("--log-every", log_every)->check(CLI::PositiveNumber);
  app.add_option("--data-dir", dir, "folder with the Fashion-MNIST *-ubyte.gz files");
  CLI11_PARSE(app, argc, argv);

  const auto train = data::load_fashion_mnist(dir, "train");
  const auto test = data::load_fashion_mnist(dir, "test");
  ParamTree params = nn::init_params(cnn, seed);
  auto optimizer = optim::sgd(lr, {.momentum = momentum});
  Tensor x = Tensor::empty({batch, 1, 28, 28}), y = Tensor::empty({batch}, DType::i64);
  std::vector<int64_t> order(size_t(train.count));
  std::iota(order.begin(), order.end(), 0);
  fmt::print("Fashion-MNIST: {} train / {} test images; {} epoch(s) of {} steps\n", train.count,
             test.count, epochs, train.count / batch);
  for (int epoch = 0; epoch < epochs; ++epoch) {
    std::shuffle(order.begin(), order.end(), std::mt19937_64(seed + uint64_t(epoch)));
    double running = 0;
    for (int64_t step = 0; (step + 1) * batch <= train.count; ++step) {
      collate(train, std::span(order).subspan(size_t(step * batch), size_t(batch)), x, y);
      auto [loss, grads] = value_and_grad(
          [&](const ParamTree& p) { return cross_entropy(nn::apply(cnn, p, x), y); }, params);
      optimizer.step(params, grads);
      running += loss.item();
      if ((step + 1) % log_every == 0) {
        fmt::print("epoch {} step {:5d}  loss {:.4f}\n", epoch, step + 1, running / log_every);
        running = 0;
      }
    }
    fmt::print("epoch {} test accuracy {:.2f}%\n", epoch, 100 * accuracy(params, test, 500));
  }
} catch (const std::exception& e) {
  fmt::print(stderr, "mnist: {}\n", e.what());
  return 1;
}
