#pragma once
// GPT-NeoX (Black et al., 2022; also Pythia) in the model DSL: rotary
// positions on the first rotary_pct of each head (rotate-half pairing, as
// redco's kernel), attention and MLP each behind their own layer norm, run
// side by side (use_parallel_residual: x + attn(ln1(x)) + mlp(ln2(x))) or in
// sequence, and an untied LM head (embed_out).
// The checkpoint fuses q, k and v in one query_key_value [3 * dim, dim] laid
// out head by head (h0's q, k, v rows, then h1's, ...); gpt_neox.cpp reads
// each projection as a list of those rows, so the parameters are ordinary
// q/k/v_proj split by heads under tensor parallelism.
// Names follow GPTNeoXForCausalLM without "gpt_neox.": embed_in,
// layers.N.input_layernorm, layers.N.attention (q/k/v/o_proj; o_proj is
// dense), layers.N.post_attention_layernorm, layers.N.mlp (fc1 =
// dense_h_to_4h, fc2 = dense_4h_to_h), final_layer_norm, embed_out.
#include "redco/models/hf_checkpoint.hpp"
#include "redco/models/hf_family.hpp"
#include "redco/nn/model.hpp"

namespace redco::models {

// Designated initialisers name these fields in the order declared below (C++20 rule).
struct GptNeoxConfig {              // defaults: GPT-NeoX-20B (transformers' GPTNeoXConfig)
  int64_t vocab = 50432;            // vocab_size
  int64_t dim = 6144;               // hidden_size
  int64_t layers = 44;              // num_hidden_layers
  int64_t heads = 64;               // num_attention_heads
  int64_t hidden = 24576;           // intermediate_size
  int64_t rotary_dim = 24;          // int(head size * rotary_pct)
  float rotary_base = 10000.f;      // rotary_emb_base
  float norm_eps = 1e-5f;           // layer_norm_eps
  nn::Act act = nn::Act::gelu_erf;  // hidden_act: "gelu"
  bool parallel_residual = true;    // use_parallel_residual
  bool attention_bias = true;       // attention_bias (q/k/v and dense)
  bool tie_embeddings = false;      // tie_word_embeddings
  float dropout = 0.f;              // hidden_dropout
  int64_t context = 2048;           // max_position_embeddings (kept for config.json)
};

inline auto gpt_neox(const GptNeoxConfig& c) {
  const int64_t d = c.dim;
  auto ln = [&] { return nn::layer_norm(d, c.norm_eps); };
  auto attn = nn::causal_attention(d, c.heads,
                                   {.rotary = c.rotary_dim > 0,
                                    .rope = {.base = c.rotary_base, .rotary_dim = c.rotary_dim},
                                    .qkv_bias = c.attention_bias,
                                    .o_bias = c.attention_bias});
  auto block =
      nn::parallel_residual(nn::named<"input_layernorm">(ln()) |
                                nn::named<"attention">(std::move(attn)) | nn::dropout(c.dropout),
                            nn::named<"post_attention_layernorm">(ln()) |
                                nn::mlp(d, c.hidden, c.act) | nn::dropout(c.dropout),
                            c.parallel_residual);
  nn::LMHead head = nn::lm_head(d, c.vocab);
  if (c.tie_embeddings) head.tied_to = "embed_in.weight";
  return nn::named<"embed_in">(nn::embedding(c.vocab, d)) | nn::dropout(c.dropout) |
         nn::named<"layers">(nn::repeat(c.layers, std::move(block))) |
         nn::named<"final_layer_norm">(ln()) | nn::named<"embed_out">(head);
}

using GptNeox = decltype(gpt_neox(GptNeoxConfig{}));

// ---- Hugging Face checkpoints (model_type "gpt_neox") -------------------------------------
GptNeoxConfig gpt_neox_config(const hf::Config& config);
io::Json gpt_neox_hf_config(const GptNeoxConfig& c, io::Json base = io::Json::object());
hf::Layout gpt_neox_layout(const GptNeoxConfig& c);

// What from_pretrained / save_pretrained need of it (models/hf_family.hpp).
template <>
struct HfFamily<GptNeox> {
  using Config = GptNeoxConfig;
  static Config config(const hf::Config& f) { return gpt_neox_config(f); }
  static GptNeox build(const Config& c) { return gpt_neox(c); }
  static hf::Layout layout(const Config& c) { return gpt_neox_layout(c); }
  static io::Json to_json(const Config& c, io::Json base) { return gpt_neox_hf_config(c, base); }
};

}  // namespace redco::models
