#pragma once
// The op list's meta functions: one per op of ops/op_list.hpp, with the op's
// own parameters, device-independent. Each checks what every backend needs of
// its arguments (ranks, shapes, dtypes, axes, sizes, argument ranges) and
// throws the one message a user sees, naming the op and the fix. The
// `kernels::` entry points call it before they pick a backend (ops/backend.hpp),
// so the CPU, test-device and CUDA kernels start from arguments known to be
// valid and check again only what is theirs (a CUDA GEMM's int dimensions, an
// id read on the device). Meta functions read their arguments and never write
// them, though output parameters (`Tensor& lse`) arrive as the op declares
// them.
//
// What is read from tensor values rather than shapes is checked here too
// where the values are host bookkeeping (a paged KV cache's block table,
// attention's per-row key ranges); ids and labels on a device stay with the
// kernels that read them.
#include <array>
#include <span>

#include "redco/ops/op_list.hpp"
#include "redco/ops/op_types.hpp"

namespace redco::meta {

#define REDCO_OP_META(ret, name, params, args) void name params;
REDCO_OPS(REDCO_OP_META)
#undef REDCO_OP_META

// The shape of an op's result where deriving it is more than a copy of an
// input's, for the backends to allocate by (each assumes its op's meta
// function passed).
Shape matmul_shape(const Shape& a, const Shape& b, bool trans_a, bool trans_b);
// A reduction over sorted `axes` as every backend runs it: one pass per run
// of adjacent reduced axes, innermost first, each viewing the current shape
// as [outer, reduced, inner] and collapsing the run to 1s (`out`).
struct ReducePass {
  int64_t outer, reduced, inner;
  Shape out;
};
struct ReducePasses {
  std::array<ReducePass, Shape::kMaxRank> pass;
  int count = 0;
};
ReducePasses reduce_passes(const Shape& x, std::span<const int> axes);
Shape conv2d_shape(const Shape& x, const Shape& w, int64_t stride, int64_t pad);
Shape pooled_shape(const Shape& x, int64_t k, int64_t stride);

}  // namespace redco::meta
