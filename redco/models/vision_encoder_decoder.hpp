#pragma once
// An image-to-text model as transformers' VisionEncoderDecoderModel builds it
// from a ViT encoder (ViTModel) and a GPT-2 decoder with cross-attention
// (GPT2LMHeadModel, add_cross_attention=True): each decoder block is
// ln_1 -> causal self-attention -> residual, ln_cross_attn -> cross-attention
// over the encoder's last hidden state (every patch and the class token) ->
// residual, ln_2 -> MLP -> residual; the LM head is tied to the decoder's wte.
// Encoder and decoder share the hidden size (a checkpoint with
// enc_to_dec_proj is refused).
//
// Run it like models::t5: ctx.source holds the images [N, C, H, W] f32, the
// decoder's ids [N, T] are the input; generation::generate with ctx.source
// set and one {decoder_start} prompt per image decodes with a KV cache (the
// encoder runs once, each cross-attention projects its keys and values once).
//
// Names (redco's; vision_encoder_decoder.cpp maps them to the checkpoint's):
//   encoder.* as models::Vit (checkpoint: encoder.embeddings..., encoder.encoder.layer.N...,
//   encoder.layernorm), decoder.{wte, wpe, h.N.{ln_1, attn, ln_cross_attn, crossattention
//   (q_proj = q_attn, k_proj | v_proj = c_attn, o_proj = c_proj), ln_2, mlp}, ln_f}
//   (checkpoint: decoder.transformer.*).
//
// Tensor-parallel plan (the two rules): the ViT's as models::Vit; the
// decoder's as models::Gpt2 (wte by vocabulary, the tied head's logits stay
// vocabulary-split), with crossattention's q/k/v split by heads and its
// c_proj by input columns: 3 all-reduces per decoder layer.
#include "redco/models/gpt2.hpp"
#include "redco/models/hf_family.hpp"
#include "redco/models/vit.hpp"

namespace redco::models {

// Designated initialisers name these fields in the order declared below (C++20 rule).
struct VisionGpt2Config {
  VitConfig encoder{};
  Gpt2Config decoder{};
  int64_t decoder_start = 0;  // decoder_start_token_id
};

inline constexpr const char* kVisionGpt2Embedding = "decoder.wte.weight";

inline auto vision_gpt2_decoder(const Gpt2Config& c) {
  const int64_t d = c.dim, inner = c.inner ? c.inner : 4 * d;
  auto attn = nn::causal_attention(d, c.heads);
  attn.scale_by_inverse_layer = c.scale_attn_by_inverse_layer_idx;
  auto cross = nn::cross_attention(d, c.heads);
  cross.scale_by_inverse_layer = c.scale_attn_by_inverse_layer_idx;  // GPT2Attention scales both
  auto ln = [&] { return nn::layer_norm(d, c.norm_eps); };
  auto block =
      nn::residual(ln() | std::move(attn) | nn::dropout(c.dropout)) |
      nn::residual(nn::named<"ln_cross_attn">(ln()) |
                   nn::named<"crossattention">(std::move(cross)) | nn::dropout(c.dropout)) |
      nn::residual(ln() | nn::mlp(d, inner, c.act) | nn::dropout(c.dropout));
  return (nn::embedding(c.vocab, d) + nn::positions(c.context, d)) | nn::dropout(c.dropout) |
         nn::repeat(c.layers, std::move(block)) | nn::named<"ln_f">(ln()) |
         nn::TiedLMHead<"decoder.wte.weight">{.vocab = c.vocab};
}

inline auto vision_gpt2(const VisionGpt2Config& c) {
  REDCO_CHECK(c.encoder.dim == c.decoder.dim,
              "vision_gpt2: the encoder's hidden size {} must equal the decoder's n_embd {}",
              c.encoder.dim, c.decoder.dim);
  return nn::encoder_decoder(vit(c.encoder), vision_gpt2_decoder(c.decoder));
}

using VisionGpt2 = decltype(vision_gpt2(VisionGpt2Config{}));

// ---- Hugging Face checkpoints (model_type "vision-encoder-decoder") -------------------------
VisionGpt2Config vision_gpt2_config(const hf::Config& config);
io::Json vision_gpt2_hf_config(const VisionGpt2Config& c, io::Json base = io::Json::object());
hf::Layout vision_gpt2_layout(const VisionGpt2Config& c);

// What from_pretrained / save_pretrained need of it (models/hf_family.hpp).
template <>
struct HfFamily<VisionGpt2> {  // VisionEncoderDecoderModel: ViT encoder, GPT-2 decoder
  using Config = VisionGpt2Config;
  static Config config(const hf::Config& f) { return vision_gpt2_config(f); }
  static VisionGpt2 build(const Config& c) { return vision_gpt2(c); }
  static hf::Layout layout(const Config& c) { return vision_gpt2_layout(c); }
  static io::Json to_json(const Config& c, io::Json base) { return vision_gpt2_hf_config(c, base); }
};

}  // namespace redco::models
