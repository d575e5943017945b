#pragma once
// LoRA (Hu et al., 2021): low-rank adapters on an existing model's
// fully-connected weights. For a target weight W [out, in] the layer adds
// A [r, in] and B [out, r] and computes with W + (alpha / r) B A:
//
//   auto base = models::from_pretrained<models::Gpt2>(dir);
//   auto model = nn::lora(base.model, {.rank = 8, .alpha = 16, .targets = "c_attn"});
//   Trainer trainer(deployer, model, collate, loss, train::lora_groups(optim::adamw(...)),
//                   nn::with_adapters(model, std::move(base.params), seed));
//
// Names. The adapters of "h.0.attn.q_proj.weight" are "h.0.attn.q_proj.lora_A"
// and "...lora_B"; the base keeps its names, so a base checkpoint loads as is
// and nn::merge_adapters gives back a tree of the base model's names.
// Targets: a comma-separated list of module names, each matching a module
// path or its last dotted components ("q_proj,v_proj", "attn.o_proj",
// "mlp"), plus Hugging Face GPT-2's Conv1D names: c_attn (q, k and v), c_fc
// (mlp.fc1), c_proj (attn.o_proj and mlp.fc2).
//
// Initialisation as in the paper: A normal with std 1/sqrt(in), B zero, so a
// fresh adapter leaves the base's output unchanged.
//
// Why the merged weight. The adapter enters through the weight the base layer
// already reads, W + s B A, computed each forward pass (r · out · in
// multiply-adds per target, small next to a batch's matmuls). It needs no
// change to any layer, covers every layer kind with a fully-connected weight
// (fused qkv, the fused bias-GELU MLP, grouped-query attention), and x W_eff^T
// = x W^T + s (x A^T) B^T exactly. The cost: backward forms W_eff's gradient
// [out, in] before reducing it to A's and B's; the frozen base still gets no
// gradient and no optimizer state. Adapter dropout (dropout on x before A)
// cannot be expressed through a merged weight and is not offered.
//
// Tensor parallelism. The adapters' roles come from the base weight's role in
// the plan, taken from the walk that just declared that weight, never from
// shapes: for a column-split W (column, attention q/k/v: rows split) B has
// W's role (split by rows, same group and head unit) and A is replicated; for
// a row-split W (row, attention o: columns split) A has W's role (split by
// input columns) and B is replicated. Each rank's B A is then exactly its
// shard of the whole B A (column: B's rows times all of A; row: all of B
// times A's columns), so W_eff's shard is formed locally with no forward
// collective, and the base layer's own collectives (the row layer's
// all-reduce) carry the adapter's term. Backward, the replicated factor's
// gradient on a rank covers only its rows (columns) of W: it enters through
// nn::to_parallel (identity forward, all-reduce backward), as a whole
// activation enters a column-parallel layer. The result is the TP = 1 one.
// Adapters share the base weight's group, so a group that shard::resolve
// replicates keeps them whole too (whether W arrived split is read from its
// shape against the whole shape the walk declared, as layers do). The compile-time plan (shard::plan_v) has no targets to see and lists
// the base model's parameters; param_entries and shard::resolve list the
// adapters with the roles above.
#include <string>
#include <vector>

#include "redco/nn/model.hpp"

namespace redco::nn {

// Designated initialisers name these fields in the order declared below (C++20 rule).
struct LoraOptions {
  int64_t rank = 8;                // r
  float alpha = 16.f;              // scale alpha / r
  std::string targets = "c_attn";  // module name patterns, comma-separated
};

// Whether a parameter name is an adapter's (its last component is lora_A or lora_B).
bool is_adapter(std::string_view name);

// Appends to `entries` the adapters of the target weights among entries[from,
// end): A and B after each, roles from the weight's (see above). Fails,
// naming the pattern and the weights it could match, when a pattern matches
// no fully-connected weight, or when the rank is out of range.
void add_adapter_entries(std::vector<ParamEntry>& entries, size_t from, const LoraOptions& o);

// `tree` with every adapted weight under `prefix` replaced by W + s B A
// (differentiable). `entries`: the Lora model's param_entries (names below
// `prefix`), which give each adapter's role and each weight's whole shape.
// On a shard of a split W, the replicated factor (A of a column-split W, B
// of a row-split one) enters through nn::to_parallel: identity forward, its
// gradient all-reduced over ctx.mp backward, since each rank's gradient of
// it is the partial sum over its own rows (columns) of W. The adapters stay
// in the tree.
ParamTree with_merged_weights(const ParamTree& tree, std::string_view prefix, float scale,
                              const std::vector<ParamEntry>& entries, const Ctx& ctx);

template <Layer M>
struct Lora {
  static constexpr bool kTransparent = true;
  static constexpr std::string_view kName = "";
  M base;
  LoraOptions options{};

  float scale() const { return options.alpha / float(options.rank); }
  template <typename F>
  static constexpr void for_each_child_type(F&& f) {
    f.template operator()<M>();
  }
  static constexpr void walk(Walker& w, const Lora* l) {
    const size_t from = w.params.size();
    w.child<M>(l ? &l->base : nullptr);
    if (l) add_adapter_entries(w.params, from, l->options);  // run time only: targets are values
  }
  Tensor forward(const Params& p, const Tensor& x, Ctx& ctx) const {
    // The merged tree must outlive the base's forward pass (Params holds a pointer).
    const ParamTree merged =
        with_merged_weights(p.tree(), p.path().view(), scale(), param_entries(*this), ctx);
    return apply_child(base, p.with_tree(merged), x, ctx);
  }
};

template <Layer M>
Lora<M> lora(M base, LoraOptions options = {}) {
  return {std::move(base), std::move(options)};
}

// The base model's parameters with fresh adapters added: A drawn as
// nn::init_params would (element i depends only on seed, name and i), B zero.
// `base` must hold exactly the base model's parameters.
template <Layer M>
ParamTree with_adapters(const Lora<M>& model, ParamTree base, uint64_t seed) {
  check_params(param_entries(model.base), base);
  for (const ParamEntry& e : param_entries(model))
    if (is_adapter(e.name.view())) base.emplace(std::string(e.name.view()), init_param(e, seed));
  return base;
}

// Whole parameters of a Lora model -> the base model's: each target weight
// W + s B A (computed without recording), adapters dropped. What a merged
// export writes.
ParamTree drop_adapters(ParamTree merged);
template <Layer M>
ParamTree merge_adapters(const Lora<M>& model, const ParamTree& whole) {
  const std::vector<ParamEntry> entries = param_entries(model);
  check_params(entries, whole);
  NoGradGuard off;
  return drop_adapters(with_merged_weights(whole, "", model.scale(), entries, Ctx{}));
}

// Parameters a LoRA run trains (the adapters) against all of them: counts
// from the run-time walk, no tensors needed.
struct ParamShare {
  int64_t trained = 0, total = 0;
  double fraction() const { return total ? double(trained) / double(total) : 0.0; }
};
template <Layer L>
ParamShare adapter_share(const L& model) {
  ParamShare s;
  for (const ParamEntry& e : param_entries(model)) {
    int64_t n = 1;
    for (int i = 0; i < e.shape.rank; ++i) n *= e.shape.d[size_t(i)];
    s.total += n;
    if (is_adapter(e.name.view())) s.trained += n;
  }
  return s;
}

}  // namespace redco::nn
