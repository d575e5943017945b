// The optimizers' element loops on CUDA (Backend::sgd_update, adam_update,
// sum_of_squares), the arithmetic of ops/cpu/optim_update.cpp element for
// element: one fused pass over parameter, gradient and state per tensor.
// sum_of_squares accumulates in double over a fixed partition (one partial
// per block, then one block sums the partials in order), so the gradient
// norm is bitwise the same from run to run.
#include "redco/ops/cuda/cuda_util.hpp"
#include "redco/ops/cuda/optim_cuda.hpp"

namespace redco::cuda::k {
namespace {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 1024;

__global__ void sgd_k(float* p, const float* g, float* b, SgdCoeffs c, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    float gi = g[i] * c.gscale + c.wd * p[i];
    if (b) {
      const float bi = c.fresh ? gi : c.momentum * b[i] + c.damp_keep * gi;
      b[i] = bi;
      gi = c.nesterov ? gi + c.momentum * bi : bi;
    }
    p[i] -= c.lr * gi;
  }
}

__global__ void adam_k(float* p, const float* g, float* m, float* v, AdamCoeffs c, int64_t n) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float pi = p[i], gi = g[i] * c.gscale + c.l2 * pi;
    const float mi = c.b1 * m[i] + c.one_minus_b1 * gi;
    const float vi = c.b2 * v[i] + c.one_minus_b2 * (gi * gi);
    m[i] = mi;
    v[i] = vi;
    p[i] = pi * c.keep - c.step_size * (mi / (sqrtf(vi) / c.bc2_sqrt + c.eps));
  }
}

// Block-wide sum in double with a fixed shape (shared-memory tree).
__device__ double block_sum_double(double v, double* s) {
  s[threadIdx.x] = v;
  __syncthreads();
  for (int w = kThreads / 2; w > 0; w >>= 1) {
    if (threadIdx.x < w) s[threadIdx.x] += s[threadIdx.x + w];
    __syncthreads();
  }
  return s[0];
}

// partials[block] = sum of squares of the block's fixed chunk.
__global__ void squares_k(const float* x, double* partials, int64_t n, int64_t chunk) {
  __shared__ double s[kThreads];
  const int64_t begin = int64_t(blockIdx.x) * chunk, end = begin + chunk < n ? begin + chunk : n;
  double acc = 0.0;
  for (int64_t i = begin + threadIdx.x; i < end; i += kThreads) acc += double(x[i]) * double(x[i]);
  const double total = block_sum_double(acc, s);
  if (threadIdx.x == 0) partials[blockIdx.x] = total;
}

__global__ void sum_partials_k(const double* partials, double* out, int64_t blocks) {
  __shared__ double s[kThreads];
  double acc = 0.0;
  for (int64_t i = threadIdx.x; i < blocks; i += kThreads) acc += partials[i];
  const double total = block_sum_double(acc, s);
  if (threadIdx.x == 0) *out = total;
}

unsigned grid_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return unsigned(b < 1 ? 1 : (b > 65536 ? 65536 : b));
}

}  // namespace

void sgd_update(float* p, const float* g, float* buf, const SgdCoeffs& c, int64_t n) {
  if (n == 0) return;
  sgd_k<<<grid_for(n), kThreads, 0, stream()>>>(p, g, buf, c, n);
  check_launch("sgd_update");
}

void adam_update(float* p, const float* g, float* m, float* v, const AdamCoeffs& c, int64_t n) {
  if (n == 0) return;
  adam_k<<<grid_for(n), kThreads, 0, stream()>>>(p, g, m, v, c, n);
  check_launch("adam_update");
}

int64_t squares_blocks(int64_t n) {
  const int64_t b = (n + 65535) / 65536;  // about 64 Ki elements per block
  return b < 1 ? 1 : (b > kMaxBlocks ? kMaxBlocks : b);
}

void sum_of_squares(const float* x, int64_t n, double* partials, int64_t blocks, double* out) {
  const int64_t chunk = (n + blocks - 1) / blocks;
  squares_k<<<unsigned(blocks), kThreads, 0, stream()>>>(x, partials, n, chunk < 1 ? 1 : chunk);
  check_launch("sum_of_squares");
  sum_partials_k<<<1, kThreads, 0, stream()>>>(partials, out, blocks);
  check_launch("sum_of_squares (partials)");
}

}  // namespace redco::cuda::k
