#pragma once
// Group norm and nearest-neighbour upsampling over images [N, C, S] (S = H*W,
// or any spatial extent flattened): the two image kernels a diffusion UNet
// needs beyond convolution.
#include <cstdint>

namespace redco::cpu {

struct GroupNormGeometry {
  int64_t N, C, S, G;                     // batch, channels, spatial size, groups (G divides C)
  int64_t rows() const { return N * G; }  // one statistic per (n, group)
  int64_t row_size() const { return (C / G) * S; }  // the elements a statistic covers
};

// y[n, c, s] = (x - mean[n, g]) * rstd[n, g] * gamma[c] + beta[c], g = c / (C/G).
// Saves mean and rstd [N*G] for the backward pass.
void group_norm_forward(const float* x, const float* gamma, const float* beta, float* y,
                        float* mean, float* rstd, const GroupNormGeometry& g, float eps);
// Writes dx [N, C, S], dgamma [C] and dbeta [C] (if non-null); nothing accumulated.
// `partials` is scratch of 2*N*C floats.
void group_norm_backward(const float* dy, const float* x, const float* gamma, const float* mean,
                         const float* rstd, float* dx, float* dgamma, float* dbeta, float* partials,
                         const GroupNormGeometry& g);

// Nearest-neighbour upsampling by an integer factor f: x [P, H, W] (P = N*C
// planes) -> y [P, H*f, W*f], each input pixel repeated over an f x f block.
void upsample_nearest2d_forward(const float* x, float* y, int64_t P, int64_t H, int64_t W,
                                int64_t f);
// Its adjoint: dx [P, H, W] = the sum of dy [P, H*f, W*f] over each f x f block.
void upsample_nearest2d_backward(const float* dy, float* dx, int64_t P, int64_t H, int64_t W,
                                 int64_t f);

}  // namespace redco::cpu
