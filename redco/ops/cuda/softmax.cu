// Softmax, log-softmax and cross entropy over the rows of [N, D]: one block
// per row, with the same max-shifted formulations as ops/cpu/softmax.cpp (so
// exp never overflows and a confident prediction's loss is not swamped by
// the rounding of the log-sum-exp).
#include "redco/ops/cuda/block_reduce.cuh"
#include "redco/ops/cuda/cuda_util.hpp"

namespace redco::cuda::k {
namespace {

__device__ float row_max(const float* x, int64_t D, float* s) {
  float m = -INFINITY;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) m = fmaxf(m, x[j]);
  return block_max(m, s);
}

__device__ float row_sum_exp(const float* x, int64_t D, float m, float* s) {
  float acc = 0.f;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) acc += expf(x[j] - m);
  return block_sum(acc, s);
}

__global__ void softmax_fwd(const float* x, float* y, int64_t D, bool log) {
  __shared__ float s[kRowThreads / 32];
  const float* xr = x + int64_t(blockIdx.x) * D;
  float* yr = y + int64_t(blockIdx.x) * D;
  const float m = row_max(xr, D, s);
  const float sum = row_sum_exp(xr, D, m, s);
  const float log_s = logf(sum), inv = 1.f / sum;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x)
    yr[j] = log ? (xr[j] - m) - log_s : expf(xr[j] - m) * inv;
}

// softmax: dx = y (dy - sum(dy y)); log_softmax: dx = dy - exp(y) sum(dy).
__global__ void softmax_bwd(const float* y, const float* dy, float* dx, int64_t D, bool log) {
  __shared__ float s[kRowThreads / 32];
  const int64_t off = int64_t(blockIdx.x) * D;
  float acc = 0.f;
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x)
    acc += log ? dy[off + j] : dy[off + j] * y[off + j];
  const float dot = block_sum(acc, s);
  for (int64_t j = threadIdx.x; j < D; j += blockDim.x) {
    const int64_t i = off + j;
    dx[i] = log ? dy[i] - expf(y[i]) * dot : y[i] * (dy[i] - dot);
  }
}

__global__ void ce_fwd(const float* logits, const int64_t* labels, float* losses, float* lse,
                       int64_t V, int64_t ignore_index) {
  __shared__ float s[kRowThreads / 32];
  const int64_t n = blockIdx.x;
  if (labels[n] == ignore_index) {  // whole block takes the same branch
    if (threadIdx.x == 0) losses[n] = lse[n] = 0.f;
    return;
  }
  const float* xr = logits + n * V;
  const float m = row_max(xr, V, s);
  const float log_s = logf(row_sum_exp(xr, V, m, s));
  if (threadIdx.x == 0) {
    losses[n] = (m - xr[labels[n]]) + log_s;
    lse[n] = m + log_s;
  }
}

__global__ void ce_bwd(const float* logits, const int64_t* labels, const float* lse,
                       const float* dloss, float* dlogits, int64_t V, int64_t ignore_index) {
  const int64_t n = blockIdx.x;
  const bool ignored = labels[n] == ignore_index;
  const float dl = ignored ? 0.f : dloss[n];
  for (int64_t j = threadIdx.x; j < V; j += blockDim.x) {
    const int64_t i = n * V + j;
    dlogits[i] = ignored ? 0.f : expf(logits[i] - lse[n]) * dl - (j == labels[n] ? dl : 0.f);
  }
}

}  // namespace

void softmax_forward(const float* x, float* y, int64_t N, int64_t D, bool log) {
  if (N == 0) return;
  softmax_fwd<<<unsigned(N), kRowThreads, 0, stream()>>>(x, y, D, log);
  check_launch(log ? "log_softmax" : "softmax");
}

void softmax_backward(const float* y, const float* dy, float* dx, int64_t N, int64_t D, bool log) {
  if (N == 0) return;
  softmax_bwd<<<unsigned(N), kRowThreads, 0, stream()>>>(y, dy, dx, D, log);
  check_launch(log ? "log_softmax backward" : "softmax backward");
}

void cross_entropy_forward(const float* logits, const int64_t* labels, float* losses, float* lse,
                           int64_t N, int64_t V, int64_t ignore_index) {
  if (N == 0) return;
  ce_fwd<<<unsigned(N), kRowThreads, 0, stream()>>>(logits, labels, losses, lse, V, ignore_index);
  check_launch("cross_entropy");
}

void cross_entropy_backward(const float* logits, const int64_t* labels, const float* lse,
                            const float* dloss, float* dlogits, int64_t N, int64_t V,
                            int64_t ignore_index) {
  if (N == 0) return;
  ce_bwd<<<unsigned(N), kRowThreads, 0, stream()>>>(logits, labels, lse, dloss, dlogits, V,
                                                    ignore_index);
  check_launch("cross_entropy backward");
}

}  // namespace redco::cuda::k
