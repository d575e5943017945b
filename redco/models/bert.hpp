#pragma once
// BERT (Devlin et al., 2018) and RoBERTa (Liu et al., 2019) encoders with a
// sequence-classification head, as transformers' BertForSequenceClassification
// and RobertaForSequenceClassification compute them: word + position +
// token-type embeddings and a layer norm, post-LN blocks (GELU MLP), then
//  * BERT: the pooler (tanh(dense(h[:, 0]))) and a linear classifier;
//  * RoBERTa: classifier.out_proj(tanh(classifier.dense(h[:, 0]))), with
//    positions numbered from padding_idx + 1 over the non-pad tokens.
// Token types and a padded batch's mask are arguments of bert_forward (below;
// the layers read them from ctx.token_types and ctx.mask). The output is the logits [B, labels];
// bert_encoder / roberta_encoder build the encoder alone (its last hidden state [B, T, d]) over the
// same parameter names.
//
// Names (redco's; bert.cpp maps them to the checkpoint's):
//   embeddings.{word_embeddings, position_embeddings, token_type_embeddings, LayerNorm},
//   layer.N.{attention (q/k/v/o_proj), attention_norm, mlp (fc1, fc2), output_norm},
//   BERT: pooler.dense, classifier; RoBERTa: classifier.dense, classifier.out_proj.
// Tensor-parallel: the two rules give the heads plan with no hint (pooler
// dense column-parallel, tanh on its split output, classifier row-parallel).
#include "redco/models/hf_checkpoint.hpp"
#include "redco/models/hf_family.hpp"
#include "redco/nn/ctx_inputs.hpp"
#include "redco/nn/encoder_layers.hpp"
#include "redco/nn/model.hpp"

namespace redco::models {

// Designated initialisers name these fields in the order declared below (C++20 rule).
struct BertConfig {                 // defaults: bert-base-uncased
  int64_t vocab = 30522;            // vocab_size
  int64_t dim = 768;                // hidden_size
  int64_t layers = 12;              // num_hidden_layers
  int64_t heads = 12;               // num_attention_heads
  int64_t hidden = 3072;            // intermediate_size
  int64_t context = 512;            // max_position_embeddings
  int64_t types = 2;                // type_vocab_size
  int64_t labels = 2;               // num_labels (len(id2label))
  float norm_eps = 1e-12f;          // layer_norm_eps
  float dropout = 0.f;              // hidden_dropout_prob (config.json's default is 0.1)
  nn::Act act = nn::Act::gelu_erf;  // hidden_act
  int64_t pad = 0;                  // pad_token_id (RoBERTa: the positions' padding_idx)
};

namespace detail {
template <nn::Layer Pos>
auto bert_embeddings(const BertConfig& c, Pos pos) {
  return nn::named<"embeddings">((nn::named<"word_embeddings">(nn::embedding(c.vocab, c.dim)) +
                                  std::move(pos) + nn::token_type_embedding(c.types, c.dim)) |
                                 nn::named<"LayerNorm">(nn::layer_norm(c.dim, c.norm_eps)) |
                                 nn::dropout(c.dropout));
}
inline auto bert_layers(const BertConfig& c) {
  auto ln = [&] { return nn::layer_norm(c.dim, c.norm_eps); };
  auto block = nn::residual(nn::named<"attention">(nn::self_attention(c.dim, c.heads)) |
                            nn::dropout(c.dropout)) |
               nn::named<"attention_norm">(ln()) |
               nn::residual(nn::mlp(c.dim, c.hidden, c.act) | nn::dropout(c.dropout)) |
               nn::named<"output_norm">(ln());
  return nn::named<"layer">(nn::repeat(c.layers, std::move(block)));
}
inline auto bert_positions(const BertConfig& c) {
  return nn::named<"position_embeddings">(nn::positions(c.context, c.dim));
}
inline auto roberta_positions(const BertConfig& c) {
  return nn::padded_positions(c.context, c.dim, c.pad);
}
}  // namespace detail

inline auto bert_encoder(const BertConfig& c) {
  return detail::bert_embeddings(c, detail::bert_positions(c)) | detail::bert_layers(c);
}
inline auto bert(const BertConfig& c) {
  auto pooler = nn::named<"pooler">(nn::first_token() |
                                    nn::named<"dense">(nn::linear(c.dim, c.dim)) | nn::tanh());
  return bert_encoder(c) | std::move(pooler) | nn::dropout(c.dropout) |
         nn::named<"classifier">(nn::linear(c.dim, c.labels));
}
inline auto roberta_encoder(const BertConfig& c) {
  return detail::bert_embeddings(c, detail::roberta_positions(c)) | detail::bert_layers(c);
}
inline auto roberta(const BertConfig& c) {
  auto head = nn::named<"classifier">(
      nn::first_token() | nn::dropout(c.dropout) | nn::named<"dense">(nn::linear(c.dim, c.dim)) |
      nn::tanh() | nn::dropout(c.dropout) | nn::named<"out_proj">(nn::linear(c.dim, c.labels)));
  return roberta_encoder(c) | std::move(head);
}

using Bert = decltype(bert(BertConfig{}));
using Roberta = decltype(roberta(BertConfig{}));
// The encoders alone (BertModel, RobertaModel without their pooler): the
// output is the last hidden state [B, T, d].
using BertEncoder = decltype(bert_encoder(BertConfig{}));
using RobertaEncoder = decltype(roberta_encoder(BertConfig{}));

// A bound BERT / RoBERTa (or either encoder: train::BoundModel, as a loss or
// predict function gets it) run on `ids` [B, T] with their token types (i64
// [B, T]; undefined: all type 0) and padding mask ([B, T], 1 for a token;
// undefined: none) as arguments: the logits [B, labels], or the encoder's
// last hidden state. The model's context is left as it was, even when the
// call throws.
template <typename Bound>
Tensor bert_forward(Bound& model, const Tensor& ids, const Tensor& token_types,
                    const Tensor& mask = {}) {
  const nn::CallInputs<2> in(model.ctx(),
                             {{{&nn::Ctx::token_types, token_types}, {&nn::Ctx::mask, mask}}});
  return model(ids);
}

// ---- Hugging Face checkpoints (model_type "bert", "roberta") -----------------------------
BertConfig bert_config(const hf::Config& config);  // either model_type
// encoder_only: a *Model checkpoint (names without the "bert." / "roberta."
// prefix, which a *ForSequenceClassification one has and which is accepted
// too; pooler and classifier tensors are skipped).
io::Json bert_hf_config(const BertConfig& c, bool roberta, bool encoder_only = false,
                        io::Json base = io::Json::object());
hf::Layout bert_layout(const BertConfig& c, bool roberta, bool encoder_only = false);

// What from_pretrained / save_pretrained need of it (models/hf_family.hpp).
template <>
struct HfFamily<Bert> {
  using Config = BertConfig;
  static Config config(const hf::Config& f) {
    f.expect_model_type({"bert"}, "models::Bert");
    return bert_config(f);
  }
  static Bert build(const Config& c) { return bert(c); }
  static hf::Layout layout(const Config& c) { return bert_layout(c, false); }
  static io::Json to_json(const Config& c, io::Json base) {
    return bert_hf_config(c, false, false, base);
  }
};

template <>
struct HfFamily<Roberta> {
  using Config = BertConfig;
  static Config config(const hf::Config& f) {
    f.expect_model_type({"roberta"}, "models::Roberta");
    return bert_config(f);
  }
  static Roberta build(const Config& c) { return roberta(c); }
  static hf::Layout layout(const Config& c) { return bert_layout(c, true); }
  static io::Json to_json(const Config& c, io::Json base) {
    return bert_hf_config(c, true, false, base);
  }
};

template <>
struct HfFamily<BertEncoder> {  // BertModel (or the encoder of a BERT classifier)
  using Config = BertConfig;
  static Config config(const hf::Config& f) {
    f.expect_model_type({"bert"}, "models::BertEncoder");
    return bert_config(f);
  }
  static BertEncoder build(const Config& c) { return bert_encoder(c); }
  static hf::Layout layout(const Config& c) { return bert_layout(c, false, true); }
  static io::Json to_json(const Config& c, io::Json base) {
    return bert_hf_config(c, false, true, base);
  }
};

template <>
struct HfFamily<RobertaEncoder> {  // RobertaModel (or the encoder of a RoBERTa classifier)
  using Config = BertConfig;
  static Config config(const hf::Config& f) {
    f.expect_model_type({"roberta"}, "models::RobertaEncoder");
    return bert_config(f);
  }
  static RobertaEncoder build(const Config& c) { return roberta_encoder(c); }
  static hf::Layout layout(const Config& c) { return bert_layout(c, true, true); }
  static io::Json to_json(const Config& c, io::Json base) {
    return bert_hf_config(c, true, true, base);
  }
};

}  // namespace redco::models
