// LLaMA-family checkpoints (LLaMA 1/2/3, Mistral, Qwen2): config.json <->
// LlamaConfig, and where each parameter sits in a *ForCausalLM state dict.
// HF stores q and k for rotate-half rotary, redco's pairing, so no rows move.
#include "redco/models/llama.hpp"

#include <fmt/format.h>

#include "redco/models/hf_fields.hpp"
#include "redco/models/hf_util.hpp"

namespace redco::models {
namespace {

nn::RopeOptions rope_options(const hf::Config& f) {
  nn::RopeOptions r{.base = float(f.number("rope_theta", 10000.0))};
  if (!f.has("rope_scaling")) return r;
  const hf::Config s(f.object("rope_scaling"), f.source() + " (rope_scaling)");
  const std::string type = s.has("rope_type") ? s.string("rope_type") : s.string("type");
  if (type == "default") return r;
  if (type == "linear") {
    r.scaling = nn::RopeScaling::linear;
    r.factor = float(s.number("factor"));
  } else if (type == "llama3") {
    r.scaling = nn::RopeScaling::llama3;
    r.factor = float(s.number("factor"));
    r.low_freq_factor = float(s.number("low_freq_factor"));
    r.high_freq_factor = float(s.number("high_freq_factor"));
    r.original_max_positions = s.size("original_max_position_embeddings");
  } else {
    f.fail("rope_scaling", fmt::format("has type \"{}\"; redco implements default, linear and "
                                       "llama3",
                                       type));
  }
  return r;
}

io::Json rope_json(const nn::RopeOptions& r) {
  if (r.scaling == nn::RopeScaling::none) return nullptr;
  io::Json j = io::Json::object();
  j["factor"] = double(r.factor);
  if (r.scaling == nn::RopeScaling::linear) {
    j["rope_type"] = "linear";
    return j;
  }
  j["rope_type"] = "llama3";
  j["low_freq_factor"] = double(r.low_freq_factor);
  j["high_freq_factor"] = double(r.high_freq_factor);
  j["original_max_position_embeddings"] = r.original_max_positions;
  return j;
}

}  // namespace

namespace {
using C = LlamaConfig;
const hf::Field<C> kFields[] = {
    {"vocab_size", &C::vocab},
    {"hidden_size", &C::dim},
    {"num_hidden_layers", &C::layers},
    {"num_attention_heads", &C::heads},
    {"intermediate_size", &C::hidden},
    {"rms_norm_eps", &C::norm_eps, 1e-6},
    {"tie_word_embeddings", &C::tie_embeddings, 0},
};
}  // namespace

LlamaConfig llama_config(const hf::Config& f) {
  f.expect_model_type({"llama", "mistral", "qwen2"}, "models::Llama");
  const std::string type = f.model_type();
  LlamaConfig c;
  hf::read_fields<C>(f, c, kFields);
  c.kv_heads = f.size("num_key_value_heads", c.heads);
  c.rope = rope_options(f);
  c.head_dim = f.size("head_dim", 0);
  if (c.head_dim == c.dim / c.heads && c.dim % c.heads == 0) c.head_dim = 0;
  const bool bias = f.boolean("attention_bias", false);
  c.qkv_bias = type == "qwen2" || bias;
  c.o_bias = type != "qwen2" && bias;
  c.context = f.size("max_position_embeddings", 0);
  if (c.heads <= 0 || (c.head_dim == 0 && c.dim % c.heads != 0))
    f.fail("num_attention_heads",
           fmt::format("= {} must divide hidden_size = {} (or give head_dim)", c.heads, c.dim));
  if (c.kv_heads <= 0 || c.heads % c.kv_heads != 0)
    f.fail("num_key_value_heads",
           fmt::format("= {} must divide num_attention_heads = {}", c.kv_heads, c.heads));
  if (hf::activation(f, "hidden_act", "silu") != nn::Act::silu)
    f.fail("hidden_act", "must be silu: redco's gated MLP is SwiGLU");
  if (f.boolean("mlp_bias", false)) f.fail("mlp_bias", "is true; redco's gated MLP has no biases");
  // Sliding-window attention changes nothing for sequences within the window;
  // longer ones are refused where attention runs (nn::Attention::window).
  c.window = type == "mistral" ? f.size("sliding_window", 0) : 0;
  if (type == "qwen2" && f.boolean("use_sliding_window", false))
    f.fail("use_sliding_window", "is true; redco does not implement sliding-window attention");
  return c;
}

io::Json llama_hf_config(const LlamaConfig& c, io::Json j) {
  const bool qwen = j.contains("model_type") && j.at("model_type") == io::Json("qwen2");
  const bool mistral = j.contains("model_type") && j.at("model_type") == io::Json("mistral");
  j["architectures"] = io::Json::array();
  j["architectures"].push_back(qwen      ? "Qwen2ForCausalLM"
                               : mistral ? "MistralForCausalLM"
                                         : "LlamaForCausalLM");
  j["model_type"] = qwen ? "qwen2" : mistral ? "mistral" : "llama";
  hf::write_fields<C>(c, j, kFields);
  j["num_key_value_heads"] = c.kv_heads ? c.kv_heads : c.heads;
  j["rope_theta"] = double(c.rope.base);
  j["rope_scaling"] = rope_json(c.rope);
  j["head_dim"] = c.head_dim ? c.head_dim : c.dim / c.heads;
  if (!qwen) j["attention_bias"] = c.qkv_bias;
  j["hidden_act"] = "silu";
  if (c.context) j["max_position_embeddings"] = c.context;
  if (mistral) j["sliding_window"] = c.window ? io::Json(c.window) : io::Json(nullptr);
  if (!j.contains("torch_dtype")) j["torch_dtype"] = "float32";
  return j;
}

hf::Layout llama_layout(const LlamaConfig& c) {
  const int64_t d = c.dim, hd = c.head_dim ? c.head_dim : d / c.heads;
  const int64_t q = c.heads * hd, kv = (c.kv_heads ? c.kv_heads : c.heads) * hd;
  hf::Layout l;
  l.prefixes = {""};
  l.ignored_suffixes = {".rotary_emb.inv_freq"};  // a buffer older checkpoints saved
  if (c.tie_embeddings) l.ignored_suffixes.push_back("lm_head.weight");
  auto& s = l.sources;
  auto add = [&](const std::string& name, Shape shape) {
    s.push_back(hf::same(name, "model." + name, std::move(shape)));
  };
  add("embed_tokens.weight", {c.vocab, d});
  for (int64_t i = 0; i < c.layers; ++i) {
    const std::string r = fmt::format("layers.{}.", i);
    add(r + "input_layernorm.weight", {d});
    add(r + "self_attn.q_proj.weight", {q, d});
    if (c.qkv_bias) add(r + "self_attn.q_proj.bias", {q});
    add(r + "self_attn.k_proj.weight", {kv, d});
    if (c.qkv_bias) add(r + "self_attn.k_proj.bias", {kv});
    add(r + "self_attn.v_proj.weight", {kv, d});
    if (c.qkv_bias) add(r + "self_attn.v_proj.bias", {kv});
    add(r + "self_attn.o_proj.weight", {d, q});
    if (c.o_bias) add(r + "self_attn.o_proj.bias", {d});
    add(r + "post_attention_layernorm.weight", {d});
    add(r + "mlp.gate_proj.weight", {c.hidden, d});
    add(r + "mlp.up_proj.weight", {c.hidden, d});
    add(r + "mlp.down_proj.weight", {d, c.hidden});
  }
  add("norm.weight", {d});
  if (!c.tie_embeddings) s.push_back(hf::same("lm_head.weight", "lm_head.weight", {c.vocab, d}));
  return l;
}

}  // namespace redco::models
