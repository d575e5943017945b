// The C++ examples of README.md, verbatim, in a context that declares what
// they use (collate, schedule, train, test, accuracy): this file compiles only
// if they do, designated initialisers in declaration order included.
// tests/test_readme.sh checks that every ```cpp block of README.md appears
// here unchanged, so the README cannot drift from what compiles.
// Nothing here runs (the examples need Fashion-MNIST and a Llama checkpoint):
// main() only proves the functions link.
#include <numeric>
#include <vector>

#include "redco/redco.hpp"

using namespace redco;

namespace {

struct Batch {
  Tensor images;  // f32 [B, 1, 28, 28]
  Tensor labels;  // i64 [B]
};

[[maybe_unused]] void what_a_program_looks_like() {
  std::vector<int64_t> train(64), test(16);  // example ids
  std::iota(train.begin(), train.end(), 0);
  std::iota(test.begin(), test.end(), 64);
  auto collate = [](std::span<const int64_t> ids) {
    const auto B = int64_t(ids.size());
    return Batch{Tensor::zeros({B, 1, 28, 28}), Tensor::zeros({B}, DType::i64)};
  };
  auto accuracy = [](std::span<const int64_t> ids, std::span<const int64_t>) {
    return train::Metrics{{"accuracy", double(ids.size())}};
  };
  auto schedule = optim::constant(0.05f);
  // clang-format off
  // ---- README.md "What a program looks like" ----
auto loss = [](auto& model, const Batch& b, Rng) { return cross_entropy(model(b.images), b.labels); };
auto predict = [](auto& model, const Batch& b, Rng) { return argmax(model(b.images), 1).template values<int64_t>(); };

Deployer deployer({.seed = 42, .workdir = "cls_workdir"});
Trainer trainer(deployer, models::small_cnn({}), collate, loss, optim::sgd(schedule, {.momentum = 0.9f}));
Predictor predictor(deployer, models::small_cnn({}), collate, predict);
trainer.fit(train, {.per_device_batch_size = 64, .n_epochs = 3, .eval_examples = test,
                    .evaluate = {predictor, accuracy}, .save_best_by = {{"accuracy", train::Mode::max}}});
  // ---- README.md: options in any order ----
train::FitOptions<int64_t> fit;  // the examples above are int64_t ids
fit.max_steps = 30;
fit.log_every = 1000;
trainer.fit(train, fit);

  // clang-format on
}

[[maybe_unused]] void pretrained_checkpoints() {
  const Tensor ids = Tensor::zeros({2, 3}, DType::i64), mask = Tensor::ones({2, 3});
  // clang-format off
  // ---- README.md "Pretrained checkpoints" ----
auto llama = models::from_pretrained<models::Llama>("Llama-3.2-1B");  // config.json + safetensors
// ids [B, T] i64, mask [B, T]: transformers' attention_mask (1 a token, 0 padding)
Tensor logits = nn::apply(llama.model, llama.params, ids, {.mask = mask});
// generation_config.json's settings (end-of-sequence ids, sampling); ours where it has none:
auto config = models::generation_config("Llama-3.2-1B", {.max_new_tokens = 64});
auto out = generation::generate(llama.model, llama.params, {{128000, 791, 6460}}, config);
// out.sequences[0]: the new tokens only, up to and including an end-of-sequence id
// (transformers' generate returns the prompt and then these)
models::save_pretrained("out", llama);  // transformers.AutoModelForCausalLM loads it back

  // clang-format on
}

}  // namespace

int main() {
  // Taking the addresses keeps both functions compiled and linked.
  void (*examples[])() = {what_a_program_looks_like, pretrained_checkpoints};
  return examples[0] && examples[1] ? 0 : 1;
}
