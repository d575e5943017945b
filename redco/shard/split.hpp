#pragma once
// A shard plan as the run uses it: for every parameter, its whole shape, its
// role under the two rules and the dimension cut across the model shards (or
// none, and why). shard::resolve (redco/nn/shard_plan.hpp) makes one from a
// typed model; the trainer, checkpoints and the Hugging Face loader read it.
#include <cstdint>
#include <string>
#include <vector>

#include "redco/core/shape.hpp"
#include "redco/shard/spec.hpp"

namespace redco::shard {

struct ParamSplit {
  std::string name;  // dotted, as the model's walk names it: "h.0.attn.q_proj.weight"
  Shape shape;       // the whole parameter
  Role role;         // what the rules made of it, even if it could not split
  int split_dim;     // the dimension cut across the shards; -1: replicated
  std::string note;  // why a role that splits was replicated
};

// The shape one shard holds.
Shape shard_shape(const ParamSplit& p, int n_shards);

// The half-open index range along split_dim that shard `shard` holds, for a
// parameter the plan splits (split_dim >= 0).
struct IndexRange {
  int64_t begin;
  int64_t end;
  friend bool operator==(const IndexRange&, const IndexRange&) = default;
};
IndexRange shard_range(const ParamSplit& p, int n_shards, int shard);

// A table of the plan: parameter, shape, role, split and f32 bytes per shard,
// then a total and the notes.
std::string describe(const std::vector<ParamSplit>& plan, int n_shards);

}  // namespace redco::shard
