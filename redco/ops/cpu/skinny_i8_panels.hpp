#pragma once
// Rows of f32 activations against an int8 weight packed in decode panels
// (pack_panels_i8, redco/ops/cpu/panel_layout.hpp):
//   y[m, n] = scale[n] * sum_k x[m, k] * q[n, k]   x f32 [M, K], q i8 [N, K], y f32 [M, N]
// Each output is one FMA chain over k in order from zero, times its row's
// scale at the end, so its bits depend neither on M nor on the vector width
// (the AVX-512 kernel and the scalar loop agree exactly) nor on the threads.
// The matrix streams as one straight read per pair of panels: a byte a weight,
// half of bf16's traffic, at bf16 panels' bytes per second (the row-major
// int8 kernel, whose rows are 2-6 KB streams, reached three quarters of it).
#include <cstdint>

namespace redco::cpu {

// panels, scale: the packed storage and row scales of q; ldx, ldy: elements between rows of x, y.
void skinny_matmul_i8_panels(const float* x, int64_t ldx, const int8_t* panels, const float* scale,
                             float* y, int64_t ldy, int64_t M, int64_t N, int64_t K);

}  // namespace redco::cpu
