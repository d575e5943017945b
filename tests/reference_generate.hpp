#pragma once
// The tests' reference for generation::generate: greedy decoding or nucleus
// (top-p) sampling (Holtzman et al., 2020) with no cache at all, the simplest
// thing that can be right. It was the library's first generator (9x slower
// than the cached one) and lives here now, where it checks that the cached
// path changes nothing.
//
//   Tensor out = test::generate(model, params, prompt, {.max_new = 64, .top_p = 0.9f,
//                                                       .context = 256}, seed);
//
// Each step re-runs the forward pass over the whole (context-cropped)
// sequence and keeps the last position's logits: there is no key/value cache,
// so a step costs a full forward over up to `context` tokens. That is simple
// and works for any model whose forward maps ids [B, T] to logits [B, T, V].
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <numeric>
#include <vector>

#include "redco/autodiff/node.hpp"
#include "redco/core/error.hpp"
#include "redco/core/philox.hpp"
#include "redco/nn/model.hpp"

namespace redco::test {

using nn::Layer;
using nn::ParamTree;

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
namespace detail {

inline int64_t first_argmax(const float* row, int64_t V) {
  return int64_t(std::max_element(row, row + V) - row);  // the first of equal maxima
}

// Draws from softmax(row / temperature) restricted to its nucleus: the most
// probable tokens, in order, until their mass reaches top_p (at least one).
// `u` in [0, 1) picks the token by inverse CDF.
inline int64_t sample_nucleus(const float* row, int64_t V, float temperature, float top_p, float u,
                              std::vector<double>& prob, std::vector<int64_t>& order) {
  const float m = row[first_argmax(row, V)];
  prob.resize(size_t(V));
  double total = 0;
  for (int64_t v = 0; v < V; ++v)
    total += prob[size_t(v)] = std::exp(double(row[v] - m) / temperature);
  REDCO_CHECK(std::isfinite(total) && total > 0, "generate: the logits are not finite");
  order.resize(size_t(V));
  std::iota(order.begin(), order.end(), 0);
  int64_t kept = V;
  double mass = total;
  if (top_p < 1.f) {
    // Most probable first; equal probabilities keep index order, so the top
    // token is the greedy one.
    std::stable_sort(order.begin(), order.end(),
                     [&](int64_t a, int64_t b) { return prob[size_t(a)] > prob[size_t(b)]; });
    mass = 0;
    for (kept = 0; kept < V && (kept == 0 || mass < double(top_p) * total); ++kept)
      mass += prob[size_t(order[size_t(kept)])];
  }
  const double target = double(u) * mass;
  double cum = 0;
  for (int64_t k = 0; k < kept; ++k) {
    cum += prob[size_t(order[size_t(k)])];
    if (target < cum) return order[size_t(k)];
  }
  return order[size_t(kept - 1)];  // rounding left u * mass at the very top
}

inline void check_options(const Tensor& prompt, const GenerateOptions& o) {
  REDCO_CHECK(prompt.rank() == 2 && prompt.dtype() == DType::i64 && prompt.dim(1) >= 1,
              "generate: the prompt must be i64 [batch, length >= 1], got {} {}",
              dtype_name(prompt.dtype()), prompt.shape());
  REDCO_CHECK(o.max_new >= 0, "generate: max_new {} must be >= 0", o.max_new);
  REDCO_CHECK(o.greedy || o.temperature > 0.f,
              "generate: temperature {} must be > 0 (or set greedy)", o.temperature);
  REDCO_CHECK(o.top_p >= 0.f && o.top_p <= 1.f, "generate: top_p {} must be in [0, 1]", o.top_p);
  REDCO_CHECK(o.context >= 0, "generate: context {} must be >= 0", o.context);
}

}  // namespace detail

inline Tensor generate(const LogitsFn& logits_fn, const Tensor& prompt, const GenerateOptions& o,
                       uint64_t seed = 0) {
  detail::check_options(prompt, o);
  NoGradGuard no_grad;
  const int64_t B = prompt.dim(0), T0 = prompt.dim(1), total = T0 + o.max_new;
  std::vector<int64_t> seq(size_t(B * total), o.eos);
  const int64_t* p = prompt.data<int64_t>();
  for (int64_t b = 0; b < B; ++b) std::copy_n(p + b * T0, T0, seq.begin() + b * total);
  std::vector<bool> done(size_t(B), false);
  std::vector<float> u(static_cast<size_t>(B));
  std::vector<double> prob;
  std::vector<int64_t> order;
  const uint64_t stream = stream_of("redco.nn.generate");
  for (int64_t step = 0; step < o.max_new; ++step) {
    const int64_t t = T0 + step, start = o.context > 0 ? std::max<int64_t>(0, t - o.context) : 0;
    const int64_t w = t - start;
    Tensor ids = Tensor::empty({B, w}, DType::i64);
    for (int64_t b = 0; b < B; ++b)
      std::copy_n(seq.begin() + b * total + start, w, ids.data<int64_t>() + b * w);
    const Tensor logits = logits_fn(ids).to(DType::f32);
    REDCO_CHECK(logits.rank() == 3 && logits.dim(0) == B && logits.dim(1) == w,
                "generate: the model mapped ids {} to {}; expected logits [{}, {}, vocab]",
                ids.shape(), logits.shape(), B, w);
    const int64_t V = logits.dim(2);
    if (!o.greedy) philox_uniform(u.data(), B, seed, stream ^ uint64_t(step), 0, 0.f, 1.f);
    bool all_done = true;
    for (int64_t b = 0; b < B; ++b) {
      if (done[size_t(b)]) continue;
      const float* row = logits.data<float>() + (b * w + w - 1) * V;
      const int64_t next = o.greedy ? detail::first_argmax(row, V)
                                    : detail::sample_nucleus(row, V, o.temperature, o.top_p,
                                                             u[size_t(b)], prob, order);
      seq[size_t(b * total + t)] = next;
      done[size_t(b)] = o.eos >= 0 && next == o.eos;
      all_done = all_done && done[size_t(b)];
    }
    if (all_done) break;  // the rest is already eos padding
  }
  return Tensor::from<int64_t>(std::span<const int64_t>(seq), {B, total});
}

template <Layer L>
Tensor generate(const L& model, const ParamTree& params, const Tensor& prompt,
                const GenerateOptions& options, uint64_t seed = 0) {
  return generate([&](const Tensor& ids) { return nn::apply(model, params, ids); }, prompt, options,
                  seed);
}

}  // namespace redco::test
