#pragma once
// GPT-2 (Radford et al., 2019) in the model DSL: learned positions, pre-norm
// blocks with a GELU MLP, biases everywhere and the LM head tied to the token
// embedding. Parameter names follow Hugging Face's GPT2Model where the DSL
// allows: wte, wpe, h.N.ln_1, h.N.attn (q/k/v/o_proj: the fused c_attn is
// split into its three projections), h.N.ln_2, h.N.mlp (fc1, fc2), ln_f.
//
// The sizes are run-time values, so a config read from a file builds the same
// type as the defaults (GPT-2 small, 124,439,808 parameters).
#include "redco/nn/model.hpp"

namespace redco::models {

struct Gpt2Config {
  int64_t vocab = 50257;
  int64_t context = 1024;  // longest sequence (rows of wpe)
  int64_t dim = 768;
  int64_t layers = 12;
  int64_t heads = 12;
  float dropout = 0.f;  // embd_pdrop = resid_pdrop (attention weights are not dropped)
};

inline auto gpt2(const Gpt2Config& c) {
  const int64_t d = c.dim;
  auto attn_block =
      nn::residual(nn::layer_norm(d) | nn::causal_attention(d, c.heads) | nn::dropout(c.dropout));
  auto mlp_block =
      nn::residual(nn::layer_norm(d) | nn::mlp(d, 4 * d, nn::Act::gelu) | nn::dropout(c.dropout));
  return (nn::embedding(c.vocab, d) + nn::positions(c.context, d)) | nn::dropout(c.dropout) |
         nn::repeat(c.layers, std::move(attn_block) | std::move(mlp_block)) |
         nn::named<"ln_f">(nn::layer_norm(d)) | nn::tied_lm_head(c.vocab);
}

using Gpt2 = decltype(gpt2(Gpt2Config{}));

}  // namespace redco::models
