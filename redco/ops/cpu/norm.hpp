#pragma once
// Fused layer norm and RMS norm over the last dimension of an [N, D] matrix.
#include <cstdint>

namespace redco::cpu {

// y = (x - mean) * rstd * gamma + beta. beta may be null (no bias).
// Saves mean[N] and rstd[N] = 1/sqrt(var + eps) for the backward pass.
void layer_norm_forward(const float* x, const float* gamma, const float* beta, float* y,
                        float* mean, float* rstd, int64_t N, int64_t D, float eps);
// Writes dx[N,D], dgamma[D] and (if non-null) dbeta[D]; nothing is accumulated.
void layer_norm_backward(const float* dy, const float* x, const float* gamma, const float* mean,
                         const float* rstd, float* dx, float* dgamma, float* dbeta, int64_t N,
                         int64_t D);

// y = x * rstd * gamma with rstd = 1/sqrt(mean(x^2) + eps); saves rstd[N].
void rms_norm_forward(const float* x, const float* gamma, float* y, float* rstd, int64_t N,
                      int64_t D, float eps);
void rms_norm_backward(const float* dy, const float* x, const float* gamma, const float* rstd,
                       float* dx, float* dgamma, int64_t N, int64_t D);

}  // namespace redco::cpu
