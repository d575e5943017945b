// Convolution's im2col / col2im and 2-D pooling on CUDA, NCHW, the layouts
// of ops/cpu/conv.hpp. Every backward is written as a gather (each input
// pixel sums the outputs that read it, in a fixed order), so overlapping
// windows need no atomics and the results do not depend on scheduling.
#include "redco/ops/cuda/conv_cuda.hpp"
#include "redco/ops/cuda/cuda_util.hpp"

namespace redco::cuda::k {
namespace {

unsigned blocks_for(int64_t n) { return unsigned((n + 255) / 256); }

// cols [N, C*KH*KW, OH*OW]: one thread per column entry.
__global__ void im2col_k(const float* x, float* cols, ConvDims g, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int64_t OH = g.out_h(), OW = g.out_w();
  const int64_t ow = i % OW, oh = (i / OW) % OH, r = (i / (OW * OH)) % (g.C * g.KH * g.KW);
  const int64_t b = i / (OW * OH * g.C * g.KH * g.KW);
  const int64_t kw = r % g.KW, kh = (r / g.KW) % g.KH, c = r / (g.KW * g.KH);
  const int64_t ih = oh * g.stride - g.pad + kh, iw = ow * g.stride - g.pad + kw;
  const bool in = ih >= 0 && ih < g.H && iw >= 0 && iw < g.W;
  cols[i] = in ? x[((b * g.C + c) * g.H + ih) * g.W + iw] : 0.f;
}

// dx [N, C, H, W]: one thread per input pixel, summing the column entries
// that read it (kh, kw in order).
__global__ void col2im_k(const float* cols, float* dx, ConvDims g, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int64_t OH = g.out_h(), OW = g.out_w();
  const int64_t iw = i % g.W, ih = (i / g.W) % g.H, c = (i / (g.W * g.H)) % g.C;
  const int64_t b = i / (g.W * g.H * g.C);
  float acc = 0.f;
  for (int64_t kh = 0; kh < g.KH; ++kh) {
    const int64_t t = ih + g.pad - kh;  // = oh * stride
    if (t < 0 || t % g.stride != 0 || t / g.stride >= OH) continue;
    for (int64_t kw = 0; kw < g.KW; ++kw) {
      const int64_t u = iw + g.pad - kw;  // = ow * stride
      if (u < 0 || u % g.stride != 0 || u / g.stride >= OW) continue;
      const int64_t r = (c * g.KH + kh) * g.KW + kw;
      acc += cols[((b * g.C * g.KH * g.KW + r) * OH + t / g.stride) * OW + u / g.stride];
    }
  }
  dx[i] = acc;
}

// The pooling windows that contain input pixel (ih, iw): [o0, o1) per axis.
__device__ void windows_of(int64_t i, int64_t K, int64_t stride, int64_t out, int64_t& o0,
                           int64_t& o1) {
  o0 = i < K ? 0 : (i - K) / stride + 1;
  o1 = i / stride + 1;
  if (o1 > out) o1 = out;
}

__global__ void max_pool_fwd(const float* x, float* y, int32_t* argmax, PoolDims g, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int64_t OH = g.out_h(), OW = g.out_w();
  const int64_t ow = i % OW, oh = (i / OW) % OH, p = i / (OW * OH);
  const float* xp = x + p * g.H * g.W;
  int64_t at = (oh * g.stride) * g.W + ow * g.stride;
  float best = xp[at];
  for (int64_t a = 0; a < g.K; ++a)
    for (int64_t b = 0; b < g.K; ++b) {
      const int64_t idx = (oh * g.stride + a) * g.W + ow * g.stride + b;
      // First maximum wins ties; a NaN wins (propagates): the CPU kernel's rule.
      if (xp[idx] > best || (isnan(xp[idx]) && !isnan(best))) best = xp[idx], at = idx;
    }
  y[i] = best;
  argmax[i] = int32_t(at);
}

__global__ void max_pool_bwd(const float* dy, const int32_t* argmax, float* dx, PoolDims g,
                             int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int64_t OH = g.out_h(), OW = g.out_w();
  const int64_t iw = i % g.W, ih = (i / g.W) % g.H, p = i / (g.W * g.H);
  int64_t h0, h1, w0, w1;
  windows_of(ih, g.K, g.stride, OH, h0, h1);
  windows_of(iw, g.K, g.stride, OW, w0, w1);
  const int32_t me = int32_t(ih * g.W + iw);
  float acc = 0.f;
  for (int64_t oh = h0; oh < h1; ++oh)
    for (int64_t ow = w0; ow < w1; ++ow) {
      const int64_t o = (p * OH + oh) * OW + ow;
      if (argmax[o] == me) acc += dy[o];
    }
  dx[i] = acc;
}

__global__ void max_pool_gather_k(const float* dx, const int32_t* argmax, float* out, int64_t hw,
                                  int64_t ohw, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n) out[i] = dx[(i / ohw) * hw + argmax[i]];
}

__global__ void avg_pool_fwd(const float* x, float* y, PoolDims g, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int64_t OH = g.out_h(), OW = g.out_w();
  const int64_t ow = i % OW, oh = (i / OW) % OH, p = i / (OW * OH);
  const float* xp = x + p * g.H * g.W;
  float acc = 0.f;
  for (int64_t a = 0; a < g.K; ++a)
    for (int64_t b = 0; b < g.K; ++b) acc += xp[(oh * g.stride + a) * g.W + ow * g.stride + b];
  y[i] = acc / float(g.K * g.K);
}

__global__ void avg_pool_bwd(const float* dy, float* dx, PoolDims g, int64_t n) {
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= n) return;
  const int64_t OH = g.out_h(), OW = g.out_w();
  const int64_t iw = i % g.W, ih = (i / g.W) % g.H, p = i / (g.W * g.H);
  int64_t h0, h1, w0, w1;
  windows_of(ih, g.K, g.stride, OH, h0, h1);
  windows_of(iw, g.K, g.stride, OW, w0, w1);
  float acc = 0.f;
  for (int64_t oh = h0; oh < h1; ++oh)
    for (int64_t ow = w0; ow < w1; ++ow) acc += dy[(p * OH + oh) * OW + ow];
  dx[i] = acc / float(g.K * g.K);
}

}  // namespace

void im2col(const float* x, float* cols, const ConvDims& g) {
  const int64_t n = g.N * g.C * g.KH * g.KW * g.out_h() * g.out_w();
  if (n == 0) return;
  im2col_k<<<blocks_for(n), 256, 0, stream()>>>(x, cols, g, n);
  check_launch("conv2d (im2col)");
}
void col2im(const float* cols, float* dx, const ConvDims& g) {
  const int64_t n = g.N * g.C * g.H * g.W;
  if (n == 0) return;
  col2im_k<<<blocks_for(n), 256, 0, stream()>>>(cols, dx, g, n);
  check_launch("conv2d backward (col2im)");
}
void max_pool2d_forward(const float* x, float* y, int32_t* argmax, const PoolDims& g) {
  const int64_t n = g.N * g.C * g.out_h() * g.out_w();
  if (n == 0) return;
  max_pool_fwd<<<blocks_for(n), 256, 0, stream()>>>(x, y, argmax, g, n);
  check_launch("max_pool2d");
}
void max_pool2d_backward(const float* dy, const int32_t* argmax, float* dx, const PoolDims& g) {
  const int64_t n = g.N * g.C * g.H * g.W;
  if (n == 0) return;
  max_pool_bwd<<<blocks_for(n), 256, 0, stream()>>>(dy, argmax, dx, g, n);
  check_launch("max_pool2d backward");
}
void max_pool2d_gather(const float* dx, const int32_t* argmax, float* out, int64_t planes,
                       int64_t hw, int64_t ohw) {
  const int64_t n = planes * ohw;
  if (n == 0) return;
  max_pool_gather_k<<<blocks_for(n), 256, 0, stream()>>>(dx, argmax, out, hw, ohw, n);
  check_launch("max_pool2d gather");
}
void avg_pool2d_forward(const float* x, float* y, const PoolDims& g) {
  const int64_t n = g.N * g.C * g.out_h() * g.out_w();
  if (n == 0) return;
  avg_pool_fwd<<<blocks_for(n), 256, 0, stream()>>>(x, y, g, n);
  check_launch("avg_pool2d");
}
void avg_pool2d_backward(const float* dy, float* dx, const PoolDims& g) {
  const int64_t n = g.N * g.C * g.H * g.W;
  if (n == 0) return;
  avg_pool_bwd<<<blocks_for(n), 256, 0, stream()>>>(dy, dx, g, n);
  check_launch("avg_pool2d backward");
}

}  // namespace redco::cuda::k
