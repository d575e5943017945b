#pragma once
// Tensor-parallel shard plans for parameter trees that come with names but no
// typed model, such as an imported Hugging Face checkpoint.
//
// The rules, for weights stored (out, in):
//  1. fully-connected layers alternate in execution order: column-parallel (dim 0),
//     then row-parallel (dim 1), so the activations between them stay split;
//  2. attention Q, K, V split dim 0 by whole heads; O splits dim 1.
// Token embeddings and an untied LM head split the vocabulary (dim 0); norms,
// position embeddings and row-parallel biases are replicated; column-parallel
// biases split with their weight; anything else is replicated.
//
// RedCoast sorted the parameter names and alternated by sorted position, which
// mis-shards models whose layers share names (BERT's "attention.output.dense",
// "intermediate.dense", "output.dense"). Here every known layer is recognised
// by its name's structure, which no ordering can change, and only linears the
// patterns don't know fall back to alternation, in the order given (the
// checkpoint's / model definition's order, which is execution order).
//
// Recognised names (dotted, case-sensitive, matched on the module's last
// component and its parent):
//   attention  q_proj k_proj v_proj o_proj out_proj (LLaMA, OPT, GPT-J, BART);
//              q k v o under a parent holding "Attention"/"attn"/"attention" (T5);
//              query key value + attention.output.dense (BERT);
//              q_lin k_lin v_lin out_lin (DistilBERT);
//              attn.c_attn (GPT-2 fused q|k|v), crossattention.c_attn (fused k|v),
//              crossattention.q_attn, attn.c_proj (GPT-2 O);
//              attention.wq wk wv wo (Meta's LLaMA checkpoints)
//   column     up_proj gate_proj fc1 fc_in wi wi_0 wi_1 c_fc intermediate.dense w1 w3
//   row        down_proj fc2 fc_out wo mlp.c_proj output.dense (not under attention) w2
//   vocab      embed_tokens wte word_embeddings shared lm_head tok_embeddings,
//              and a top-level "output" (Meta's LM head)
//   replicated wpe embed_positions position_embeddings token_type_embeddings,
//              norms (a component containing "norm"/"Norm", or starting "ln_"),
//              relative_attention_bias, buffers and anything not 2-D.
//
// Unrecognised 2-D weights inside a numbered layer (a name with an all-digit
// component, e.g. "model.layers.3.foo.weight": the layer is the prefix up to the
// last such component, "model.layers.3") alternate column, row, column, ... in
// the given order, counting only the unrecognised ones of that layer. Outside a
// numbered layer there is no order to trust (a pooler, a classifier, OPT-350m's
// project_in/out) and they are replicated.
//
// Split activations must be produced and consumed in pairs: every column-side
// layer (column, attention q/k/v) of a group needs a row-side partner (row,
// attention o) and vice versa. Groups are the attention projections of a
// numbered layer, its recognised MLP linears, and each column-then-row run of
// its unrecognised linears. If any member cannot split (not divisible, partial
// heads) or a side is missing, the whole group is replicated and each member's
// note says why. Grouping by layer rather than by position makes recognised
// layers' plans independent of the order they are listed in.
//
// GPT-2's Conv1D stores weights (in, out), so its split dims are flipped
// (ParamSplit::in_out). Its fused c_attn [d, 3d] packs q|k|v side by side; a
// contiguous split would hand shard 0 all of q and part of k, so it is split per
// block instead: shard s takes the same slice of each of the fused_blocks blocks
// (see shard_ranges), which gives every shard the q, k and v of the same heads.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "redco/core/shape.hpp"
#include "redco/shard/spec.hpp"

namespace redco::shard {

struct NamedShape {
  std::string name;  // dotted, as in the checkpoint: "model.layers.0.mlp.up_proj.weight"
  Shape shape;
};

// Which fully-connected weights are stored (in, out), like GPT-2's Conv1D.
enum class Conv1d : uint8_t {
  detect,  // only GPT-2's c_attn, q_attn, c_fc and c_proj
  always,  // every fully-connected weight (a checkpoint saved transposed)
  never,   // none: everything is nn.Linear (out, in)
};

// Designated initialisers name these fields in the order declared below (C++20 rule).
struct NameRuleOptions {
  // Attention head size, for the whole-heads check. 0: derived from num_heads
  // and the first query projection; if both are 0 a split only needs the head
  // dimension to divide by the shard count, and the note says so.
  int64_t head_dim = 0;
  int64_t num_heads = 0;  // query heads (GQA's fewer key/value heads are fine)
  Conv1d conv1d = Conv1d::detect;
};

struct ParamSplit {
  std::string name;
  Shape shape;           // as stored
  Role role;             // what the rules made of it, even if it could not split
  int split_dim;         // dimension of the stored tensor that is split; -1: replicated
  std::string note;      // why a role that splits was replicated, or a caveat on the split
  bool in_out = false;   // stored (in, out): the split dim is flipped from split_dim_of(role)
  int fused_blocks = 1;  // >1: split_dim packs this many equal blocks, each split alike
};

// One plan entry per parameter, in the given order. Throws redco::Error if
// n_shards < 1, a name repeats, or num_heads does not divide the query width.
std::vector<ParamSplit> plan_by_names(std::span<const NamedShape> params, int n_shards,
                                      const NameRuleOptions& opts = {});

// The shape one shard holds.
Shape shard_shape(const ParamSplit& p, int n_shards);

// Half-open index ranges along split_dim that shard `shard` holds, one per
// fused block; empty for a replicated parameter (every shard holds it whole).
struct IndexRange {
  int64_t begin;
  int64_t end;
  friend bool operator==(const IndexRange&, const IndexRange&) = default;
};
std::vector<IndexRange> shard_ranges(const ParamSplit& p, int n_shards, int shard);

// A table of the plan: parameter, shape, role, split and f32 bytes per shard,
// then a total and the notes.
std::string describe(const std::vector<ParamSplit>& plan, int n_shards);

}  // namespace redco::shard
