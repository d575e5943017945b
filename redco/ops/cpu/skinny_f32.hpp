#pragma once
// A few rows of f32 activations against an f32 weight stored [N, K]:
//   y[m, n] = sum_k x[m, k] * w[n, k]       x [M, K], w [N, K], y [M, N]
// the shape of every projection while decoding (M = sequences in the batch,
// at most kSkinnyRows). Decoding is bound by reading the weights; the general
// GEMM, tuned for large M, reaches about 40% of the read bandwidth on GPT-2's
// matrices at M = 1. This streams each weight row once, with software
// prefetch, against up to four activation rows held in registers.
#include <cstdint>

namespace redco::cpu {

// ldx, ldw, ldy: elements between consecutive rows of x, w and y.
void skinny_matmul_f32(const float* x, int64_t ldx, const float* w, int64_t ldw, float* y,
                       int64_t ldy, int64_t M, int64_t N, int64_t K);

}  // namespace redco::cpu
