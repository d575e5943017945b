#pragma once
// A T5-style encoder-decoder (Raffel et al., 2020) in the model DSL:
// pre-norm blocks with RMS norms, no biases, a ReLU MLP, and a decoder whose
// blocks add cross-attention to the encoder output between self-attention
// and the MLP.
//
// Differences from T5 proper, all where the DSL has no equivalent layer:
//  * positions are learned absolute embeddings (wpe) added to the token
//    embeddings of encoder and decoder, instead of T5's bucketed relative
//    position bias on the attention logits;
//  * encoder and decoder have their own token embeddings, and the LM head is
//    untied (as in T5 v1.1), instead of one shared embedding;
//  * attention logits are scaled by 1/sqrt(head_dim) as in most transformers.
//
// Names (what the DSL makes of the structure):
//   encoder.wte, encoder.wpe, encoder.h.N.{norm_1, attn, norm_2, mlp}, encoder.norm,
//   decoder.wte, decoder.wpe, decoder.h.N.{norm_1, attn, norm_2, cross_attn, norm_3, mlp},
//   decoder.norm, decoder.lm_head.
// Run it with nn::Ctx::source set to the encoder's input ids [B, Ts]; the
// input is the decoder's ids [B, Tt] and the output the logits [B, Tt, vocab].
#include "redco/nn/model.hpp"

namespace redco::models {

struct T5Config {  // defaults: t5-small's sizes
  int64_t vocab = 32128;
  int64_t context = 512;  // longest source or target sequence
  int64_t dim = 512;
  int64_t heads = 8;
  int64_t hidden = 2048;
  int64_t encoder_layers = 6;
  int64_t decoder_layers = 6;
  float dropout = 0.f;
  float norm_eps = 1e-6f;
};

namespace detail {
// A sublayer of a T5 block: x + dropout(f(norm(x))).
template <nn::Layer F>
auto t5_sublayer(const T5Config& c, F f) {
  return nn::residual(nn::rms_norm(c.dim, c.norm_eps) | std::move(f) | nn::dropout(c.dropout));
}
inline auto t5_mlp(const T5Config& c) { return nn::mlp<false>(c.dim, c.hidden, nn::Act::relu); }
inline auto t5_embed(const T5Config& c) {
  return (nn::embedding(c.vocab, c.dim) + nn::positions(c.context, c.dim)) | nn::dropout(c.dropout);
}
}  // namespace detail

inline auto t5(const T5Config& c) {
  using detail::t5_sublayer;
  const int64_t d = c.dim;
  auto enc_block =
      t5_sublayer(c, nn::self_attention<false>(d, c.heads)) | t5_sublayer(c, detail::t5_mlp(c));
  auto dec_block = t5_sublayer(c, nn::causal_attention<false>(d, c.heads)) |
                   t5_sublayer(c, nn::cross_attention<false>(d, c.heads)) |
                   t5_sublayer(c, detail::t5_mlp(c));
  auto encoder = detail::t5_embed(c) | nn::repeat(c.encoder_layers, std::move(enc_block)) |
                 nn::rms_norm(d, c.norm_eps) | nn::dropout(c.dropout);
  auto decoder = detail::t5_embed(c) | nn::repeat(c.decoder_layers, std::move(dec_block)) |
                 nn::rms_norm(d, c.norm_eps) | nn::dropout(c.dropout) | nn::lm_head(d, c.vocab);
  return nn::encoder_decoder(std::move(encoder), std::move(decoder));
}

using T5 = decltype(t5(T5Config{}));

}  // namespace redco::models
