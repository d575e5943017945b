#pragma once
// Many rows (a prefill) of f32 activations against an int8 weight quantized
// by rows (quantized_rows.hpp):
//   y[m, n] = scale[n] * sum_k x[m, k] * q[n, k]    x f32 [M, K], q i8 [N, K], y f32 [M, N]
// Two kernels, neither of which widens the weight to f32 in memory (the old
// path wrote 4 bytes a weight and ran sgemm: a 1.1B model's 17-token prompt
// spent 0.6 s there):
// - rows: the decode kernel (skinny_i8.hpp), 16 rows a pass over blocks of
//   weight rows that stay in L2, so the matrix streams from memory once.
//   Every output is the decode kernel's f32 sum: exact f32 activations, and a
//   row's bits do not depend on the batch.
// - amx: the weight as AMX's left operand (each int8 value is exact in bf16),
//   the activations rounded to bf16 (as prefill_panels.hpp does).
#include <cstdint>

#include "redco/ops/cpu/prefill_panels.hpp"

namespace redco::cpu {

// ldx, ldw, ldy: elements between rows of x, q and y. unit: none (the rows
// kernel, any CPU) or amx (where best_prefill_unit() is amx).
void prefill_matmul_i8(const float* x, int64_t ldx, const int8_t* q, int64_t ldw,
                       const float* scale, float* y, int64_t ldy, int64_t M, int64_t N, int64_t K,
                       PrefillUnit unit);

}  // namespace redco::cpu
