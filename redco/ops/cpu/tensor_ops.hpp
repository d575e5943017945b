#pragma once
// CPU implementations of the generic tensor kernels (elementwise with
// broadcasting, reductions, layout changes, batched matmul). CpuBackend
// forwards to these; see redco/ops/backend.hpp for the semantics.
#include <span>

#include "redco/ops/backend.hpp"

namespace redco::cpu {

// elementwise.cpp
Tensor unary(UnaryOp op, const Tensor& x);
Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b);
Tensor binary_scalar(BinaryOp op, const Tensor& a, float s);
void add_inplace(Tensor& a, const Tensor& b);
// reduce.cpp
Tensor reduce(ReduceOp op, const Tensor& x, std::span<const int> axes);
Tensor argmax(const Tensor& x, int axis);
// layout.cpp
Tensor broadcast_to(const Tensor& x, const Shape& shape);
Tensor permute(const Tensor& x, std::span<const int> perm);
Tensor slice(const Tensor& x, int axis, int64_t start, int64_t len);
void slice_assign(Tensor& dst, const Tensor& src, int axis, int64_t start);
// matmul.cpp
Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b);
void matmul_into(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b, Tensor& c,
                 bool accumulate);
// How matmul computes under Precision::bf16: `automatic` picks oneDNN's bf16
// GEMM where the CPU has bf16 dot products and f32 GEMM on bf16-rounded
// operands elsewhere (the same numerics); the others force one path (tests,
// benchmarks).
enum class Bf16GemmPath { automatic, onednn, rounded };
void set_bf16_gemm_path(Bf16GemmPath path);

}  // namespace redco::cpu
