#include "redco/models/pretrained.hpp"

#include <fmt/format.h>

namespace redco::models {

AnyPretrained from_pretrained_any(const std::filesystem::path& dir, const hf::LoadOptions& opts) {
  const std::string type = hf::Config(dir).model_type();
  if (type == "gpt2") return from_pretrained<Gpt2>(dir, opts);
  if (type == "llama" || type == "mistral" || type == "qwen2")
    return from_pretrained<Llama>(dir, opts);
  if (type == "opt") return from_pretrained<Opt>(dir, opts);
  if (type == "gptj") return from_pretrained<Gptj>(dir, opts);
  if (type == "gpt_neox") return from_pretrained<GptNeox>(dir, opts);
  if (type == "t5") return from_pretrained<T5>(dir, opts);
  if (type == "bart") return from_pretrained<Bart>(dir, opts);
  if (type == "bert") return from_pretrained<Bert>(dir, opts);
  if (type == "roberta") return from_pretrained<Roberta>(dir, opts);
  throw Error(
      fmt::format("{}/config.json: model_type '{}' is not one redco loads (gpt2, llama, "
                  "mistral, qwen2, opt, gptj, gpt_neox, t5, bart, bert, roberta)",
                  dir.string(), type));
}

}  // namespace redco::models
