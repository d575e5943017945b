// LoRA: a causal LM that knows the King James Bible adapted to modern English (the World
// English Bible) by rank-r adapters on a frozen base. The base is a Hugging Face GPT-2 /
// LLaMA / Mistral / Qwen2 folder (--init-from DIR), or by default a small GPT-2 trained on the
// KJV first (kept in WORKDIR/base). It prints the trainable share, the held-out WEB loss
// before and after, the adapter checkpoint's size, with --full the same steps of full
// fine-tuning, and with --export DIR writes the merged model (W + alpha/r B A) for transformers.
//   build/samples/lora/lora --full --workdir lora_workdir
#include "redco/train/lora.hpp"

#include <fmt/core.h>

#include "redco/data/bibles.hpp"
#include "redco/data/lm_data.hpp"
#include "redco/redco.hpp"
#include "redco_cli.hpp"

using namespace redco;
namespace fs = std::filesystem;
using Windows = std::vector<data::TokenWindow>;

struct Options {
  int64_t steps = 300, base_steps = 1000, batch = 16, context = 64;
  float lr = 3e-3f, full_lr = 1e-3f, base_lr = 3e-3f;
  nn::LoraOptions lora{.rank = 8, .alpha = 16.f, .targets = ""};
  bool full = false;
  std::string export_dir;
};

// One text (texts[0]: KJV, texts[1]: WEB) as windows of tokens; `ids` keeps the tokens.
Windows windows(const data::Tokenizer& tok, std::span<const data::AlignedVerse> verses,
                size_t which, int64_t context, std::vector<int64_t>& ids) {
  std::string text;
  for (const data::AlignedVerse& v : verses) text += v.texts[which] + "\n";
  ids = data::token_ids(tok, text);
  return data::token_windows(ids, context);
}

optim::Optimizer adamw(Deployer& d, float lr, const Options& o, int64_t steps) {
  return optim::adamw(d.cosine_schedule({.learning_rate = lr,
                                         .n_examples = steps * o.batch,
                                         .global_batch_size = o.batch,
                                         .warmup_fraction = 0.05}),
                      {.max_grad_norm = 1.f});
}

// `steps` steps on `train`; the held-out loss before and after; then(trainer) at the end.
template <typename L, typename Then>
std::pair<double, double> fit(Deployer& d, const L& model, ParamGroups opt,
                              std::optional<nn::ParamTree> params, const Windows& train,
                              const Windows& valid, int64_t steps, const Options& o, bool save,
                              Then then) {
  auto loss = [](auto& m, const data::LmBatch& b, Rng) {
    return cross_entropy(m(b.inputs), b.targets);
  };
  Trainer trainer(d, model, data::shifted_batch, loss, std::move(opt), std::move(params));
  const double before = trainer.eval_loss(valid, o.batch);
  const int64_t per_epoch = std::max<int64_t>(1, int64_t(train.size()) / o.batch);
  trainer.fit(train, {.global_batch_size = o.batch,
                      .n_epochs = (steps + per_epoch - 1) / per_epoch,
                      .save_at_end = save,
                      .log_every = std::max<int64_t>(1, steps / 4),
                      .max_steps = steps});
  then(trainer);
  return {before, trainer.eval_loss(valid, o.batch)};
}

// Adapts `base` to the WEB. Exit status 0 when the adapters lower the held-out loss by at
// least 0.2 nats and their checkpoint is under 5% of the model's size in f32.
template <typename M>
int adapt(Deployer& d, const data::TokenizerFile& tok, const data::AlignedSplit& bible,
          models::Pretrained<M> base, Options o) {
  std::vector<int64_t> train_ids, valid_ids;
  const Windows train = windows(tok.tok, bible.train, 1, o.context, train_ids),
                valid = windows(tok.tok, bible.valid, 1, o.context, valid_ids);
  if (o.lora.targets.empty())
    o.lora.targets = std::is_same_v<M, models::Gpt2> ? "c_attn" : "q_proj,v_proj";
  const auto model = nn::lora(base.model, o.lora);
  const nn::ParamShare share = nn::adapter_share(model);
  std::ostream& out = d.console();
  out << fmt::format("LoRA r={} alpha={} on {}: {} trainable of {} parameters ({:.3f}%)\n",
                     o.lora.rank, o.lora.alpha, o.lora.targets, share.trained, share.total,
                     100 * share.fraction());
  double ckpt_bytes = 0;
  const auto [before, after] = fit(d, model, train::lora_groups(adamw(d, o.lr, o, o.steps)),
                                   nn::with_adapters(model, base.params, d.seed()), train, valid,
                                   o.steps, o, true, [&](auto& trainer) {
                                     if (const auto ck = io::latest_checkpoint(d.workdir()))
                                       ckpt_bytes =
                                           double(fs::file_size(ck->dir / io::kCheckpointParams));
                                     if (!o.export_dir.empty())
                                       train::export_merged(trainer, o.export_dir, base, tok.file);
                                   });
  const double model_bytes = 4.0 * double(share.total - share.trained);
  out << fmt::format(
      "held-out WEB loss: base {:.3f}, LoRA {:.3f} after {} steps; adapter checkpoint {:.0f} "
      "bytes ({:.2f}% of the model)\n",
      before, after, o.steps, ckpt_bytes, 100 * ckpt_bytes / model_bytes);
  if (o.full) {
    const double full = fit(d, base.model, adamw(d, o.full_lr, o, o.steps), base.params, train,
                            valid, o.steps, o, false, [](auto&) {})
                            .second;
    out << fmt::format("held-out WEB loss: full fine-tuning {:.3f} after {} steps\n", full,
                       o.steps);
  }
  return after < before - 0.2 && ckpt_bytes > 0 && ckpt_bytes < 0.05 * model_bytes ? 0 : 1;
}

// The default base: a small GPT-2 trained on the KJV (the training books), saved as a
// Hugging Face folder in `dir` and read from there when it exists.
models::Pretrained<models::Gpt2> kjv_base(Deployer& d, const data::TokenizerFile& tok,
                                          const data::AlignedSplit& bible, models::Gpt2Config cfg,
                                          const Options& o, const fs::path& dir) {
  if (fs::exists(dir / "config.json")) return models::from_pretrained<models::Gpt2>(dir);
  std::vector<int64_t> ids, valid_ids;
  const Windows kjv = windows(tok.tok, bible.train, 0, o.context, ids),
                kjv_valid = windows(tok.tok, bible.valid, 0, o.context, valid_ids);
  cfg.vocab = tok.tok.vocab_size(), cfg.context = o.context;
  auto base = models::untrained<models::Gpt2>(cfg);
  const double loss = fit(d, base.model, adamw(d, o.base_lr, o, o.base_steps), std::nullopt, kjv,
                          kjv_valid, o.base_steps, o, false,
                          [&](auto& t) {
                            base.params = t.whole_params();  // every process keeps them
                            if (d.is_main())
                              train::write_pretrained(base.params, dir, base, tok.file);
                          })
                          .second;
  d.console() << fmt::format("base: held-out KJV loss {:.3f} after {} steps, saved in {}\n", loss,
                             o.base_steps, dir.string());
  return base;
}

int main(int argc, char** argv) try {
  CLI::App app{"Adapt a causal LM from the KJV to modern English (WEB) with LoRA"};
  models::Gpt2Config cfg{.vocab = 2048, .dim = 128, .layers = 4, .heads = 4};
  Options o;
  int n_model_shards = 1;
  uint64_t seed = 0;
  std::string workdir = "lora_workdir", tokenizer, init_from;
  app.add_option("--init-from", init_from, "a Hugging Face folder to adapt (its tokenizer)");
  app.add_option("--export", o.export_dir, "write the merged model as a Hugging Face folder");
  app.add_option("--rank", o.lora.rank, "LoRA rank r")->check(cli::at_least(1));
  app.add_option("--alpha", o.lora.alpha, "LoRA scale alpha (adapters add alpha/r B A)");
  app.add_option("--targets", o.lora.targets, "module names (default c_attn; q_proj,v_proj)");
  app.add_flag("--full", o.full, "also fine-tune every parameter for the same steps");
  app.add_option("--steps", o.steps)->check(cli::at_least(1));
  app.add_option("--lr", o.lr, "peak AdamW learning rate of the adapters")->check(cli::positive());
  app.add_option("--full-lr", o.full_lr, "the same for --full")->check(cli::positive());
  app.add_option("--base-steps", o.base_steps, "steps of the default base on the KJV")
      ->check(cli::at_least(1));
  app.add_option("--batch-size", o.batch)->check(cli::at_least(1));
  app.add_option("--context", o.context, "tokens per window")->check(cli::at_least(1));
  app.add_option("--tokenizer", tokenizer, "a tokenizer.json instead of the learned one");
  app.add_option("--vocab", cfg.vocab, "BPE vocabulary size")->check(cli::between(256, 65536));
  app.add_option("--dim", cfg.dim, "default base: width")->check(cli::at_least(1));
  app.add_option("--layers", cfg.layers)->check(cli::at_least(1));
  app.add_option("--heads", cfg.heads)->check(cli::at_least(1));
  app.add_option("--seed", seed);
  app.add_option("--n-model-shards", n_model_shards)->check(cli::at_least(1));
  app.add_option("--workdir", workdir, "tokenizer, base, adapter checkpoints and metrics");
  REDCO_CLI_PARSE(app, argc, argv);

  Deployer d({.n_model_shards = n_model_shards, .seed = seed, .workdir = workdir});
  // Verses in both Bibles; three books held out (the WEB text of those is the test).
  const data::AlignedSplit bible =
      data::split_books(data::aligned_verses({"KJV", "WEB"}), {"Ruth", "Jonah", "Phlm"});
  std::string kjv;
  for (const data::AlignedVerse& v : bible.train) kjv += v.texts[0] + "\n";
  const data::TokenizerFile tok = data::pick_tokenizer(
      tokenizer, init_from, d.workdir() / "tokenizer.json", kjv, cfg.vocab, d.is_main());
  d.console() << fmt::format("{} verses to adapt on, {} held out\n", bible.train.size(),
                             bible.valid.size());
  if (init_from.empty())
    return adapt(d, tok, bible, kjv_base(d, tok, bible, cfg, o, d.workdir() / "base"), o);
  return models::with_family<models::Gpt2, models::Llama>(init_from, [&]<typename M>() {
    return adapt(d, tok, bible, models::from_pretrained<M>(init_from), o);
  });
} catch (const std::exception& e) {
  fmt::print(stderr, "lora: {}\n", e.what());
  return 1;
}
