// GPT-NeoX checkpoints: GPTNeoXConfig <-> GptNeoxConfig, and where each
// parameter sits in a GPTNeoXForCausalLM state dict, q/k/v read out of the
// head-interleaved query_key_value (see gpt_neox.hpp).
#include "redco/models/gpt_neox.hpp"

#include <fmt/format.h>

#include <cmath>

#include "redco/models/hf_fields.hpp"
#include "redco/models/hf_util.hpp"

namespace redco::models {

namespace {
using C = GptNeoxConfig;
const hf::Field<C> kFields[] = {
    {"vocab_size", &C::vocab},
    {"hidden_size", &C::dim},
    {"num_hidden_layers", &C::layers},
    {"num_attention_heads", &C::heads},
    {"intermediate_size", &C::hidden},
    {"rotary_emb_base", &C::rotary_base, 10000.0},
    {"layer_norm_eps", &C::norm_eps, 1e-5},
    {"hidden_act", &C::act, {}, "gelu"},
    {"use_parallel_residual", &C::parallel_residual, 1},
    {"attention_bias", &C::attention_bias, 1},
    {"tie_word_embeddings", &C::tie_embeddings, 0},
    {"hidden_dropout", &C::dropout, 0.0},
};
}  // namespace

GptNeoxConfig gpt_neox_config(const hf::Config& f) {
  f.expect_model_type({"gpt_neox"}, "models::GptNeox");
  GptNeoxConfig c;
  hf::read_fields<C>(f, c, kFields);
  c.context = f.size("max_position_embeddings", 0);  // written only when known
  if (c.heads <= 0 || c.dim % c.heads != 0)
    f.fail("num_attention_heads", fmt::format("= {} must divide hidden_size = {}", c.heads, c.dim));
  const int64_t hd = c.dim / c.heads;
  const double pct = f.number("rotary_pct", 0.25);
  if (!(pct >= 0.0 && pct <= 1.0)) f.fail("rotary_pct", "must lie in [0, 1]");
  c.rotary_dim = int64_t(double(hd) * pct);  // transformers truncates, as int() does
  if (c.rotary_dim % 2 != 0)
    f.fail("rotary_pct", fmt::format("gives {} rotary dimensions of a {}-wide head; rotary pairs "
                                     "need an even number",
                                     c.rotary_dim, hd));
  if (f.has("rope_scaling"))
    f.fail("rope_scaling", "is set; redco's GPT-NeoX implements unscaled rotary positions");
  return c;
}

io::Json gpt_neox_hf_config(const GptNeoxConfig& c, io::Json j) {
  j["architectures"] = io::Json::array();
  j["architectures"].push_back("GPTNeoXForCausalLM");
  j["model_type"] = "gpt_neox";
  hf::write_fields<C>(c, j, kFields);
  // Keep the file's rotary_pct when it gives the same dimensions (0.25 stays
  // 0.25); transformers reads partial_rotary_factor from it.
  const int64_t hd = c.dim / c.heads;
  const bool same = j.contains("rotary_pct") && j.at("rotary_pct").is_number() &&
                    int64_t(double(hd) * j.at("rotary_pct").as_double()) == c.rotary_dim;
  const double pct = same ? j.at("rotary_pct").as_double() : double(c.rotary_dim) / double(hd);
  j["rotary_pct"] = pct;
  j["partial_rotary_factor"] = pct;
  j["rope_theta"] = double(c.rotary_base);
  j["rope_scaling"] = nullptr;
  if (c.context) j["max_position_embeddings"] = c.context;
  if (!j.contains("attention_dropout")) j["attention_dropout"] = 0.0;
  if (!j.contains("torch_dtype")) j["torch_dtype"] = "float32";
  return j;
}

hf::Layout gpt_neox_layout(const GptNeoxConfig& c) {
  const int64_t d = c.dim, hd = d / c.heads;
  hf::Layout l;
  l.prefixes = {""};  // names carry "gpt_neox." themselves: embed_out sits outside it
  // Buffers older checkpoints (Pythia) saved: causal masks and rotary frequencies.
  l.ignored_suffixes = {".attention.bias", ".attention.masked_bias", ".rotary_emb.inv_freq"};
  if (c.tie_embeddings) l.ignored_suffixes.push_back("embed_out.weight");
  auto& s = l.sources;
  auto add = [&](const std::string& param, const std::string& hf, Shape shape) {
    s.push_back(hf::same(param, "gpt_neox." + hf, std::move(shape)));
  };
  auto norm = [&](const std::string& name) {
    add(name + ".weight", name + ".weight", {d});
    add(name + ".bias", name + ".bias", {d});
  };
  // query_key_value's rows for projection p (0 q, 1 k, 2 v): head h's block
  // of hd rows starts at (3h + p) * hd.
  auto fused_rows = [&](int64_t p) {
    std::vector<int64_t> rows;
    for (int64_t h = 0; h < c.heads; ++h)
      for (int64_t i = 0; i < hd; ++i) rows.push_back((3 * h + p) * hd + i);
    return rows;
  };
  add("embed_in.weight", "embed_in.weight", {c.vocab, d});
  for (int64_t i = 0; i < c.layers; ++i) {
    const std::string r = fmt::format("layers.{}.", i);
    const std::string qkv = "gpt_neox." + r + "attention.query_key_value";
    norm(r + "input_layernorm");
    const char* proj[] = {"q_proj", "k_proj", "v_proj"};
    for (int64_t p = 0; p < 3; ++p) {
      const std::string param = r + "attention." + proj[p];
      s.push_back({param + ".weight", qkv + ".weight", {3 * d, d}, false, fused_rows(p)});
      if (c.attention_bias)
        s.push_back({param + ".bias", qkv + ".bias", {3 * d}, false, fused_rows(p)});
    }
    add(r + "attention.o_proj.weight", r + "attention.dense.weight", {d, d});
    if (c.attention_bias) add(r + "attention.o_proj.bias", r + "attention.dense.bias", {d});
    norm(r + "post_attention_layernorm");
    add(r + "mlp.fc1.weight", r + "mlp.dense_h_to_4h.weight", {c.hidden, d});
    add(r + "mlp.fc1.bias", r + "mlp.dense_h_to_4h.bias", {c.hidden});
    add(r + "mlp.fc2.weight", r + "mlp.dense_4h_to_h.weight", {d, c.hidden});
    add(r + "mlp.fc2.bias", r + "mlp.dense_4h_to_h.bias", {d});
  }
  norm("final_layer_norm");
  if (!c.tie_embeddings)
    s.push_back(hf::same("embed_out.weight", "embed_out.weight", {c.vocab, d}));
  return l;
}

}  // namespace redco::models
