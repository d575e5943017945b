#pragma once
// The CUDA convolution and pooling kernels (conv.cu), NCHW, with the
// geometry of ops/cpu/conv.hpp; every pointer on the device.
#include <cstdint>

// The geometry's helpers run on both sides; the host files are built by g++.
#ifdef __CUDACC__
#define REDCO_HOST_DEVICE __host__ __device__
#else
#define REDCO_HOST_DEVICE
#endif

namespace redco::cuda::k {

struct ConvDims {
  int64_t N, C, H, W;  // input
  int64_t O, KH, KW;   // output channels, kernel
  int64_t stride, pad;
  REDCO_HOST_DEVICE int64_t out_h() const { return (H + 2 * pad - KH) / stride + 1; }
  REDCO_HOST_DEVICE int64_t out_w() const { return (W + 2 * pad - KW) / stride + 1; }
};
struct PoolDims {
  int64_t N, C, H, W, K, stride;
  REDCO_HOST_DEVICE int64_t out_h() const { return (H - K) / stride + 1; }
  REDCO_HOST_DEVICE int64_t out_w() const { return (W - K) / stride + 1; }
};

// x [N, C, H, W] -> cols [N, C*KH*KW, OH*OW]; col2im is its adjoint (overwrites dx).
void im2col(const float* x, float* cols, const ConvDims& g);
void col2im(const float* cols, float* dx, const ConvDims& g);
// argmax [N, C, OH, OW]: the flat h*W+w index of each max, as on the CPU.
void max_pool2d_forward(const float* x, float* y, int32_t* argmax, const PoolDims& g);
void max_pool2d_backward(const float* dy, const int32_t* argmax, float* dx, const PoolDims& g);
void max_pool2d_gather(const float* dx, const int32_t* argmax, float* out, int64_t planes,
                       int64_t hw, int64_t ohw);
void avg_pool2d_forward(const float* x, float* y, const PoolDims& g);
void avg_pool2d_backward(const float* dy, float* dx, const PoolDims& g);

}  // namespace redco::cuda::k
