#pragma once
// A Trainer's model as a Hugging Face folder, in one call:
//
//   auto base = models::from_pretrained<models::Llama>(dir);   // or models::untrained<M>(config)
//   train::Trainer trainer(deployer, base.model, collate, loss, opt, base.params);
//   trainer.fit(...);
//   train::export_pretrained(trainer, "out", base, dir / "tokenizer.json");
//
// `transformers` loads "out" (config.json, safetensors, tokenizer files) with
// the trained parameters.
#include <filesystem>

#include "redco/models/pretrained.hpp"

namespace redco::train {

// The tokenizer files a Hugging Face folder carries beside tokenizer.json.
inline constexpr const char* kTokenizerSideFiles[] = {"tokenizer_config.json",
                                                      "special_tokens_map.json"};

// Writes whole parameters `whole` as `base`'s architecture (its config.json
// keys redco does not model are kept). `tokenizer`: a tokenizer.json (or a
// folder holding one) copied in with its side files; empty: none. Called on
// one process (nn::merge_adapters' result: train/lora.hpp).
template <typename M>
void write_pretrained(const nn::ParamTree& whole, const std::filesystem::path& dir,
                      const models::Pretrained<M>& base, std::filesystem::path tokenizer = {}) {
  namespace fs = std::filesystem;
  models::save_pretrained<M>(dir, base.config, whole, {}, base.hf_config);
  if (tokenizer.empty()) return;
  if (fs::is_directory(tokenizer)) tokenizer /= "tokenizer.json";
  REDCO_CHECK(fs::is_regular_file(tokenizer), "export_pretrained: no tokenizer file {}",
              tokenizer.string());
  fs::copy_file(tokenizer, dir / "tokenizer.json", fs::copy_options::overwrite_existing);
  for (const char* side : kTokenizerSideFiles)
    if (fs::is_regular_file(tokenizer.parent_path() / side))
      fs::copy_file(tokenizer.parent_path() / side, dir / side,
                    fs::copy_options::overwrite_existing);
}

// Gathers the trainer's parameters (collective over the model shards) and
// writes them on the main process as `base`'s architecture (write_pretrained).
template <typename T, typename M>
void export_pretrained(const T& trainer, const std::filesystem::path& dir,
                       const models::Pretrained<M>& base, std::filesystem::path tokenizer = {}) {
  const nn::ParamTree whole = trainer.whole_params();
  if (!trainer.deployer().is_main()) return;
  write_pretrained(whole, dir, base, std::move(tokenizer));
}

}  // namespace redco::train
