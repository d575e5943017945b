// The 30-line user program whose compile time tools/bench/build_time.sh
// records: a GPT-2 trained on a repeating token pattern by the Trainer.
#include <cstdio>

#include "redco/data/lm_data.hpp"
#include "redco/models/gpt2.hpp"
#include "redco/train/trainer.hpp"

using namespace redco;

int main() {
  std::vector<int64_t> tokens(4096);
  for (size_t i = 0; i < tokens.size(); ++i) tokens[i] = int64_t(i * 7 % 61);
  const auto windows = data::token_windows(tokens, 32);
  auto model = models::gpt2({.vocab = 64, .context = 32, .dim = 32, .layers = 2, .heads = 2});
  auto loss = [](auto& m, const data::LmBatch& b, train::Rng) {
    return cross_entropy(m(b.inputs), b.targets);
  };
  train::Deployer deployer({.seed = 1, .workdir = "user_program_workdir"});
  const auto schedule = deployer.cosine_schedule(
      {.learning_rate = 3e-3f, .n_examples = 40 * 8, .global_batch_size = 8});
  train::Trainer trainer(deployer, model, data::shifted_batch, loss, optim::adamw(schedule));
  trainer.fit(windows, {.global_batch_size = 8, .n_epochs = 1, .max_steps = 40});
  std::puts("user program: trained");
  return 0;
}
