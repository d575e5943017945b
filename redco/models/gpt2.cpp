// GPT-2 checkpoints: GPT2Config <-> Gpt2Config, and where each parameter
// sits in a GPT2LMHeadModel / GPT2Model state dict.
#include "redco/models/gpt2.hpp"

#include <fmt/format.h>

#include "redco/models/hf_fields.hpp"
#include "redco/models/hf_util.hpp"

namespace redco::models {

namespace {
using C = Gpt2Config;
const hf::Field<C> kFields[] = {
    {"vocab_size", &C::vocab},
    {"n_positions", &C::context},
    {"n_embd", &C::dim},
    {"n_layer", &C::layers},
    {"n_head", &C::heads},
    {"layer_norm_epsilon", &C::norm_eps, 1e-5},
    {"activation_function", &C::act, {}, "gelu_new"},
    {"scale_attn_by_inverse_layer_idx", &C::scale_attn_by_inverse_layer_idx, 0},
};
}  // namespace

Gpt2Config gpt2_config(const hf::Config& f) {
  f.expect_model_type({"gpt2"}, "models::Gpt2");
  Gpt2Config c;
  hf::read_fields<C>(f, c, kFields);
  c.inner = f.size("n_inner", 0);  // null: 4 * n_embd
  if (c.heads <= 0 || c.dim % c.heads != 0)
    f.fail("n_head", fmt::format("= {} must divide n_embd = {}", c.heads, c.dim));
  if (!f.boolean("tie_word_embeddings", true))
    f.fail("tie_word_embeddings", "is false: redco's GPT-2 ties its LM head to wte");
  // reorder_and_upcast_attn changes only fp16 rounding: the fp32 result is the same.
  return c;
}

io::Json gpt2_hf_config(const Gpt2Config& c, io::Json j) {
  j["architectures"] = io::Json::array();
  j["architectures"].push_back("GPT2LMHeadModel");
  j["model_type"] = "gpt2";
  hf::write_fields<C>(c, j, kFields);
  j["n_ctx"] = c.context;
  j["n_inner"] = c.inner ? io::Json(c.inner) : io::Json(nullptr);
  j["tie_word_embeddings"] = true;
  for (const char* k : {"embd_pdrop", "resid_pdrop"}) j[k] = double(c.dropout);
  if (!j.contains("attn_pdrop")) j["attn_pdrop"] = 0.0;
  if (!j.contains("torch_dtype")) j["torch_dtype"] = "float32";
  return j;
}

hf::Layout gpt2_layout(const Gpt2Config& c) {
  using hf::row_range;
  const int64_t d = c.dim, inner = c.inner ? c.inner : 4 * d;
  hf::Layout l;
  l.prefixes = {"transformer.", ""};
  // The causal-mask buffers older checkpoints carry, and the tied head some include.
  l.ignored_suffixes = {".attn.bias", ".attn.masked_bias", "lm_head.weight"};
  auto& s = l.sources;
  s.push_back(hf::same("wte.weight", "wte.weight", {c.vocab, d}));
  s.push_back(hf::same("wpe.weight", "wpe.weight", {c.context, d}));
  for (int64_t i = 0; i < c.layers; ++i) {
    const std::string r = fmt::format("h.{}.", i);
    auto conv1d = [&](std::string param, std::string hf, Shape stored, std::vector<int64_t> rows) {
      s.push_back({r + param, r + hf, std::move(stored), true, std::move(rows)});
    };
    auto bias = [&](std::string param, std::string hf, int64_t n, std::vector<int64_t> rows) {
      s.push_back({r + param, r + hf, Shape{n}, false, std::move(rows)});
    };
    for (const char* ln : {"ln_1", "ln_2"}) {
      s.push_back(hf::same(r + ln + ".weight", r + ln + ".weight", {d}));
      s.push_back(hf::same(r + ln + ".bias", r + ln + ".bias", {d}));
    }
    const char* qkv[] = {"q_proj", "k_proj", "v_proj"};
    for (int p = 0; p < 3; ++p) {  // c_attn [d, 3d] packs q | k | v along its outputs
      conv1d(fmt::format("attn.{}.weight", qkv[p]), "attn.c_attn.weight", {d, 3 * d},
             row_range(p * d, (p + 1) * d));
      bias(fmt::format("attn.{}.bias", qkv[p]), "attn.c_attn.bias", 3 * d,
           row_range(p * d, (p + 1) * d));
    }
    conv1d("attn.o_proj.weight", "attn.c_proj.weight", {d, d}, {});
    bias("attn.o_proj.bias", "attn.c_proj.bias", d, {});
    conv1d("mlp.fc1.weight", "mlp.c_fc.weight", {d, inner}, {});
    bias("mlp.fc1.bias", "mlp.c_fc.bias", inner, {});
    conv1d("mlp.fc2.weight", "mlp.c_proj.weight", {inner, d}, {});
    bias("mlp.fc2.bias", "mlp.c_proj.bias", d, {});
  }
  s.push_back(hf::same("ln_f.weight", "ln_f.weight", {d}));
  s.push_back(hf::same("ln_f.bias", "ln_f.bias", {d}));
  return l;
}

}  // namespace redco::models
