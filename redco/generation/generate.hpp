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
// beams exactly; sampling too, its draws keyed by the prompt). Under tensor
// parallelism pass ctx.mp: each rank caches its heads and every rank returns
// the same tokens. Encoder-decoders: set ctx.source (and ctx.source_mask) to
// the encoder's input; the prompts are then the decoder's start tokens.
#include <functional>
#include <vector>

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

// One forward pass: ids [B, T] with the cache set -> logits [B, 1, V].
using StepFn = std::function<Tensor(const Tensor& ids, nn::Ctx& ctx)>;

// The model-independent core; `ctx` carries mp, source, ... into every step.
Generated generate(const StepFn& step, const std::vector<std::vector<int64_t>>& prompts,
                   const GenerationConfig& config, nn::Ctx ctx, const OnToken& on_token = {});

template <nn::Layer L>
Generated generate(const L& model, const nn::ParamTree& params,
                   const std::vector<std::vector<int64_t>>& prompts, const GenerationConfig& config,
                   nn::Ctx ctx = {}, const OnToken& on_token = {}) {
  const StepFn step = [&](const Tensor& ids, nn::Ctx& c) {
    return nn::apply(model, params, ids, c);
  };
  return generate(step, prompts, config, std::move(ctx), on_token);
}

}  // namespace redco::generation
