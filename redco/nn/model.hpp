#pragma once
// Running a model: its parameters (names, shapes, initial values) and its
// forward pass over a parameter tree.
#include "redco/nn/blocks.hpp"
#include "redco/nn/build.hpp"

namespace redco::nn {

// Every parameter of `model`, in execution order, with its shape and its role
// under the sharding rules.
template <Layer L>
std::vector<ParamEntry> param_entries(const L& model) {
  Walker w;
  w.content<L>(&model);
  return std::move(w.params);
}

// Draws one parameter: element i depends only on (seed, name, i), so a
// parameter is the same whatever the sharding or the order of creation.
Tensor init_param(const ParamEntry& e, uint64_t seed);

template <Layer L>
ParamTree init_params(const L& model, uint64_t seed) {
  ParamTree tree;
  for (const ParamEntry& e : param_entries(model))
    tree.emplace(std::string(e.name.view()), init_param(e, seed));
  return tree;
}

int64_t count_parameters(const ParamTree& params);

// Checks that `params` holds exactly the model's parameters with the model's
// shapes; the message names the first offender and what was expected.
void check_params(const std::vector<ParamEntry>& expected, const ParamTree& params);

// The plan's split of every parameter of a model with these entries over
// `n_shards` model shards (shard::resolve, nn/shard_plan.cpp).
std::shared_ptr<const SplitTable> split_table(const std::vector<ParamEntry>& entries, int n_shards);
// The plan `model` runs under with ctx's model-parallel group; null without one.
template <Layer L>
std::shared_ptr<const SplitTable> split_table(const L& model, const Ctx& ctx) {
  return tp_active(ctx) ? split_table(param_entries(model), tp_size(ctx)) : nullptr;
}

// With ctx.mp a model-parallel group, `params` are this rank's shards
// (train::shard_params / train::init_shard with shard::resolve(model, n)),
// and an output split by its last dim (vocabulary-split logits) is returned
// as ctx.split_output says: this rank's part carrying its placement (which
// cross_entropy reads without gathering; nn::whole gathers it), or whole.
template <Layer L>
Tensor apply(const L& model, const ParamTree& params, const Tensor& x, Ctx& ctx) {
  ctx.split_features = false;  // the input is whole
  return finish_output(model.forward(Params(params, split_table(model, ctx)).content<L>(), x, ctx),
                       ctx);
}
// The inputs of one call, e.g. a padded batch with Hugging Face's
// attention_mask (1 for a token, 0 for padding, [B, T]):
//   nn::apply(model, params, ids, {.mask = attention_mask})
template <Layer L>
Tensor apply(const L& model, const ParamTree& params, const Tensor& x, Ctx&& ctx = {}) {
  return apply(model, params, x, ctx);
}

}  // namespace redco::nn
