// Group norm and nearest upsampling over images [N, C, S] (S = H*W), the
// CUDA twins of ops/cpu/group_norm.cpp.
//
// Group norm: one block per (sample, group) slab of (C/G)*S contiguous floats,
// with the corrected two-pass variance of the CPU kernel. The backward writes
// per-(sample, channel) sums of dy*xhat and dy into [2, N, C] partials; the
// backend sums them over the batch with a fixed-order reduction, so dgamma and
// dbeta are deterministic (no atomics), as on the CPU.
// Upsampling: one thread per output element forward; the backward gives one
// thread per input pixel the sum of its f x f block, so it too is atomic-free.
#include "redco/ops/cuda/block_reduce.cuh"
#include "redco/ops/cuda/cuda_util.hpp"

namespace redco::cuda::k {
namespace {

__global__ void gn_fwd(const float* x, const float* gamma, const float* beta, float* y, float* mean,
                       float* rstd, int64_t G, int64_t Cg, int64_t S, float eps) {
  __shared__ float s[kRowThreads / 32];
  const int64_t r = blockIdx.x, D = Cg * S, c0 = (r % G) * Cg;
  const float* xr = x + r * D;
  float* yr = y + r * D;
  const float inv_d = 1.f / float(D);
  float acc = 0.f;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) acc += xr[j];
  const float m0 = block_sum(acc, s) * inv_d;
  float ac = 0.f, aq = 0.f;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    const float d = xr[j] - m0;
    ac += d;
    aq += d * d;
  }
  const float c = block_sum(ac, s) * inv_d;
  const float var = fmaxf(block_sum(aq, s) * inv_d - c * c, 0.f);
  const float rs = 1.f / sqrtf(var + eps), m = m0 + c;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    const int64_t ch = c0 + j / S;
    const float v = (xr[j] - m) * rs * gamma[ch];
    yr[j] = beta ? v + beta[ch] : v;
  }
  if (threadIdx.x == 0) mean[r] = m, rstd[r] = rs;
}

// dx = rstd (dy*gamma - mean(dy*gamma) - xhat * mean(dy*gamma*xhat)) over the
// slab; the per-channel sums it needs are also the dgamma/dbeta partials.
__global__ void gn_bwd(const float* dy, const float* x, const float* gamma, const float* mean,
                       const float* rstd, float* dx, float* sxh, float* sdy, int64_t G, int64_t C,
                       int64_t Cg, int64_t S) {
  __shared__ float s[kRowThreads / 32];
  const int64_t r = blockIdx.x, D = Cg * S, c0 = (r % G) * Cg, nc0 = (r / G) * C + c0;
  const float m = mean[r], rs = rstd[r];
  float a = 0.f, b = 0.f;  // every thread ends with the slab's sums of dy*gamma, dy*gamma*xhat
  for (int64_t k = 0; k < Cg; ++k) {
    const float* xs = x + r * D + k * S;
    const float* ds = dy + r * D + k * S;
    float p = 0.f, q = 0.f;
    for (int64_t j = threadIdx.x; j < S; j += blockDim.x) {
      p += ds[j] * (xs[j] - m) * rs;
      q += ds[j];
    }
    const float sx = block_sum(p, s), sd = block_sum(q, s);
    if (threadIdx.x == 0) sxh[nc0 + k] = sx, sdy[nc0 + k] = sd;
    a += gamma[c0 + k] * sd;
    b += gamma[c0 + k] * sx;
  }
  a /= float(D), b /= float(D);
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    const int64_t off = r * D + j;
    const float xhat = (x[off] - m) * rs;
    dx[off] = rs * (dy[off] * gamma[c0 + j / S] - a - xhat * b);
  }
}

__global__ void up_fwd(const float* x, float* y, int64_t n, int64_t H, int64_t W, int64_t f) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int64_t OW = W * f, OH = H * f;
  const int64_t ow = i % OW, oh = (i / OW) % OH, p = i / (OW * OH);
  y[i] = x[(p * H + oh / f) * W + ow / f];
}

__global__ void up_bwd(const float* dy, float* dx, int64_t n, int64_t H, int64_t W, int64_t f) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int64_t OW = W * f, w = i % W, h = (i / W) % H, p = i / (W * H);
  const float* d0 = dy + (p * H * f + h * f) * OW + w * f;
  float acc = 0.f;
  for (int64_t a = 0; a < f; ++a)
    for (int64_t b = 0; b < f; ++b) acc += d0[a * OW + b];
  dx[i] = acc;
}

unsigned blocks_for(int64_t n) { return unsigned((n + 255) / 256); }

}  // namespace

void group_norm_forward(const float* x, const float* gamma, const float* beta, float* y,
                        float* mean, float* rstd, int64_t N, int64_t C, int64_t S, int64_t G,
                        float eps) {
  if (N * G == 0) return;
  gn_fwd<<<unsigned(N * G), kRowThreads, 0, stream()>>>(x, gamma, beta, y, mean, rstd, G, C / G, S,
                                                        eps);
  check_launch("group_norm");
}

void group_norm_backward(const float* dy, const float* x, const float* gamma, const float* mean,
                         const float* rstd, float* dx, float* partials, int64_t N, int64_t C,
                         int64_t S, int64_t G) {
  if (N * G == 0) return;
  gn_bwd<<<unsigned(N * G), kRowThreads, 0, stream()>>>(dy, x, gamma, mean, rstd, dx, partials,
                                                        partials + N * C, G, C, C / G, S);
  check_launch("group_norm backward");
}

void upsample_nearest2d_forward(const float* x, float* y, int64_t P, int64_t H, int64_t W,
                                int64_t f) {
  const int64_t n = P * H * f * W * f;
  if (n == 0) return;
  up_fwd<<<blocks_for(n), 256, 0, stream()>>>(x, y, n, H, W, f);
  check_launch("upsample_nearest2d");
}

void upsample_nearest2d_backward(const float* dy, float* dx, int64_t P, int64_t H, int64_t W,
                                 int64_t f) {
  const int64_t n = P * H * W;
  if (n == 0) return;
  up_bwd<<<blocks_for(n), 256, 0, stream()>>>(dy, dx, n, H, W, f);
  check_launch("upsample_nearest2d backward");
}

}  // namespace redco::cuda::k
