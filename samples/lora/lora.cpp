// LoRA: a causal LM that knows the KJV adapted to modern English (the WEB) by rank-r adapters on
// a frozen base: a Hugging Face causal LM folder (--init-from DIR: GPT-2, LLaMA, Mistral, Qwen2,
// OPT, GPT-J, GPT-NeoX) or a small GPT-2 trained on the KJV first (WORKDIR/base). Prints the
// trainable share, the adapter checkpoint's size, the held-out WEB loss before and after (and with
// --full after full fine-tuning); --export DIR writes the merged model.
//   build/samples/lora/lora --full --workdir lora_workdir
#include "redco/train/lora.hpp"

#include <fmt/core.h>

#include "datasets/bibles.hpp"
#include "model_shards.hpp"
#include "redco/data/lm_data.hpp"
#include "redco/redco.hpp"
#include "redco_cli.hpp"

using namespace redco;
namespace fs = std::filesystem;
using Windows = std::vector<data::TokenWindow>;

struct Options {
  int64_t steps = 300, base_steps = 1000, batch = 16, context = 64;
  float lr = 3e-3f;  // the adapters' and the default base's peak AdamW rate
  nn::LoraOptions lora{.rank = 8, .alpha = 16.f, .targets = ""};
  bool full = false;  // also full fine-tuning, at a third of lr
  std::string export_dir;
};

// The tokenizer; the training and held-out books' KJV and WEB token ids, and their windows.
struct Corpus : data::TokenizerFile {
  std::vector<int64_t> ids[4];  // KJV train, KJV held out, WEB train, WEB held out
  Windows w[4];                 // their windows
};

// `steps` AdamW steps (cosine decay from `lr`) on `train`, of the adapters alone if `adapters`
// (their checkpoint saved at the end), then(trainer); the held-out loss before and after.
template <typename L, typename Then>
std::pair<double, double> fit(Deployer& d, const L& model, std::optional<nn::ParamTree> params,
                              const Windows& train, const Windows& valid, float lr, int64_t steps,
                              bool adapters, const Options& o, Then then) {
  auto opt = optim::adamw(d.cosine_schedule({.learning_rate = lr,
                                             .n_examples = steps * o.batch,
                                             .global_batch_size = o.batch,
                                             .warmup_fraction = 0.05}),
                          {.max_grad_norm = 1.f});
  auto loss = [](auto& m, const data::LmBatch& b, Rng) {
    return cross_entropy(m(b.inputs), b.targets);
  };
  Trainer trainer(d, model, data::shifted_batch, loss,
                  adapters ? train::lora_groups(std::move(opt)) : ParamGroups(std::move(opt)),
                  std::move(params));
  const double before = trainer.eval_loss(valid, o.batch);
  trainer.fit(train, {.global_batch_size = o.batch,
                      .n_epochs = steps,  // max_steps stops it
                      .save_at_end = adapters,
                      .max_steps = steps});
  then(trainer);
  return {before, trainer.eval_loss(valid, o.batch)};
}

// Adapts `base` to the WEB. Exit status 0 when the adapters lower the held-out loss by at
// least 0.15 nats and their checkpoint is under 10% of the model's size in f32. Every family
// is one type, models::CausalLM, so this compiles once.
int adapt(Deployer& d, const Corpus& c, models::Pretrained<models::CausalLM> base, Options o) {
  if (o.lora.targets.empty())
    o.lora.targets = base.model.family() == "gpt2" ? "c_attn" : "q_proj,v_proj";
  const auto model = nn::lora(base.model, o.lora);
  const nn::ParamShare share = nn::adapter_share(model);
  double ckpt_bytes = 1e300;        // no checkpoint: fails the bar
  auto save = [&](auto& trainer) {  // the adapter-only checkpoint's size; the merged export
    if (const auto ck = io::latest_checkpoint(d.workdir()))
      ckpt_bytes = double(fs::file_size(ck->dir / io::kCheckpointParams));
    if (!o.export_dir.empty()) train::export_merged(trainer, o.export_dir, base, c.file);
  };
  const auto [before, after] = fit(d, model, nn::with_adapters(model, base.params, d.seed()),
                                   c.w[2], c.w[3], o.lr, o.steps, true, o, save);
  const double model_bytes = 4.0 * double(share.total - share.trained);
  d.console() << fmt::format(
      "LoRA r={} alpha={} on {}: {} of {} parameters trained ({:.3f}%)\nadapter checkpoint: "
      "{:.0f} bytes, {:.2f}% of the model\nheld-out WEB loss: base {:.3f}, LoRA {:.3f} after {} "
      "steps\n",
      o.lora.rank, o.lora.alpha, o.lora.targets, share.trained, share.total, 100 * share.fraction(),
      ckpt_bytes, 100 * ckpt_bytes / model_bytes, before, after, o.steps);
  if (o.full)
    d.console() << fmt::format(
        "full fine-tuning: {:.3f}\n",
        fit(d, base.model, base.params, c.w[2], c.w[3], o.lr / 3, o.steps, false, o, [](auto&) {
        }).second);
  return after < before - 0.15 && ckpt_bytes < 0.1 * model_bytes ? 0 : 1;
}

// The default base: a GPT-2 trained on the KJV's training books, kept in `dir` (a HF folder).
models::Pretrained<models::CausalLM> kjv_base(Deployer& d, const Corpus& c, models::Gpt2Config cfg,
                                              const Options& o, const fs::path& dir) {
  if (fs::exists(dir / "config.json")) return models::from_pretrained<models::CausalLM>(dir);
  cfg.vocab = c.tok.vocab_size(), cfg.context = o.context;
  auto base = models::untrained<models::CausalLM>(models::causal_lm(cfg));
  auto keep = [&](auto& t) {
    base.params = t.whole_params();  // every process keeps them
    if (d.is_main()) train::write_pretrained(base.params, dir, base, c.file);
  };
  const auto [_, loss] =
      fit(d, base.model, std::nullopt, c.w[0], c.w[1], o.lr, o.base_steps, false, o, keep);
  d.console() << fmt::format("base: held-out KJV loss {:.3f}, in {}\n", loss, dir.string());
  return base;
}

int main(int argc, char** argv) try {
  cli::App app{"Adapt a causal LM from the KJV to modern English (WEB) with LoRA"};
  models::Gpt2Config cfg{.vocab = 2048, .dim = 128, .layers = 4, .heads = 4};
  Options o;
  uint64_t seed = 0;
  std::string workdir = "lora_workdir", init_from;
  app.add_option("--init-from", init_from, "a Hugging Face folder to adapt (its tokenizer)");
  app.add_option("--export", o.export_dir, "write the merged model as a Hugging Face folder");
  app.add_option("--alpha", o.lora.alpha, "LoRA scale alpha (adapters add alpha/r B A)");
  app.add_option("--targets", o.lora.targets, "module names (default c_attn; q_proj,v_proj)");
  app.add_flag("--full", o.full, "also fine-tune every parameter (at --lr / 3)");
  app.add_option("--lr", o.lr, "peak AdamW learning rate of the adapters")->check(cli::positive());
  auto count = [&](const char* f, int64_t& v) { app.add_option(f, v)->check(cli::at_least(1)); };
  count("--steps", o.steps), count("--base-steps", o.base_steps), count("--rank", o.lora.rank);
  count("--batch-size", o.batch), count("--context", o.context), count("--dim", cfg.dim);
  count("--layers", cfg.layers);
  sample::ModelShards shards(app);  // auto plans full fine-tuning: an upper bound for adapters
  app.add_option("--vocab", cfg.vocab, "BPE vocabulary size")->check(cli::between(256, 65536));
  app.add_option("--seed", seed);
  app.add_option("--workdir", workdir, "tokenizer, base, adapter checkpoints and metrics");
  REDCO_CLI_PARSE(app, argc, argv);

  cfg.context = o.context;
  shards.plan(init_from, [&] { return models::gpt2_hf_config(cfg); },
              {.seq_len = o.context, .global_batch = o.batch});
  Deployer d({.n_model_shards = shards.count(),
              .seed = seed,
              .workdir = workdir,
              .auto_mesh = shards.auto_mesh()});
  // Verses in both Bibles; three books held out (the WEB text of those is the test).
  const data::AlignedSplit bible =
      data::split_books(data::aligned_verses({"KJV", "WEB"}), {"Ruth", "Jonah", "Phlm"});
  std::string text[4];  // as Corpus::ids
  for (int i = 0; i < 4; ++i)
    for (const data::AlignedVerse& v : i % 2 ? bible.valid : bible.train)
      text[i] += v.texts[i / 2] + "\n";
  Corpus c{data::pick_tokenizer("", init_from, d.workdir() / "tokenizer.json", text[0], cfg.vocab,
                                d.is_main()),
           {},
           {}};
  for (int i = 0; i < 4; ++i)
    c.ids[i] = data::token_ids(c.tok, text[i]), c.w[i] = data::token_windows(c.ids[i], o.context);
  if (init_from.empty()) return adapt(d, c, kjv_base(d, c, cfg, o, d.workdir() / "base"), o);
  auto base = models::from_pretrained<models::CausalLM>(init_from);
  REDCO_CHECK(c.tok.vocab_size() <= base.model.vocab_size(),
              "{}: tokenizer.json has {} ids but the model's vocabulary has {}: the folder's "
              "tokenizer does not belong to its model",
              init_from, c.tok.vocab_size(), base.model.vocab_size());
  return adapt(d, c, std::move(base), o);
} catch (const std::exception& e) {
  fmt::print(stderr, "lora: {}\n", e.what());
  return 1;
}
