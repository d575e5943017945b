#pragma once
// Examples that change every epoch: MAML samples new tasks, reinforcement
// learning collects fresh rollouts with the current policy.
//
//   trainer.fit(train::per_epoch(n_envs * horizon,
//                   [&](int64_t epoch, auto& model, Rng rng) { return rollouts(model, rng); }),
//               {.global_batch_size = 64, .n_epochs = 100});
//
// The function is called once at the start of every epoch as
//   examples(epoch)                          or
//   examples(epoch, BoundModel<L>& model, Rng rng)
// and returns a random-access range of exactly n examples (fit's other
// options are as for a fixed range: each epoch visits them in
// deployer.epoch_order(epoch, n)). The second form receives the model bound
// to the parameters at the start of the epoch, in evaluation mode without
// gradient recording, and Rng{seed, epoch, examples}; its part<"name">()
// picks a part of a collection. Every data-parallel replica calls it, and all
// must return the same examples (they do when the examples depend only on
// the epoch, the model and the Rng), then take their slice of each batch.
// Under model parallelism it is collective over the model shards, as any
// forward pass is.
//
// Several passes. per_epoch(n, fn, {.passes = k}) visits the epoch's n
// examples k times, each pass in its own order (PPO's optimisation epochs
// over one batch of rollouts): the epoch is floor(k * n / global_batch_size)
// steps, pass p is ordered by deployer.epoch_order(epoch * k + p, n), and a
// batch that straddles two passes takes the end of one and the start of the
// next. fn is still called once per epoch. k = 1 is the plain per_epoch.
//
// Each replica its own examples. With {.per_replica = true} every
// data-parallel replica makes its own n / dp_size() examples (n must divide
// evenly) and its micro-batches come from them alone: reinforcement learning
// collects rollouts on every replica's own environments instead of
// repeating the same collection on each. The function then takes a fourth
// argument, the number of examples to return,
//   examples(epoch, BoundModel<L>& model, Rng rng, int64_t count)
// and its Rng is Rng{seed, epoch, examples}.split(replica), so the replicas
// draw differently. Steps per epoch are as without it (floor(passes * n /
// global_batch_size)). The 4-argument form without per_replica gets count = n.
//
// Exact resume. A resumed run equals an uninterrupted one bit for bit when
// the examples are a function of the epoch (and, in the second form, of the
// model and the Rng it receives) alone: a checkpoint written in the middle of
// an epoch also keeps the parameters the epoch started with (as
// "epoch_start.params.<name>" in opt_state.safetensors), so the resumed run
// rebuilds the same examples before continuing the epoch.
#include <concepts>
#include <cstdint>
#include <utility>

#include "redco/train/bound_model.hpp"
#include "redco/train/concepts.hpp"

namespace redco::train {

// Designated initialisers name these fields in the order declared below (C++20 rule).
struct PerEpochOptions {
  int64_t passes = 1;        // visits of the epoch's examples, each in its own order
  bool per_replica = false;  // each data-parallel replica makes its own n / dp_size()
};

template <typename F>
struct PerEpoch {
  int64_t n = 0;  // examples in every epoch
  F fn;
  int64_t passes = 1;
  bool per_replica = false;
};

template <typename F>
PerEpoch<F> per_epoch(int64_t n, F fn, PerEpochOptions options = {}) {
  return {n, std::move(fn), options.passes, options.per_replica};
}

template <typename T>
struct is_per_epoch : std::false_type {};
template <typename F>
struct is_per_epoch<PerEpoch<F>> : std::true_type {};

// Which form the function has, and what it returns.
template <typename F>
concept EpochOnlyFn = std::invocable<F&, int64_t>;
template <typename F, typename L>
concept EpochModelFn = std::invocable < F&,
        int64_t, BoundModel<L>
&, Rng > ;
template <typename F, typename L>
concept EpochCountFn = std::invocable < F&,
        int64_t, BoundModel<L>
&, Rng, int64_t > ;

namespace detail {
template <typename F, typename L>
struct epoch_result {
  using type = void;
};
template <typename F, typename L>
requires EpochOnlyFn<F>
struct epoch_result<F, L> {
  using type = std::remove_cvref_t<std::invoke_result_t<F&, int64_t>>;
};
template <typename F, typename L>
requires(!EpochOnlyFn<F> && !EpochCountFn<F, L> && EpochModelFn<F, L>) struct epoch_result<F, L> {
  using type = std::remove_cvref_t<std::invoke_result_t<F&, int64_t, BoundModel<L>&, Rng>>;
};
template <typename F, typename L>
requires(!EpochOnlyFn<F> && EpochCountFn<F, L>) struct epoch_result<F, L> {
  using type = std::remove_cvref_t<std::invoke_result_t<F&, int64_t, BoundModel<L>&, Rng, int64_t>>;
};
}  // namespace detail
template <typename F, typename L>
using epoch_result_t = typename detail::epoch_result<F, L>::type;

#define REDCO_PER_EPOCH_MESSAGE                                                                   \
  "redco: per_epoch(n, examples) needs examples(int64_t epoch), examples(int64_t epoch, "         \
  "model&, "                                                                                      \
  "Rng) or examples(int64_t epoch, model&, Rng, int64_t count) returning a random-access, sized " \
  "range of copyable examples (e.g. std::vector)"

}  // namespace redco::train

namespace redco::train::detail {
// Where fit() keeps an epoch's examples: the function's result, or nothing
// (a char) for a fixed range.
template <typename S, typename L>
struct epoch_storage {
  using type = char;
};
template <typename F, typename L>
struct epoch_storage<PerEpoch<F>, L> {
  using type = epoch_result_t<F, L>;
};
template <typename S, typename L>
using epoch_storage_t = typename epoch_storage<S, L>::type;
}  // namespace redco::train::detail
