#pragma once
// Many rows (a prefill) of f32 activations against a bf16 weight packed in
// decode panels (redco/ops/cpu/panel_layout.hpp), on the CPU's bf16
// dot-product units:
//   y[m, n] = sum_k bf16(x[m, k]) * w[n, k]   x f32 [M, K], w bf16 [N, K], y f32 [M, N]
// The activations are rounded to bf16 first (as llama.cpp and PyTorch's bf16
// GEMMs do), so a product of two bf16 values is exact in f32 and each
// instruction multiplies pairs of k: twice the multiply-adds of an f32 FMA per
// lane (vdpbf16ps), or a 16 x 16 x 32 block per instruction (AMX). The decode
// kernel (skinny_panels.hpp) keeps f32 activations and one FMA chain per
// output; this one trades that for speed where rows are many.
//
// A row's result depends neither on M nor on the other rows (each output sums
// its own k in a fixed order per unit), so a prompt prefilled inside a batch
// gets the bits it gets alone. The two units sum in different orders: results
// agree to f32 rounding, not bit for bit.
#include <cstdint>

namespace redco::cpu {

enum class PrefillUnit {
  none,    // neither unit: the caller keeps the f32 chain kernel
  dpbf16,  // AVX512_BF16 vdpbf16ps
  amx,     // AMX tiles (tdpbf16ps)
};

// The fastest unit this CPU and build offer (AMX needs the kernel's
// permission, asked once per process).
PrefillUnit best_prefill_unit();
// The unit linear layers use: best_prefill_unit() (vdpbf16ps only where it
// beats the f32 chain kernel, timed once), or the environment's
// REDCO_PREFILL (chain, dpbf16, amx) for A/B runs.
PrefillUnit prefill_unit();

// panels: the packed storage of w; ldx, ldy: elements between rows of x and y.
// unit: not none, and at most best_prefill_unit() (AMX CPUs have vdpbf16ps).
void prefill_matmul_panels(const float* x, int64_t ldx, const uint16_t* panels, float* y,
                           int64_t ldy, int64_t M, int64_t N, int64_t K, PrefillUnit unit);

// The same against an int8 weight packed in decode panels (pack_panels_i8):
//   y[m, n] = scale[n] * sum_k bf16(x[m, k]) * q[n, k]
// each int8 value exact in bf16 (the weight is never widened in memory: each
// task repacks half a panel, in L2, as pairs of k).
void prefill_matmul_i8_panels(const float* x, int64_t ldx, const int8_t* panels, const float* scale,
                              float* y, int64_t ldy, int64_t M, int64_t N, int64_t K,
                              PrefillUnit unit);

// Rows from which a linear layer against panels takes this kernel rather
// than the f32 chain (the chain stays exact and batch-invariant for decode
// steps and short prompts; measured crossover: see prefill_panels.cpp).
inline constexpr int64_t kPrefillRows = 32;  // one AMX block of rows

}  // namespace redco::cpu
