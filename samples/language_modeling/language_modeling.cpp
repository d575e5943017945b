// A small GPT on the King James Bible, with a byte-level BPE tokenizer learned
// from the training text. It reports the validation loss against the unigram
// entropy of the validation tokens (the best loss without looking at context)
// and then continues a prompt greedily and with nucleus sampling.
//   build/samples/language_modeling/language_modeling --steps 800 --workdir lm_workdir
#include <fmt/core.h>

#include <cmath>
#include <filesystem>
#include <unordered_map>

#include "redco/data/bpe.hpp"
#include "redco/data/text.hpp"
#include "redco/models/gpt2.hpp"
#include "redco/nn/generate.hpp"
#include "redco/redco.hpp"
#include "redco/train/trainer.hpp"
#include "redco_cli.hpp"

using namespace redco;
using Window = std::span<const int64_t>;  // an example: context + 1 consecutive tokens

struct Batch {
  Tensor inputs, targets;  // i64 [B, T]: a window's first T tokens, and its last T
};

// Loaded from `dir` when a tokenizer of this size was saved there, else trained and saved.
// Every process trains the same tokenizer (it is deterministic); one saves it.
data::Bpe tokenizer(const std::filesystem::path& dir, std::string_view text, int64_t vocab,
                    bool save) {
  if (std::filesystem::exists(dir / "merges.txt")) {
    data::Bpe bpe = data::Bpe::load(dir);
    if (bpe.vocab_size() == vocab) return bpe;
  }
  data::Bpe bpe = data::Bpe::train(text, vocab);
  if (save) bpe.save(dir);
  return bpe;
}

std::vector<int64_t> encode(const data::Bpe& bpe, std::string_view text) {
  const std::vector<int32_t> ids = bpe.encode(text);
  return {ids.begin(), ids.end()};
}

// Non-overlapping windows covering `tokens`.
std::vector<Window> windows(const std::vector<int64_t>& tokens, int64_t context) {
  std::vector<Window> out;
  for (size_t s = 0; s + size_t(context) < tokens.size(); s += size_t(context))
    out.push_back(Window(tokens).subspan(s, size_t(context) + 1));
  return out;
}

// Entropy of the token frequencies, in nats: the loss of the best context-free model.
double unigram_entropy(const std::vector<int64_t>& tokens) {
  std::unordered_map<int64_t, double> count;
  for (int64_t t : tokens) count[t] += 1;
  double h = 0;
  for (const auto& [t, c] : count)
    h -= c / double(tokens.size()) * std::log(c / double(tokens.size()));
  return h;
}

struct Corpus {
  data::Bpe bpe;
  std::vector<int64_t> train, valid;  // token ids
};

// The KJV, tokenized; the last 5% of the verses (from 2 Peter on) are held out.
Corpus load_corpus(const std::filesystem::path& tokenizer_dir, int64_t vocab,
                   const train::Deployer& deployer) {
  const std::vector<data::Verse> verses = data::read_kjv();
  const auto split = std::span(verses).subspan(0, verses.size() - verses.size() / 20);
  const std::string train_text = data::join_verses(split);
  const std::string valid_text = data::join_verses(std::span(verses).subspan(split.size()));
  Corpus c{tokenizer(tokenizer_dir, train_text, vocab, deployer.is_main()), {}, {}};
  c.train = encode(c.bpe, train_text);
  c.valid = encode(c.bpe, valid_text);
  deployer.console() << fmt::format(
      "KJV: {} training tokens ({:.2f} bytes/token), {} validation tokens\n", c.train.size(),
      double(train_text.size()) / double(c.train.size()), c.valid.size());
  return c;
}

Batch collate(std::span<const Window> ws) {
  const auto B = int64_t(ws.size()), T = int64_t(ws[0].size()) - 1;
  Batch b{Tensor::empty({B, T}, DType::i64), Tensor::empty({B, T}, DType::i64)};
  for (int64_t i = 0; i < B; ++i) {
    std::copy_n(ws[size_t(i)].begin(), T, b.inputs.data<int64_t>() + i * T);
    std::copy_n(ws[size_t(i)].begin() + 1, T, b.targets.data<int64_t>() + i * T);
  }
  return b;
}

int main(int argc, char** argv) try {
  CLI::App app{"Train a small GPT on the KJV and generate text"};
  models::Gpt2Config cfg{.vocab = 2048, .context = 128, .dim = 128, .layers = 4, .heads = 4};
  int64_t steps = 800, batch = 16, max_new = 40;
  float lr = 3e-3f;
  uint64_t seed = 0;
  int n_model_shards = 1;
  std::string workdir = "lm_workdir", prompt = "And God said unto Moses,";
  app.add_option("--vocab", cfg.vocab, "BPE vocabulary size")
      ->check(redco::cli::between(256, 65536));
  app.add_option("--context", cfg.context, "tokens per training window")
      ->check(redco::cli::at_least(1));
  app.add_option("--dim", cfg.dim, "model width")->check(redco::cli::at_least(1));
  app.add_option("--layers", cfg.layers)->check(redco::cli::at_least(1));
  app.add_option("--heads", cfg.heads)->check(redco::cli::at_least(1));
  app.add_option("--steps", steps)->check(redco::cli::at_least(1));
  app.add_option("--batch-size", batch)->check(redco::cli::at_least(1));
  app.add_option("--lr", lr, "peak AdamW learning rate (cosine decay)")
      ->check(redco::cli::positive());
  app.add_option("--seed", seed);
  app.add_option("--n-model-shards", n_model_shards, "tensor-parallel shards of the model")
      ->check(redco::cli::at_least(1));
  app.add_option("--workdir", workdir, "tokenizer, checkpoints and metrics");
  app.add_option("--prompt", prompt);
  app.add_option("--max-new", max_new, "tokens to generate")->check(redco::cli::at_least(0));
  REDCO_CLI_PARSE(app, argc, argv);

  train::Deployer deployer({.n_model_shards = n_model_shards, .seed = seed, .workdir = workdir});
  const Corpus kjv = load_corpus(std::filesystem::path(workdir) / "tokenizer", cfg.vocab, deployer);
  const std::vector<Window> train = windows(kjv.train, cfg.context);
  const std::vector<Window> valid = windows(kjv.valid, cfg.context);

  const auto schedule = deployer.cosine_schedule({.learning_rate = lr,
                                                  .n_examples = steps * batch,
                                                  .global_batch_size = batch,
                                                  .warmup_fraction = 0.05});
  auto loss = [](auto& model, const Batch& b, train::Rng) {
    return cross_entropy(model(b.inputs), b.targets);
  };
  train::Trainer trainer(deployer, models::gpt2(cfg), collate, loss,
                         optim::adamw(schedule, {.weight_decay = 0.1f, .max_grad_norm = 1.f}));
  const int64_t per_epoch = int64_t(train.size()) / batch;
  const double n_params = double(nn::count_parameters(trainer.params()));
  trainer.fit(train, {.global_batch_size = batch,
                      .n_epochs = (steps + per_epoch - 1) / per_epoch,
                      .eval_examples = valid,
                      .eval_every_steps = std::max<int64_t>(1, steps / 3),
                      .max_steps = steps,
                      .throughput = {.items_per_example = double(cfg.context),
                                     .item_name = "tokens",
                                     .flops_per_item = 6 * n_params}});

  const double valid_loss = trainer.eval_loss(valid, batch), unigram = unigram_entropy(kjv.valid);
  std::ostream& out = deployer.console();  // printed once, whatever the number of processes
  out << fmt::format(
      "validation loss {:.3f} nats/token; unigram entropy of the validation tokens {:.3f}: {}\n",
      valid_loss, unigram, valid_loss < unigram - 0.5 ? "clearly below" : "NOT clearly below");

  // The third function, predict: continue a prompt, greedily or by nucleus sampling.
  nn::GenerateOptions how{.max_new = max_new, .greedy = true, .context = cfg.context};
  auto collate_prompt = [&](std::span<const std::string> texts) {  // one prompt per batch
    const std::vector<int64_t> ids = encode(kjv.bpe, texts[0]);
    return Tensor::from<int64_t>(Window(ids), {1, int64_t(ids.size())});
  };
  auto predict = [&](auto& model, const Tensor& ids, train::Rng rng) {
    auto logits = [&](const Tensor& x) { return nn::whole(model(x)); };  // all of the vocabulary
    const Tensor out = nn::generate(logits, ids, how, rng.key());
    return std::vector<std::string>{kjv.bpe.decode(out.values<int64_t>())};
  };
  train::Predictor generator(deployer, models::gpt2(cfg), collate_prompt, predict);
  const std::vector<std::string> prompts{prompt};
  out << fmt::format("--- greedy ---\n{}\n", generator.predict(prompts, 1, trainer.params())[0]);
  how = {.max_new = max_new, .temperature = 0.8f, .top_p = 0.9f, .context = cfg.context};
  out << fmt::format("--- top-p 0.9 ---\n{}\n", generator.predict(prompts, 1, trainer.params())[0]);
  return valid_loss < unigram - 0.5 ? 0 : 1;
} catch (const std::exception& e) {
  fmt::print(stderr, "language_modeling: {}\n", e.what());
  return 1;
}
