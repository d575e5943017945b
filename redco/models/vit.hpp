#pragma once
// ViT (Dosovitskiy et al., 2020) in the model DSL, as transformers' ViTModel
// computes it: patch embedding with a class token and learned positions
// (nn::PatchEmbedding), pre-LN encoder blocks (layernorm_before ->
// bidirectional attention -> residual, layernorm_after -> GELU MLP ->
// residual), a final layernorm. Input: images [N, C, H, W] f32; output: the
// last hidden state [N, 1 + patches, dim] (the pooler is not modelled: its
// tensors are skipped on load).
//
// Names (redco's; vit.cpp maps them to the checkpoint's):
//   embeddings.{patch_embeddings.projection, cls_token, position_embeddings}
//   layer.N.{layernorm_before, attention (q/k/v/o_proj = attention.query,
//   .key, .value, output.dense), layernorm_after, mlp (fc1 = intermediate.dense,
//   fc2 = output.dense)} (checkpoint: encoder.layer.N), layernorm.
//
// Tensor-parallel plan (the two rules, no hint): query/key/value split by
// heads, output.dense by its input columns; intermediate.dense column,
// output.dense row; patch projection, class token, positions and norms
// replicated (see nn/patch_embedding.hpp).
#include "redco/models/hf_checkpoint.hpp"
#include "redco/models/hf_family.hpp"
#include "redco/nn/model.hpp"
#include "redco/nn/patch_embedding.hpp"

namespace redco::models {

// Designated initialisers name these fields in the order declared below (C++20 rule).
struct VitConfig {       // defaults: ViTConfig's (vit-base-patch16-224)
  int64_t channels = 3;  // num_channels
  int64_t height = 224;  // image_size (an int, or [height, width])
  int64_t width = 224;
  int64_t patch = 16;               // patch_size
  int64_t dim = 768;                // hidden_size
  int64_t layers = 12;              // num_hidden_layers
  int64_t heads = 12;               // num_attention_heads
  int64_t inner = 3072;             // intermediate_size
  float norm_eps = 1e-12f;          // layer_norm_eps
  nn::Act act = nn::Act::gelu_erf;  // hidden_act ("gelu")
  bool qkv_bias = true;             // qkv_bias
  float dropout = 0.f;              // hidden_dropout_prob
};

inline auto vit(const VitConfig& c) {
  const int64_t d = c.dim;
  auto ln = [&] { return nn::layer_norm(d, c.norm_eps); };
  auto attn = nn::self_attention(d, c.heads, {.qkv_bias = c.qkv_bias});
  auto block = nn::residual(nn::named<"layernorm_before">(ln()) |
                            nn::named<"attention">(std::move(attn)) | nn::dropout(c.dropout)) |
               nn::residual(nn::named<"layernorm_after">(ln()) | nn::mlp(d, c.inner, c.act) |
                            nn::dropout(c.dropout));
  return nn::patch_embedding(c.channels, c.height, c.width, c.patch, d) | nn::dropout(c.dropout) |
         nn::named<"layer">(nn::repeat(c.layers, std::move(block))) | nn::named<"layernorm">(ln());
}

using Vit = decltype(vit(VitConfig{}));

// ---- Hugging Face checkpoints (model_type "vit") ------------------------------------------
VitConfig vit_config(const hf::Config& config);
io::Json vit_hf_config(const VitConfig& c, io::Json base = io::Json::object());
// ViTModel's tensors (and those of a ViTForImageClassification's "vit."
// encoder, whose classifier is skipped); the pooler is skipped.
hf::Layout vit_layout(const VitConfig& c);

// What from_pretrained / save_pretrained need of it (models/hf_family.hpp).
template <>
struct HfFamily<Vit> {  // ViTModel (or the encoder of a ViTForImageClassification)
  using Config = VitConfig;
  static Config config(const hf::Config& f) { return vit_config(f); }
  static Vit build(const Config& c) { return vit(c); }
  static hf::Layout layout(const Config& c) { return vit_layout(c); }
  static io::Json to_json(const Config& c, io::Json base) { return vit_hf_config(c, base); }
};

}  // namespace redco::models
