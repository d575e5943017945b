// CudaBackend, the optimizer step: the fused element
// loops of optim_update.cu, and the gradient norm's one 8-byte read-back.
#include <bit>

#include "redco/core/error.hpp"
#include "redco/ops/cuda/backend_cuda.hpp"
#include "redco/ops/cuda/cuda_util.hpp"
#include "redco/ops/cuda/optim_cuda.hpp"
#include "redco/ops/cuda/tensor_util.hpp"

namespace redco {
namespace {

// Dtypes and sizes are checked by the ops' meta functions (ops/meta.hpp).
float* f32_ptr(const Tensor& t, Device dev, const char* op) {
  cuda::expect_on(t, dev, op);
  return t.device_data<float>();
}

}  // namespace

void CudaBackend::sgd_update(Tensor& param, const Tensor& grad, Tensor& buf, const SgdCoeffs& c) {
  const Device dev = param.device();
  cuda::Scope scope(dev);
  float* p = f32_ptr(param, dev, "sgd_update");
  const float* g = f32_ptr(grad, dev, "sgd_update");
  float* b = buf.defined() ? f32_ptr(buf, dev, "sgd_update") : nullptr;
  cuda::k::sgd_update(p, g, b, c, param.numel());
}

void CudaBackend::adam_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v,
                              const AdamCoeffs& c) {
  const Device dev = param.device();
  cuda::Scope scope(dev);
  const char* op = "adam_update";
  float* p = f32_ptr(param, dev, op);
  const float* g = f32_ptr(grad, dev, op);
  float* mp = f32_ptr(m, dev, op);
  float* vp = f32_ptr(v, dev, op);
  cuda::k::adam_update(p, g, mp, vp, c, param.numel());
}

double CudaBackend::sum_of_squares(const Tensor& x) {
  const Device dev = x.device();
  cuda::Scope scope(dev);
  const float* p = f32_ptr(x, dev, "sum_of_squares");
  const int64_t blocks = cuda::k::squares_blocks(x.numel());
  // Doubles in an 8-byte integer buffer (there is no f64 dtype): the partials, then the total.
  Tensor scratch = Tensor::empty({blocks + 1}, DType::i64, dev);
  double* s = reinterpret_cast<double*>(scratch.device_data<int64_t>());
  cuda::k::sum_of_squares(p, x.numel(), s, blocks, s + blocks);
  return std::bit_cast<double>(scratch.slice0(blocks, blocks + 1).values<int64_t>()[0]);
}

}  // namespace redco
