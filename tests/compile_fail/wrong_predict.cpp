// A predict function that returns the batch's logits tensor, not one output per example.
// expect: redco: predict must be callable as predict(model, const Batch&, Rng) -> a sized range
#include "common.hpp"

int main() {
  using namespace cf;
  auto bad_predict = [](auto& m, const Batch& b, Rng) { return m(b.x); };
  Deployer deployer({.seed = 1});
  Predictor predictor(deployer, model, collate, bad_predict);
  std::vector<Example> examples(10);
  predictor.predict(examples, 4, nn::init_params(model, 1));
}
