// A collate function that takes one example instead of a span of them.
// expect: redco: collate must be callable as collate(std::span<const Example>) -> Batch
#include "common.hpp"

int main() {
  using namespace cf;
  auto bad_collate = [](const Example&) { return Batch{Tensor::zeros({1, 4}), Tensor()}; };
  Deployer deployer({.seed = 1});
  Trainer trainer(deployer, model, bad_collate, loss, optim::sgd(0.1f));
  std::vector<Example> train(64);
  trainer.fit(train, {.per_device_batch_size = 8});
}
