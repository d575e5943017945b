#pragma once
// Rotary position embedding (RoPE), "rotate half" convention (LLaMA / GPT-NeoX):
// for i < D/2, the pair (x[i], x[i + D/2]) at position p is rotated by angle
// p * base^(-2i/D). It is orthogonal, so the backward pass is the same rotation
// with the angle negated (`inverse`).
#include <cstdint>

namespace redco::cpu {

// x, y: [B, H, T, D] (D even); position of token t is pos_offset + t.
// y may alias x.
void rotary_apply(const float* x, float* y, int64_t B, int64_t H, int64_t T, int64_t D,
                  int64_t pos_offset, float base, bool inverse);

}  // namespace redco::cpu
