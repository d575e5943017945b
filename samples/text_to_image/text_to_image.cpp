// Text-to-image diffusion on Fashion-MNIST: captions made from the class
// names in varied wording ("a photo of a sneaker", "an ankle boot", ...) are
// embedded by a frozen BERT-architecture encoder, and a UNet learns to
// predict the noise of DDPM's forward process, conditioned on them through
// cross-attention (text dropped for 10% of the rows, so that sampling can use
// classifier-free guidance). DDIM then draws images for captions of every
// class; a small CNN trained on Fashion-MNIST scores how many show the
// prompted class (chance: 10%), and a grid of them is written as PNG.
//   build/samples/text_to_image/text_to_image --epochs 2 --workdir t2i_workdir
#include <fmt/core.h>

#include "redco/data/lm_data.hpp"
#include "redco/data/text_batch.hpp"
#include "redco/generation/diffusion.hpp"
#include "redco/io/png.hpp"
#include "redco/models/bert.hpp"
#include "redco/models/unet.hpp"
#include "redco/redco.hpp"
#include "redco_cli.hpp"

using namespace redco;

const std::vector<std::string> kClasses = {"t-shirt", "trouser", "pullover", "dress", "coat",
                                           "sandal",  "shirt",   "sneaker",  "bag",   "ankle boot"};
const std::vector<std::string> kWordings = {
    "a photo of {}",          "{}",         "a picture of {}",
    "an image of {}",         "this is {}", "a small photo of {}",
    "a grayscale photo of {}"};
std::string caption(int64_t label, int64_t wording) {
  const std::string& name = kClasses[size_t(label)];
  const std::string article =
      std::string("aeiou").find(name[0]) != std::string::npos ? "an " : "a ";
  return fmt::format(fmt::runtime(kWordings[size_t(wording % int64_t(kWordings.size()))]),
                     article + name);
}

struct Example {  // a training image and its caption, or (image -1) a caption to draw
  int64_t image = -1, label = 0, wording = 0;
};
struct Batch {
  Tensor images;         // f32 [B, 1, 28, 28] in [-1, 1] (zeros when drawing)
  data::TextBatch text;  // the captions' ids, mask: i64 [B, T]
  Tensor labels;         // i64 [B]: the captioned class
};

int main(int argc, char** argv) try {
  cli::App app{"Train a text-conditioned diffusion model on Fashion-MNIST"};
  int64_t epochs = 2, max_steps = 0, batch = 64, base = 16, per_class = 20, ddim = 25,
          classifier_epochs = 1, train_images = 0;
  float lr = 2e-3f, guidance = 3.f, bar = 0.3f;
  uint64_t seed = 42;
  std::string workdir = "t2i_workdir", data_dir = data::kFashionMnistDir;
  app.add_option("--epochs", epochs)->check(redco::cli::at_least(1));
  app.add_option("--max-steps", max_steps, "stop after this many steps (0: all epochs)");
  app.add_option("--batch-size", batch)->check(redco::cli::at_least(1));
  app.add_option("--lr", lr, "peak AdamW learning rate (cosine decay)")
      ->check(redco::cli::positive());
  app.add_option("--base", base, "UNet channels at 28x28 (2x below)")
      ->check(redco::cli::at_least(8));
  app.add_option("--train-images", train_images, "use the first N training images (0: all)");
  app.add_option("--per-class", per_class, "images drawn per class")
      ->check(redco::cli::at_least(1));
  app.add_option("--ddim-steps", ddim)->check(redco::cli::between(1, 1000));
  app.add_option("--guidance", guidance, "classifier-free guidance scale");
  app.add_option("--classifier-epochs", classifier_epochs)->check(redco::cli::at_least(1));
  app.add_option("--min-agreement", bar,
                 "exit 1 below this share of drawn images classified as prompted");
  app.add_option("--seed", seed);
  app.add_option("--workdir", workdir, "tokenizer, checkpoints, metrics, samples.png");
  app.add_option("--data-dir", data_dir, "folder with the Fashion-MNIST *-ubyte.gz files");
  REDCO_CLI_PARSE(app, argc, argv);

  const auto train_set = data::load_fashion_mnist(data_dir, "train");
  const int64_t n_train =
      train_images > 0 ? std::min(train_images, train_set.count) : train_set.count;
  std::vector<Example> train, draw;
  for (int64_t i = 0; i < n_train; ++i) train.push_back({i, train_set.labels[size_t(i)], i});
  for (int64_t c = 0; c < 10; ++c)
    for (int64_t k = 0; k < per_class; ++k) draw.push_back({-1, c, k});

  train::Deployer deployer({.seed = seed, .workdir = workdir});
  std::string captions;
  for (int64_t c = 0; c < 10; ++c)
    for (size_t w = 0; w < kWordings.size(); ++w) captions += caption(c, int64_t(w)) + "\n";
  const auto enc =
      data::TextEncoder::with_cls(data::load_or_train_bpe(deployer.workdir() / "tokenizer.json",
                                                          captions, 300, deployer.is_main()),
                                  16);
  auto collate = [&](std::span<const Example> ex) {
    const auto B = int64_t(ex.size()), px = int64_t(28 * 28);
    Batch b{Tensor::zeros({B, 1, 28, 28}), {}, Tensor::empty({B}, DType::i64)};
    std::vector<std::string> texts;
    for (int64_t i = 0; i < B; ++i) {
      const Example& e = ex[size_t(i)];
      texts.push_back(caption(e.label, e.wording));
      b.labels.data<int64_t>()[i] = e.label;
      if (e.image < 0) continue;
      const float* src = train_set.images.data() + e.image * px;
      std::transform(src, src + px, b.images.data<float>() + i * px,
                     [](float v) { return 2 * v - 1; });
    }
    b.text = enc.encode(texts);
    return b;
  };

  // The frozen text encoder (random weights tell the captions apart well enough) and the UNet.
  models::BertConfig text_cfg{.dim = 64, .layers = 2, .heads = 4, .hidden = 128, .context = 16};
  text_cfg.vocab = enc.vocab_size(), text_cfg.pad = enc.pad_id();
  const auto model = nn::parts(nn::named<"text">(models::bert_encoder(text_cfg)),
                               nn::named<"unet">(models::unet({.base = base, .text_dim = 64})));
  const auto sched = generation::noise_schedule({.kind = generation::BetaSchedule::cosine});
  auto denoiser = [](auto& m) {
    return [&m](const Tensor& x, const Tensor& t, const Tensor& text) {
      auto unet = train::part<"unet">(m);
      return models::predict_noise(unet, x, t, text);
    };
  };
  auto loss = [&](auto& m, const Batch& b, train::Rng rng) {
    const Tensor text = train::part<"text">(m)(b.text.ids, b.text.mask);  // [B, T, 64]
    return generation::noise_prediction_loss(sched, b.images, text, rng, denoiser(m), 0.1f);
  };
  auto predict = [&](auto& m, const Batch& b, train::Rng rng) {
    const Tensor text = train::part<"text">(m)(b.text.ids, b.text.mask);
    const Tensor x = generation::ddim_sample(sched, denoiser(m), rng.normal(b.images.shape()), text,
                                             {.steps = ddim, .guidance = guidance});
    std::vector<std::vector<float>> out;
    for (int64_t i = 0; i < x.dim(0); ++i) out.push_back(slice(x, 0, i, i + 1).to_vector());
    return out;
  };
  const auto schedule =
      deployer.cosine_schedule({.learning_rate = lr,
                                .n_examples = max_steps > 0 ? max_steps * batch : n_train,
                                .global_batch_size = batch,
                                .n_epochs = max_steps > 0 ? 1 : epochs,
                                .warmup_fraction = 0.02});
  train::Trainer trainer(deployer, model, collate, loss,
                         train::ParamGroups().freeze("text").train(
                             "unet", optim::adamw(schedule, {.max_grad_norm = 1.f})));
  trainer.fit(
      train,
      {.global_batch_size = batch, .n_epochs = epochs, .log_every = 50, .max_steps = max_steps});

  // The judge: a CNN trained on the same images (in its own workdir).
  const auto cnn = models::small_cnn({});
  train::Deployer judge(
      {.seed = seed, .workdir = deployer.workdir() / "classifier", .quiet = true});
  auto cnn_loss = [](auto& m, const Batch& b, train::Rng) {
    return cross_entropy(m(b.images), b.labels);
  };
  train::Trainer judge_trainer(judge, cnn, collate, cnn_loss,
                               optim::sgd(judge.cosine_schedule({.learning_rate = 0.05f,
                                                                 .n_examples = n_train,
                                                                 .global_batch_size = 64,
                                                                 .n_epochs = classifier_epochs}),
                                          {.momentum = 0.9f}));
  judge_trainer.fit(train,
                    {.global_batch_size = 64, .n_epochs = classifier_epochs, .log_every = 100});

  // Draw per_class images for captions of every class; the share the judge classifies as prompted.
  train::Predictor predictor(deployer, model, collate, predict);
  const auto drawn = predictor.predict(draw, batch, trainer.params());
  Tensor images = Tensor::empty({int64_t(draw.size()), 1, 28, 28});
  for (size_t i = 0; i < drawn.size(); ++i)
    std::copy(drawn[i].begin(), drawn[i].end(), images.data<float>() + int64_t(i) * 28 * 28);
  const Tensor classes = argmax(nn::apply(cnn, judge_trainer.params(), images), 1);
  double agree = 0;  // the share of drawn images in their caption's class
  for (size_t i = 0; i < draw.size(); ++i)
    agree += double(classes.data<int64_t>()[i] == draw[i].label) / double(draw.size());
  if (deployer.is_main())
    io::write_image_grid(deployer.workdir() / "samples.png", images, per_class);
  deployer.console() << fmt::format(
      "drawn images in their caption's class: {:.1f}% of {} (chance 10%): {}; grid: {}\n",
      100 * agree, draw.size(), agree >= bar ? "above the bar" : "BELOW the bar",
      (deployer.workdir() / "samples.png").string());
  return agree >= bar ? 0 : 1;
} catch (const std::exception& e) {
  fmt::print(stderr, "text_to_image: {}\n", e.what());
  return 1;
}
