#pragma once
// The argument types of the op list's kernels (ops/op_list.hpp) beside
// tensors: which elementwise op, what attention takes beyond q, k, v, what a
// norm saves for its backward, the optimizers' coefficients.
#include "redco/core/tensor.hpp"
#include "redco/ops/optim_update.hpp"

namespace redco {

enum class UnaryOp {
  neg,
  exp,
  log,
  tanh,
  sqrt,
  rsqrt,
  sigmoid,
  relu,
  erf,
  abs,
  square,
  reciprocal,
  step,  // 1 where x > 0 else 0 (the derivative of relu)
};
// Comparisons (eq, gt) yield 1.f / 0.f in the output dtype (f32).
enum class BinaryOp { add, sub, mul, div, max, min, pow, eq, gt };
// The op's name in messages ("add", "gt").
inline const char* binary_name(BinaryOp op) {
  switch (op) {
    case BinaryOp::add:
      return "add";
    case BinaryOp::sub:
      return "sub";
    case BinaryOp::mul:
      return "mul";
    case BinaryOp::div:
      return "div";
    case BinaryOp::max:
      return "max";
    case BinaryOp::min:
      return "min";
    case BinaryOp::pow:
      return "pow";
    case BinaryOp::eq:
      return "eq";
    case BinaryOp::gt:
      return "gt";
  }
  return "binary";
}
enum class ReduceOp { sum, max };

// What attention may take beyond q, k, v: per-batch-row key ranges (padded
// batches, left or right: row b sees keys [key_begin[b], key_end[b]) only;
// a query that sees no key gets a zero output) and an additive bias on the
// scaled scores (T5's relative position bias), differentiable.
struct AttentionExtras {
  Tensor key_begin, key_end;  // i64 [B] on q's device, or undefined (all keys)
  // i64 [B] on q's device, or undefined (Tk - Tq): with causal, query i of row b
  // sees keys j <= i + causal_offset[b] (a KV cache's rows of other lengths).
  Tensor causal_offset;
  Tensor bias;  // f32 [Hq, Tq, Tk], [B, Hq, Tq, Tk] (per row), or undefined
  // i64 [B, blocks a row] on the CPU, or undefined: k and v are then the
  // pools of a paged KV cache [N, Hkv, block, D] and row b's keys are the
  // blocks it names (ops/paged_kv.hpp; Tk = blocks a row x block). Forward
  // only, without a bias.
  Tensor block_table;
};

struct LayerNormSaved {
  Tensor mean, rstd;  // [rows] each; mean undefined for RMS norm
};

}  // namespace redco
