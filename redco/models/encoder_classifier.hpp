#pragma once
// Fine-tuning starts here: a BERT or RoBERTa sequence classifier (a
// regressor with labels = 1) whose encoder comes from a Hugging Face
// checkpoint folder and whose head is new, as transformers'
// *ForSequenceClassification.from_pretrained(dir, num_labels=n) builds it.
//
//   auto p = models::classifier_from_pretrained<models::Bert>("bert-base-uncased", 30, seed);
//   Trainer trainer(deployer, p.model, collate, loss, opt, p.params);
//
// The folder may hold a BertModel / RobertaModel, a *ForSequenceClassification
// (its head is replaced) or a pre-training checkpoint (*ForMaskedLM,
// BertForPreTraining: the language-model heads are not loaded). The head
// (BERT: pooler and classifier; RoBERTa: classifier.dense and out_proj) is
// drawn by nn::init_params from `seed`, the pooler included.
#include <filesystem>
#include <type_traits>

#include "redco/models/pretrained.hpp"

namespace redco::models {

template <typename M>
requires(std::is_same_v<M, Bert> || std::is_same_v<M, Roberta>)
    Pretrained<M> classifier_from_pretrained(const std::filesystem::path& dir, int64_t labels,
                                             uint64_t seed) {
  constexpr bool kRoberta = std::is_same_v<M, Roberta>;
  using Encoder = std::conditional_t<kRoberta, RobertaEncoder, BertEncoder>;
  const hf::Config file(dir);
  BertConfig c = HfFamily<Encoder>::config(file);
  REDCO_CHECK(labels >= 1, "classifier_from_pretrained: labels must be >= 1, got {}", labels);
  c.labels = labels;
  hf::Layout layout = HfFamily<Encoder>::layout(c);
  for (const char* head :
       {"cls.predictions.bias", "cls.predictions.transform.dense.weight",
        "cls.predictions.transform.dense.bias", "cls.predictions.transform.LayerNorm.weight",
        "cls.predictions.transform.LayerNorm.bias", "cls.predictions.decoder.weight",
        "cls.predictions.decoder.bias", "cls.seq_relationship.weight", "cls.seq_relationship.bias",
        "lm_head.bias", "lm_head.dense.weight", "lm_head.dense.bias", "lm_head.layer_norm.weight",
        "lm_head.layer_norm.bias", "lm_head.decoder.weight", "lm_head.decoder.bias"})
    layout.ignored_suffixes.push_back(head);
  const Encoder encoder = HfFamily<Encoder>::build(c);
  nn::ParamTree loaded = hf::load_weights(dir, layout, shard::resolve(encoder, 1), {});
  M model = HfFamily<M>::build(c);
  nn::ParamTree params = nn::init_params(model, seed);
  for (auto& [name, t] : loaded) params.at(name) = std::move(t);
  return {c, std::move(model), std::move(params), file.json()};
}

}  // namespace redco::models
