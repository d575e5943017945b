// BERT and RoBERTa checkpoints: their configs <-> models::BertConfig, and
// where each parameter sits in a *ForSequenceClassification state dict.
#include "redco/models/bert.hpp"

#include <fmt/format.h>

#include "redco/models/hf_fields.hpp"
#include "redco/models/hf_util.hpp"

namespace redco::models {

namespace {
using C = BertConfig;
const hf::Field<C> kFields[] = {
    {"vocab_size", &C::vocab},
    {"hidden_size", &C::dim},
    {"num_hidden_layers", &C::layers},
    {"num_attention_heads", &C::heads},
    {"intermediate_size", &C::hidden},
    {"max_position_embeddings", &C::context},
    {"type_vocab_size", &C::types, 2},
    {"layer_norm_eps", &C::norm_eps, 1e-12},
    {"hidden_dropout_prob", &C::dropout, 0.1},
    {"hidden_act", &C::act, {}, "gelu"},
};
}  // namespace

BertConfig bert_config(const hf::Config& f) {
  f.expect_model_type({"bert", "roberta"}, "models::Bert or models::Roberta");
  BertConfig c;
  hf::read_fields<C>(f, c, kFields);
  c.pad = f.integer("pad_token_id", 0);
  // num_labels is not saved: transformers counts id2label.
  c.labels = f.has("id2label") ? int64_t(f.object("id2label").size()) : 2;
  if (c.heads <= 0 || c.dim % c.heads != 0)
    f.fail("num_attention_heads", fmt::format("= {} must divide hidden_size = {}", c.heads, c.dim));
  if (f.string("position_embedding_type", "absolute") != "absolute")
    f.fail("position_embedding_type", "is not \"absolute\", the only kind redco implements");
  return c;
}

io::Json bert_hf_config(const BertConfig& c, bool roberta, bool encoder_only, io::Json j) {
  j["architectures"] = io::Json::array();
  j["architectures"].push_back(fmt::format("{}{}", roberta ? "Roberta" : "Bert",
                                           encoder_only ? "Model" : "ForSequenceClassification"));
  j["model_type"] = roberta ? "roberta" : "bert";
  hf::write_fields<C>(c, j, kFields);
  j["pad_token_id"] = c.pad;
  j["position_embedding_type"] = "absolute";
  if (!j.contains("id2label") || int64_t(j.at("id2label").size()) != c.labels) {
    j["id2label"] = io::Json::object();
    j["label2id"] = io::Json::object();
    for (int64_t i = 0; i < c.labels; ++i) {
      j["id2label"][std::to_string(i)] = fmt::format("LABEL_{}", i);
      j["label2id"][fmt::format("LABEL_{}", i)] = i;
    }
  }
  if (!j.contains("torch_dtype")) j["torch_dtype"] = "float32";
  return j;
}

hf::Layout bert_layout(const BertConfig& c, bool roberta, bool encoder_only) {
  const int64_t d = c.dim, h = c.hidden;
  const std::string base = roberta ? "roberta." : "bert.", m = encoder_only ? "" : base;
  hf::Layout l;
  l.prefixes = {""};
  l.ignored_suffixes = {"embeddings.position_ids", "embeddings.token_type_ids"};  // buffers
  if (encoder_only) {
    l.prefixes.push_back(base);
    for (const char* head :
         {"pooler.dense", "classifier", "classifier.dense", "classifier.out_proj"})
      for (const char* p : {".weight", ".bias"})
        l.ignored_suffixes.push_back(std::string(head) + p);
  }
  auto& s = l.sources;
  auto add = [&](const std::string& mine, const std::string& theirs, Shape shape) {
    s.push_back(hf::same(mine, theirs, std::move(shape)));
  };
  auto linear = [&](const std::string& mine, const std::string& theirs, int64_t out, int64_t in) {
    add(mine + ".weight", theirs + ".weight", {out, in});
    add(mine + ".bias", theirs + ".bias", {out});
  };
  auto norm = [&](const std::string& mine, const std::string& theirs) {
    add(mine + ".weight", theirs + ".weight", {d});
    add(mine + ".bias", theirs + ".bias", {d});
  };
  const std::string e = "embeddings.";
  add(e + "word_embeddings.weight", m + e + "word_embeddings.weight", {c.vocab, d});
  add(e + "position_embeddings.weight", m + e + "position_embeddings.weight", {c.context, d});
  add(e + "token_type_embeddings.weight", m + e + "token_type_embeddings.weight", {c.types, d});
  norm(e + "LayerNorm", m + e + "LayerNorm");
  for (int64_t i = 0; i < c.layers; ++i) {
    const std::string r = fmt::format("layer.{}.", i), t = fmt::format("{}encoder.layer.{}.", m, i);
    linear(r + "attention.q_proj", t + "attention.self.query", d, d);
    linear(r + "attention.k_proj", t + "attention.self.key", d, d);
    linear(r + "attention.v_proj", t + "attention.self.value", d, d);
    linear(r + "attention.o_proj", t + "attention.output.dense", d, d);
    norm(r + "attention_norm", t + "attention.output.LayerNorm");
    linear(r + "mlp.fc1", t + "intermediate.dense", h, d);
    linear(r + "mlp.fc2", t + "output.dense", d, h);
    norm(r + "output_norm", t + "output.LayerNorm");
  }
  if (encoder_only) return l;
  if (roberta) {
    linear("classifier.dense", "classifier.dense", d, d);
    linear("classifier.out_proj", "classifier.out_proj", c.labels, d);
  } else {
    linear("pooler.dense", m + "pooler.dense", d, d);
    linear("classifier", "classifier", c.labels, d);
  }
  return l;
}

}  // namespace redco::models
