#pragma once
// Pretrained Hugging Face checkpoints as typed redco models:
//
//   auto llama = models::from_pretrained<models::Llama>("path/to/hf-folder");
//   // ids [B, T] i64; mask [B, T] (transformers' attention_mask: 1 token, 0 padding)
//   Tensor logits = nn::apply(llama.model, llama.params, ids, {.mask = mask});
//   models::save_pretrained("out", llama);   // transformers loads it back
//
// The model type names the architecture (as LlamaForCausalLM.from_pretrained
// does); a folder holding another one is refused with the loader to use.
// from_pretrained_any picks the type from config.json for tools that take any
// checkpoint. With LoadOptions::n_shards > 1 the parameters are this rank's
// shards under the model's shard plan, read slice by slice from the files.
#include <fmt/format.h>

#include <filesystem>
#include <optional>
#include <variant>

#include "redco/models/bart.hpp"
#include "redco/models/bert.hpp"
#include "redco/models/causal_lm.hpp"
#include "redco/models/gpt2.hpp"
#include "redco/models/gpt_neox.hpp"
#include "redco/models/gptj.hpp"
#include "redco/models/hf_checkpoint.hpp"
#include "redco/models/hf_family.hpp"
#include "redco/models/llama.hpp"
#include "redco/models/opt.hpp"
#include "redco/models/t5.hpp"
#include "redco/models/vision_encoder_decoder.hpp"
#include "redco/models/vit.hpp"
#include "redco/nn/shard_plan.hpp"

namespace redco::models {

template <typename M>
struct Pretrained {
  using Config = typename HfFamily<M>::Config;
  Config config;
  M model;
  nn::ParamTree params;  // whole, or this rank's shards (LoadOptions::n_shards)
  io::Json hf_config;    // config.json as read: saved back with the model's keys updated

  // What a Trainer starts from: the loaded parameters (moved out), or none for
  // an untrained model (the Trainer initialises them).
  std::optional<nn::ParamTree> take_params() {
    if (params.empty()) return std::nullopt;
    return std::move(params);
  }
};

// A model of `config` with no parameters yet (a Trainer given none
// initialises them), exported like a loaded one.
template <typename M>
Pretrained<M> untrained(const typename HfFamily<M>::Config& config) {
  return {config, HfFamily<M>::build(config), {}, io::Json::object()};
}

template <typename M>
Pretrained<M> from_pretrained(const std::filesystem::path& dir, const hf::LoadOptions& opts = {}) {
  const hf::Config file(dir);
  auto config = HfFamily<M>::config(file);
  M model = HfFamily<M>::build(config);
  const auto plan = shard::resolve(model, opts.n_shards);
  nn::ParamTree params = hf::load_weights(dir, HfFamily<M>::layout(config), plan, opts);
  return {std::move(config), std::move(model), std::move(params), file.json()};
}

// `params` are whole (a Trainer's whole_params()). `base`: a config.json to
// keep keys redco does not model (tokenizer ids, generation settings).
template <typename M>
void save_pretrained(const std::filesystem::path& dir, const typename HfFamily<M>::Config& config,
                     const nn::ParamTree& params, const hf::SaveOptions& opts = {},
                     io::Json base = io::Json::object()) {
  hf::save_folder(dir, HfFamily<M>::to_json(config, std::move(base)), HfFamily<M>::layout(config),
                  params, opts);
}
template <typename M>
void save_pretrained(const std::filesystem::path& dir, const Pretrained<M>& p,
                     const hf::SaveOptions& opts = {}) {
  save_pretrained<M>(dir, p.config, p.params, opts, p.hf_config);
}

// Any supported checkpoint, by config.json's model_type.
using AnyPretrained = std::variant<Pretrained<Gpt2>, Pretrained<Llama>, Pretrained<Opt>,
                                   Pretrained<Gptj>, Pretrained<GptNeox>, Pretrained<T5>,
                                   Pretrained<Bart>, Pretrained<Bert>, Pretrained<Roberta>>;
AnyPretrained from_pretrained_any(const std::filesystem::path& dir,
                                  const hf::LoadOptions& opts = {});

namespace detail {
template <typename M, typename... Only>
inline constexpr bool takes = sizeof...(Only) == 0 || (std::is_same_v<M, Only> || ...);
template <typename First = Gpt2, typename...>
struct first_of {
  using type = First;
};
}  // namespace detail

// The model type that loads config.json's model_type: returns
// f.template operator()<M>(); throws naming the types redco loads otherwise.
// The one list of which type serves which model_type. With `Only...` given,
// f is instantiated for those types alone and any other family is refused
// (a program that fine-tunes causal LMs names the causal LM types).
template <typename... Only, typename F>
auto with_family(const std::string& type, const std::string& source, F&& f) {
  using R = decltype(f.template operator()<typename detail::first_of<Only...>::type>());
  auto call = [&]<typename M>() -> R {
    if constexpr (detail::takes<M, Only...>)
      return f.template operator()<M>();
    else
      throw Error(fmt::format("{}: model_type '{}' is not an architecture this program takes",
                              source, type));
  };
  if (type == "gpt2") return call.template operator()<Gpt2>();
  if (type == "llama" || type == "mistral" || type == "qwen2")
    return call.template operator()<Llama>();
  if (type == "opt") return call.template operator()<Opt>();
  if (type == "gptj") return call.template operator()<Gptj>();
  if (type == "gpt_neox") return call.template operator()<GptNeox>();
  if (type == "t5") return call.template operator()<T5>();
  if (type == "bart") return call.template operator()<Bart>();
  if (type == "bert") return call.template operator()<Bert>();
  if (type == "roberta") return call.template operator()<Roberta>();
  throw Error(
      fmt::format("{}: model_type '{}' is not one redco loads (gpt2, llama, mistral, "
                  "qwen2, opt, gptj, gpt_neox, t5, bart, bert, roberta)",
                  source, type));
}
// The same for a checkpoint folder (its config.json's model_type).
template <typename... Only, typename F>
auto with_family(const std::filesystem::path& dir, F&& f) {
  const hf::Config config(dir);
  return with_family<Only...>(config.model_type(), config.source(), std::forward<F>(f));
}

// The shard plan of a checkpoint folder's model over n model shards, from its
// config.json alone (no weights read): parameter, shape, split.
std::vector<shard::ParamSplit> checkpoint_plan(const std::filesystem::path& dir, int n_shards);

}  // namespace redco::models
