#pragma once
// GPT-2 (Radford et al., 2019) in the model DSL: learned positions, pre-norm
// blocks with a GELU MLP, biases everywhere and the LM head tied to the token
// embedding. Parameter names follow Hugging Face's GPT2Model where the DSL
// allows: wte, wpe, h.N.ln_1, h.N.attn (q/k/v/o_proj: the fused c_attn is
// split into its three projections), h.N.ln_2, h.N.mlp (fc1 = c_fc, fc2 =
// c_proj), ln_f. Checkpoints convert on load and save (gpt2.cpp): Conv1D
// weights are stored [in, out] there and transposed here.
//
// The sizes are run-time values, so a config read from a file builds the same
// type as the defaults (GPT-2 small, 124,439,808 parameters).
#include "redco/models/hf_checkpoint.hpp"
#include "redco/models/hf_family.hpp"
#include "redco/nn/model.hpp"

namespace redco::models {

// Designated initialisers name these fields in the order declared below (C++20 rule).
struct Gpt2Config {             // Hugging Face's GPT2Config defaults
  int64_t vocab = 50257;        // vocab_size
  int64_t context = 1024;       // n_positions: longest sequence (rows of wpe)
  int64_t dim = 768;            // n_embd
  int64_t layers = 12;          // n_layer
  int64_t heads = 12;           // n_head
  float dropout = 0.f;          // embd_pdrop = resid_pdrop (attention weights are not dropped)
  int64_t inner = 0;            // n_inner: the MLP's width, 0 = 4 * dim
  float norm_eps = 1e-5f;       // layer_norm_epsilon
  nn::Act act = nn::Act::gelu;  // activation_function: gelu_new (tanh approximation)
  bool scale_attn_by_inverse_layer_idx = false;
};

inline auto gpt2(const Gpt2Config& c) {
  const int64_t d = c.dim, inner = c.inner ? c.inner : 4 * d;
  auto attn = nn::causal_attention(d, c.heads);
  attn.scale_by_inverse_layer = c.scale_attn_by_inverse_layer_idx;
  auto attn_block =
      nn::residual(nn::layer_norm(d, c.norm_eps) | std::move(attn) | nn::dropout(c.dropout));
  auto mlp_block = nn::residual(nn::layer_norm(d, c.norm_eps) | nn::mlp(d, inner, c.act) |
                                nn::dropout(c.dropout));
  return (nn::embedding(c.vocab, d) + nn::positions(c.context, d)) | nn::dropout(c.dropout) |
         nn::repeat(c.layers, std::move(attn_block) | std::move(mlp_block)) |
         nn::named<"ln_f">(nn::layer_norm(d, c.norm_eps)) | nn::tied_lm_head(c.vocab);
}

using Gpt2 = decltype(gpt2(Gpt2Config{}));

// ---- Hugging Face checkpoints (model_type "gpt2") ----------------------------------------
Gpt2Config gpt2_config(const hf::Config& config);
io::Json gpt2_hf_config(const Gpt2Config& c, io::Json base = io::Json::object());
hf::Layout gpt2_layout(const Gpt2Config& c);

// What from_pretrained / save_pretrained need of it (models/hf_family.hpp).
template <>
struct HfFamily<Gpt2> {
  using Config = Gpt2Config;
  static Config config(const hf::Config& f) { return gpt2_config(f); }
  static Gpt2 build(const Config& c) { return gpt2(c); }
  static hf::Layout layout(const Config& c) { return gpt2_layout(c); }
  static io::Json to_json(const Config& c, io::Json base) { return gpt2_hf_config(c, base); }
};

}  // namespace redco::models
