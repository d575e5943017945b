// A loss function without the Rng argument.
// expect: redco: loss must be callable as loss(model, const Batch&, Rng) -> Tensor (a scalar)
#include "common.hpp"

int main() {
  using namespace cf;
  auto bad_loss = [](auto& m, const Batch& b) { return cross_entropy(m(b.x), b.y); };
  Deployer deployer({.seed = 1});
  Trainer trainer(deployer, model, collate, bad_loss, optim::sgd(0.1f));
  std::vector<Example> train(64);
  trainer.fit(train, {.per_device_batch_size = 8});
}
