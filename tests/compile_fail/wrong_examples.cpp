// Examples that are not a random-access range.
// expect: redco: examples must be a random-access, sized range of copyable values
#include <list>

#include "common.hpp"

int main() {
  using namespace cf;
  Deployer deployer({.seed = 1});
  Trainer trainer(deployer, model, collate, loss, optim::sgd(0.1f));
  std::list<Example> train(64);
  trainer.fit(train, {.per_device_batch_size = 8});
}
