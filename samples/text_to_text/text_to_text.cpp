// Translation with an encoder-decoder: KJV verses into modern English (WEB)
// or, with --target RV1909, into Spanish, books held out for validation and
// test. From scratch (T5, with a byte-level BPE learned from both sides of
// the training pairs; it first learns to copy the KJV verse, --copy-steps,
// which finds the alignment translation alone does not) or fine-tuned from a
// Hugging Face T5 / BART folder with its tokenizer (--init-from DIR). Beam search (4) translates;
// the best checkpoint by validation chrF is scored on the test books by BLEU and chrF next to
// copying the KJV verse unchanged.
//   build/samples/text_to_text/text_to_text --workdir t2t_web
//   build/samples/text_to_text/text_to_text --target RV1909 --workdir t2t_es
#include <fmt/core.h>

#include "datasets/verse_pairs.hpp"
#include "model_shards.hpp"
#include "redco/data/lm_data.hpp"
#include "redco/redco.hpp"
#include "redco/train/export_pretrained.hpp"
#include "redco/train/seq2seq.hpp"
#include "redco/train/trainer.hpp"
#include "redco/train/translation_metrics.hpp"
#include "redco_cli.hpp"

using namespace redco;

struct Options {
  std::string target = "WEB", init_from, export_dir;
  data::BookSplit books{.valid_books = {"Jonah", "Phlm"}, .test_books = {"Ruth", "Titus"}};
  int64_t copy_steps = -1, steps = 12000, batch = 16, max_length = 96, vocab = 600, beams = 4,
          eval_every = 3000, no_repeat = 4;
  float lr = 5e-3f;
  uint64_t seed = 42;
};

io::Metrics score(std::span<const data::TextPair> ex, std::span<const std::string> out) {
  return train::translation_metrics(out, data::targets(ex));
}

template <typename M>
int run(train::Deployer& deployer, const data::PairSplit& data, models::Pretrained<M> init,
        const data::Seq2SeqEncoder& enc, generation::GenerationConfig how,
        const std::filesystem::path& tokenizer, const Options& o) {
  auto collate = [&](std::span<const data::TextPair> ex) { return enc.encode(ex); };
  auto loss = [](auto& model, const data::Seq2SeqBatch& b, train::Rng) {
    return cross_entropy(train::seq2seq_logits(model, b), b.labels);
  };
  how.max_new_tokens = o.max_length, how.num_beams = o.beams,
  how.no_repeat_ngram_size = o.no_repeat;
  auto predict = [&](auto& model, const data::Seq2SeqBatch& b, train::Rng) {
    std::vector<std::string> texts;  // one translation per source
    for (const auto& ids : train::seq2seq_generate(model, b, how)) texts.push_back(enc.decode(ids));
    return texts;
  };
  const auto adamw = [&](int64_t steps) {
    return optim::adamw(deployer.cosine_schedule({.learning_rate = o.lr,
                                                  .n_examples = steps * o.batch,
                                                  .global_batch_size = o.batch,
                                                  .warmup_fraction = 0.05}),
                        {.weight_decay = 0.01f, .max_grad_norm = 1.f});
  };
  const int64_t per_epoch = std::max<int64_t>(1, int64_t(data.train.size()) / o.batch);
  auto given = init.take_params();
  if (o.copy_steps > 0) {  // stage 1: copy the KJV verse, which finds the alignment sooner
    std::vector<data::TextPair> copies;
    for (const data::TextPair& p : data.train) copies.push_back({p.source, p.source});
    train::Trainer copier(deployer, init.model, collate, loss, adamw(o.copy_steps),
                          std::move(given));
    copier.fit(copies, {.global_batch_size = o.batch,
                        .n_epochs = (o.copy_steps + per_epoch - 1) / per_epoch,
                        .log_every = 50,
                        .max_steps = o.copy_steps});
    given = copier.whole_params();
  }
  train::Trainer trainer(deployer, init.model, collate, loss, adamw(o.steps), std::move(given));
  train::Predictor translator(deployer, init.model, collate, predict);
  trainer.fit(data.train, {.global_batch_size = o.batch,
                           .n_epochs = (o.steps + per_epoch - 1) / per_epoch,
                           .eval_examples = data.valid,
                           .evaluate = {translator, score},
                           .eval_every_steps = o.eval_every,
                           .save_best_by = {{"chrF", train::Mode::max}},
                           .log_every = 50,
                           .max_steps = o.steps});
  if (!o.export_dir.empty()) train::export_pretrained(trainer, o.export_dir, init, tokenizer);
  std::vector<int64_t> tokens;  // of the validation targets, as the loss sees them
  for (const auto& ids : enc.ids(data::targets(data.valid)))
    tokens.insert(tokens.end(), ids.begin(), ids.end());
  const double valid_loss = trainer.eval_loss(data.valid, o.batch),
               bar = data::unigram_entropy(tokens);
  const auto best = deployer.load_checkpoint(deployer.best_dir("chrF")).params;
  const std::vector<std::string> out = translator.predict(data.test, o.batch, best);
  const io::Metrics m = score(data.test, out), base = score(data.test, data::sources(data.test));
  std::ostream& console = deployer.console();
  for (size_t i = 0; i < std::min<size_t>(3, out.size()); ++i)
    console << fmt::format("KJV: {}\nref: {}\nout: {}\n", data.test[i].source, data.test[i].target,
                           out[i]);
  console << fmt::format(
      "test ({} verses): BLEU {:.2f}, chrF {:.2f}; copying the KJV: BLEU {:.2f}, chrF {:.2f}: {}\n"
      "validation loss {:.3f} nats/token; unigram entropy of its targets {:.3f}: {}\n",
      data.test.size(), m[0].second, m[1].second, base[0].second, base[1].second,
      m[1].second > base[1].second ? "better than copying" : "NOT better than copying", valid_loss,
      bar, valid_loss < bar - 0.5 ? "clearly below" : "NOT clearly below");
  return valid_loss < bar - 0.5 ? 0 : 1;  // learned: below what ignoring the source scores
}

int main(int argc, char** argv) try {
  cli::App app{"Translate KJV verses into modern English or Spanish with an encoder-decoder"};
  models::T5Config cfg{.dim = 64,
                       .heads = 4,
                       .hidden = 128,
                       .encoder_layers = 1,
                       .decoder_layers = 1,
                       .tie_embeddings = false};
  Options o;
  std::string workdir = "t2t_workdir";
  app.add_option("--target", o.target, "the SWORD module to translate into (WEB, RV1909)");
  app.add_option("--init-from", o.init_from, "a Hugging Face T5 / BART folder to fine-tune");
  app.add_option("--export", o.export_dir, "write the trained model as a Hugging Face folder");
  app.add_option("--valid-books", o.books.valid_books, "OSIS ids held out for validation")
      ->delimiter(',');
  app.add_option("--test-books", o.books.test_books, "OSIS ids held out for the test")
      ->delimiter(',');
  app.add_option("--train-books", o.books.train_books, "train on these only")->delimiter(',');
  app.add_option("--vocab", o.vocab, "BPE vocabulary size")->check(cli::between(256, 65536));
  app.add_option("--max-length", o.max_length, "tokens per verse")->check(cli::between(2, 4096));
  app.add_option("--dim", cfg.dim)->check(cli::at_least(1));
  app.add_option("--hidden", cfg.hidden, "feed-forward width")->check(cli::at_least(1));
  app.add_option("--layers", cfg.encoder_layers, "encoder and decoder layers each")
      ->check(cli::at_least(1));
  app.add_option("--heads", cfg.heads)->check(cli::at_least(1));
  app.add_option("--copy-steps", o.copy_steps,
                 "steps learning to copy the source first (default 1500 from scratch, 0 with "
                 "--init-from)")
      ->check(cli::at_least(0));
  app.add_option("--steps", o.steps, "translation steps")->check(cli::at_least(1));
  app.add_option("--batch-size", o.batch, "global batch size")->check(cli::at_least(1));
  app.add_option("--lr", o.lr, "peak AdamW learning rate (cosine decay)")->check(cli::positive());
  app.add_option("--beams", o.beams, "beam search width")->check(cli::at_least(1));
  app.add_option("--no-repeat-ngram", o.no_repeat, "beam search: no n-gram twice in an output")
      ->check(cli::at_least(0));
  app.add_option("--eval-every", o.eval_every, "steps between validations")
      ->check(cli::at_least(1));
  app.add_option("--seed", o.seed);
  sample::ModelShards shards(app);  // --n-model-shards N|auto, --memory-per-device
  app.add_option("--workdir", workdir, "tokenizer, checkpoints and metrics");
  REDCO_CLI_PARSE(app, argc, argv);
  if (o.copy_steps < 0) o.copy_steps = o.init_from.empty() ? 1500 : 0;

  // auto: the planner cuts the run for this model (the folder's, or the one built
  // here with --vocab rows) at --max-length tokens a row.
  models::T5Config planned = cfg;
  planned.decoder_layers = planned.encoder_layers, planned.vocab = o.vocab;
  shards.plan(o.init_from, [&] { return models::t5_hf_config(planned); },
              {.seq_len = o.max_length, .global_batch = o.batch});
  train::Deployer deployer({.n_model_shards = shards.count(),
                            .seed = o.seed,
                            .workdir = workdir,
                            .auto_mesh = shards.auto_mesh()});
  const data::PairSplit data = data::verse_pairs("KJV", o.target, o.books);
  deployer.console() << fmt::format("KJV -> {}: {} training pairs, {} validation, {} test\n",
                                    o.target, data.train.size(), data.valid.size(),
                                    data.test.size());
  if (!o.init_from.empty()) {
    return models::with_family<models::T5, models::Bart>(o.init_from, [&]<typename M>() {
      const auto how = models::generation_config(o.init_from);
      const auto enc = data::Seq2SeqEncoder::pretrained(data::Tokenizer::from_file(o.init_from),
                                                        o.max_length, train::seq2seq_ids(how));
      return run(deployer, data, models::from_pretrained<M>(o.init_from), enc, how, o.init_from, o);
    });
  }
  std::string text;  // both sides: one vocabulary for the shared embedding
  for (const data::TextPair& p : data.train) text += p.source + "\n" + p.target + "\n";
  const std::filesystem::path tok = deployer.workdir() / "tokenizer.json";
  const auto enc = data::Seq2SeqEncoder::with_eos(
      data::load_or_train_bpe(tok, text, o.vocab, deployer.is_main()), o.max_length);
  cfg.decoder_layers = cfg.encoder_layers, cfg.vocab = enc.vocab_size();
  cfg.decoder_start = enc.decoder_start();
  auto init = models::untrained<models::T5>(cfg);
  init.hf_config["pad_token_id"] = enc.pad_id(), init.hf_config["eos_token_id"] = enc.eos_id();
  return run(deployer, data, std::move(init), enc, train::generation_ids(enc), tok, o);
} catch (const std::exception& e) {
  fmt::print(stderr, "text_to_text: {}\n", e.what());
  return 1;
}
