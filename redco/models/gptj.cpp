// GPT-J checkpoints: GPTJConfig <-> GptjConfig, and where each parameter
// sits in a GPTJForCausalLM / GPTJModel state dict, with the rotary row
// permutation of q and k (see gptj.hpp).
#include "redco/models/gptj.hpp"

#include <fmt/format.h>

#include "redco/models/hf_fields.hpp"
#include "redco/models/hf_util.hpp"

namespace redco::models {

namespace {
using C = GptjConfig;
const hf::Field<C> kFields[] = {
    {"vocab_size", &C::vocab},
    {"n_positions", &C::context},
    {"n_embd", &C::dim},
    {"n_layer", &C::layers},
    {"n_head", &C::heads},
    {"layer_norm_epsilon", &C::norm_eps, 1e-5},
    {"resid_pdrop", &C::dropout, 0.0},
    {"embd_pdrop", &C::embed_dropout, 0.0},
    {"activation_function", &C::act, {}, "gelu_new"},
    {"tie_word_embeddings", &C::tie_embeddings, 0},
};
}  // namespace

GptjConfig gptj_config(const hf::Config& f) {
  f.expect_model_type({"gptj"}, "models::Gptj");
  GptjConfig c;
  hf::read_fields<C>(f, c, kFields);
  c.inner = f.size("n_inner", 0);  // null: 4 * n_embd
  if (c.heads <= 0 || c.dim % c.heads != 0)
    f.fail("n_head", fmt::format("= {} must divide n_embd = {}", c.heads, c.dim));
  const int64_t hd = c.dim / c.heads;
  // Without rotary_dim transformers rotates n_embd dimensions of each head,
  // which only runs with a single head.
  c.rotary_dim = f.size("rotary_dim");
  if (c.rotary_dim <= 0 || c.rotary_dim % 2 != 0 || c.rotary_dim > hd)
    f.fail("rotary_dim", fmt::format("= {} must be even, positive and at most the head size {}",
                                     c.rotary_dim, hd));
  return c;
}

io::Json gptj_hf_config(const GptjConfig& c, io::Json j) {
  j["architectures"] = io::Json::array();
  j["architectures"].push_back("GPTJForCausalLM");
  j["model_type"] = "gptj";
  hf::write_fields<C>(c, j, kFields);
  j["rotary_dim"] = c.rotary_dim;
  j["n_inner"] = c.inner ? io::Json(c.inner) : io::Json(nullptr);
  if (!j.contains("attn_pdrop")) j["attn_pdrop"] = 0.0;
  if (!j.contains("torch_dtype")) j["torch_dtype"] = "float32";
  return j;
}

std::vector<int64_t> interleaved_to_half_rows(int64_t heads, int64_t head_dim, int64_t rotary_dim) {
  std::vector<int64_t> rows;
  rows.reserve(size_t(heads * head_dim));
  for (int64_t h = 0; h < heads; ++h) {
    const int64_t base = h * head_dim;
    for (int64_t i = 0; i < rotary_dim; i += 2) rows.push_back(base + i);  // first of each pair
    for (int64_t i = 1; i < rotary_dim; i += 2) rows.push_back(base + i);  // second of each pair
    for (int64_t i = rotary_dim; i < head_dim; ++i) rows.push_back(base + i);
  }
  return rows;
}

hf::Layout gptj_layout(const GptjConfig& c) {
  const int64_t d = c.dim, inner = c.inner ? c.inner : 4 * d;
  const std::vector<int64_t> rotary_rows =
      interleaved_to_half_rows(c.heads, d / c.heads, c.rotary_dim);
  hf::Layout l;
  l.prefixes = {""};  // names carry "transformer." themselves: lm_head sits outside it
  // Causal-mask buffers older checkpoints carry; the tied head's copy.
  l.ignored_suffixes = {".attn.bias", ".attn.masked_bias"};
  if (c.tie_embeddings) l.ignored_suffixes.push_back("lm_head.weight");
  auto& s = l.sources;
  auto add = [&](const std::string& param, const std::string& hf, Shape shape) {
    s.push_back(hf::same(param, "transformer." + hf, std::move(shape)));
  };
  add("wte.weight", "wte.weight", {c.vocab, d});
  for (int64_t i = 0; i < c.layers; ++i) {
    const std::string r = fmt::format("h.{}.", i);
    add(r + "ln_1.weight", r + "ln_1.weight", {d});
    add(r + "ln_1.bias", r + "ln_1.bias", {d});
    for (const char* p : {"q_proj", "k_proj"})
      s.push_back({r + "attn." + p + ".weight",
                   "transformer." + r + "attn." + p + ".weight",
                   {d, d},
                   false,
                   rotary_rows});
    add(r + "attn.v_proj.weight", r + "attn.v_proj.weight", {d, d});
    add(r + "attn.o_proj.weight", r + "attn.out_proj.weight", {d, d});
    add(r + "mlp.fc1.weight", r + "mlp.fc_in.weight", {inner, d});
    add(r + "mlp.fc1.bias", r + "mlp.fc_in.bias", {inner});
    add(r + "mlp.fc2.weight", r + "mlp.fc_out.weight", {d, inner});
    add(r + "mlp.fc2.bias", r + "mlp.fc_out.bias", {d});
  }
  add("ln_f.weight", "ln_f.weight", {d});
  add("ln_f.bias", "ln_f.bias", {d});
  if (!c.tie_embeddings) s.push_back(hf::same("lm_head.weight", "lm_head.weight", {c.vocab, d}));
  s.push_back(hf::same("lm_head.bias", "lm_head.bias", {c.vocab}));
  return l;
}

}  // namespace redco::models
