#pragma once
// The roles a parameter can play under the two sharding rules, and the
// dimension each role splits. For weights stored (out, in):
//  1. fully-connected layers alternate in execution order: column-parallel
//     (dim 0), then row-parallel (dim 1), so the activations between them
//     stay split and one all-reduce ends each pair;
//  2. attention Q, K, V split dim 0 by whole heads; O splits dim 1.
// Token embeddings and an untied LM head split the vocabulary (dim 0); norms,
// positions and row-parallel biases are replicated; column-parallel biases
// split with their weight. Layers declare their parameters' roles in walk()
// (redco/nn/walk.hpp); shard::resolve turns them into the plan
// (redco/nn/shard_plan.hpp, redco/shard/split.hpp).
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
