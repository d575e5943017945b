// Each family's kept buffers, written from its layers (models/<family>.hpp)
// and the autodiff ops they call. A buffer is counted once, where it is
// made: a block's output is the next block's input, kept by that block's
// first op, and counted with the block that made it.
#include "redco/plan/model_shape.hpp"

#include <fmt/format.h>

#include <numeric>

#include "redco/models/bart.hpp"
#include "redco/models/bert.hpp"
#include "redco/models/gpt2.hpp"
#include "redco/models/gpt_neox.hpp"
#include "redco/models/gptj.hpp"
#include "redco/models/llama.hpp"
#include "redco/models/opt.hpp"
#include "redco/models/t5.hpp"
#include "redco/nn/shard_plan.hpp"

namespace redco::plan {
namespace {

Kept whole(std::string what, int64_t width) { return {std::move(what), width, false, false}; }
Kept inside(std::string what, int64_t width, bool operand = false) {
  return {std::move(what), width, true, operand};
}
void append(std::vector<Kept>& to, std::vector<Kept> more) {
  for (Kept& k : more) to.push_back(std::move(k));
}

// A norm keeps its input (made elsewhere) and its per-row statistics
// (LayerNormSaved: mean and 1/std, RMS norm 1/rms only). Its output is not
// kept: the linear layers that read it save a recipe to recompute it in
// backward (autodiff SavedInput), and every norm here feeds linear layers
// (or the LM head) only; where a dropout reads it, add_dropout counts it.
std::vector<Kept> norm(const std::string& name, int64_t, bool rms) {
  return {whole(name + " statistics", rms ? 1 : 2)};
}

// Self-attention after its norm: q, k, v as attention keeps them (its
// operands: bf16 copies under Precision::bf16; after rotary, the rotated
// copies), the log-sum-exp of every query row, and the merged-heads output
// that attention and the output projection both keep.
std::vector<Kept> self_attention(int64_t q_width, int64_t kv_width, int64_t heads) {
  return {inside("attention q", q_width, true), inside("attention k", kv_width, true),
          inside("attention v", kv_width, true), inside("attention log-sum-exp", heads),
          inside("attention output", q_width)};
}
// Rotary embeddings over part of each head (GPT-J, GPT-NeoX) or with scaled
// frequencies (LLaMA 3's rope_scaling) are composed of differentiable ops
// (nn/rope.cpp apply_rope): the two rotated halves of q and of k are kept by
// the products with cos and sin, rotary_dim of every head. The plain full
// rotation is one op that keeps nothing.
void add_composed_rotary(std::vector<Kept>& to, int64_t heads, int64_t kv_heads,
                         int64_t rotary_dim) {
  to.push_back(inside("rotary halves of q and k", (heads + kv_heads) * rotary_dim));
}

// Cross-attention, per target token: q, log-sum-exp, output. Its k and v are
// per source token (cross_kv).
std::vector<Kept> cross_attention(int64_t q_width, int64_t heads) {
  return {inside("cross-attention q", q_width, true), inside("cross-attention log-sum-exp", heads),
          inside("cross-attention output", q_width)};
}
std::vector<Kept> cross_kv(int64_t kv_width) {
  return {inside("cross-attention k", kv_width, true), inside("cross-attention v", kv_width, true)};
}

// The MLP after its norm. GELU: fc1, bias, GELU and fc2 as one op keeping
// fc1's output only (autodiff bias_gelu_linear). Others: fc1's output (kept
// by the activation) and the activation's (kept by fc2).
std::vector<Kept> mlp(int64_t hidden, nn::Act act) {
  if (act == nn::Act::gelu || act == nn::Act::gelu_erf)
    return {inside("MLP fc1 output", hidden, true)};
  return {inside("MLP fc1 output", hidden), inside("MLP activation", hidden)};
}
// Stack::backward_width of a block whose widest sublayer is this MLP.
int64_t mlp_work(int64_t hidden, nn::Act act, bool gated = false) {
  return gated || act == nn::Act::gelu || act == nn::Act::gelu_erf ? 3 * hidden : 2 * hidden;
}

// down(act(gate x) * up x): gate's output (kept by the activation), the
// activation's and up's (kept by the product), the product (kept by down).
std::vector<Kept> gated_mlp(int64_t hidden) {
  return {inside("MLP gate output", hidden), inside("MLP activation", hidden),
          inside("MLP up output", hidden), inside("MLP product", hidden)};
}

// Dropout (p > 0 in training) multiplies by a mask: the product keeps its
// input and the f32 mask, [d] each, at every site (the sum it feeds, or the
// layer after it, keeps the product as before).
void add_dropout(std::vector<Kept>& to, float p, int64_t d, int sites) {
  if (p > 0.f && sites > 0) to.push_back(whole("dropout inputs and masks", 2 * d * sites));
}

// A decoder-only stack: the embedding's output, the blocks, the final norm
// and (a head run with the loss) the input gradient it makes in forward.
Stack decoder_stack(int64_t layers, std::vector<Kept> block, int64_t d, bool rms) {
  Stack s{.name = "decoder", .layers = layers};
  s.per_token = std::move(block);
  s.once_per_token = {whole("embedding output", d)};
  append(s.once_per_token, norm("final norm", d, rms));
  s.once_per_token.push_back(whole("LM head input gradient", d));
  return s;
}

// Residual x + f(norm(x)): the norm, f, the sum.
std::vector<Kept> pre_norm(const std::string& name, int64_t d, bool rms, std::vector<Kept> f) {
  std::vector<Kept> k = norm(name, d, rms);
  append(k, std::move(f));
  k.push_back(whole(name + " residual sum", d));
  return k;
}
// norm(x + f(x)) (post-norm: BART, OPT-350m): the sum, kept by the norm; the norm.
std::vector<Kept> post_norm(const std::string& name, int64_t d, std::vector<Kept> f) {
  std::vector<Kept> k = std::move(f);
  k.push_back(whole(name + " residual sum", d));
  append(k, norm(name, d, false));
  return k;
}

ModelShape gpt2_shape(const models::Gpt2Config& c) {
  const int64_t d = c.dim, inner = c.inner ? c.inner : 4 * d;
  std::vector<Kept> block = pre_norm("ln_1", d, false, self_attention(d, d, c.heads));
  append(block, pre_norm("ln_2", d, false, mlp(inner, c.act)));
  add_dropout(block, c.dropout, d, 2);
  Stack s = decoder_stack(c.layers, std::move(block), d, false);
  add_dropout(s.once_per_token, c.dropout, d, 1);
  s.self_width = d, s.backward_width = mlp_work(inner, c.act);
  return {.family = "gpt2",
          .vocab = c.vocab,
          .dim = d,
          .heads = c.heads,
          .context = c.context,
          .stacks = {std::move(s)}};
}

ModelShape llama_shape(const models::LlamaConfig& c) {
  const int64_t d = c.dim, hd = c.head_dim ? c.head_dim : d / c.heads;
  const int64_t kv = (c.kv_heads ? c.kv_heads : c.heads) * hd;
  std::vector<Kept> attn = self_attention(c.heads * hd, kv, c.heads);
  if (c.rope.scaling != nn::RopeScaling::none || (c.rope.rotary_dim && c.rope.rotary_dim < hd))
    add_composed_rotary(attn, c.heads, kv / hd, c.rope.rotary_dim ? c.rope.rotary_dim : hd);
  std::vector<Kept> block = pre_norm("input_layernorm", d, true, std::move(attn));
  append(block, pre_norm("post_attention_layernorm", d, true, gated_mlp(c.hidden)));
  Stack s = decoder_stack(c.layers, std::move(block), d, true);
  s.self_width = c.heads * hd, s.backward_width = mlp_work(c.hidden, nn::Act::silu, true);
  return {
      .family = "llama", .vocab = c.vocab, .dim = d, .heads = c.heads, .stacks = {std::move(s)}};
}

ModelShape opt_shape(const models::OptConfig& c) {
  const int64_t d = c.dim;
  std::vector<Kept> block;
  if (c.pre_norm) {
    block = pre_norm("self_attn_layer_norm", d, false, self_attention(d, d, c.heads));
    append(block, pre_norm("final_layer_norm", d, false, mlp(c.ffn, c.act)));
  } else {
    block = post_norm("self_attn_layer_norm", d, self_attention(d, d, c.heads));
    append(block, post_norm("final_layer_norm", d, mlp(c.ffn, c.act)));
  }
  add_dropout(block, c.dropout, d, 2);
  Stack s = decoder_stack(c.layers, std::move(block), d, false);
  s.self_width = d, s.backward_width = mlp_work(c.ffn, c.act);
  return {.family = "opt",
          .vocab = c.vocab,
          .dim = d,
          .heads = c.heads,
          .context = c.context,
          .stacks = {std::move(s)}};
}

// x + attn(ln(x)) + mlp(ln(x)): one norm, one sum.
ModelShape gptj_shape(const models::GptjConfig& c) {
  const int64_t d = c.dim, inner = c.inner ? c.inner : 4 * d;
  std::vector<Kept> f = self_attention(d, d, c.heads);
  if (c.rotary_dim < d / c.heads) add_composed_rotary(f, c.heads, c.heads, c.rotary_dim);
  append(f, mlp(inner, c.act));
  add_dropout(f, c.dropout, d, 2);
  Stack s = decoder_stack(c.layers, pre_norm("ln_1", d, false, std::move(f)), d, false);
  add_dropout(s.once_per_token, c.embed_dropout, d, 1);
  // The biased head forms its logits (no gradient in forward); their product keeps its input.
  s.once_per_token.back() = whole("LM head input", d);
  s.self_width = d, s.backward_width = mlp_work(inner, c.act);
  s.reductions = 1;  // attention and MLP outputs summed, then one all-reduce
  // Rotary positions: no table ends the sequence (n_positions is what it was trained at).
  return {.family = "gptj",
          .vocab = c.vocab,
          .dim = d,
          .heads = c.heads,
          .whole_logits = true,
          .stacks = {std::move(s)}};
}

ModelShape gpt_neox_shape(const models::GptNeoxConfig& c) {
  const int64_t d = c.dim;
  std::vector<Kept> attn = self_attention(d, d, c.heads);
  if (c.rotary_dim > 0 && c.rotary_dim < d / c.heads)
    add_composed_rotary(attn, c.heads, c.heads, c.rotary_dim);
  std::vector<Kept> block;
  if (c.parallel_residual) {  // x + attn(ln1 x) + mlp(ln2 x)
    block = norm("input_layernorm", d, false);
    append(block, attn);
    append(block, norm("post_attention_layernorm", d, false));
    append(block, mlp(c.hidden, c.act));
    block.push_back(whole("residual sum", d));
  } else {
    block = pre_norm("input_layernorm", d, false, attn);
    append(block, pre_norm("post_attention_layernorm", d, false, mlp(c.hidden, c.act)));
  }
  add_dropout(block, c.dropout, d, 2);
  Stack s = decoder_stack(c.layers, std::move(block), d, false);
  s.self_width = d, s.backward_width = mlp_work(c.hidden, c.act);
  return {
      .family = "gpt_neox", .vocab = c.vocab, .dim = d, .heads = c.heads, .stacks = {std::move(s)}};
}

ModelShape t5_shape(const models::T5Config& c) {
  const int64_t d = c.dim, w = c.heads * c.kv_dim();
  const std::vector<Kept> ff = c.gated ? gated_mlp(c.hidden) : mlp(c.hidden, c.act);
  Stack enc{.name = "encoder", .layers = c.encoder_layers, .over_source = true};
  enc.per_token = pre_norm("self-attention layer_norm", d, true, self_attention(w, w, c.heads));
  append(enc.per_token, pre_norm("feed-forward layer_norm", d, true, ff));
  add_dropout(enc.per_token, c.dropout, d, 2);
  enc.score_bias_heads = c.heads;
  enc.self_width = w, enc.causal = false, enc.backward_width = mlp_work(c.hidden, c.act, c.gated);
  enc.once_per_token = {whole("embedding output", d)};
  append(enc.once_per_token, norm("final_layer_norm", d, true));
  add_dropout(enc.once_per_token, c.dropout, d, 2);  // after the embedding and the final norm
  Stack dec{.name = "decoder", .layers = c.decoder_layers};
  dec.per_token = pre_norm("self-attention layer_norm", d, true, self_attention(w, w, c.heads));
  append(dec.per_token,
         pre_norm("cross-attention layer_norm", d, true, cross_attention(w, c.heads)));
  append(dec.per_token, pre_norm("feed-forward layer_norm", d, true, ff));
  add_dropout(dec.per_token, c.dropout, d, 3);
  dec.per_source_token = cross_kv(w);
  dec.score_bias_heads = c.heads;
  dec.self_width = w, dec.cross_width = w, dec.reductions = 3;
  dec.backward_width = enc.backward_width;
  dec.once_per_token = {whole("embedding output", d)};
  append(dec.once_per_token, norm("final_layer_norm", d, true));
  add_dropout(dec.once_per_token, c.dropout, d, 2);
  if (c.tie_embeddings) dec.once_per_token.push_back(whole("scaled output", d));
  dec.once_per_token.push_back(whole("LM head input gradient", d));
  return {.family = "t5",
          .vocab = c.vocab,
          .dim = d,
          .heads = c.heads,
          .encoder_decoder = true,
          .stacks = {std::move(enc), std::move(dec)}};
}

ModelShape bart_shape(const models::BartConfig& c) {
  const int64_t d = c.dim;
  // The embedding: tokens (times a scale) plus positions, kept by
  // layernorm_embedding; its output.
  auto embed = [&] {
    std::vector<Kept> k = {whole("embedding sum", d)};
    append(k, norm("layernorm_embedding", d, false));
    add_dropout(k, c.dropout, d, 1);
    return k;
  };
  Stack enc{.name = "encoder", .layers = c.encoder_layers, .over_source = true};
  enc.per_token = post_norm("self_attn_layer_norm", d, self_attention(d, d, c.encoder_heads));
  append(enc.per_token, post_norm("final_layer_norm", d, mlp(c.encoder_ffn, c.act)));
  add_dropout(enc.per_token, c.dropout, d, 2);
  enc.once_per_token = embed();
  enc.self_width = d, enc.causal = false, enc.backward_width = mlp_work(c.encoder_ffn, c.act);
  Stack dec{.name = "decoder", .layers = c.decoder_layers};
  dec.per_token = post_norm("self_attn_layer_norm", d, self_attention(d, d, c.decoder_heads));
  append(dec.per_token,
         post_norm("encoder_attn_layer_norm", d, cross_attention(d, c.decoder_heads)));
  append(dec.per_token, post_norm("final_layer_norm", d, mlp(c.decoder_ffn, c.act)));
  add_dropout(dec.per_token, c.dropout, d, 3);
  dec.per_source_token = cross_kv(d);
  dec.once_per_token = embed();
  dec.once_per_token.push_back(whole("LM head input", d));  // kept by the logits' product
  dec.self_width = d, dec.cross_width = d, dec.reductions = 3;
  dec.backward_width = mlp_work(c.decoder_ffn, c.act);
  // The head is followed by final_logits_bias, which forms the logits whole.
  return {.family = "bart",
          .vocab = c.vocab,
          .dim = d,
          .heads = c.decoder_heads,
          .context = c.context,
          .encoder_decoder = true,
          .whole_logits = true,
          .stacks = {std::move(enc), std::move(dec)}};
}

// A BERT / RoBERTa sequence classifier (models/bert.hpp): the embeddings'
// sum, LayerNorm and dropout, then post-norm blocks as BART's encoder; the
// head reads each row's first token (ModelShape::classes).
ModelShape bert_shape(const models::BertConfig& c) {
  const int64_t d = c.dim;
  Stack enc{.name = "encoder", .layers = c.layers};
  enc.per_token = post_norm("attention_norm", d, self_attention(d, d, c.heads));
  append(enc.per_token, post_norm("output_norm", d, mlp(c.hidden, c.act)));
  add_dropout(enc.per_token, c.dropout, d, 2);
  enc.once_per_token = {whole("embedding sum", d)};
  append(enc.once_per_token, norm("embeddings LayerNorm", d, false));
  add_dropout(enc.once_per_token, c.dropout, d, 1);
  enc.self_width = d, enc.causal = false, enc.backward_width = mlp_work(c.hidden, c.act);
  return {.family = "bert",
          .vocab = c.vocab,
          .dim = d,
          .heads = c.heads,
          .context = c.context,
          .classes = c.labels,
          .stacks = {std::move(enc)}};
}

template <typename M>
std::vector<nn::ParamEntry> entries_of(const typename models::HfFamily<M>::Config& c) {
  return nn::param_entries(models::HfFamily<M>::build(c));
}

template <typename M, typename F>
ModelShape shape_of(const models::hf::Config& f, F shape) {
  const auto c = models::HfFamily<M>::config(f);
  ModelShape m = shape(c);
  m.entries = entries_of<M>(c);
  return m;
}

}  // namespace

int64_t ModelShape::n_params() const {
  int64_t n = 0;
  for (const nn::ParamEntry& e : entries) n += e.shape.shape().numel();
  return n;
}

bool ModelShape::tied_head() const {
  int tables = 0;
  for (const nn::ParamEntry& e : entries)
    tables +=
        e.role == shard::Role::vocab && e.shape.shape().rank() == 2 && e.shape.shape()[0] == vocab;
  return tables == 1;
}

std::vector<shard::ParamSplit> ModelShape::resolve(int n_model_shards) const {
  return shard::resolve(entries, n_model_shards);
}

std::vector<std::string> planned_families() {
  return {"gpt2",     "llama", "mistral", "qwen2", "opt",    "gptj",
          "gpt_neox", "t5",    "bart",    "bert",  "roberta"};
}

ModelShape model_shape(const models::hf::Config& f) {
  const std::string type = f.model_type();
  if (type == "gpt2") return shape_of<models::Gpt2>(f, gpt2_shape);
  if (type == "llama" || type == "mistral" || type == "qwen2")
    return shape_of<models::Llama>(f, llama_shape);
  if (type == "opt") return shape_of<models::Opt>(f, opt_shape);
  if (type == "gptj") return shape_of<models::Gptj>(f, gptj_shape);
  if (type == "gpt_neox") return shape_of<models::GptNeox>(f, gpt_neox_shape);
  if (type == "t5") return shape_of<models::T5>(f, t5_shape);
  if (type == "bart") return shape_of<models::Bart>(f, bart_shape);
  if (type == "bert") return shape_of<models::Bert>(f, bert_shape);
  if (type == "roberta") return shape_of<models::Roberta>(f, bert_shape);
  const std::vector<std::string> known = planned_families();
  f.fail("model_type", fmt::format("is '{}', which the planner does not model; it models {}", type,
                                   fmt::join(known, ", ")));
}

}  // namespace redco::plan
