#pragma once
// The shard plan of a typed model, computed from its type alone:
//   constexpr auto plan = shard::plan_v<decltype(model)>;
//   static_assert(plan.split("h.*.attn.q_proj.weight") == 0);
// It lists every parameter (repeats as "*") with its role under the two rules
// and the collectives between blocks. `resolve` applies it to a model's
// run-time sizes and a shard count, replicating a block whose dimensions do
// not divide, and `describe` prints the result.
#include <array>

#include "redco/nn/model.hpp"
#include "redco/shard/split.hpp"

namespace redco::shard {

template <size_t NP, size_t NC>
struct Plan {
  std::array<nn::ParamEntry, NP> params;
  std::array<nn::CollectiveEntry, NC> collectives;

  constexpr const nn::ParamEntry& param(std::string_view name) const {
    for (const auto& p : params)
      if (p.name.view() == name) return p;
    throw "redco::shard::Plan: no parameter of that name in the model";
  }
  constexpr bool has(std::string_view name) const {
    for (const auto& p : params)
      if (p.name.view() == name) return true;
    return false;
  }
  constexpr Role role(std::string_view name) const { return param(name).role; }
  constexpr int split(std::string_view name) const { return split_dim_of(role(name)); }
  constexpr size_t count(nn::Collective kind) const {
    size_t n = 0;
    for (const auto& c : collectives) n += c.kind == kind;
    return n;
  }
  // Whether `name` is split given its stored size along the split dimension,
  // the shard count and the unit that must stay whole (an attention head):
  // evaluable at compile time when the sizes are constants.
  constexpr int split_if_divisible(std::string_view name, int64_t size, int n_shards,
                                   int64_t unit = 1) const {
    const int d = split(name);
    return d >= 0 && size % (int64_t(n_shards) * unit) == 0 ? d : -1;
  }
};

template <nn::Layer L>
constexpr auto plan_of() {
  // The model's output leaves whole (or vocabulary-split, for an LM head).
  constexpr auto walk = [] {
    nn::Walker w;
    w.content<L>(static_cast<const L*>(nullptr));
    w.need_whole("(model output)");
    return w;
  };
  constexpr auto sizes = [&] {
    nn::Walker w = walk();
    return std::pair{w.params.size(), w.collectives.size()};
  }();
  nn::Walker w = walk();
  Plan<sizes.first, sizes.second> plan{};
  for (size_t i = 0; i < sizes.first; ++i) plan.params[i] = w.params[i];
  for (size_t i = 0; i < sizes.second; ++i) plan.collectives[i] = w.collectives[i];
  return plan;
}

template <nn::Layer L>
inline constexpr auto plan_v = plan_of<L>();

// The plan for `n_shards` model shards with the model's sizes. A parameter
// group (a column/row pair, an attention block, a vocabulary) is split only if
// every member divides (attention: by whole heads); otherwise the whole group
// is replicated and each member's note says which size did not divide.
std::vector<ParamSplit> resolve(const std::vector<nn::ParamEntry>& entries, int n_shards);

template <nn::Layer L>
std::vector<ParamSplit> resolve(const L& model, int n_shards) {
  return resolve(nn::param_entries(model), n_shards);
}

// Where the collectives go, one line each ("after h.*.attn: all-reduce").
template <size_t NP, size_t NC>
std::string describe_collectives(const Plan<NP, NC>& plan);
std::string describe_collectives(std::span<const nn::CollectiveEntry> collectives);

template <size_t NP, size_t NC>
std::string describe_collectives(const Plan<NP, NC>& plan) {
  return describe_collectives(std::span<const nn::CollectiveEntry>(plan.collectives));
}

}  // namespace redco::shard
