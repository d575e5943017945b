#pragma once
// LLaMA (Touvron et al., 2023) in the model DSL: RMSNorm, rotary positions,
// grouped-query attention, a SwiGLU MLP and an LM head, untied or tied to the
// embedding. Mistral and Qwen2 checkpoints are the same architecture with
// other settings (Qwen2: biases on q, k and v), so one type serves all three.
// Names follow Hugging Face's LlamaForCausalLM without its "model." prefix:
// embed_tokens, layers.N.input_layernorm, layers.N.self_attn (q/k/v/o_proj),
// layers.N.post_attention_layernorm, layers.N.mlp (gate/up/down_proj), norm,
// lm_head.
#include "redco/models/hf_checkpoint.hpp"
#include "redco/models/hf_family.hpp"
#include "redco/nn/model.hpp"

namespace redco::models {

// Designated initialisers name these fields in the order declared below (C++20 rule).
struct LlamaConfig {            // defaults: LLaMA-7B (6,738,415,616 parameters)
  int64_t vocab = 32000;        // vocab_size
  int64_t dim = 4096;           // hidden_size
  int64_t layers = 32;          // num_hidden_layers
  int64_t heads = 32;           // num_attention_heads
  int64_t kv_heads = 0;         // num_key_value_heads; 0: as many as heads
  int64_t hidden = 11008;       // intermediate_size
  float norm_eps = 1e-6f;       // rms_norm_eps
  nn::RopeOptions rope{};       // rope_theta and rope_scaling
  int64_t head_dim = 0;         // 0: dim / heads
  bool qkv_bias = false;        // attention_bias (LLaMA), always on in Qwen2
  bool o_bias = false;          // attention_bias (LLaMA)
  bool tie_embeddings = false;  // tie_word_embeddings
  int64_t context = 0;          // max_position_embeddings (kept for config.json)
  int64_t window = 0;           // Mistral's sliding_window (0: none)
};

inline auto llama(const LlamaConfig& c) {
  const int64_t d = c.dim;
  auto norm = [&] { return nn::rms_norm(d, c.norm_eps); };
  auto attn = nn::causal_attention(d, c.heads,
                                   {.kv_heads = c.kv_heads,
                                    .rotary = true,
                                    .rope = c.rope,
                                    .head_dim = c.head_dim,
                                    .qkv_bias = c.qkv_bias,
                                    .o_bias = c.o_bias});
  attn.window = c.window;
  auto block =
      nn::residual(nn::named<"input_layernorm">(norm()) | nn::named<"self_attn">(std::move(attn))) |
      nn::residual(nn::named<"post_attention_layernorm">(norm()) | nn::gated_mlp(d, c.hidden));
  nn::LMHead head = nn::lm_head(d, c.vocab);
  if (c.tie_embeddings) head.tied_to = "embed_tokens.weight";
  return nn::named<"embed_tokens">(nn::embedding(c.vocab, d)) |
         nn::named<"layers">(nn::repeat(c.layers, std::move(block))) | nn::named<"norm">(norm()) |
         head;
}

using Llama = decltype(llama(LlamaConfig{}));

// ---- Hugging Face checkpoints (model_type "llama", "mistral", "qwen2") -------------------
LlamaConfig llama_config(const hf::Config& config);
io::Json llama_hf_config(const LlamaConfig& c, io::Json base = io::Json::object());
hf::Layout llama_layout(const LlamaConfig& c);

// What from_pretrained / save_pretrained need of it (models/hf_family.hpp).
template <>
struct HfFamily<Llama> {
  using Config = LlamaConfig;
  static Config config(const hf::Config& f) { return llama_config(f); }
  static Llama build(const Config& c) { return llama(c); }
  static hf::Layout layout(const Config& c) { return llama_layout(c); }
  static io::Json to_json(const Config& c, io::Json base) { return llama_hf_config(c, base); }
};

}  // namespace redco::models
