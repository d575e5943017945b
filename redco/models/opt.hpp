#pragma once
// OPT (Zhang et al., 2022) in the model DSL: learned positions read two rows
// past the start of their table (fairseq's padding offset), a ReLU MLP,
// biases everywhere and the LM head tied to the token embedding. Two shapes
// of checkpoint share the type, chosen by config.json at run time:
//  * do_layer_norm_before (125m, 1.3b, ...): pre-LN blocks and a final norm;
//    post-LN (350m): each block's norm after its residual sum, no final norm;
//  * word_embed_proj_dim != hidden_size (350m): token embeddings and the head
//    live in the smaller width, project_in / project_out map between them.
// Names follow OPTForCausalLM without its "model.decoder." prefix, except
// that the MLP's fc1/fc2 sit under "mlp" and out_proj is o_proj, as in every
// redco attention (opt.cpp maps them).
#include "redco/models/hf_checkpoint.hpp"
#include "redco/models/hf_family.hpp"
#include "redco/nn/model.hpp"

namespace redco::models {

// Designated initialisers name these fields in the order declared below (C++20 rule).
struct OptConfig {              // defaults: OPT-125m (transformers' OPTConfig)
  int64_t vocab = 50272;        // vocab_size
  int64_t context = 2048;       // max_position_embeddings (the table has 2 more rows)
  int64_t dim = 768;            // hidden_size
  int64_t layers = 12;          // num_hidden_layers
  int64_t heads = 12;           // num_attention_heads
  int64_t ffn = 3072;           // ffn_dim
  int64_t embed_dim = 0;        // word_embed_proj_dim; 0: hidden_size
  bool pre_norm = true;         // do_layer_norm_before
  bool final_norm = true;       // pre_norm && !_remove_final_layer_norm
  float dropout = 0.f;          // dropout (attention weights are not dropped)
  nn::Act act = nn::Act::relu;  // activation_function
  static constexpr int64_t kPositionOffset = 2;
  int64_t embed_width() const { return embed_dim ? embed_dim : dim; }
};

inline auto opt(const OptConfig& c) {
  const int64_t d = c.dim, e = c.embed_width();
  auto ln = [&] { return nn::layer_norm(d, 1e-5f); };  // OPT's nn.LayerNorm default
  auto block = nn::normed_residual(nn::named<"self_attn_layer_norm">(ln()),
                                   nn::named<"self_attn">(nn::causal_attention(d, c.heads)) |
                                       nn::dropout(c.dropout),
                                   c.pre_norm) |
               nn::normed_residual(nn::named<"final_layer_norm">(ln()),
                                   nn::mlp(d, c.ffn, c.act) | nn::dropout(c.dropout), c.pre_norm);
  nn::LMHead head = nn::lm_head(e, c.vocab);
  head.tied_to = "embed_tokens.weight";
  auto tokens = nn::named<"embed_tokens">(nn::embedding(c.vocab, e)) |
                nn::maybe(nn::named<"project_in">(nn::projection(e, d)), e != d);
  nn::Positions pos =
      nn::positions(c.context + OptConfig::kPositionOffset, d, OptConfig::kPositionOffset);
  pos.count_tokens = true;  // a padded row's positions start at its first token
  auto positions = nn::named<"embed_positions">(std::move(pos));
  return (std::move(tokens) + std::move(positions)) |
         nn::named<"layers">(nn::repeat(c.layers, std::move(block))) |
         nn::maybe(nn::named<"final_layer_norm">(ln()), c.final_norm) |
         nn::maybe(nn::named<"project_out">(nn::projection(d, e)), e != d) | head;
}

using Opt = decltype(opt(OptConfig{}));

// ---- Hugging Face checkpoints (model_type "opt") ------------------------------------------
OptConfig opt_config(const hf::Config& config);
io::Json opt_hf_config(const OptConfig& c, io::Json base = io::Json::object());
hf::Layout opt_layout(const OptConfig& c);

// What from_pretrained / save_pretrained need of it (models/hf_family.hpp).
template <>
struct HfFamily<Opt> {
  using Config = OptConfig;
  static Config config(const hf::Config& f) { return opt_config(f); }
  static Opt build(const Config& c) { return opt(c); }
  static hf::Layout layout(const Config& c) { return opt_layout(c); }
  static io::Json to_json(const Config& c, io::Json base) { return opt_hf_config(c, base); }
};

}  // namespace redco::models
