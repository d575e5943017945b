#pragma once
// 2-D convolution (NCHW, weights [O, C, KH, KW]) and pooling for small images.
#include <cstdint>

namespace redco::cpu {

struct Conv2dGeometry {
  int64_t N, C, H, W;  // input
  int64_t O, KH, KW;   // output channels, kernel
  int64_t stride = 1, pad = 0;
  int64_t out_h() const { return (H + 2 * pad - KH) / stride + 1; }
  int64_t out_w() const { return (W + 2 * pad - KW) / stride + 1; }
};

// im2col: x [N, C, H, W] -> cols [N, C*KH*KW, OH*OW]; col2im is its adjoint
// (accumulates back into dx [N, C, H, W], which it overwrites).
void im2col(const float* x, float* cols, const Conv2dGeometry& g);
void col2im(const float* cols, float* dx, const Conv2dGeometry& g);

// y [N, O, OH, OW] = conv(x, w) + bias[O] (bias may be null).
// `cols` is scratch of N*C*KH*KW*OH*OW floats.
void conv2d_forward(const float* x, const float* w, const float* bias, float* y, float* cols,
                    const Conv2dGeometry& g);
// Writes dx (if non-null), dw, dbias (if non-null); `cols` scratch as above.
void conv2d_backward(const float* dy, const float* x, const float* w, float* dx, float* dw,
                     float* dbias, float* cols, const Conv2dGeometry& g);

struct Pool2dGeometry {
  int64_t N, C, H, W, K, stride;
  int64_t out_h() const { return (H - K) / stride + 1; }
  int64_t out_w() const { return (W - K) / stride + 1; }
};
// argmax [N, C, OH, OW] holds the flat h*W+w index of each max, for backward.
void max_pool2d_forward(const float* x, float* y, int32_t* argmax, const Pool2dGeometry& g);
void max_pool2d_backward(const float* dy, const int32_t* argmax, float* dx,
                         const Pool2dGeometry& g);  // overwrites dx
void avg_pool2d_forward(const float* x, float* y, const Pool2dGeometry& g);
void avg_pool2d_backward(const float* dy, float* dx, const Pool2dGeometry& g);  // overwrites dx

}  // namespace redco::cpu
