// A metric that takes its arguments in the wrong order.
// expect: redco: metric must be callable as metric(std::span<const Example>, std::span<const
// Value>)
#include "common.hpp"

int main() {
  using namespace cf;
  auto bad_metric = [](std::span<const int64_t> preds, std::span<const Example> ex) {
    return Metrics{{"n", double(preds.size() + ex.size())}};
  };
  Deployer deployer({.seed = 1});
  Trainer trainer(deployer, model, collate, loss, optim::sgd(0.1f));
  Predictor predictor(deployer, model, collate, predict);
  std::vector<Example> train(64), valid(16);
  trainer.fit(
      train,
      {.per_device_batch_size = 8, .eval_examples = valid, .evaluate = {predictor, bad_metric}});
}
