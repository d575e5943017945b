// A GPT on the KJV, from scratch with a BPE learned from the training text (or --tokenizer),
// or fine-tuned from a Hugging Face causal LM folder (--init-from: GPT-2, LLaMA, Mistral, Qwen2,
// OPT, GPT-J, GPT-NeoX); the validation loss against the validation tokens' unigram entropy, a
// folder transformers loads (--export DIR), and a prompt continued with a KV cache.
//   build/samples/language_modeling/language_modeling --steps 800 --workdir lm_workdir
#include <fmt/core.h>

#include "model_shards.hpp"
#include "redco/data/lm_data.hpp"
#include "redco/redco.hpp"
#include "redco/train/export_pretrained.hpp"
#include "redco_cli.hpp"

using namespace redco;
using Ids = std::vector<int64_t>;  // token ids
using Prompts = std::vector<Ids>;

struct Options {
  int64_t steps = 800, batch = 16, max_new = 40, context = 128;
  float lr = 3e-3f;
  uint64_t seed = 0;
  std::string prompt = "And God said unto Moses,", export_dir;
};

// The KJV as token ids, with the tokenizer and its file (an exported folder copies it).
struct Corpus : data::TokenizerFile {
  Ids train{}, valid{};
};

// Trains `init` and generates; every family is one type, models::CausalLM: this compiles once.
bool fit_and_generate(train::Deployer& deployer, const Corpus& kjv,
                      models::Pretrained<models::CausalLM> init, Options o) {
  init.model.check_fits(o.context, kjv.tok.vocab_size());  // --context, --tokenizer
  const auto train = data::token_windows(kjv.train, o.context),
             valid = data::token_windows(kjv.valid, o.context);
  // The KV cache holds as many positions as the model learned: prompt and new tokens must fit.
  const Prompts prompts{data::token_ids(kjv.tok, o.prompt)};
  const int64_t room = o.context - int64_t(prompts[0].size());
  REDCO_CHECK(room > 0, "--prompt is {} tokens: --context must be longer", prompts[0].size());
  const auto schedule = deployer.cosine_schedule({.learning_rate = o.lr,
                                                  .n_examples = o.steps * o.batch,
                                                  .global_batch_size = o.batch,
                                                  .warmup_fraction = 0.05});
  auto loss = [](auto& model, const data::LmBatch& b, train::Rng) {
    return cross_entropy(model(b.inputs), b.targets);
  };
  train::Trainer trainer(deployer, init.model, data::shifted_batch, loss,
                         optim::adamw(schedule, {.weight_decay = 0.1f, .max_grad_norm = 1.f}),
                         init.take_params());
  const int64_t per_epoch = int64_t(train.size()) / o.batch;
  trainer.fit(train,
              {.global_batch_size = o.batch,
               .n_epochs = (o.steps + per_epoch - 1) / per_epoch,
               .eval_examples = valid,
               .eval_every_steps = std::max<int64_t>(1, o.steps / 3),
               .max_steps = o.steps,
               .throughput = {.items_per_example = double(o.context), .item_name = "tokens"}});
  const double valid_loss = trainer.eval_loss(valid, o.batch),
               bar = data::unigram_entropy(kjv.valid);
  std::ostream& out = deployer.console();  // printed once, whatever the number of processes
  out << fmt::format(
      "validation loss {:.3f} nats/token; unigram entropy of the validation tokens {:.3f}: {}\n",
      valid_loss, bar, valid_loss < bar - 0.5 ? "clearly below" : "NOT clearly below");
  if (!o.export_dir.empty()) train::export_pretrained(trainer, o.export_dir, init, kjv.file);
  // The third function, predict: continue prompts with a KV cache (every rank
  // runs it and caches its own heads), greedily or by nucleus sampling.
  generation::GenerationConfig how{.max_new_tokens = std::min(o.max_new, room), .seed = o.seed};
  auto predict = [&](auto& model, const Prompts& ps, train::Rng) {
    const auto gen = generation::generate(model.layer(), model.params(), ps, how, model.ctx());
    std::vector<std::string> texts;  // the prompts' continuations
    for (const Ids& s : gen.sequences) texts.push_back(kjv.tok.decode(s));
    return texts;
  };
  auto collate_prompts = [](std::span<const Ids> ps) { return Prompts(ps.begin(), ps.end()); };
  train::Predictor generator(deployer, init.model, collate_prompts, predict);
  out << fmt::format("--- greedy ---\n{}{}\n", o.prompt,
                     generator.predict(prompts, 1, trainer.params())[0]);
  how.do_sample = true, how.temperature = 0.8f, how.top_p = 0.9f;  // nucleus sampling
  out << fmt::format("--- top-p 0.9 ---\n{}{}\n", o.prompt,
                     generator.predict(prompts, 1, trainer.params())[0]);
  return valid_loss < bar - 0.5;
}

int main(int argc, char** argv) try {
  cli::App app{"Train or fine-tune a GPT on the KJV and generate text"};
  models::Gpt2Config cfg{.vocab = 2048, .dim = 128, .layers = 4, .heads = 4};
  Options o;
  std::string workdir = "lm_workdir", tokenizer, init_from;
  app.add_option("--init-from", init_from, "a Hugging Face folder to fine-tune");
  app.add_option("--export", o.export_dir, "write the trained model as a Hugging Face folder");
  app.add_option("--tokenizer", tokenizer, "a tokenizer.json instead of the learned one");
  app.add_option("--vocab", cfg.vocab, "BPE vocabulary size")->check(cli::between(256, 65536));
  app.add_option("--context", o.context, "tokens per window")->check(cli::at_least(1));
  cli::add_size_options(app, cfg);  // --dim, --layers, --heads
  app.add_option("--steps", o.steps)->check(cli::at_least(1));
  app.add_option("--batch-size", o.batch)->check(cli::at_least(1));
  app.add_option("--lr", o.lr, "peak AdamW learning rate (cosine decay)")->check(cli::positive());
  app.add_option("--seed", o.seed);
  sample::ModelShards shards(app);  // --n-model-shards N|auto, --memory-per-device
  app.add_option("--workdir", workdir, "tokenizer, checkpoints and metrics");
  app.add_option("--prompt", o.prompt);
  app.add_option("--max-new", o.max_new, "tokens to generate")->check(cli::at_least(0));
  REDCO_CLI_PARSE(app, argc, argv);

  cfg.context = o.context;  // auto: the planner cuts the run for the folder's model or this one
  shards.plan(init_from, [&] { return models::gpt2_hf_config(cfg); },
              {.seq_len = o.context, .global_batch = o.batch});
  train::Deployer deployer({.n_model_shards = shards.count(),
                            .seed = o.seed,
                            .workdir = workdir,
                            .auto_mesh = shards.auto_mesh()});
  const data::TextSplit text = data::kjv_split();  // the last 5% of the verses held out
  Corpus kjv{data::pick_tokenizer(tokenizer, init_from, deployer.workdir() / "tokenizer.json",
                                  text.train, cfg.vocab, deployer.is_main())};
  kjv.train = data::token_ids(kjv.tok, text.train),
  kjv.valid = data::token_ids(kjv.tok, text.valid);
  deployer.console() << fmt::format("KJV: {} training tokens, {} validation\n", kjv.train.size(),
                                    kjv.valid.size());
  if (init_from.empty()) {  // from scratch: the Trainer initialises the parameters
    cfg.vocab = kjv.tok.vocab_size(), cfg.context = o.context;
    const models::CausalLM gpt2 = models::causal_lm(cfg);
    return fit_and_generate(deployer, kjv, models::untrained<models::CausalLM>(gpt2), o) ? 0 : 1;
  }
  auto init = models::from_pretrained<models::CausalLM>(init_from);
  return fit_and_generate(deployer, kjv, std::move(init), o) ? 0 : 1;
} catch (const std::exception& e) {
  fmt::print(stderr, "language_modeling: {}\n", e.what());
  return 1;
}
