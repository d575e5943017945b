// Layer norm and RMS norm over the rows of [N, D] (mean == nullptr selects
// RMS). Forward and dx: one block per row, with the corrected two-pass
// variance of ops/cpu/norm.cpp. dgamma/dbeta: fixed chunks of rows each write
// their own partial sums, which the backend then adds in chunk order, so the
// gradients are deterministic (no atomics).
#include "redco/ops/cuda/block_reduce.cuh"
#include "redco/ops/cuda/cuda_util.hpp"

namespace redco::cuda::k {
namespace {

constexpr int64_t kRowsPerChunk = 64;
constexpr int64_t kMaxChunks = 1024;

__global__ void norm_fwd(const float* x, const float* gamma, const float* beta, float* y,
                         float* mean, float* rstd, int64_t D, float eps) {
  __shared__ float s[kRowThreads / 32];
  const int64_t n = blockIdx.x;
  const float* xr = x + n * D;
  float* yr = y + n * D;
  const float inv_d = 1.f / float(D);
  float m0 = 0.f, c = 0.f, r;
  if (mean) {
    float acc = 0.f;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) acc += xr[j];
    m0 = block_sum(acc, s) * inv_d;
    float ac = 0.f, aq = 0.f;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
      const float d = xr[j] - m0;
      ac += d;
      aq += d * d;
    }
    c = block_sum(ac, s) * inv_d;
    const float var = fmaxf(block_sum(aq, s) * inv_d - c * c, 0.f);
    r = 1.f / sqrtf(var + eps);
  } else {
    float aq = 0.f;
    for (int64_t j = threadIdx.x; j < D; j += blockDim.x) aq += xr[j] * xr[j];
    r = 1.f / sqrtf(block_sum(aq, s) * inv_d + eps);
  }
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    const float v = mean ? ((xr[j] - m0) - c) * r * gamma[j] : xr[j] * r * gamma[j];
    yr[j] = beta ? v + beta[j] : v;
  }
  if (threadIdx.x == 0) {
    if (mean) mean[n] = m0 + c;
    rstd[n] = r;
  }
}

// dx = rstd (g - mean(g) - xhat mean(g xhat)) with g = dy gamma; RMS drops mean(g).
__global__ void norm_bwd_dx(const float* dy, const float* x, const float* gamma, const float* mean,
                            const float* rstd, float* dx, int64_t D) {
  __shared__ float s[kRowThreads / 32];
  const int64_t off = int64_t(blockIdx.x) * D;
  const float m = mean ? mean[blockIdx.x] : 0.f, r = rstd[blockIdx.x];
  const float inv_d = 1.f / float(D);
  float aa = 0.f, ab = 0.f;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    const float g = dy[off + j] * gamma[j];
    aa += g;
    ab += g * (x[off + j] - m) * r;
  }
  const float a = mean ? block_sum(aa, s) * inv_d : 0.f;
  const float b = block_sum(ab, s) * inv_d;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    const float xhat = (x[off + j] - m) * r;
    dx[off + j] = r * ((dy[off + j] * gamma[j] - a) - xhat * b);
  }
}

// partials[c, 0, j] = sum over the chunk's rows of dy * xhat, [c, 1, j] of dy.
__global__ void norm_bwd_partials(const float* dy, const float* x, const float* mean,
                                  const float* rstd, float* partials, int64_t N, int64_t D,
                                  int64_t rows_per) {
  const int64_t j = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (j >= D) return;
  const int64_t c = blockIdx.y, r0 = c * rows_per, r1 = r0 + rows_per < N ? r0 + rows_per : N;
  float dg = 0.f, db = 0.f;
  for (int64_t n = r0; n < r1; ++n) {
    const float d = dy[n * D + j];
    dg += d * (x[n * D + j] - (mean ? mean[n] : 0.f)) * rstd[n];
    db += d;
  }
  partials[c * 2 * D + j] = dg;
  partials[c * 2 * D + D + j] = db;
}

}  // namespace

void norm_forward(const float* x, const float* gamma, const float* beta, float* y, float* mean,
                  float* rstd, int64_t N, int64_t D, float eps) {
  if (N == 0) return;
  norm_fwd<<<unsigned(N), kRowThreads, 0, stream()>>>(x, gamma, beta, y, mean, rstd, D, eps);
  check_launch(mean ? "layer_norm" : "rms_norm");
}

int64_t norm_chunks(int64_t N) {
  const int64_t c = (N + kRowsPerChunk - 1) / kRowsPerChunk;
  return c < 1 ? 1 : (c > kMaxChunks ? kMaxChunks : c);
}

void norm_backward(const float* dy, const float* x, const float* gamma, const float* mean,
                   const float* rstd, float* dx, float* partials, int64_t chunks, int64_t N,
                   int64_t D) {
  const int64_t rows_per = (N + chunks - 1) / chunks;
  if (N > 0) {
    norm_bwd_dx<<<unsigned(N), kRowThreads, 0, stream()>>>(dy, x, gamma, mean, rstd, dx, D);
    check_launch("norm backward (dx)");
  }
  const dim3 grid(unsigned((D + 255) / 256), unsigned(chunks));
  norm_bwd_partials<<<grid, 256, 0, stream()>>>(dy, x, mean, rstd, partials, N, D, rows_per);
  check_launch("norm backward (dgamma)");
}

}  // namespace redco::cuda::k
