// BART checkpoints: BartConfig (transformers') <-> models::BartConfig, and
// where each parameter sits in a BartForConditionalGeneration state dict.
#include "redco/models/bart.hpp"

#include <fmt/format.h>

#include "redco/models/hf_fields.hpp"
#include "redco/models/hf_util.hpp"

namespace redco::models {

namespace {
using C = BartConfig;
const hf::Field<C> kFields[] = {
    {"vocab_size", &C::vocab},
    {"d_model", &C::dim},
    {"encoder_layers", &C::encoder_layers},
    {"decoder_layers", &C::decoder_layers},
    {"encoder_attention_heads", &C::encoder_heads},
    {"decoder_attention_heads", &C::decoder_heads},
    {"encoder_ffn_dim", &C::encoder_ffn},
    {"decoder_ffn_dim", &C::decoder_ffn},
    {"max_position_embeddings", &C::context},
    {"dropout", &C::dropout, 0.1},
    {"activation_function", &C::act, {}, "gelu"},
    {"scale_embedding", &C::scale_embedding, 0},
    {"tie_word_embeddings", &C::tie_embeddings, 1},
};
}  // namespace

BartConfig bart_config(const hf::Config& f) {
  f.expect_model_type({"bart"}, "models::Bart");
  BartConfig c;
  hf::read_fields<C>(f, c, kFields);
  c.decoder_start = f.integer("decoder_start_token_id", 2);
  for (auto [key, heads] : {std::pair{"encoder_attention_heads", c.encoder_heads},
                            std::pair{"decoder_attention_heads", c.decoder_heads}})
    if (heads <= 0 || c.dim % heads != 0)
      f.fail(key, fmt::format("= {} must divide d_model = {}", heads, c.dim));
  return c;
}

io::Json bart_hf_config(const BartConfig& c, io::Json j) {
  j["architectures"] = io::Json::array();
  j["architectures"].push_back("BartForConditionalGeneration");
  j["model_type"] = "bart";
  hf::write_fields<C>(c, j, kFields);
  j["decoder_start_token_id"] = c.decoder_start;
  j["is_encoder_decoder"] = true;
  if (!j.contains("torch_dtype")) j["torch_dtype"] = "float32";
  return j;
}

namespace {

void add_stack(hf::Layout& l, const BartConfig& c, bool decoder) {
  const int64_t d = c.dim, ffn = decoder ? c.decoder_ffn : c.encoder_ffn;
  const std::string mine = decoder ? "decoder." : "encoder.", theirs = "model." + mine;
  auto& s = l.sources;
  auto add = [&](const std::string& a, const std::string& b, Shape shape) {
    s.push_back(hf::same(mine + a, theirs + b, std::move(shape)));
  };
  add("embed_positions.weight", "embed_positions.weight", {c.context + kBartPositionOffset, d});
  for (const char* p : {"weight", "bias"})
    add(fmt::format("layernorm_embedding.{}", p), fmt::format("layernorm_embedding.{}", p), {d});
  const int64_t layers = decoder ? c.decoder_layers : c.encoder_layers;
  for (int64_t i = 0; i < layers; ++i) {
    const std::string r = fmt::format("layers.{}.", i);
    auto attention = [&](const char* name) {
      for (const char* p : {"q", "k", "v", "o"}) {
        const std::string hf = *p == 'o' ? "out_proj" : fmt::format("{}_proj", p);
        add(fmt::format("{}{}.{}_proj.weight", r, name, p),
            fmt::format("{}{}.{}.weight", r, name, hf), {d, d});
        add(fmt::format("{}{}.{}_proj.bias", r, name, p), fmt::format("{}{}.{}.bias", r, name, hf),
            {d});
      }
    };
    auto norm = [&](const char* name) {
      for (const char* p : {"weight", "bias"})
        add(fmt::format("{}{}.{}", r, name, p), fmt::format("{}{}.{}", r, name, p), {d});
    };
    attention("self_attn");
    norm("self_attn_layer_norm");
    if (decoder) {
      attention("encoder_attn");
      norm("encoder_attn_layer_norm");
    }
    add(r + "mlp.fc1.weight", r + "fc1.weight", {ffn, d});
    add(r + "mlp.fc1.bias", r + "fc1.bias", {ffn});
    add(r + "mlp.fc2.weight", r + "fc2.weight", {d, ffn});
    add(r + "mlp.fc2.bias", r + "fc2.bias", {d});
    norm("final_layer_norm");
  }
}

}  // namespace

hf::Layout bart_layout(const BartConfig& c) {
  hf::Layout l;
  l.prefixes = {""};
  // Aliases of the shared embedding some checkpoints carry, and the tied head.
  l.ignored_suffixes = {"model.encoder.embed_tokens.weight", "model.decoder.embed_tokens.weight"};
  if (c.tie_embeddings) l.ignored_suffixes.push_back("lm_head.weight");
  l.sources.push_back(hf::same(kBartEmbedding, "model.shared.weight", {c.vocab, c.dim}));
  add_stack(l, c, false);
  add_stack(l, c, true);
  if (!c.tie_embeddings)
    l.sources.push_back(hf::same("decoder.lm_head.weight", "lm_head.weight", {c.vocab, c.dim}));
  // Stored [1, vocab]: read transposed into the [vocab, 1] parameter.
  l.sources.push_back(
      {"decoder.final_logits_bias", "final_logits_bias", Shape{1, c.vocab}, true, {}});
  return l;
}

}  // namespace redco::models
