#pragma once
// GPT-J (Wang & Komatsuzaki, 2021) in the model DSL: one layer norm feeds
// attention and the MLP side by side (x + attn(ln(x)) + mlp(ln(x))), rotary
// positions on the first rotary_dim dimensions of each head, no biases on the
// attention projections, a gelu_new MLP and an untied LM head with a bias.
//
// Rotary pairing. GPT-J rotates interleaved pairs (2i, 2i+1) of a head;
// redco's kernel rotates (i, i + rotary_dim/2) ("rotate half"). Attention is
// invariant to a permutation applied to the rows of both q and k within each
// head, so the checkpoint's q_proj and k_proj rows are reordered on load,
// head by head, to [0, 2, ..., r-2, 1, 3, ..., r-1, r, ..., head_dim-1], and
// put back on save by the same row list (gptj.cpp). The parameters therefore
// differ from the file's rows, the logits do not.
// Names follow GPTJForCausalLM without "transformer.": wte, h.N.ln_1,
// h.N.attn (q/k/v/o_proj; o_proj is out_proj), h.N.mlp (fc1 = fc_in,
// fc2 = fc_out), ln_f, lm_head.
#include "redco/models/hf_checkpoint.hpp"
#include "redco/models/hf_family.hpp"
#include "redco/nn/model.hpp"

namespace redco::models {

// Designated initialisers name these fields in the order declared below (C++20 rule).
struct GptjConfig {             // defaults: GPT-J-6B (transformers' GPTJConfig)
  int64_t vocab = 50400;        // vocab_size
  int64_t context = 2048;       // n_positions
  int64_t dim = 4096;           // n_embd
  int64_t layers = 28;          // n_layer
  int64_t heads = 16;           // n_head
  int64_t rotary_dim = 64;      // rotary_dim: rotated dimensions of each head
  int64_t inner = 0;            // n_inner: the MLP's width, 0 = 4 * dim
  float norm_eps = 1e-5f;       // layer_norm_epsilon
  float dropout = 0.f;          // resid_pdrop (attention weights are not dropped)
  float embed_dropout = 0.f;    // embd_pdrop
  nn::Act act = nn::Act::gelu;  // activation_function: gelu_new
  bool tie_embeddings = false;  // tie_word_embeddings (the bias stays the head's own)
};

inline auto gptj(const GptjConfig& c) {
  const int64_t d = c.dim, inner = c.inner ? c.inner : 4 * d;
  auto attn = nn::causal_attention<false>(d, c.heads,
                                          {.rotary = true, .rope = {.rotary_dim = c.rotary_dim}});
  auto both = (std::move(attn) | nn::dropout(c.dropout)) +
              (nn::mlp(d, inner, c.act) | nn::dropout(c.dropout));  // one input, outputs summed
  auto block = nn::residual(nn::named<"ln_1">(nn::layer_norm(d, c.norm_eps)) | std::move(both));
  nn::BiasedLMHead head = nn::biased_lm_head(d, c.vocab);
  if (c.tie_embeddings) head.tied_to = "wte.weight";
  return nn::embedding(c.vocab, d) | nn::dropout(c.embed_dropout) |
         nn::repeat(c.layers, std::move(block)) | nn::named<"ln_f">(nn::layer_norm(d, c.norm_eps)) |
         head;
}

using Gptj = decltype(gptj(GptjConfig{}));

// ---- Hugging Face checkpoints (model_type "gptj") -----------------------------------------
GptjConfig gptj_config(const hf::Config& config);
io::Json gptj_hf_config(const GptjConfig& c, io::Json base = io::Json::object());
hf::Layout gptj_layout(const GptjConfig& c);
// The row order (within the q or k projection of `heads` heads of size
// head_dim) that turns GPT-J's interleaved rotary pairs into rotate-half ones:
// parameter row i is checkpoint row rows[i].
std::vector<int64_t> interleaved_to_half_rows(int64_t heads, int64_t head_dim, int64_t rotary_dim);

// What from_pretrained / save_pretrained need of it (models/hf_family.hpp).
template <>
struct HfFamily<Gptj> {
  using Config = GptjConfig;
  static Config config(const hf::Config& f) { return gptj_config(f); }
  static Gptj build(const Config& c) { return gptj(c); }
  static hf::Layout layout(const Config& c) { return gptj_layout(c); }
  static io::Json to_json(const Config& c, io::Json base) { return gptj_hf_config(c, base); }
};

}  // namespace redco::models
