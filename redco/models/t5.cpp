// T5 checkpoints: T5Config (transformers') <-> models::T5Config, and where
// each parameter sits in a T5ForConditionalGeneration state dict.
#include "redco/models/t5.hpp"

#include <fmt/format.h>

#include "redco/models/hf_fields.hpp"
#include "redco/models/hf_util.hpp"

namespace redco::models {

void check_t5_config(const T5Config& c) {
  REDCO_CHECK(c.heads > 0 && (c.head_dim > 0 || c.dim % c.heads == 0),
              "t5: dim {} must be a multiple of heads {} (or give head_dim)", c.dim, c.heads);
  REDCO_CHECK(c.buckets >= 4 && c.max_distance > 0,
              "t5: the relative position bias needs at least 4 buckets and a positive max "
              "distance, got {} and {}",
              c.buckets, c.max_distance);
}

Tensor t5_shift_right(const Tensor& labels, int64_t decoder_start, int64_t pad) {
  REDCO_CHECK(labels.rank() == 2 && labels.dtype() == DType::i64,
              "t5_shift_right: expected labels i64 [batch, seq], got {} {}",
              dtype_name(labels.dtype()), labels.shape());
  const Tensor in = labels.to(Device::cpu());
  const int64_t B = in.dim(0), T = in.dim(1);
  Tensor out = Tensor::empty({B, T}, DType::i64);
  const int64_t* l = in.data<int64_t>();
  int64_t* o = out.data<int64_t>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) {
      const int64_t v = t == 0 ? decoder_start : l[b * T + t - 1];
      o[b * T + t] = v == -100 ? pad : v;
    }
  return out.to(labels.device());
}

namespace {
using C = T5Config;
const hf::Field<C> kFields[] = {
    {"vocab_size", &C::vocab},
    {"d_model", &C::dim},
    {"num_heads", &C::heads},
    {"d_ff", &C::hidden},
    {"num_layers", &C::encoder_layers},
    {"relative_attention_num_buckets", &C::buckets, 32},
    {"relative_attention_max_distance", &C::max_distance, 128},
    {"dropout_rate", &C::dropout, 0.1},
    {"layer_norm_epsilon", &C::norm_eps, 1e-6},
    {"tie_word_embeddings", &C::tie_embeddings, 1},
};
}  // namespace

T5Config t5_config(const hf::Config& f) {
  f.expect_model_type({"t5"}, "models::T5");
  T5Config c;
  hf::read_fields<C>(f, c, kFields);
  c.decoder_layers = f.size("num_decoder_layers", c.encoder_layers);
  c.head_dim = f.size("d_kv");  // written back as kv_dim()
  c.decoder_start = f.integer("decoder_start_token_id", f.integer("pad_token_id", 0));
  // feed_forward_proj: "ACT" or "gated-ACT"; "gated-gelu" means the tanh GELU.
  const std::string proj = f.string("feed_forward_proj", "relu");
  const size_t dash = proj.find('-');
  c.gated = dash != std::string::npos;
  if (c.gated && (proj.substr(0, dash) != "gated" || proj.find('-', dash + 1) != std::string::npos))
    f.fail("feed_forward_proj",
           fmt::format("= \"{}\" is neither an activation nor \"gated-\" and one", proj));
  const std::string act = c.gated ? proj.substr(dash + 1) : proj;
  io::Json one = io::Json::object();
  one["feed_forward_proj"] = act == "gelu" && c.gated ? "gelu_new" : act;
  c.act = hf::activation(hf::Config(one, f.source()), "feed_forward_proj", "relu");
  if (c.heads <= 0 || c.head_dim <= 0)
    f.fail("num_heads", fmt::format("= {} and d_kv = {} must be positive", c.heads, c.head_dim));
  if (c.buckets < 4 || c.max_distance <= 0)
    f.fail("relative_attention_num_buckets",
           fmt::format("= {} (max distance {}): redco needs at least 4 buckets and a positive "
                       "distance",
                       c.buckets, c.max_distance));
  return c;
}

io::Json t5_hf_config(const T5Config& c, io::Json j) {
  j["architectures"] = io::Json::array();
  j["architectures"].push_back("T5ForConditionalGeneration");
  j["model_type"] = "t5";
  hf::write_fields<C>(c, j, kFields);
  j["d_kv"] = c.kv_dim();
  j["num_decoder_layers"] = c.decoder_layers;
  const std::string act = c.gated && c.act == nn::Act::gelu ? "gelu" : hf::activation_name(c.act);
  j["feed_forward_proj"] = (c.gated ? "gated-" : "") + act;
  j["is_gated_act"] = c.gated;
  j["dense_act_fn"] = hf::activation_name(c.act);
  j["decoder_start_token_id"] = c.decoder_start;
  j["is_encoder_decoder"] = true;
  if (!j.contains("pad_token_id")) j["pad_token_id"] = c.decoder_start;
  if (!j.contains("torch_dtype")) j["torch_dtype"] = "float32";
  return j;
}

namespace {

// The sources of one stack's blocks: redco block.N.<name> <- layer.K.<name>.
void add_stack(hf::Layout& l, const T5Config& c, bool decoder) {
  const int64_t d = c.dim, inner = c.heads * c.kv_dim(), h = c.hidden;
  const std::string stack = decoder ? "decoder." : "encoder.";
  auto& s = l.sources;
  s.push_back(hf::same(stack + "relative_attention_bias.weight",
                       stack + "block.0.layer.0.SelfAttention.relative_attention_bias.weight",
                       {c.buckets, c.heads}));
  const int64_t layers = decoder ? c.decoder_layers : c.encoder_layers;
  for (int64_t i = 0; i < layers; ++i) {
    const std::string r = fmt::format("{}block.{}.", stack, i);
    auto add = [&](const std::string& mine, int64_t sub, const std::string& theirs, Shape shape) {
      s.push_back(hf::same(r + mine, fmt::format("{}layer.{}.{}", r, sub, theirs), shape));
    };
    auto attention = [&](const char* name, int64_t sub) {
      for (const char* p : {"q", "k", "v"})
        add(fmt::format("{}.{}_proj.weight", name, p), sub, fmt::format("{}.{}.weight", name, p),
            {inner, d});
      add(fmt::format("{}.o_proj.weight", name), sub, fmt::format("{}.o.weight", name), {d, inner});
    };
    add("layer_norm_1.weight", 0, "layer_norm.weight", {d});
    attention("SelfAttention", 0);
    if (decoder) {
      add("layer_norm_2.weight", 1, "layer_norm.weight", {d});
      attention("EncDecAttention", 1);
    }
    const int64_t ff = decoder ? 2 : 1;
    add(fmt::format("layer_norm_{}.weight", ff + 1), ff, "layer_norm.weight", {d});
    for (const char* wi :
         c.gated ? std::vector<const char*>{"wi_0", "wi_1"} : std::vector<const char*>{"wi"})
      add(fmt::format("DenseReluDense.{}.weight", wi), ff,
          fmt::format("DenseReluDense.{}.weight", wi), {h, d});
    add("DenseReluDense.wo.weight", ff, "DenseReluDense.wo.weight", {d, h});
  }
  s.push_back(hf::same(stack + "final_layer_norm.weight", stack + "final_layer_norm.weight", {d}));
}

}  // namespace

hf::Layout t5_layout(const T5Config& c) {
  hf::Layout l;
  l.prefixes = {""};
  // Aliases of the shared embedding some checkpoints carry, and the tied head.
  l.ignored_suffixes = {"encoder.embed_tokens.weight", "decoder.embed_tokens.weight"};
  if (c.tie_embeddings) l.ignored_suffixes.push_back("lm_head.weight");
  l.sources.push_back(hf::same(kT5Embedding, "shared.weight", {c.vocab, c.dim}));
  add_stack(l, c, false);
  add_stack(l, c, true);
  if (!c.tie_embeddings)
    l.sources.push_back(hf::same("decoder.lm_head.weight", "lm_head.weight", {c.vocab, c.dim}));
  return l;
}

}  // namespace redco::models
