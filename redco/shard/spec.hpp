#pragma once
// What a shard plan says about one parameter: which dimension is split across
// the model shards (or none), and why. Shared by the compile-time plans of
// typed models (redco/nn/shard_plan.hpp) and the name-based rules for parameter
// trees that come from elsewhere (redco/shard/name_rules.hpp).
#include <cstdint>
#include <string_view>

namespace redco::shard {

// The part a parameter plays, which decides its split.
enum class Role : uint8_t {
  column,       // fully-connected weight [out, in], split dim 0 (output features)
  row,          // fully-connected weight [out, in], split dim 1 (input features)
  column_bias,  // bias of a column-parallel layer: split with its weight's outputs
  row_bias,     // bias of a row-parallel layer: replicated (added once, after the all-reduce)
  attn_q,       // attention projections: whole heads per shard
  attn_k,
  attn_v,
  attn_o,      // output projection: dim 1 (row-parallel)
  vocab,       // token embedding / untied LM head [vocab, d]: vocabulary split (dim 0)
  head_table,  // per-head table [rows, heads] (T5's relative position bias): split by heads (dim 1)
  replicated,  // norms, positions, convolutions, anything the rules don't cover
};

// -1: replicated; otherwise the dimension of the (out, in)-stored tensor that is split.
constexpr int split_dim_of(Role r) {
  switch (r) {
    case Role::column:
    case Role::column_bias:
    case Role::attn_q:
    case Role::attn_k:
    case Role::attn_v:
    case Role::vocab:
      return 0;
    case Role::row:
    case Role::attn_o:
    case Role::head_table:
      return 1;
    case Role::row_bias:
    case Role::replicated:
      return -1;
  }
  return -1;
}

constexpr std::string_view role_name(Role r) {
  switch (r) {
    case Role::column:
      return "column";
    case Role::row:
      return "row";
    case Role::column_bias:
      return "column bias";
    case Role::row_bias:
      return "row bias";
    case Role::attn_q:
      return "attention q";
    case Role::attn_k:
      return "attention k";
    case Role::attn_v:
      return "attention v";
    case Role::attn_o:
      return "attention o";
    case Role::vocab:
      return "vocab";
    case Role::head_table:
      return "per-head table";
    case Role::replicated:
      return "replicated";
  }
  return "?";
}

}  // namespace redco::shard
