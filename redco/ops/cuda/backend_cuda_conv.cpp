// CudaBackend, convolution and pooling (shapes checked by the ops' meta
// functions): conv2d as im2col + one batched cuBLAS product (the weight
// broadcast over the images), its backward as two products and col2im.
#include "redco/core/error.hpp"
#include "redco/ops/cuda/backend_cuda.hpp"
#include "redco/ops/cuda/conv_cuda.hpp"
#include "redco/ops/cuda/cuda_util.hpp"
#include "redco/ops/cuda/tensor_util.hpp"

namespace redco {
namespace {
using cuda::f32;

cuda::k::ConvDims conv_dims(const Tensor& x, const Tensor& w, int64_t stride, int64_t pad) {
  return {x.dim(0), x.dim(1), x.dim(2), x.dim(3), w.dim(0), w.dim(2), w.dim(3), stride, pad};
}
Tensor cols_of(const Tensor& x, const cuda::k::ConvDims& g) {  // [N, C*KH*KW, OH*OW]
  Tensor cols =
      Tensor::empty({g.N, g.C * g.KH * g.KW, g.out_h() * g.out_w()}, DType::f32, x.device());
  cuda::k::im2col(x.device_data<float>(), cols.device_data<float>(), g);
  return cols;
}
cuda::k::PoolDims pool_dims(const Shape& x, int64_t k, int64_t stride) {
  return {x[0], x[1], x[2], x[3], k, stride};
}
}  // namespace

Tensor CudaBackend::conv2d(const Tensor& x_in, const Tensor& w_in, const Tensor& bias_in,
                           int64_t stride, int64_t pad) {
  const Device dev = x_in.device();
  cuda::Scope scope(dev);
  Tensor x = f32(x_in, dev, "conv2d"), w = f32(w_in, dev, "conv2d");
  const auto g = conv_dims(x, w, stride, pad);
  // [O, CKK] x [N, CKK, OHW] -> [N, O, OHW]
  Tensor y = matmul(w.view({g.O, g.C * g.KH * g.KW}), cols_of(x, g), false, false);
  if (bias_in.defined()) {
    Tensor bias = f32(bias_in, dev, "conv2d");
    y = binary(BinaryOp::add, y, bias.view({g.O, 1}));
  }
  return y.view({g.N, g.O, g.out_h(), g.out_w()});
}

TensorList CudaBackend::conv2d_backward(const Tensor& dy_in, const Tensor& x_in, const Tensor& w_in,
                                        bool has_bias, int64_t stride, int64_t pad) {
  const Device dev = x_in.device();
  cuda::Scope scope(dev);
  Tensor x = f32(x_in, dev, "conv2d"), w = f32(w_in, dev, "conv2d");
  Tensor dy = f32(dy_in, dev, "conv2d backward");
  const auto g = conv_dims(x, w, stride, pad);
  const int64_t ckk = g.C * g.KH * g.KW, ohw = g.out_h() * g.out_w();
  const Tensor d = dy.view({g.N, g.O, ohw});
  // dw = sum_n dy[n] cols[n]^T: [N, O, CKK] summed over the images in order.
  const int batch_axis[] = {0};
  Tensor dw =
      reduce(ReduceOp::sum, matmul(d, cols_of(x, g), false, true), batch_axis).view(w.shape());
  // dcols[n] = w^T dy[n]: [CKK, O] x [N, O, OHW] -> [N, CKK, OHW], then col2im.
  Tensor dcols = matmul(w.view({g.O, ckk}), d, true, false);
  Tensor dx = Tensor::empty(x.shape(), DType::f32, dev);
  cuda::k::col2im(dcols.device_data<float>(), dx.device_data<float>(), g);
  Tensor dbias;
  if (has_bias) {
    const int image_axes[] = {0, 2};
    dbias = reduce(ReduceOp::sum, d, image_axes).view({g.O});
  }
  return {dx, dw, dbias};
}

Tensor CudaBackend::max_pool2d(const Tensor& x_in, int64_t k, int64_t stride, Tensor& argmax) {
  const Device dev = x_in.device();
  cuda::Scope scope(dev);
  Tensor x = f32(x_in, dev, "max_pool2d");
  const auto g = pool_dims(x.shape(), k, stride);
  Tensor y = Tensor::empty({g.N, g.C, g.out_h(), g.out_w()}, DType::f32, dev);
  argmax = Tensor::empty(y.shape(), DType::i32, dev);
  cuda::k::max_pool2d_forward(x.device_data<float>(), y.device_data<float>(),
                              argmax.device_data<int32_t>(), g);
  return y;
}
Tensor CudaBackend::max_pool2d_backward(const Tensor& dy_in, const Tensor& argmax, const Shape& x,
                                        int64_t k, int64_t stride) {
  const Device dev = dy_in.device();
  cuda::Scope scope(dev);
  Tensor dy = f32(dy_in, dev, "max_pool2d backward"), dx = Tensor::empty(x, DType::f32, dev);
  cuda::expect_on(argmax, dev, "max_pool2d backward");
  const auto g = pool_dims(x, k, stride);
  cuda::k::max_pool2d_backward(dy.device_data<float>(), argmax.device_data<int32_t>(),
                               dx.device_data<float>(), g);
  return dx;
}
Tensor CudaBackend::max_pool2d_gather(const Tensor& dx_in, const Tensor& argmax) {
  const Device dev = dx_in.device();
  cuda::Scope scope(dev);
  Tensor dx = f32(dx_in, dev, "max_pool2d gather");
  cuda::expect_on(argmax, dev, "max_pool2d gather");
  Tensor out = Tensor::empty(argmax.shape(), DType::f32, dev);
  cuda::k::max_pool2d_gather(dx.device_data<float>(), argmax.device_data<int32_t>(),
                             out.device_data<float>(), dx.dim(0) * dx.dim(1), dx.dim(2) * dx.dim(3),
                             argmax.dim(2) * argmax.dim(3));
  return out;
}
Tensor CudaBackend::avg_pool2d(const Tensor& x_in, int64_t k, int64_t stride) {
  const Device dev = x_in.device();
  cuda::Scope scope(dev);
  Tensor x = f32(x_in, dev, "avg_pool2d");
  const auto g = pool_dims(x.shape(), k, stride);
  Tensor y = Tensor::empty({g.N, g.C, g.out_h(), g.out_w()}, DType::f32, dev);
  cuda::k::avg_pool2d_forward(x.device_data<float>(), y.device_data<float>(), g);
  return y;
}
Tensor CudaBackend::avg_pool2d_backward(const Tensor& dy_in, const Shape& x, int64_t k,
                                        int64_t stride) {
  const Device dev = dy_in.device();
  cuda::Scope scope(dev);
  Tensor dy = f32(dy_in, dev, "avg_pool2d backward"), dx = Tensor::empty(x, DType::f32, dev);
  const auto g = pool_dims(x, k, stride);
  cuda::k::avg_pool2d_backward(dy.device_data<float>(), dx.device_data<float>(), g);
  return dx;
}

}  // namespace redco
