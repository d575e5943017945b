#pragma once
// Tensor parallelism inside the layer DSL: what lets nn::apply(model, shard,
// x, ctx) run on this rank's parameter shards when ctx.mp is a group of more
// than one rank.
//
// Which parameters are split is the shard plan's decision (shard::resolve,
// which replicates a block whose sizes do not divide), made once per run and
// read by every layer through Params::split: no layer guesses a role from a
// shape. Shapes are only checked against what the plan gives this rank. The
// activations between a column- and a row-parallel layer are split by
// features (their last dim): Ctx tracks it (Ctx::split_features, the run-time
// twin of Walker::sharded), and layers that need whole features gather first
// (the twin of Walker::need_whole).
//
// Placement. A model output that is still split (vocabulary-split logits,
// classes split by a last column-parallel layer) is returned as this rank's
// part with a Placement (core/tensor.hpp). cross_entropy reads it without
// gathering: the row max and the sum of exponentials are all-reduced and the
// label's logit comes from the rank that holds it. Any other op that reads a
// split tensor fails with a message naming whole(): data access is the one
// central point every kernel goes through. whole() gathers; local() is this
// rank's part as a plain tensor. Failing beats gathering there: a gather is a
// collective every rank must call in the same order, and a kernel's read
// happens wherever the caller's code goes (one rank printing a value), so an
// automatic one could deadlock. In evaluation (!ctx.train) nn::apply returns
// whole outputs by default, so prediction code (argmax) runs unchanged.
//
// A layer written outside the DSL whose walk calls need_whole() calls
// whole_features(x, ctx) first in its forward, like the DSL's own layers.
#include "redco/autodiff/functional.hpp"
#include "redco/nn/walk.hpp"

namespace redco::nn {

// ---- placements --------------------------------------------------------------------------
// `part` (this rank's slice along `dim`, the slices in rank order along
// `dim`), marked as split across `comm`. Differentiable (an identity).
Tensor split_by(const Tensor& part, comm::Comm& comm, int dim = -1);
// `part` marked as this rank's term of a sum over `comm`.
Tensor partial_sum(const Tensor& part, comm::Comm& comm);
// The whole tensor: split parts gathered, partial sums reduced, a tensor with
// no placement returned as is. Collective over the tensor's group when it has
// a placement (every rank must call it). Differentiable.
Tensor whole(const Tensor& t);
// This rank's part as a plain tensor, sharing its data (t itself when it has
// no placement). Differentiable.
Tensor local(const Tensor& t);

// ---- layer helpers (every rank calls them in the same order) ------------------------------
// ctx.mp holds more than one rank.
bool tp_active(const Ctx& ctx);
// The number of model shards ctx runs with (1 without a group).
int tp_size(const Ctx& ctx);
// The dimension of parameter `leaf` that the plan cuts across ctx.mp (-1:
// whole here), after checking that this rank's tensor has the shape the plan
// gives it: `full` (the whole parameter) with that dimension divided by the
// shard count. Another shape fails, naming the parameter and the fix.
int split_of(const Params& p, std::string_view leaf, const Shape& full, const Ctx& ctx);
// x with whole features (gathered if ctx.split_features; the flag is cleared).
Tensor whole_features(const Tensor& x, Ctx& ctx);
// A whole activation entering column-parallel layers: identity forward, the
// gradient all-reduced backward (copy_to_parallel). x itself when !tp_active.
Tensor to_parallel(const Tensor& x, const Ctx& ctx);
// whole_features, then to_parallel.
Tensor enter_parallel(const Tensor& x, Ctx& ctx);
// Row-parallel partial sums reduced over ctx.mp, then the bias (once, after
// the reduction; may be undefined). Clears ctx.split_features.
Tensor leave_parallel(const Tensor& partial, const Tensor& bias, Ctx& ctx);
// x W^T + b for a Linear whose weight p[leaf] is [out, in] whole: column-split
// (output split), row-split (input split, output reduced) or replicated, as
// the plan says. `b` (this rank's part of the bias) may be undefined.
Tensor parallel_linear(const Tensor& x, const Params& p, std::string_view leaf, const Tensor& b,
                       int64_t in, int64_t out, Ctx& ctx);
// Token ids [...] -> [..., d] from the table [vocab, d] or, when the plan
// splits it (split == 0), this rank's rows of it.
Tensor parallel_embedding(const Tensor& table, int split, const Tensor& ids, Ctx& ctx);
// An LM head whose table the plan splits by vocabulary (split == 0): x
// enters the parallel region (returned) and the logits will be split.
// Otherwise x with whole features.
Tensor enter_vocab_head(const Tensor& x, int split, Ctx& ctx);
// The logits h table^T of an LM head. In training (ctx.split_output), with a
// gradient to record, they are deferred: a tensor of the logits' shape (this
// rank's columns when h entered a vocabulary-split head) with no values,
// which cross_entropy reads a chunk of rows at a time (linear_cross_entropy,
// or vocab_parallel_linear_cross_entropy when split) and nn::whole forms
// (nn/deferred_logits.cpp). Otherwise formed, split by vocabulary when h
// entered a vocabulary-split head.
Tensor vocab_head_logits(const Tensor& h, const Tensor& table, const Ctx& ctx);
// This rank's columns of a vocabulary-split head's deferred logits, formed
// (differentiably); t itself when it holds values.
Tensor form_split_logits(const Tensor& t);
// Dropout whose mask is the 1-rank mask (or this rank's slice of it when x is
// split by features): masks depend on (seed, step, call index, element).
Tensor parallel_dropout(const Tensor& x, float rate, Ctx& ctx);
// The model output: split outputs keep a placement or are gathered, as
// ctx.split_output says.
Tensor finish_output(const Tensor& y, Ctx& ctx);

// ---- vocabulary-parallel pieces ------------------------------------------------------------
// The token embedding with the table split by vocabulary rows: each rank looks
// up the ids it holds (zeros elsewhere) and the partial results are summed.
// ids i64 [...] -> [..., d], whole on every rank.
Tensor vocab_parallel_embedding(const Tensor& table_shard, const Tensor& ids, comm::Comm& mp);
// cross_entropy(whole logits, labels) from this rank's logits [..., V/mp]
// (columns [rank * V/mp, ...)): the row max and the sum of exponentials are
// all-reduced, so whole logits are never formed. Labels i64 [...]; rows
// labelled ignore_index are skipped. The loss is the same on every rank.
Tensor vocab_parallel_cross_entropy(const Tensor& logits_shard, const Tensor& labels,
                                    comm::Comm& mp, int64_t ignore_index = -100);
// cross_entropy(whole(x table^T), labels) from this rank's rows of the table
// [V/mp, d] (rows [rank * V/mp, ...)), the logits formed a chunk of token
// rows at a time and their gradient taken in forward (nn/vocab_parallel_head.cpp):
// nothing of size [tokens, V/mp] outlives its chunk. x [..., d] is the head's
// input after it entered the parallel region; labels i64 [...].
Tensor vocab_parallel_linear_cross_entropy(const Tensor& x, const Tensor& table_shard,
                                           const Tensor& labels, comm::Comm& mp,
                                           int64_t ignore_index = -100);

}  // namespace redco::nn
