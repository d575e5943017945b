#pragma once
// Pointwise activations with their fused derivatives.
#include <cstdint>

namespace redco::cpu {

// tanh_approx: GELU(x) ~= 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) (GPT-2);
// otherwise the exact 0.5 x (1 + erf(x / sqrt 2)).
void gelu_forward(const float* x, float* y, int64_t n, bool tanh_approx);
void gelu_backward(const float* x, const float* dy, float* dx, int64_t n, bool tanh_approx);
// SiLU(x) = x * sigmoid(x)
void silu_forward(const float* x, float* y, int64_t n);
void silu_backward(const float* x, const float* dy, float* dx, int64_t n);

}  // namespace redco::cpu
