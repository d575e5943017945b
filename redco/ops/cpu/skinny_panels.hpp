#pragma once
// Rows of f32 activations against a bf16 weight packed in decode panels
// (redco/ops/cpu/panel_layout.hpp):
//   y[m, n] = sum_k x[m, k] * w[n, k]       x f32 [M, K], w bf16 [N, K], y f32 [M, N]
// Each output is one FMA chain over k in order, starting from zero, so its
// bits depend neither on M nor on the vector width (AVX-512, AVX2 and the
// scalar loop agree exactly) nor on the threads. Decode steps (a few rows) and
// prefills (hundreds: rows past the first 8 read each panel again from L2).
#include <cstdint>

namespace redco::cpu {

// panels: the packed storage of w; ldx, ldy: elements between rows of x and y.
void skinny_matmul_panels(const float* x, int64_t ldx, const uint16_t* panels, float* y,
                          int64_t ldy, int64_t M, int64_t N, int64_t K);

// Whether packing bf16 weights in panels pays for decoding on this build's
// CPU target: measured on AVX-512 only; elsewhere the row-major kernel stays.
bool panels_pay();

}  // namespace redco::cpu
