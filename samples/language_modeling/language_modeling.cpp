// A small GPT on the King James Bible, with a byte-level BPE tokenizer learned
// from the training text (or any Hugging Face tokenizer.json, --tokenizer). It
// reports the validation loss against the unigram entropy of the validation
// tokens (the best loss without looking at context) and then continues a
// prompt greedily and with nucleus sampling, decoding with a KV cache.
//   build/samples/language_modeling/language_modeling --steps 800 --workdir lm_workdir
#include <fmt/core.h>

#include "redco/data/lm_data.hpp"
#include "redco/generation/generate.hpp"
#include "redco/models/gpt2.hpp"
#include "redco/redco.hpp"
#include "redco/train/trainer.hpp"
#include "redco_cli.hpp"

using namespace redco;
using Ids = std::vector<int64_t>;  // token ids
using Prompts = std::vector<Ids>;

struct Corpus {
  data::Tokenizer tok;
  std::vector<int64_t> train{}, valid{};  // token ids
};

// The KJV, tokenized; the last 5% of the verses (from 2 Peter on) are held out.
// The tokenizer: `file`, else workdir/tokenizer.json, learned from the training text once.
Corpus load_corpus(const std::string& file, int64_t vocab, const train::Deployer& deployer) {
  const std::vector<data::Verse> verses = data::read_kjv();
  const auto split = std::span(verses).subspan(0, verses.size() - verses.size() / 20);
  const std::string train_text = data::join_verses(split);
  const std::string valid_text = data::join_verses(std::span(verses).subspan(split.size()));
  Corpus c{file.empty() ? data::load_or_train_bpe(deployer.workdir() / "tokenizer.json", train_text,
                                                  vocab, deployer.is_main())
                        : data::Tokenizer::from_file(file)};
  c.train = data::token_ids(c.tok, train_text);
  c.valid = data::token_ids(c.tok, valid_text);
  deployer.console() << fmt::format(
      "KJV: {} training tokens ({:.2f} bytes/token), {} validation tokens\n", c.train.size(),
      double(train_text.size()) / double(c.train.size()), c.valid.size());
  return c;
}

int main(int argc, char** argv) try {
  CLI::App app{"Train a small GPT on the KJV and generate text"};
  models::Gpt2Config cfg{.vocab = 2048, .context = 128, .dim = 128, .layers = 4, .heads = 4};
  int64_t steps = 800, batch = 16, max_new = 40;
  float lr = 3e-3f;
  uint64_t seed = 0;
  int n_model_shards = 1;
  std::string workdir = "lm_workdir", prompt = "And God said unto Moses,", tokenizer;
  app.add_option("--vocab", cfg.vocab, "BPE vocabulary size")
      ->check(redco::cli::between(256, 65536));
  app.add_option("--tokenizer", tokenizer, "a tokenizer.json to use instead of learning one");
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
  const Corpus kjv = load_corpus(tokenizer, cfg.vocab, deployer);
  cfg.vocab = kjv.tok.vocab_size();
  const std::vector<data::TokenWindow> train = data::token_windows(kjv.train, cfg.context);
  const std::vector<data::TokenWindow> valid = data::token_windows(kjv.valid, cfg.context);
  // The KV cache holds as many positions as the model learned: prompt and new tokens must fit.
  const Prompts prompts{data::token_ids(kjv.tok, prompt)};
  const int64_t room = cfg.context - int64_t(prompts[0].size());
  REDCO_CHECK(room > 0, "--prompt is {} tokens: --context must be longer", prompts[0].size());
  max_new = std::min(max_new, room);

  const auto schedule = deployer.cosine_schedule({.learning_rate = lr,
                                                  .n_examples = steps * batch,
                                                  .global_batch_size = batch,
                                                  .warmup_fraction = 0.05});
  auto loss = [](auto& model, const data::LmBatch& b, train::Rng) {
    return cross_entropy(model(b.inputs), b.targets);
  };
  train::Trainer trainer(deployer, models::gpt2(cfg), data::shifted_batch, loss,
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

  const double valid_loss = trainer.eval_loss(valid, batch);
  const double unigram = data::unigram_entropy(kjv.valid);
  std::ostream& out = deployer.console();  // printed once, whatever the number of processes
  out << fmt::format(
      "validation loss {:.3f} nats/token; unigram entropy of the validation tokens {:.3f}: {}\n",
      valid_loss, unigram, valid_loss < unigram - 0.5 ? "clearly below" : "NOT clearly below");

  // The third function, predict: continue prompts with a KV cache (every rank
  // runs it and caches its own heads), greedily or by nucleus sampling.
  generation::GenerationConfig how{.max_new_tokens = max_new, .seed = seed};
  auto predict = [&](auto& model, const Prompts& ps, train::Rng) {
    const auto gen = generation::generate(model.layer(), model.params(), ps, how, model.ctx());
    std::vector<std::string> texts;  // the prompts' continuations
    for (const Ids& s : gen.sequences) texts.push_back(kjv.tok.decode(s));
    return texts;
  };
  auto collate_prompts = [](std::span<const Ids> ps) { return Prompts(ps.begin(), ps.end()); };
  train::Predictor generator(deployer, models::gpt2(cfg), collate_prompts, predict);
  out << fmt::format("--- greedy ---\n{}{}\n", prompt,
                     generator.predict(prompts, 1, trainer.params())[0]);
  how.do_sample = true, how.temperature = 0.8f, how.top_p = 0.9f;  // nucleus sampling
  out << fmt::format("--- top-p 0.9 ---\n{}{}\n", prompt,
                     generator.predict(prompts, 1, trainer.params())[0]);
  return valid_loss < unigram - 0.5 ? 0 : 1;
} catch (const std::exception& e) {
  fmt::print(stderr, "language_modeling: {}\n", e.what());
  return 1;
}
