// Text classification and regression with a BERT encoder. Classification: Debian's fortunes by
// category (the file each comes from), scored by accuracy and macro-F1 on every 10th fortune of
// each category. --regression: where a KJV verse stands in the Bible (0 Genesis 1:1, 1 Revelation
// 22:21), scored by mean squared error on every 10th verse. From scratch with a byte-level BPE
// learned from the training text, or fine-tuned from a Hugging Face BERT/RoBERTa folder
// (--init-from: config.json, safetensors, tokenizer.json).
//   build/samples/classification_regression/classification_regression --epochs 3
//   build/samples/classification_regression/classification_regression --regression
#include <fmt/core.h>

#include <numeric>

#include "datasets/bibles.hpp"
#include "datasets/fortunes.hpp"
#include "model_shards.hpp"
#include "redco/data/lm_data.hpp"
#include "redco/data/text_batch.hpp"
#include "redco/models/encoder_classifier.hpp"
#include "redco/redco.hpp"
#include "redco/train/metrics.hpp"
#include "redco/train/trainer.hpp"
#include "redco_cli.hpp"

using namespace redco;

using Example = data::LabelledText;  // text, label (classification), target (regression)
using Batch = data::LabelledBatch;   // x (ids, mask: i64 [B, T]), labels i64 [B], targets f32 [B]
using data::labels_of, data::targets_of;
struct Task {
  std::vector<Example> train, valid;
  int64_t labels = 1;  // 1: regression
};
struct Options {
  std::string init_from, workdir = "clsreg_workdir", fortunes = data::kFortunesDir;
  bool regression = false;
  int64_t epochs = 3, max_steps = 0, batch = 32, vocab = 4096, max_length = 128,
          min_per_category = 100;
  models::BertConfig cfg{.dim = 128, .layers = 2, .heads = 4, .hidden = 512, .dropout = 0.1f};
  float lr = 5e-4f;
  uint64_t seed = 42;
};

Task fortune_categories(const Options& o) {
  const data::Fortunes f =
      data::read_fortunes(o.fortunes, {.min_per_category = o.min_per_category});
  const data::FortuneSplit split = data::holdout(f, 10);
  Task t;
  t.labels = int64_t(f.categories.size());
  for (const auto& e : split.train) t.train.push_back({e.text, e.category});
  for (const auto& e : split.valid) t.valid.push_back({e.text, e.category});
  return t;
}

// Where a KJV verse stands in the Bible: 0 for Genesis 1:1, 1 for Revelation 22:21.
Task verse_positions() {
  const std::vector<data::Verse> kjv = data::read_bible("KJV");
  Task t;
  for (size_t i = 0; i < kjv.size(); ++i)
    (i % 10 == 5 ? t.valid : t.train).push_back({kjv[i].text, 0, float(i) / float(kjv.size() - 1)});
  return t;
}

template <typename Model>
int run(const Options& o, train::Deployer& deployer, const Task& task, const Model& model,
        const data::TextEncoder& enc, std::optional<nn::ParamTree> init) {
  auto collate = [&](std::span<const Example> ex) { return enc.encode(ex); };
  const bool regression = task.labels == 1;
  auto loss = [regression](auto& m, const Batch& b, train::Rng) {
    const Tensor out = m(b.x.ids, b.x.mask);  // [B, labels]
    return regression ? mean(square(reshape(out, {-1}) - b.targets)) : cross_entropy(out, b.labels);
  };
  auto predict = [regression](auto& m, const Batch& b, train::Rng) {
    const Tensor out = m(b.x.ids, b.x.mask);
    return regression ? reshape(out, {-1}).to_vector() : argmax(out, 1).to(DType::f32).to_vector();
  };
  auto metric = [&](std::span<const Example> ex, std::span<const float> pred) {
    if (regression) return io::Metrics{{"mse", train::mean_squared_error(targets_of(ex), pred)}};
    return train::classification_metrics(labels_of(ex), pred, task.labels);
  };
  // The learning rate decays to 0 over the steps that will run.
  const auto schedule = deployer.cosine_schedule(
      {.learning_rate = o.lr,
       .n_examples = o.max_steps > 0 ? o.max_steps * o.batch : int64_t(task.train.size()),
       .global_batch_size = o.batch,
       .n_epochs = o.max_steps > 0 ? 1 : o.epochs,
       .warmup_fraction = 0.05});
  train::Trainer trainer(deployer, model, collate, loss,
                         optim::adamw(schedule, {.weight_decay = 0.01f, .max_grad_norm = 1.f}),
                         std::move(init));
  train::Predictor predictor(deployer, model, collate, predict);
  trainer.fit(task.train, {.global_batch_size = o.batch,
                           .n_epochs = o.epochs,
                           .eval_examples = task.valid,
                           .evaluate = {predictor, metric},
                           .save_best_by = {{regression ? "mse" : "accuracy",
                                             regression ? train::Mode::min : train::Mode::max}},
                           .log_every = 50,
                           .max_steps = o.max_steps});
  const std::vector<float> pred = predictor.predict(task.valid, o.batch, trainer.params());
  const io::Metrics final = metric(task.valid, pred);
  // What predicting without reading the text scores.
  const double base =
      regression
          ? train::mean_target_mse(targets_of(task.train), targets_of(task.valid))
          : train::majority_accuracy(labels_of(task.train), labels_of(task.valid), task.labels);
  // Clearly better than ignoring the text: 10 points of accuracy, or 20% less squared error.
  const bool learned = regression ? final[0].second < 0.8 * base : final[0].second > base + 0.10;
  std::string line;
  for (const auto& [name, v] : final) line += fmt::format("{} {:.4f}, ", name, v);
  deployer.console() << fmt::format(
      "validation ({} examples): {}{} without reading the text {:.4f}: {}\n", task.valid.size(),
      line, regression ? "mse" : "accuracy", base,
      learned ? "clearly better" : "NOT clearly better");
  return learned ? 0 : 1;
}

int main(int argc, char** argv) try {
  cli::App app{"Classify fortunes by category, or regress a verse's place in the Bible, with BERT"};
  Options o;
  app.add_option("--init-from", o.init_from,
                 "a Hugging Face BERT/RoBERTa folder (config.json, safetensors, tokenizer.json)");
  app.add_flag("--regression,--is-regression", o.regression,
               "predict where a KJV verse stands in the Bible, 0..1 (mean squared error)");
  app.add_option("--epochs", o.epochs)->check(cli::at_least(1));
  app.add_option("--max-steps", o.max_steps, "stop after this many steps (0: all epochs)")
      ->check(cli::at_least(0));
  app.add_option("--batch-size", o.batch, "global batch size")->check(cli::at_least(1));
  app.add_option("--lr", o.lr, "peak AdamW learning rate (cosine decay)")->check(cli::positive());
  app.add_option("--max-length", o.max_length, "tokens per text, [CLS] included")
      ->check(cli::between(2, 4096));
  app.add_option("--vocab", o.vocab, "BPE vocabulary (from scratch)")
      ->check(cli::between(258, 65536));
  cli::add_size_options(app, o.cfg);  // --dim, --layers, --heads
  app.add_option("--fortunes", o.fortunes, "folder of fortune files");
  app.add_option("--min-per-category", o.min_per_category, "leave out smaller categories")
      ->check(cli::at_least(2));
  app.add_option("--seed", o.seed);
  sample::ModelShards shards(app);  // --n-model-shards N|auto, --memory-per-device
  app.add_option("--workdir", o.workdir, "tokenizer, checkpoints and metrics");
  REDCO_CLI_PARSE(app, argc, argv);

  models::BertConfig planned = o.cfg;  // auto: the planner cuts the run for this model
  planned.vocab = o.vocab, planned.context = o.max_length;
  shards.plan(o.init_from, [&] { return models::bert_hf_config(planned, false); },
              {.seq_len = o.max_length, .global_batch = o.batch});
  train::Deployer deployer({.n_model_shards = shards.count(),
                            .seed = o.seed,
                            .workdir = o.workdir,
                            .auto_mesh = shards.auto_mesh()});
  const Task task = o.regression ? verse_positions() : fortune_categories(o);
  deployer.console() << fmt::format("{} training and {} validation examples, {} {}\n",
                                    task.train.size(), task.valid.size(), task.labels,
                                    o.regression ? "target" : "categories");
  if (!o.init_from.empty()) {
    const std::string type = models::hf::Config(o.init_from).string("model_type", "");
    auto fine_tune = [&]<typename M>() {
      auto p = models::classifier_from_pretrained<M>(o.init_from, task.labels, o.seed);
      const auto enc = data::TextEncoder::pretrained(data::Tokenizer::from_file(o.init_from),
                                                     std::min(o.max_length, p.config.context),
                                                     int32_t(p.config.pad));
      return run(o, deployer, task, p.model, enc, std::move(p.params));
    };
    return type == "roberta" ? fine_tune.operator()<models::Roberta>()
                             : fine_tune.operator()<models::Bert>();
  }
  std::string text;
  for (const Example& e : task.train) text += e.text + "\n";
  const auto enc =
      data::TextEncoder::with_cls(data::load_or_train_bpe(deployer.workdir() / "tokenizer.json",
                                                          text, o.vocab - 2, deployer.is_main()),
                                  o.max_length);
  models::BertConfig cfg = o.cfg;
  cfg.vocab = enc.vocab_size(), cfg.context = o.max_length, cfg.labels = task.labels;
  cfg.pad = enc.pad_id();
  return run(o, deployer, task, models::bert(cfg), enc, std::nullopt);
} catch (const std::exception& e) {
  fmt::print(stderr, "classification_regression: {}\n", e.what());
  return 1;
}
