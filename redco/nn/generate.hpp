#pragma once
// Autoregressive generation from a language model: greedy decoding or nucleus
// (top-p) sampling (Holtzman et al., 2020).
//
//   Tensor out = nn::generate(model, params, prompt, {.max_new = 64, .top_p = 0.9f,
//                                                     .context = 256}, seed);
//
// Each step re-runs the forward pass over the whole (context-cropped)
// sequence and keeps the last position's logits: there is no key/value cache,
// so a step costs a full forward over up to `context` tokens. That is simple
// and works for any model whose forward maps ids [B, T] to logits [B, T, V].
#include <cstdint>
#include <functional>

#include "redco/autodiff/node.hpp"
#include "redco/nn/model.hpp"

namespace redco::nn {

// Designated initialisers name these fields in the order declared below (C++20 rule).
struct GenerateOptions {
  int64_t max_new = 32;     // tokens appended to each row
  float temperature = 1.f;  // logits are divided by it before sampling (> 0)
  float top_p = 1.f;        // sample from the smallest set of top tokens with mass >= top_p
  bool greedy = false;      // take the argmax (first on ties) instead of sampling
  int64_t eos = -1;         // >= 0: a row that emits it is padded with it from then on
  int64_t context = 0;      // > 0: feed only the last `context` tokens (the model's maximum)
};

// The forward pass generation drives: ids i64 [B, t] -> logits f32 [B, t, V].
using LogitsFn = std::function<Tensor(const Tensor& ids)>;

// prompt: i64 [B, T0] (T0 >= 1). Returns i64 [B, T0 + max_new], the prompt
// followed by the new tokens. Sampling draws one Philox uniform per row from
// (seed, step), so the same call gives the same tokens on every machine.
// Runs without recording gradients.
Tensor generate(const LogitsFn& logits, const Tensor& prompt, const GenerateOptions& options,
                uint64_t seed = 0);

template <Layer L>
Tensor generate(const L& model, const ParamTree& params, const Tensor& prompt,
                const GenerateOptions& options, uint64_t seed = 0) {
  return generate([&](const Tensor& ids) { return apply(model, params, ids); }, prompt, options,
                  seed);
}

}  // namespace redco::nn
