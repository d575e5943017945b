// The same program with every function right: it must compile, so each
// wrong_*.cpp fails for the one reason its comment names.
// expect: compiles
#include <map>
#include <string>

#include "common.hpp"

int main() {
  using namespace cf;
  auto metric = [](std::span<const Example> ex, std::span<const int64_t> preds) {
    return std::map<std::string, double>{{"n", double(preds.size() + ex.size())}};
  };
  Deployer deployer({.seed = 1});
  Trainer trainer(deployer, model, collate, loss, optim::sgd(0.1f));
  Predictor predictor(deployer, model, collate, predict, [](int64_t label) { return label + 1; });
  std::vector<Example> train(64), valid(16);
  trainer.fit(train, {.per_device_batch_size = 8,
                      .eval_examples = valid,
                      .evaluate = {predictor, metric},
                      .save_best_by = {{"n", Mode::max}}});
  std::vector<int64_t> out = predictor.predict(valid, 4, trainer.params());
  return int(out.size()) - 16;
}
