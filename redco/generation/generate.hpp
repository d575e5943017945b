#pragma once
// Text generation with a KV cache (nn/kv_cache.hpp): one prefill pass over
// the prompts, then one pass per new token over one position per row.
//
//   auto out = generation::generate(model, params, {{15496, 11}, {40}},
//                                   {.max_new_tokens = 64, .do_sample = true, .top_p = 0.9f});
//   out.sequences[i]  // the new tokens of prompt i (num_return_sequences per prompt)
//
// Prompts have their own lengths: no padding, every row's positions are its
// own, so a prompt gets the same tokens alone or in any batch (greedy and
// beams exactly; sampling too, its draws keyed by the prompt and, for an
// encoder-decoder, its source's tokens). Under tensor
// parallelism pass ctx.mp: each rank caches its heads and every rank returns
// the same tokens.
//
// Encoder-decoders (T5, BART): generate_seq2seq takes the sources (encoder
// input ids, each its own length) and returns each one's generated ids:
//
//   auto cfg = models::generation_config(dir);  // decoder start, eos, pad, forced ids
//   auto out = generation::generate_seq2seq(t5.model, t5.params, {{37, 1}, {8, 9, 1}}, cfg);
//
// The encoder runs once per batch on the sources right-padded behind a mask;
// each cross-attention layer projects its keys and values once into the
// cache; the decoder starts from config.decoder_start_token_id. (generate
// with ctx.source set is the same, with the decoder's prompts given.)
#include <functional>
#include <string_view>
#include <vector>

#include "redco/data/tokenizer.hpp"
#include "redco/generation/generation_config.hpp"
#include "redco/nn/kv_cache.hpp"
#include "redco/nn/model.hpp"

namespace redco::generation {

struct Generated {
  std::vector<std::vector<int64_t>> sequences;  // new tokens, eos included; prompt-major
  std::vector<float> scores;                    // beam search: each sequence's score
};

// Called as each token is produced (rows are prompts, or prompt * n + i for
// num_return_sequences n); return false to stop that row. Not called in beam
// search, whose tokens are final only at the end.
using OnToken = std::function<bool(int64_t row, int64_t token)>;

// Text while generating (generation/text.hpp): each row's new text as it
// completes, whole UTF-8 characters only (the tokenizer's Stream decoder, in
// the context of the prompt), then once more with last = true when the row
// ends (with any text held back, e.g. a trailing U+FFFD).
// Beam search (which transformers refuses streamers for) has no text before
// a prompt's search ends, since any beam can still be overtaken: each
// prompt's chosen sequences (rows prompt * num_return_sequences + i) are
// streamed piece by piece as soon as its search ends, prompts finishing
// early first.
using OnText = std::function<void(int64_t row, std::string_view piece, bool last)>;
struct TextOptions {
  const data::Tokenizer* tokenizer = nullptr;  // needed by on_text and stop_strings
  OnText on_text{};
  bool skip_special_tokens = true;  // in the streamed text
};

// One forward pass: ids [B, T] with the cache set -> logits [B, 1, V].
using StepFn = std::function<Tensor(const Tensor& ids, nn::Ctx& ctx)>;

// The model-independent core; `ctx` carries mp, source, ... into every step.
Generated generate(const StepFn& step, const std::vector<std::vector<int64_t>>& prompts,
                   const GenerationConfig& config, nn::Ctx ctx, const OnToken& on_token = {},
                   const TextOptions& text = {});

template <nn::Layer L>
Generated generate(const L& model, const nn::ParamTree& params,
                   const std::vector<std::vector<int64_t>>& prompts, const GenerationConfig& config,
                   nn::Ctx ctx = {}, const OnToken& on_token = {}, const TextOptions& text = {}) {
  // The step's host-built ids go where the parameters are.
  const Device device = params.empty() ? Device::cpu() : params.begin()->second.device();
  const StepFn step = [&](const Tensor& ids, nn::Ctx& c) {
    return nn::apply(model, params, ids.to(device), c);
  };
  return generate(step, prompts, config, std::move(ctx), on_token, text);
}

// sources: encoder input ids per row (own lengths, padded here with
// config.pad_token_id); out.sequences: the ids generated after the decoder
// start token, row-major as generate's.
// `text` as generate's: the streamed text and stop strings are the
// decoder's output (after its start token).
Generated generate_seq2seq(const StepFn& step, const std::vector<std::vector<int64_t>>& sources,
                           const GenerationConfig& config, nn::Ctx ctx = {},
                           const OnToken& on_token = {}, const TextOptions& text = {});

template <nn::Layer L>
Generated generate_seq2seq(const L& model, const nn::ParamTree& params,
                           const std::vector<std::vector<int64_t>>& sources,
                           const GenerationConfig& config, nn::Ctx ctx = {},
                           const OnToken& on_token = {}, const TextOptions& text = {}) {
  // The step's host-built ids go where the parameters are.
  const Device device = params.empty() ? Device::cpu() : params.begin()->second.device();
  const StepFn step = [&](const Tensor& ids, nn::Ctx& c) {
    return nn::apply(model, params, ids.to(device), c);
  };
  return generate_seq2seq(step, sources, config, std::move(ctx), on_token, text);
}

}  // namespace redco::generation
