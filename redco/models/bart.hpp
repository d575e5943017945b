#pragma once
// BART (Lewis et al., 2019) in the model DSL, as transformers'
// BartForConditionalGeneration computes it: post-LN blocks (the norm after
// each residual add), learned positions read from row 2 of their table on,
// token embeddings scaled by sqrt(dim) when scale_embedding, a layer norm on
// the embeddings (layernorm_embedding), one token embedding shared by
// encoder, decoder and the tied LM head, and final_logits_bias on the logits.
//
// Names (redco's; bart.cpp maps them to the checkpoint's "model." ones):
//   encoder.embed_tokens (= shared), encoder.embed_positions,
//   encoder.layernorm_embedding, encoder.layers.N.{self_attn,
//   self_attn_layer_norm, mlp (fc1, fc2), final_layer_norm}, decoder.embed_positions,
//   decoder.layernorm_embedding, decoder.layers.N.{self_attn, self_attn_layer_norm,
//   encoder_attn, encoder_attn_layer_norm, mlp, final_layer_norm},
//   decoder.lm_head (untied only), decoder.final_logits_bias.
// Run it like models::t5: ctx.source (and ctx.source_mask) hold the encoder's
// input, the decoder's ids are the input.
#include "redco/models/hf_checkpoint.hpp"
#include "redco/models/hf_family.hpp"
#include "redco/nn/encoder_layers.hpp"
#include "redco/nn/model.hpp"

namespace redco::models {

// Designated initialisers name these fields in the order declared below (C++20 rule).
struct BartConfig {                 // defaults: bart-large
  int64_t vocab = 50265;            // vocab_size
  int64_t dim = 1024;               // d_model
  int64_t encoder_layers = 12;      // encoder_layers
  int64_t decoder_layers = 12;      // decoder_layers
  int64_t encoder_heads = 16;       // encoder_attention_heads
  int64_t decoder_heads = 16;       // decoder_attention_heads
  int64_t encoder_ffn = 4096;       // encoder_ffn_dim
  int64_t decoder_ffn = 4096;       // decoder_ffn_dim
  int64_t context = 1024;           // max_position_embeddings
  float dropout = 0.f;              // dropout (config.json's default is 0.1)
  nn::Act act = nn::Act::gelu_erf;  // activation_function ("gelu")
  bool scale_embedding = false;     // embeddings times sqrt(d_model)
  bool tie_embeddings = true;       // tie_word_embeddings
  int64_t decoder_start = 2;        // decoder_start_token_id
};

inline constexpr const char* kBartEmbedding = "encoder.embed_tokens.weight";
inline constexpr int64_t kBartPositionOffset = 2;  // BartLearnedPositionalEmbedding's offset

namespace detail {
inline auto bart_ln(const BartConfig& c) { return nn::layer_norm(c.dim, 1e-5f); }
// x -> norm(x + dropout(f(x))): a post-LN sublayer.
template <nn::Literal Norm, nn::Layer F>
auto bart_sublayer(const BartConfig& c, F f) {
  return nn::residual(std::move(f) | nn::dropout(c.dropout)) | nn::named<Norm>(bart_ln(c));
}
template <nn::Layer Tok>
auto bart_embed(const BartConfig& c, Tok tokens) {
  const float s = c.scale_embedding ? std::sqrt(float(c.dim)) : 1.f;
  return ((std::move(tokens) | nn::scale(s)) +
          nn::named<"embed_positions">(
              nn::positions(c.context + kBartPositionOffset, c.dim, kBartPositionOffset))) |
         nn::named<"layernorm_embedding">(bart_ln(c)) | nn::dropout(c.dropout);
}
}  // namespace detail

inline auto bart(const BartConfig& c) {
  using detail::bart_sublayer;
  const int64_t d = c.dim;
  auto enc_block = bart_sublayer<"self_attn_layer_norm">(
                       c, nn::named<"self_attn">(nn::self_attention(d, c.encoder_heads))) |
                   bart_sublayer<"final_layer_norm">(c, nn::mlp(d, c.encoder_ffn, c.act));
  auto dec_block = bart_sublayer<"self_attn_layer_norm">(
                       c, nn::named<"self_attn">(nn::causal_attention(d, c.decoder_heads))) |
                   bart_sublayer<"encoder_attn_layer_norm">(
                       c, nn::named<"encoder_attn">(nn::cross_attention(d, c.decoder_heads))) |
                   bart_sublayer<"final_layer_norm">(c, nn::mlp(d, c.decoder_ffn, c.act));
  auto encoder = detail::bart_embed(c, nn::named<"embed_tokens">(nn::embedding(c.vocab, d))) |
                 nn::named<"layers">(nn::repeat(c.encoder_layers, std::move(enc_block)));
  nn::LMHead head = nn::lm_head(d, c.vocab);
  if (c.tie_embeddings) head.tied_to = kBartEmbedding;
  auto decoder = detail::bart_embed(c, nn::shared_embedding(c.vocab, kBartEmbedding)) |
                 nn::named<"layers">(nn::repeat(c.decoder_layers, std::move(dec_block))) | head |
                 nn::logit_bias(c.vocab);
  return nn::encoder_decoder(std::move(encoder), std::move(decoder));
}

using Bart = decltype(bart(BartConfig{}));

// ---- Hugging Face checkpoints (model_type "bart") ----------------------------------------
BartConfig bart_config(const hf::Config& config);
io::Json bart_hf_config(const BartConfig& c, io::Json base = io::Json::object());
hf::Layout bart_layout(const BartConfig& c);

// What from_pretrained / save_pretrained need of it (models/hf_family.hpp).
template <>
struct HfFamily<Bart> {
  using Config = BartConfig;
  static Config config(const hf::Config& f) { return bart_config(f); }
  static Bart build(const Config& c) { return bart(c); }
  static hf::Layout layout(const Config& c) { return bart_layout(c); }
  static io::Json to_json(const Config& c, io::Json base) { return bart_hf_config(c, base); }
};

}  // namespace redco::models
