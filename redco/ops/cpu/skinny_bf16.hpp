#pragma once
// A few rows of f32 activations against a weight stored in bf16:
//   y[m, n] = sum_k x[m, k] * w[n, k]       x f32 [M, K], w bf16 [N, K], y f32 [M, N]
// the shape of every projection while decoding (M = sequences in the batch).
// Decoding is bound by reading the weights, so this reads each bf16 row once
// from memory (half the bytes of f32) and widens it in registers, where the
// general path would first widen the whole matrix into a fresh f32 copy: three
// times the memory traffic of the f32 model instead of half. Products
// accumulate in f32, as the f32 GEMM on the widened weight does (only the
// order of the sums differs).
#include <cstdint>

namespace redco::cpu {

// Above this many rows the general path (one widened copy, then a GEMM that
// reuses it across rows) is faster.
inline constexpr int64_t kSkinnyRows = 16;

// ldx, ldw, ldy: elements between consecutive rows of x, w and y.
void skinny_matmul_bf16(const float* x, int64_t ldx, const uint16_t* w, int64_t ldw, float* y,
                        int64_t ldy, int64_t M, int64_t N, int64_t K);

}  // namespace redco::cpu
