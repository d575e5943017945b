#pragma once
// LLaMA (Touvron et al., 2023) in the model DSL: RMSNorm, rotary positions,
// grouped-query attention, a SwiGLU MLP, no biases and an untied LM head.
// Names follow Hugging Face's LlamaForCausalLM without its "model." prefix:
// embed_tokens, layers.N.input_layernorm, layers.N.self_attn (q/k/v/o_proj),
// layers.N.post_attention_layernorm, layers.N.mlp (gate/up/down_proj), norm,
// lm_head.
#include "redco/nn/model.hpp"

namespace redco::models {

struct LlamaConfig {  // defaults: LLaMA-7B (6,738,415,616 parameters)
  int64_t vocab = 32000;
  int64_t dim = 4096;
  int64_t layers = 32;
  int64_t heads = 32;
  int64_t kv_heads = 0;  // 0: as many as heads; fewer: grouped-query attention
  int64_t hidden = 11008;
  float norm_eps = 1e-6f;
  float rope_base = 10000.f;
};

inline auto llama(const LlamaConfig& c) {
  const int64_t d = c.dim;
  auto norm = [&] { return nn::rms_norm(d, c.norm_eps); };
  auto attn = nn::causal_attention<false>(
      d, c.heads, {.kv_heads = c.kv_heads, .rotary = true, .rope_base = c.rope_base});
  auto block =
      nn::residual(nn::named<"input_layernorm">(norm()) | nn::named<"self_attn">(std::move(attn))) |
      nn::residual(nn::named<"post_attention_layernorm">(norm()) | nn::gated_mlp(d, c.hidden));
  return nn::named<"embed_tokens">(nn::embedding(c.vocab, d)) |
         nn::named<"layers">(nn::repeat(c.layers, std::move(block))) | nn::named<"norm">(norm()) |
         nn::lm_head(d, c.vocab);
}

using Llama = decltype(llama(LlamaConfig{}));

}  // namespace redco::models
