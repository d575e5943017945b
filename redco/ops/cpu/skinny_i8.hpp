#pragma once
// A few rows of f32 activations against an int8 weight quantized by rows:
//   y[m, n] = scale[n] * sum_k x[m, k] * q[n, k]     x f32 [M, K], q i8 [N, K], y f32 [M, N]
// the decode projections of a model loaded with --dtype i8 (quantize_rows).
// Decoding streams the weights: one byte a weight is a quarter of f32's and
// half of bf16's traffic. Each row is read once, widened to f32 in registers
// and accumulated in f32; the row's scale multiplies the finished sum.
#include <cstdint>

namespace redco::cpu {

// ldx, ldw, ldy: elements between consecutive rows of x, q and y; M at most kSkinnyRows.
void skinny_matmul_i8(const float* x, int64_t ldx, const int8_t* q, int64_t ldw, const float* scale,
                      float* y, int64_t ldy, int64_t M, int64_t N, int64_t K);

}  // namespace redco::cpu
