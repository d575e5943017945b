#pragma once
// T5 (Raffel et al., 2020) and its v1.1 / flan-T5 variant in the model DSL,
// as transformers' T5ForConditionalGeneration computes it:
//  * one token embedding shared by encoder and decoder (and by the LM head
//    when tie_embeddings, T5 v1.0, where the decoder output is first scaled
//    by dim**-0.5; v1.1 / flan-T5 have an lm_head of their own);
//  * pre-norm blocks with T5's RMS norm (no mean, no bias) and no biases;
//  * a bucketed relative position bias on the attention scores, computed once
//    from the table of the first layer and added in every self-attention
//    layer: bidirectional buckets in the encoder, causal ones in the decoder;
//    cross-attention has none;
//  * attention scores without the 1/sqrt(head_dim) scale, and heads of
//    head_dim (d_kv) whatever dim / heads is (d_kv * heads may differ from dim);
//  * a feed-forward block wo(act(wi x)) (ReLU) or wo(act(wi_0 x) * wi_1 x)
//    (gated-gelu, with the tanh approximation).
//
// Names (redco's; t5.cpp maps them to the checkpoint's):
//   encoder.embed_tokens (= the checkpoint's shared), encoder.relative_attention_bias,
//   encoder.block.N.{layer_norm_1, SelfAttention, layer_norm_2, DenseReluDense},
//   encoder.final_layer_norm, decoder.relative_attention_bias,
//   decoder.block.N.{layer_norm_1, SelfAttention, layer_norm_2, EncDecAttention,
//   layer_norm_3, DenseReluDense}, decoder.final_layer_norm, decoder.lm_head.
// Run it with nn::Ctx::source set to the encoder's input ids [B, Ts] (and
// ctx.source_mask to its attention mask for padded sources); the input is the
// decoder's ids [B, Tt] (the labels shifted right behind decoder_start, see
// t5_shift_right) and the output the logits [B, Tt, vocab].
#include "redco/models/hf_checkpoint.hpp"
#include "redco/models/hf_family.hpp"
#include "redco/nn/encoder_layers.hpp"
#include "redco/nn/model.hpp"

namespace redco::models {

// Designated initialisers name these fields in the order declared below (C++20 rule).
struct T5Config {               // defaults: t5-small's sizes
  int64_t vocab = 32128;        // vocab_size
  int64_t dim = 512;            // d_model
  int64_t heads = 8;            // num_heads
  int64_t hidden = 2048;        // d_ff
  int64_t encoder_layers = 6;   // num_layers
  int64_t decoder_layers = 6;   // num_decoder_layers
  int64_t head_dim = 0;         // d_kv; 0: dim / heads
  int64_t buckets = 32;         // relative_attention_num_buckets
  int64_t max_distance = 128;   // relative_attention_max_distance
  float dropout = 0.f;          // dropout_rate (config.json's default is 0.1)
  float norm_eps = 1e-6f;       // layer_norm_epsilon
  nn::Act act = nn::Act::relu;  // feed_forward_proj's activation
  bool gated = false;           // feed_forward_proj "gated-...": wi_0 and wi_1
  bool tie_embeddings = true;   // tie_word_embeddings: the head reads the shared embedding
  int64_t decoder_start = 0;    // decoder_start_token_id (T5: the pad id)

  int64_t kv_dim() const { return head_dim ? head_dim : dim / heads; }
};

inline constexpr const char* kT5Embedding = "encoder.embed_tokens.weight";

namespace detail {
// One sublayer of a T5 block: x + dropout(f(layer_norm(x))).
template <nn::Layer F>
auto t5_sublayer(const T5Config& c, F f) {
  return nn::residual(nn::named<"layer_norm">(nn::rms_norm(c.dim, c.norm_eps)) | std::move(f) |
                      nn::dropout(c.dropout));
}
template <bool Cross>
nn::Attention<false, Cross> t5_attention(const T5Config& c, bool causal) {
  return {.dim = c.dim,
          .heads = c.heads,
          .kv_heads = c.heads,
          .causal = causal,
          .head_size = c.kv_dim(),
          .qkv_bias = false,
          .o_bias = false,
          .scale = 1.f,           // T5 folds the 1/sqrt(d) into its initialisation
          .score_bias = !Cross};  // the relative position bias
}
inline auto t5_ff(const T5Config& c) {
  return nn::dense_act_dense(c.dim, c.hidden, c.act, c.gated);
}
}  // namespace detail

void check_t5_config(const T5Config& c);

inline auto t5(const T5Config& c) {
  using detail::t5_sublayer;
  check_t5_config(c);
  const int64_t d = c.dim;
  auto enc_block =
      t5_sublayer(c, nn::named<"SelfAttention">(detail::t5_attention<false>(c, false))) |
      t5_sublayer(c, detail::t5_ff(c));
  auto dec_block =
      t5_sublayer(c, nn::named<"SelfAttention">(detail::t5_attention<false>(c, true))) |
      t5_sublayer(c, nn::named<"EncDecAttention">(detail::t5_attention<true>(c, false))) |
      t5_sublayer(c, detail::t5_ff(c));
  auto final_norm = [&] { return nn::named<"final_layer_norm">(nn::rms_norm(d, c.norm_eps)); };
  auto encoder = nn::named<"embed_tokens">(nn::embedding(c.vocab, d)) | nn::dropout(c.dropout) |
                 nn::relative_position_bias(c.heads, c.buckets, c.max_distance, true) |
                 nn::named<"block">(nn::repeat(c.encoder_layers, std::move(enc_block))) |
                 final_norm() | nn::dropout(c.dropout);
  nn::LMHead head = nn::lm_head(d, c.vocab);
  if (c.tie_embeddings) head.tied_to = kT5Embedding;
  auto decoder = nn::shared_embedding(c.vocab, kT5Embedding) | nn::dropout(c.dropout) |
                 nn::relative_position_bias(c.heads, c.buckets, c.max_distance, false) |
                 nn::named<"block">(nn::repeat(c.decoder_layers, std::move(dec_block))) |
                 final_norm() | nn::dropout(c.dropout) |
                 nn::scale(c.tie_embeddings ? 1.f / std::sqrt(float(d)) : 1.f) | head;
  return nn::encoder_decoder(std::move(encoder), std::move(decoder));
}

using T5 = decltype(t5(T5Config{}));

// The decoder's input for labels [B, T] (i64): decoder_start, then the labels
// but the last, with ignored labels (-100) replaced by `pad` (transformers'
// T5 _shift_right).
Tensor t5_shift_right(const Tensor& labels, int64_t decoder_start, int64_t pad = 0);

// ---- Hugging Face checkpoints (model_type "t5") ------------------------------------------
T5Config t5_config(const hf::Config& config);
io::Json t5_hf_config(const T5Config& c, io::Json base = io::Json::object());
hf::Layout t5_layout(const T5Config& c);

// What from_pretrained / save_pretrained need of it (models/hf_family.hpp).
template <>
struct HfFamily<T5> {
  using Config = T5Config;
  static Config config(const hf::Config& f) { return t5_config(f); }
  static T5 build(const Config& c) { return t5(c); }
  static hf::Layout layout(const Config& c) { return t5_layout(c); }
  static io::Json to_json(const Config& c, io::Json base) { return t5_hf_config(c, base); }
};

}  // namespace redco::models
