#pragma once
// Training LoRA adapters (nn/lora.hpp) on a frozen base:
//
//   auto base = models::from_pretrained<models::Gpt2>(dir);
//   auto model = nn::lora(base.model, {.rank = 8, .alpha = 16, .targets = "c_attn"});
//   Trainer trainer(deployer, model, collate, loss, train::lora_groups(optim::adamw(...)),
//                   nn::with_adapters(model, base.params, seed));
//   trainer.fit(...);                                   // checkpoints hold the adapters only
//   train::export_merged(trainer, "out", base, dir);    // transformers loads "out"
//
// lora_groups freezes the base through ParamGroups (no gradient, no
// optimizer state) and leaves it out of checkpoints ({.checkpoint = false}),
// so a checkpoint's params.safetensors is the adapters alone: resumed by the
// Trainer on top of the base it is constructed with, or read into a base's
// tree by load_adapters (inference, export).
#include <filesystem>
#include <map>
#include <string>

#include "redco/io/checkpoint.hpp"
#include "redco/io/safetensors.hpp"
#include "redco/nn/lora.hpp"
#include "redco/train/export_pretrained.hpp"
#include "redco/train/param_groups.hpp"

namespace redco::train {

// The adapters trained with `optimizer`; the rest frozen, not checkpointed.
inline ParamGroups lora_groups(optim::Optimizer optimizer) {
  ParamGroups groups;
  groups.train(
      "lora", [](const std::string& n) { return nn::is_adapter(n); }, std::move(optimizer));
  groups.freeze("base", [](const std::string& n) { return !nn::is_adapter(n); },
                {.checkpoint = false});
  return groups;
}

// Reads the adapters saved in `checkpoint` (a checkpoint folder, or a
// .safetensors file) into `params`, whole parameters of `model` or of its
// base: every adapter of the model must be there with its shape, and nothing
// else may be.
template <nn::Layer M>
void load_adapters(const std::filesystem::path& checkpoint, const nn::Lora<M>& model,
                   ParamTree& params) {
  const std::filesystem::path file =
      std::filesystem::is_directory(checkpoint) ? checkpoint / io::kCheckpointParams : checkpoint;
  const ParamTree saved = io::load_safetensors(file);
  std::map<std::string, Shape> want;
  for (const nn::ParamEntry& e : nn::param_entries(model))
    if (nn::is_adapter(e.name.view())) want.emplace(std::string(e.name.view()), e.shape.shape());
  for (const auto& [name, t] : saved) {
    const auto it = want.find(name);
    REDCO_CHECK(it != want.end(),
                "{}: '{}' is not an adapter of this model (an adapter checkpoint of another "
                "model, rank or target list?)",
                file.string(), name);
    REDCO_CHECK(t.shape() == it->second, "{}: '{}' has shape {}, the model's adapter {}",
                file.string(), name, t.shape().str(), it->second.str());
  }
  for (const auto& [name, shape] : want)
    REDCO_CHECK(saved.contains(name), "{}: adapter '{}' is missing (saved with other targets?)",
                file.string(), name);
  for (const auto& [name, t] : saved) params.insert_or_assign(name, t);
}

// The trainer's whole parameters with the adapters folded into the base
// weights (W + alpha/r B A), written as `base`'s Hugging Face architecture on
// the main process: `transformers` loads it with no LoRA code. Collective
// over the model shards.
template <typename T, typename M>
void export_merged(const T& trainer, const std::filesystem::path& dir,
                   const models::Pretrained<M>& base, std::filesystem::path tokenizer = {}) {
  const ParamTree whole = trainer.whole_params();
  if (!trainer.deployer().is_main()) return;
  write_pretrained(nn::merge_adapters(trainer.model(), whole), dir, base, std::move(tokenizer));
}

}  // namespace redco::train
