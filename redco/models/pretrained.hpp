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
#include <variant>

#include "redco/models/bart.hpp"
#include "redco/models/bert.hpp"
#include "redco/models/causal_lm.hpp"
#include "redco/models/gpt2.hpp"
#include "redco/models/gpt_neox.hpp"
#include "redco/models/gptj.hpp"
#include "redco/models/hf_checkpoint.hpp"
#include "redco/models/llama.hpp"
#include "redco/models/opt.hpp"
#include "redco/models/t5.hpp"
#include "redco/models/vision_encoder_decoder.hpp"
#include "redco/models/vit.hpp"
#include "redco/nn/shard_plan.hpp"

namespace redco::models {

// What each architecture contributes: config.json <-> its config struct, the
// model, and where its parameters sit in the checkpoint.
template <typename M>
struct HfFamily;

template <>
struct HfFamily<Gpt2> {
  using Config = Gpt2Config;
  static Config config(const hf::Config& f) { return gpt2_config(f); }
  static Gpt2 build(const Config& c) { return gpt2(c); }
  static hf::Layout layout(const Config& c) { return gpt2_layout(c); }
  static io::Json to_json(const Config& c, io::Json base) { return gpt2_hf_config(c, base); }
};

template <>
struct HfFamily<Llama> {
  using Config = LlamaConfig;
  static Config config(const hf::Config& f) { return llama_config(f); }
  static Llama build(const Config& c) { return llama(c); }
  static hf::Layout layout(const Config& c) { return llama_layout(c); }
  static io::Json to_json(const Config& c, io::Json base) { return llama_hf_config(c, base); }
};

template <>
struct HfFamily<T5> {
  using Config = T5Config;
  static Config config(const hf::Config& f) { return t5_config(f); }
  static T5 build(const Config& c) { return t5(c); }
  static hf::Layout layout(const Config& c) { return t5_layout(c); }
  static io::Json to_json(const Config& c, io::Json base) { return t5_hf_config(c, base); }
};

template <>
struct HfFamily<Bart> {
  using Config = BartConfig;
  static Config config(const hf::Config& f) { return bart_config(f); }
  static Bart build(const Config& c) { return bart(c); }
  static hf::Layout layout(const Config& c) { return bart_layout(c); }
  static io::Json to_json(const Config& c, io::Json base) { return bart_hf_config(c, base); }
};

template <>
struct HfFamily<Bert> {
  using Config = BertConfig;
  static Config config(const hf::Config& f) {
    f.expect_model_type({"bert"}, "models::Bert");
    return bert_config(f);
  }
  static Bert build(const Config& c) { return bert(c); }
  static hf::Layout layout(const Config& c) { return bert_layout(c, false); }
  static io::Json to_json(const Config& c, io::Json base) {
    return bert_hf_config(c, false, false, base);
  }
};

template <>
struct HfFamily<Roberta> {
  using Config = BertConfig;
  static Config config(const hf::Config& f) {
    f.expect_model_type({"roberta"}, "models::Roberta");
    return bert_config(f);
  }
  static Roberta build(const Config& c) { return roberta(c); }
  static hf::Layout layout(const Config& c) { return bert_layout(c, true); }
  static io::Json to_json(const Config& c, io::Json base) {
    return bert_hf_config(c, true, false, base);
  }
};

template <>
struct HfFamily<BertEncoder> {  // BertModel (or the encoder of a BERT classifier)
  using Config = BertConfig;
  static Config config(const hf::Config& f) {
    f.expect_model_type({"bert"}, "models::BertEncoder");
    return bert_config(f);
  }
  static BertEncoder build(const Config& c) { return bert_encoder(c); }
  static hf::Layout layout(const Config& c) { return bert_layout(c, false, true); }
  static io::Json to_json(const Config& c, io::Json base) {
    return bert_hf_config(c, false, true, base);
  }
};

template <>
struct HfFamily<RobertaEncoder> {  // RobertaModel (or the encoder of a RoBERTa classifier)
  using Config = BertConfig;
  static Config config(const hf::Config& f) {
    f.expect_model_type({"roberta"}, "models::RobertaEncoder");
    return bert_config(f);
  }
  static RobertaEncoder build(const Config& c) { return roberta_encoder(c); }
  static hf::Layout layout(const Config& c) { return bert_layout(c, true, true); }
  static io::Json to_json(const Config& c, io::Json base) {
    return bert_hf_config(c, true, true, base);
  }
};

template <>
struct HfFamily<Opt> {
  using Config = OptConfig;
  static Config config(const hf::Config& f) { return opt_config(f); }
  static Opt build(const Config& c) { return opt(c); }
  static hf::Layout layout(const Config& c) { return opt_layout(c); }
  static io::Json to_json(const Config& c, io::Json base) { return opt_hf_config(c, base); }
};

template <>
struct HfFamily<Gptj> {
  using Config = GptjConfig;
  static Config config(const hf::Config& f) { return gptj_config(f); }
  static Gptj build(const Config& c) { return gptj(c); }
  static hf::Layout layout(const Config& c) { return gptj_layout(c); }
  static io::Json to_json(const Config& c, io::Json base) { return gptj_hf_config(c, base); }
};

template <>
struct HfFamily<GptNeox> {
  using Config = GptNeoxConfig;
  static Config config(const hf::Config& f) { return gpt_neox_config(f); }
  static GptNeox build(const Config& c) { return gpt_neox(c); }
  static hf::Layout layout(const Config& c) { return gpt_neox_layout(c); }
  static io::Json to_json(const Config& c, io::Json base) { return gpt_neox_hf_config(c, base); }
};

template <>
struct HfFamily<Vit> {  // ViTModel (or the encoder of a ViTForImageClassification)
  using Config = VitConfig;
  static Config config(const hf::Config& f) { return vit_config(f); }
  static Vit build(const Config& c) { return vit(c); }
  static hf::Layout layout(const Config& c) { return vit_layout(c); }
  static io::Json to_json(const Config& c, io::Json base) { return vit_hf_config(c, base); }
};

template <>
struct HfFamily<VisionGpt2> {  // VisionEncoderDecoderModel: ViT encoder, GPT-2 decoder
  using Config = VisionGpt2Config;
  static Config config(const hf::Config& f) { return vision_gpt2_config(f); }
  static VisionGpt2 build(const Config& c) { return vision_gpt2(c); }
  static hf::Layout layout(const Config& c) { return vision_gpt2_layout(c); }
  static io::Json to_json(const Config& c, io::Json base) { return vision_gpt2_hf_config(c, base); }
};

// Any decoder-only family, chosen by config.json's model_type (models/causal_lm.hpp):
// the model carries its family's config, so it is its own Config.
template <>
struct HfFamily<CausalLM> {
  using Config = CausalLM;
  static Config config(const hf::Config& f) { return causal_lm(f); }
  static CausalLM build(const Config& c) { return c; }
  static hf::Layout layout(const Config& c) { return c.layout(); }
  static io::Json to_json(const Config& c, io::Json base) { return c.hf_config(std::move(base)); }
};

template <typename M>
struct Pretrained {
  using Config = typename HfFamily<M>::Config;
  Config config;
  M model;
  nn::ParamTree params;  // whole, or this rank's shards (LoadOptions::n_shards)
  io::Json hf_config;    // config.json as read: saved back with the model's keys updated
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
