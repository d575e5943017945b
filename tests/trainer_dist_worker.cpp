// Trains a tiny GPT for 10 steps on however many processes started it (one,
// or redco-run -n N) with n_model_shards = argv[1], zero_stage = argv[2]
// (default 0) and a model vocabulary of argv[3] (default 32, the data's; 512
// makes the embedding over half the model, which ZeRO splits among owners),
// and prints the step losses once ("loss <step> <value>"), for
// test_trainer_ucx.sh to compare.
#include <fmt/format.h>

#include <cstdlib>
#include <random>
#include <vector>

#include "redco/models/gpt2.hpp"
#include "redco/train/trainer.hpp"

using namespace redco;

namespace {

constexpr int64_t kT = 8, kVocab = 32;

struct Batch {
  Tensor inputs, targets;
};

// Windows of kT + 1 tokens following t + 1 = (3 t + k) mod vocab.
std::vector<std::vector<int64_t>> make_data(int64_t n) {
  std::mt19937_64 rng(5);
  std::vector<std::vector<int64_t>> out(static_cast<size_t>(n));
  for (auto& s : out) {
    const auto k = int64_t(rng() % 4);
    s.push_back(int64_t(rng() % kVocab));
    for (int64_t t = 0; t < kT; ++t) s.push_back((3 * s.back() + k) % kVocab);
  }
  return out;
}

Batch collate(std::span<const std::vector<int64_t>> ex) {
  const auto n = int64_t(ex.size());
  Batch b{Tensor::empty({n, kT}, DType::i64), Tensor::empty({n, kT}, DType::i64)};
  for (int64_t i = 0; i < n; ++i) {
    std::copy_n(ex[size_t(i)].begin(), kT, b.inputs.data<int64_t>() + i * kT);
    std::copy_n(ex[size_t(i)].begin() + 1, kT, b.targets.data<int64_t>() + i * kT);
  }
  return b;
}

}  // namespace

int main(int argc, char** argv) try {
  const int shards = argc > 1 ? std::atoi(argv[1]) : 1;
  const int zero = argc > 2 ? std::atoi(argv[2]) : 0;
  const int64_t vocab = argc > 3 ? std::atoll(argv[3]) : kVocab;
  Deployer deployer({.n_model_shards = shards, .seed = 3, .quiet = true, .zero_stage = zero});
  auto loss = [](auto& model, const Batch& b, Rng) {
    return cross_entropy(model(b.inputs), b.targets);
  };
  const auto gpt =
      models::gpt2({.vocab = vocab, .context = kT, .dim = 16, .layers = 2, .heads = 4});
  Trainer trainer(deployer, gpt, collate, loss,
                  optim::adamw(optim::linear(1e-2f, 1e-3f, 10), {.max_grad_norm = 0.5f}));
  trainer.fit(make_data(96),
              {.global_batch_size = 8, .max_steps = 10, .on_step = [&](const train::StepInfo& s) {
                 deployer.console() << fmt::format("loss {} {:.9g}\n", s.step, s.loss);
               }});
  return 0;
} catch (const std::exception& e) {
  fmt::print(stderr, "trainer_dist_worker: {}\n", e.what());
  return 1;
}
