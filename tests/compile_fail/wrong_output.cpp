// An output function whose argument does not match what predict returns.
// expect: redco: the output function must be callable as output(Out) -> Value
#include <string>

#include "common.hpp"

int main() {
  using namespace cf;
  auto bad_output = [](const std::string& s) { return s.size(); };
  Deployer deployer({.seed = 1});
  Predictor predictor(deployer, model, collate, predict, bad_output);
  std::vector<Example> examples(10);
  predictor.predict(examples, 4, nn::init_params(model, 1));
}
