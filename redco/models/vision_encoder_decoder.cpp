// VisionEncoderDecoder checkpoints (ViT encoder, GPT-2 decoder): the nested
// config.json (its "encoder" and "decoder" objects are a ViTConfig and a
// GPT2Config) and the state dict, the two families' layouts under
// "encoder." and "decoder.transformer." plus the decoder's cross-attention.
#include "redco/models/vision_encoder_decoder.hpp"

#include <fmt/format.h>

#include "redco/models/hf_util.hpp"

namespace redco::models {

VisionGpt2Config vision_gpt2_config(const hf::Config& f) {
  f.expect_model_type({"vision-encoder-decoder"}, "models::VisionGpt2");
  for (const char* part : {"encoder", "decoder"})
    if (!f.has(part) || !f.json().at(part).is_object())
      f.fail(part, "must be an object (the encoder's / decoder's config)");
  VisionGpt2Config c;
  c.encoder = vit_config(hf::Config(f.object("encoder"), f.source() + " (encoder)"));
  const hf::Config dec(f.object("decoder"), f.source() + " (decoder)");
  c.decoder = gpt2_config(dec);
  if (!dec.boolean("add_cross_attention", false))
    dec.fail("add_cross_attention", "must be true: the decoder attends to the image");
  if (c.encoder.dim != c.decoder.dim)
    f.fail("encoder", fmt::format("hidden_size {} differs from the decoder's n_embd {}: redco does "
                                  "not model enc_to_dec_proj",
                                  c.encoder.dim, c.decoder.dim));
  if (f.boolean("tie_encoder_decoder", false))
    f.fail("tie_encoder_decoder", "is true: a ViT and a GPT-2 share no weights");
  c.decoder_start = f.integer("decoder_start_token_id", 0);
  return c;
}

io::Json vision_gpt2_hf_config(const VisionGpt2Config& c, io::Json j) {
  const io::Json none = io::Json::object();
  io::Json enc = vit_hf_config(c.encoder, j.contains("encoder") ? j["encoder"] : none);
  io::Json dec = gpt2_hf_config(c.decoder, j.contains("decoder") ? j["decoder"] : none);
  dec["add_cross_attention"] = true;
  dec["is_decoder"] = true;
  j["encoder"] = std::move(enc);
  j["decoder"] = std::move(dec);
  j["architectures"] = io::Json::array();
  j["architectures"].push_back("VisionEncoderDecoderModel");
  j["model_type"] = "vision-encoder-decoder";
  j["is_encoder_decoder"] = true;
  j["decoder_start_token_id"] = c.decoder_start;
  if (!j.contains("tie_word_embeddings")) j["tie_word_embeddings"] = false;
  return j;
}

namespace {

// GPT-2's cross-attention: q_attn [d, d], c_attn [d, 2d] (k | v), c_proj, as Conv1D ([in, out]).
void add_cross_attention(hf::Layout& l, const Gpt2Config& c) {
  using hf::row_range;
  const int64_t d = c.dim;
  for (int64_t i = 0; i < c.layers; ++i) {
    const std::string r = fmt::format("decoder.h.{}.", i),
                      h = fmt::format("decoder.transformer.h.{}.", i);
    auto conv = [&](const char* mine, const char* theirs, Shape stored, std::vector<int64_t> rows) {
      l.sources.push_back({r + "crossattention." + mine + ".weight",
                           h + "crossattention." + theirs + ".weight", std::move(stored), true,
                           rows});
      l.sources.push_back({r + "crossattention." + mine + ".bias",
                           h + "crossattention." + theirs + ".bias",
                           Shape{rows.empty() ? d : 2 * d}, false, std::move(rows)});
    };
    conv("q_proj", "q_attn", {d, d}, {});
    conv("k_proj", "c_attn", {d, 2 * d}, row_range(0, d));
    conv("v_proj", "c_attn", {d, 2 * d}, row_range(d, 2 * d));
    conv("o_proj", "c_proj", {d, d}, {});
    for (const char* p : {"weight", "bias"})
      l.sources.push_back(hf::same(fmt::format("{}ln_cross_attn.{}", r, p),
                                   fmt::format("{}ln_cross_attn.{}", h, p), {d}));
  }
}

}  // namespace

hf::Layout vision_gpt2_layout(const VisionGpt2Config& c) {
  hf::Layout l;
  l.prefixes = {""};
  l.ignored_suffixes = {"encoder.pooler.dense.weight", "encoder.pooler.dense.bias",
                        "decoder.lm_head.weight",      ".attn.bias",
                        ".attn.masked_bias",           ".crossattention.bias",
                        ".crossattention.masked_bias"};
  for (hf::TensorSource s : vit_layout(c.encoder).sources) {
    s.param = "encoder." + s.param;
    s.hf = "encoder." + s.hf;
    l.sources.push_back(std::move(s));
  }
  for (hf::TensorSource s : gpt2_layout(c.decoder).sources) {
    s.param = "decoder." + s.param;
    s.hf = "decoder.transformer." + s.hf;
    l.sources.push_back(std::move(s));
  }
  add_cross_attention(l, c.decoder);
  return l;
}

}  // namespace redco::models
