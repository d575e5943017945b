#pragma once
// An encoder-decoder (T5, BART) in a loss or predict function: the model
// bound by the Trainer or Predictor, run on a data::Seq2SeqBatch.
//
//   auto loss = [](auto& model, const data::Seq2SeqBatch& b, train::Rng) {
//     return cross_entropy(train::seq2seq_logits(model, b), b.labels);
//   };
//   auto predict = [&](auto& model, const data::Seq2SeqBatch& b, train::Rng) {
//     return train::seq2seq_generate(model, b, {.max_new_tokens = 64, .num_beams = 4});
//   };
#include <vector>

#include "redco/data/seq2seq_batch.hpp"
#include "redco/generation/generate.hpp"
#include "redco/nn/ctx_inputs.hpp"
#include "redco/train/bound_model.hpp"

namespace redco::train {

// An encoder's framing ids as the start of a generation config: the pad,
// end-of-sequence and decoder start ids generate_seq2seq needs besides the
// decoding choices.
inline generation::GenerationConfig generation_ids(const data::Seq2SeqEncoder& enc) {
  const data::Seq2SeqIds& ids = enc.special_ids();
  generation::GenerationConfig c;
  c.eos_token_ids = ids.eos, c.pad_token_id = ids.pad, c.decoder_start_token_id = ids.decoder_start;
  return c;
}
// A checkpoint's generation settings (models::generation_config) as the ids
// data::Seq2SeqEncoder::pretrained frames texts with.
inline data::Seq2SeqIds seq2seq_ids(const generation::GenerationConfig& c) {
  return {.pad = c.pad_token_id, .eos = c.eos_token_ids, .decoder_start = c.decoder_start_token_id};
}

// An encoder-decoder's logits [B, Tt, V] for `decoder_in`, its encoder
// reading `source` (token ids [B, Ts], or images [B, C, H, W] for a vision
// encoder) with its padding mask (undefined: none). The model's context is
// left as it was, whatever happens.
template <nn::Layer L>
Tensor seq2seq_logits(BoundModel<L>& model, const Tensor& source, const Tensor& decoder_in,
                      const Tensor& source_mask = {}) {
  const nn::CallInputs<2> in(model.ctx(),
                             {{{&nn::Ctx::source, source}, {&nn::Ctx::source_mask, source_mask}}});
  return model(decoder_in);
}
// The decoder's logits [B, Tt, V] for b.decoder_in, the encoder reading b.source.
template <nn::Layer L>
Tensor seq2seq_logits(BoundModel<L>& model, const data::Seq2SeqBatch& b) {
  return seq2seq_logits(model, b.source, b.decoder_in, b.source_mask);
}

// Generation from each row of `source` (the encoder's input, as above),
// continuing its prompt (KV cache; generation::generate with the encoder run
// once): the ids of each row, on this rank's shards of the model.
template <nn::Layer L>
std::vector<std::vector<int64_t>> seq2seq_generate(BoundModel<L>& model, const Tensor& source,
                                                   const std::vector<std::vector<int64_t>>& prompts,
                                                   const generation::GenerationConfig& config) {
  nn::Ctx ctx = model.ctx();
  ctx.source = source;
  return generation::generate(model.layer(), model.params(), prompts, config, std::move(ctx))
      .sequences;
}

// The ids each source row generates (KV cache; greedy, sampling or beam
// search as `config` says; generation::generate_seq2seq), on this rank's
// shards of the model: every rank of a model-parallel group gets the same.
template <nn::Layer L>
std::vector<std::vector<int64_t>> seq2seq_generate(BoundModel<L>& model,
                                                   const data::Seq2SeqBatch& b,
                                                   const generation::GenerationConfig& config) {
  return generation::generate_seq2seq(model.layer(), model.params(), b.source_rows(), config,
                                      model.ctx())
      .sequences;
}

}  // namespace redco::train
