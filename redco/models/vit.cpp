// ViT checkpoints: ViTConfig (transformers') <-> models::VitConfig, and where
// each parameter sits in a ViTModel state dict.
#include "redco/models/vit.hpp"

#include <fmt/format.h>

#include "redco/models/hf_fields.hpp"
#include "redco/models/hf_util.hpp"

namespace redco::models {

namespace {

// image_size / patch_size: an int, or a [height, width] pair.
std::pair<int64_t, int64_t> size_pair(const hf::Config& f, const char* key, int64_t fallback) {
  if (!f.has(key)) return {fallback, fallback};
  const io::Json& v = f.json().at(key);
  if (!v.is_array()) {
    const int64_t n = f.size(key);
    return {n, n};
  }
  if (v.size() != 2 || !v.at(0).is_int() || !v.at(1).is_int() || v.at(0).as_int() <= 0 ||
      v.at(1).as_int() <= 0)
    f.fail(key, "must be a positive integer or a [height, width] pair of them");
  return {v.at(0).as_int(), v.at(1).as_int()};
}

}  // namespace

namespace {
using C = VitConfig;
const hf::Field<C> kFields[] = {
    {"num_channels", &C::channels, 3},         {"hidden_size", &C::dim},
    {"num_hidden_layers", &C::layers},         {"num_attention_heads", &C::heads},
    {"intermediate_size", &C::inner},          {"layer_norm_eps", &C::norm_eps, 1e-12},
    {"hidden_act", &C::act, {}, "gelu"},       {"qkv_bias", &C::qkv_bias, 1},
    {"hidden_dropout_prob", &C::dropout, 0.0},
};
}  // namespace

VitConfig vit_config(const hf::Config& f) {
  f.expect_model_type({"vit"}, "models::Vit");
  VitConfig c;
  std::tie(c.height, c.width) = size_pair(f, "image_size", 224);
  const auto [ph, pw] = size_pair(f, "patch_size", 16);
  if (ph != pw) f.fail("patch_size", "must be square: redco's ViT cuts square patches");
  c.patch = ph;
  hf::read_fields<C>(f, c, kFields);
  if (c.heads <= 0 || c.dim % c.heads != 0)
    f.fail("num_attention_heads", fmt::format("= {} must divide hidden_size = {}", c.heads, c.dim));
  if (c.height % c.patch != 0 || c.width % c.patch != 0)
    f.fail("image_size", fmt::format("{}x{} must be a whole number of {}x{} patches", c.height,
                                     c.width, c.patch, c.patch));
  return c;
}

io::Json vit_hf_config(const VitConfig& c, io::Json j) {
  j["architectures"] = io::Json::array();
  j["architectures"].push_back("ViTModel");
  j["model_type"] = "vit";
  hf::write_fields<C>(c, j, kFields);
  if (c.height == c.width) {
    j["image_size"] = c.height;
  } else {
    j["image_size"] = io::Json::array();
    j["image_size"].push_back(c.height);
    j["image_size"].push_back(c.width);
  }
  j["patch_size"] = c.patch;
  if (!j.contains("attention_probs_dropout_prob")) j["attention_probs_dropout_prob"] = 0.0;
  if (!j.contains("torch_dtype")) j["torch_dtype"] = "float32";
  return j;
}

hf::Layout vit_layout(const VitConfig& c) {
  const int64_t d = c.dim;
  hf::Layout l;
  l.prefixes = {"", "vit."};
  l.ignored_suffixes = {"pooler.dense.weight", "pooler.dense.bias", "classifier.weight",
                        "classifier.bias"};
  auto& s = l.sources;
  auto add = [&](const std::string& mine, const std::string& theirs, Shape shape) {
    s.push_back(hf::same(mine, theirs, std::move(shape)));
  };
  const std::string e = "embeddings.";
  add(e + "patch_embeddings.projection.weight", e + "patch_embeddings.projection.weight",
      {d, c.channels, c.patch, c.patch});
  add(e + "patch_embeddings.projection.bias", e + "patch_embeddings.projection.bias", {d});
  add(e + "cls_token", e + "cls_token", {1, 1, d});
  add(e + "position_embeddings", e + "position_embeddings",
      {1, 1 + (c.height / c.patch) * (c.width / c.patch), d});
  for (int64_t i = 0; i < c.layers; ++i) {
    const std::string r = fmt::format("layer.{}.", i), h = "encoder." + r;
    for (const char* ln : {"layernorm_before", "layernorm_after"})
      for (const char* p : {"weight", "bias"})
        add(fmt::format("{}{}.{}", r, ln, p), fmt::format("{}{}.{}", h, ln, p), {d});
    const std::pair<const char*, const char*> proj[] = {{"q_proj", "attention.attention.query"},
                                                        {"k_proj", "attention.attention.key"},
                                                        {"v_proj", "attention.attention.value"},
                                                        {"o_proj", "attention.output.dense"}};
    for (auto [mine, theirs] : proj) {
      add(fmt::format("{}attention.{}.weight", r, mine), fmt::format("{}{}.weight", h, theirs),
          {d, d});
      if (c.qkv_bias || std::string_view(mine) == "o_proj")
        add(fmt::format("{}attention.{}.bias", r, mine), fmt::format("{}{}.bias", h, theirs), {d});
    }
    add(r + "mlp.fc1.weight", h + "intermediate.dense.weight", {c.inner, d});
    add(r + "mlp.fc1.bias", h + "intermediate.dense.bias", {c.inner});
    add(r + "mlp.fc2.weight", h + "output.dense.weight", {d, c.inner});
    add(r + "mlp.fc2.bias", h + "output.dense.bias", {d});
  }
  add("layernorm.weight", "layernorm.weight", {d});
  add("layernorm.bias", "layernorm.bias", {d});
  return l;
}

}  // namespace redco::models
