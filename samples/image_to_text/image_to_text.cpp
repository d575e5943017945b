// Reading text from images: KJV lines rendered with FreeType in varied fonts, sizes, offsets
// and noise, read by a ViT encoder + GPT-2 decoder (models::VisionGpt2), a character per token,
// from scratch or --init-from a folder --export wrote. Beam-search CER and exact match on the
// held-out books' lines must fall under half the untrained model's (from a folder: not rise).
//   build/samples/image_to_text/image_to_text --workdir ocr_workdir

#include "datasets/render.hpp"
#include "redco/redco.hpp"
#include "redco/train/export_pretrained.hpp"
#include "redco/train/seq2seq.hpp"
#include "redco/train/text_metrics.hpp"
#include "redco_cli.hpp"

using namespace redco;

struct Line {
  std::string text;
  uint64_t key = 0;  // draws its font, size, offsets and noise
};
struct Batch {
  Tensor pixels;          // f32 [B, 1, H, W]
  Tensor inputs, labels;  // i64 [B, T]: start + chars, chars + end (then -100)
};
struct Options {
  int64_t steps = 2000, batch = 32, height = 16, width = 128, max_chars = 16, beams = 4,
          valid_lines = 300;
  float lr = 2e-3f;
  uint64_t seed = 0;
  int n_model_shards = 1;
  std::string workdir = "ocr_workdir", init_from, export_dir;
  data::StyleRange style{.min_size = 10.f, .max_size = 13.f, .max_noise = 0.2f};
  std::vector<std::string> fonts{"dejavu/DejaVuSans.ttf",
                                 "dejavu/DejaVuSerif.ttf",
                                 "dejavu/DejaVuSansMono.ttf",
                                 "liberation/LiberationSans-Regular.ttf",
                                 "liberation/LiberationSerif-Regular.ttf",
                                 "liberation/LiberationMono-Regular.ttf"};
  std::vector<std::string> valid_books{"Ruth", "Jonah", "Philemon"};
};

int main(int argc, char** argv) try {
  cli::App app{"Read KJV lines from rendered images with a ViT encoder and a GPT-2 decoder"};
  Options o;
  models::VitConfig vit{.channels = 1, .patch = 8, .dim = 128, .layers = 3, .heads = 4};
  app.add_option("--init-from", o.init_from, "a VisionEncoderDecoder folder (from --export)");
  app.add_option("--export", o.export_dir, "write the trained model as a Hugging Face folder");
  app.add_option("--steps", o.steps)->check(cli::at_least(1));
  app.add_option("--batch-size", o.batch)->check(cli::at_least(1));
  app.add_option("--lr", o.lr, "peak AdamW learning rate (cosine decay)")->check(cli::positive());
  app.add_option("--dim", vit.dim, "width of encoder and decoder")->check(cli::at_least(1));
  app.add_option("--layers", vit.layers, "layers of each")->check(cli::at_least(1));
  app.add_option("--heads", vit.heads)->check(cli::at_least(1));
  app.add_option("--patch", vit.patch, "ViT patch side")->check(cli::at_least(1));
  app.add_option("--height", o.height, "image rows")->check(cli::between(8, 256));
  app.add_option("--width", o.width, "image columns")->check(cli::between(8, 4096));
  app.add_option("--max-chars", o.max_chars, "characters per line")->check(cli::between(1, 256));
  app.add_option("--min-size", o.style.min_size, "smallest font size, pixels per em");
  app.add_option("--max-size", o.style.max_size, "largest font size");
  app.add_option("--noise", o.style.max_noise, "largest noise standard deviation");
  app.add_option("--fonts", o.fonts, "font files (relative: under /usr/share/fonts/truetype)");
  app.add_option("--valid-books", o.valid_books, "held-out books");
  app.add_option("--valid-lines", o.valid_lines, "held-out lines scored")->check(cli::at_least(1));
  app.add_option("--beams", o.beams, "beam search width in predict")->check(cli::at_least(1));
  app.add_option("--seed", o.seed);
  app.add_option("--n-model-shards", o.n_model_shards)->check(cli::at_least(1));
  app.add_option("--workdir", o.workdir, "checkpoints and metrics");
  REDCO_CLI_PARSE(app, argc, argv);

  // Lines of the held-out books' verses are validation (every k-th of them scored).
  const std::vector<data::Verse> kjv = data::read_kjv();
  std::vector<Line> train, valid;
  for (const data::Verse& v : kjv)
    for (std::string& l : data::wrap_words(v.text, size_t(o.max_chars)))
      (std::ranges::count(o.valid_books, v.book) ? valid : train)
          .push_back({std::move(l), train.size() + valid.size()});
  REDCO_CHECK(!valid.empty(), "--valid-books {} name no KJV book", fmt::join(o.valid_books, ","));
  const size_t every = std::max<size_t>(1, valid.size() / size_t(o.valid_lines));
  for (size_t i = 0; i * every < valid.size(); ++i) valid[i] = valid[i * every];
  valid.resize(std::min(valid.size(), size_t(o.valid_lines)));
  // One token per character of the KJV, plus start and end of line.
  const auto chars = data::CharTokenizer::fit(data::join_verses(kjv), "\x01\x02");
  const int64_t start = chars.id('\x01'), end = chars.id('\x02');

  auto collate = [&](std::span<const Line> ls) {
    thread_local std::vector<data::Font> fonts;  // FreeType faces are per thread
    for (std::string f : o.fonts | std::views::drop(fonts.size()))
      fonts.emplace_back(f.starts_with("/") ? f : "/usr/share/fonts/truetype/" + f);
    const int64_t B = int64_t(ls.size()), T = o.max_chars + 1, HW = o.height * o.width;
    Batch b{Tensor::empty({B, 1, o.height, o.width}), Tensor::full({B, T}, float(end), DType::i64),
            Tensor::full({B, T}, -100.f, DType::i64)};
    for (int64_t i = 0; i < B; ++i) {
      const Line& l = ls[size_t(i)];
      const data::DrawnStyle d = data::draw_style(o.style, fonts.size(), o.seed, l.key);
      data::render_line_into(b.pixels.data<float>() + i * HW, o.height, o.width, fonts[d.font],
                             l.text, d.style);
      const std::vector<int64_t> ids = chars.encode(l.text);
      int64_t *in = b.inputs.data<int64_t>() + i * T, *lab = b.labels.data<int64_t>() + i * T;
      in[0] = start, lab[ids.size()] = end;
      for (size_t t = 0; t < ids.size(); ++t) in[t + 1] = lab[t] = ids[t];
    }
    return b;
  };
  auto loss = [](auto& model, const Batch& b, train::Rng) {  // the images: the encoder's input
    return cross_entropy(train::seq2seq_logits(model, b.pixels, b.inputs), b.labels);
  };
  const generation::GenerationConfig how{.max_new_tokens = o.max_chars + 1,
                                         .eos_token_ids = {end},
                                         .pad_token_id = end,
                                         .num_beams = o.beams};
  auto predict = [&](auto& model, const Batch& b, train::Rng) {  // beam search, KV cache
    const std::vector<std::vector<int64_t>> prompts(size_t(b.pixels.dim(0)), {start});
    std::vector<std::string> texts;
    for (auto s : train::seq2seq_generate(model, b.pixels, prompts, how))
      texts.push_back(chars.decode(std::vector<int64_t>(s.begin(), std::ranges::find(s, end))));
    return texts;
  };
  auto metric = [](std::span<const Line> ls, std::span<const std::string> pred) {
    std::vector<std::string> refs;
    for (const Line& l : ls) refs.push_back(l.text);
    return train::text_metrics(refs, pred);  // cer, exact_match
  };

  train::Deployer deployer(
      {.n_model_shards = o.n_model_shards, .seed = o.seed, .workdir = o.workdir});
  deployer.console() << fmt::format(
      "{} training lines, {} held-out lines scored ({}), {} symbols\n", train.size(), valid.size(),
      fmt::join(o.valid_books, ", "), chars.vocab_size());
  vit.height = o.height, vit.width = o.width, vit.inner = 4 * vit.dim;
  models::VisionGpt2Config cfg{.encoder = vit, .decoder_start = start};
  auto& dec = cfg.decoder;  // as wide and deep as the encoder
  dec.vocab = chars.vocab_size(), dec.context = o.max_chars + 2, dec.dim = vit.dim;
  dec.layers = vit.layers, dec.heads = vit.heads;
  auto base = o.init_from.empty() ? models::untrained<models::VisionGpt2>(cfg)
                                  : models::from_pretrained<models::VisionGpt2>(o.init_from);
  REDCO_CHECK(base.config.decoder.vocab == dec.vocab, "--init-from {}: not from --export",
              o.init_from);
  const auto schedule = deployer.cosine_schedule({.learning_rate = o.lr,
                                                  .n_examples = o.steps * o.batch,
                                                  .global_batch_size = o.batch,
                                                  .warmup_fraction = 0.05});
  train::Trainer trainer(deployer, base.model, collate, loss,
                         optim::adamw(schedule, {.weight_decay = 0.01f, .max_grad_norm = 1.f}),
                         base.take_params());
  train::Predictor reader(deployer, base.model, collate, predict);
  const io::Metrics before = metric(valid, reader.predict(valid, o.batch, trainer.params()));
  trainer.fit(train, {.global_batch_size = o.batch,
                      .n_epochs = 1 + o.steps * o.batch / int64_t(train.size()),
                      .eval_examples = valid,
                      .evaluate = {reader, metric},
                      .eval_every_steps = std::max<int64_t>(1, o.steps / 3),
                      .max_steps = o.steps});
  const std::vector<std::string> pred = reader.predict(valid, o.batch, trainer.params());
  const io::Metrics after = metric(valid, pred);
  if (!o.export_dir.empty()) train::export_pretrained(trainer, o.export_dir, base);
  std::ostream& out = deployer.console();
  for (size_t i = 0; i < std::min<size_t>(5, valid.size()); ++i)
    out << fmt::format("  \"{}\" -> \"{}\"\n", valid[i].text, pred[i]);
  const bool learned = after[0].second < (o.init_from.empty() ? 0.5 : 1.02) * before[0].second;
  out << fmt::format("held-out lines: CER {:.4f}, exact match {:.4f} ({}: {:.4f}, {:.4f}): {}\n",
                     after[0].second, after[1].second,
                     o.init_from.empty() ? "untrained" : "at start", before[0].second,
                     before[1].second, learned ? "learned" : "NOT learned");
  return learned ? 0 : 1;
} catch (const std::exception& e) {
  fmt::print(stderr, "image_to_text: {}\n", e.what());
  return 1;
}
