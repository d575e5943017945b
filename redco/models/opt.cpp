// OPT checkpoints: OPTConfig <-> OptConfig, and where each parameter sits in
// an OPTForCausalLM / OPTModel state dict.
#include "redco/models/opt.hpp"

#include <fmt/format.h>

#include "redco/models/hf_fields.hpp"
#include "redco/models/hf_util.hpp"

namespace redco::models {

namespace {
using C = OptConfig;
const hf::Field<C> kFields[] = {
    {"vocab_size", &C::vocab},
    {"max_position_embeddings", &C::context},
    {"hidden_size", &C::dim},
    {"num_hidden_layers", &C::layers},
    {"num_attention_heads", &C::heads},
    {"ffn_dim", &C::ffn},
    {"do_layer_norm_before", &C::pre_norm, 1},
    {"dropout", &C::dropout, 0.1},
    {"activation_function", &C::act, {}, "relu"},
};
}  // namespace

OptConfig opt_config(const hf::Config& f) {
  f.expect_model_type({"opt"}, "models::Opt");
  OptConfig c;
  hf::read_fields<C>(f, c, kFields);
  c.embed_dim = f.size("word_embed_proj_dim", c.dim);
  if (c.embed_dim == c.dim) c.embed_dim = 0;
  c.final_norm = c.pre_norm && !f.boolean("_remove_final_layer_norm", false);
  if (c.heads <= 0 || c.dim % c.heads != 0)
    f.fail("num_attention_heads", fmt::format("= {} must divide hidden_size = {}", c.heads, c.dim));
  if (!f.boolean("enable_bias", true))
    f.fail("enable_bias", "is false; redco's OPT has biases on every linear layer");
  if (!f.boolean("layer_norm_elementwise_affine", true))
    f.fail("layer_norm_elementwise_affine", "is false; redco's OPT norms have weights and biases");
  if (!f.boolean("tie_word_embeddings", true))
    f.fail("tie_word_embeddings", "is false: redco's OPT ties its LM head to embed_tokens");
  return c;
}

io::Json opt_hf_config(const OptConfig& c, io::Json j) {
  j["architectures"] = io::Json::array();
  j["architectures"].push_back("OPTForCausalLM");
  j["model_type"] = "opt";
  hf::write_fields<C>(c, j, kFields);
  j["word_embed_proj_dim"] = c.embed_width();
  j["_remove_final_layer_norm"] = c.pre_norm && !c.final_norm;
  j["enable_bias"] = true;
  j["layer_norm_elementwise_affine"] = true;
  j["tie_word_embeddings"] = true;
  if (!j.contains("attention_dropout")) j["attention_dropout"] = 0.0;
  if (!j.contains("torch_dtype")) j["torch_dtype"] = "float32";
  return j;
}

hf::Layout opt_layout(const OptConfig& c) {
  const int64_t d = c.dim, e = c.embed_width();
  hf::Layout l;
  // OPTForCausalLM saves "model.decoder.*" (its lm_head is the tied table);
  // OPTModel "decoder.*".
  l.prefixes = {"model.decoder.", "decoder."};
  l.ignored_suffixes = {"lm_head.weight"};
  auto& s = l.sources;
  auto add = [&](const std::string& param, const std::string& hf, Shape shape) {
    s.push_back(hf::same(param, hf, std::move(shape)));
  };
  auto norm = [&](const std::string& name) {
    add(name + ".weight", name + ".weight", {d});
    add(name + ".bias", name + ".bias", {d});
  };
  add("embed_tokens.weight", "embed_tokens.weight", {c.vocab, e});
  if (e != d) add("project_in.weight", "project_in.weight", {d, e});
  add("embed_positions.weight", "embed_positions.weight",
      {c.context + OptConfig::kPositionOffset, d});
  for (int64_t i = 0; i < c.layers; ++i) {
    const std::string r = fmt::format("layers.{}.", i);
    norm(r + "self_attn_layer_norm");
    for (const char* p : {"q_proj", "k_proj", "v_proj", "o_proj"}) {
      const std::string hf = r + "self_attn." + (p[0] == 'o' ? "out_proj" : p);
      add(r + "self_attn." + p + ".weight", hf + ".weight", {d, d});
      add(r + "self_attn." + p + ".bias", hf + ".bias", {d});
    }
    norm(r + "final_layer_norm");
    add(r + "mlp.fc1.weight", r + "fc1.weight", {c.ffn, d});
    add(r + "mlp.fc1.bias", r + "fc1.bias", {c.ffn});
    add(r + "mlp.fc2.weight", r + "fc2.weight", {d, c.ffn});
    add(r + "mlp.fc2.bias", r + "fc2.bias", {d});
  }
  if (c.final_norm) norm("final_layer_norm");
  if (e != d) add("project_out.weight", "project_out.weight", {e, d});
  return l;
}

}  // namespace redco::models
