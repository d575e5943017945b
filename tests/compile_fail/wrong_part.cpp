// A loss that asks a collection of models for a part it does not have.
// expect: redco: part<"name">(model): the model has no part of that name
#include "common.hpp"

int main() {
  using namespace cf;
  const auto pair = nn::parts(nn::named<"actor">(model), nn::named<"critic">(model));
  auto bad_loss = [](auto& m, const Batch& b, Rng) {
    return cross_entropy(part<"actr">(m)(b.x), b.y);
  };
  Deployer deployer({.seed = 1});
  Trainer trainer(deployer, pair, collate, bad_loss, optim::sgd(0.1f));
  std::vector<Example> train(64);
  trainer.fit(train, {.per_device_batch_size = 8});
}
