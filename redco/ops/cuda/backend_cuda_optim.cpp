// CudaBackend, the optimizer step: checks as on the CPU, the fused element
// loops of optim_update.cu, and the gradient norm's one 8-byte read-back.
#include <bit>

#include "redco/core/error.hpp"
#include "redco/ops/cuda/backend_cuda.hpp"
#include "redco/ops/cuda/cuda_util.hpp"
#include "redco/ops/cuda/optim_cuda.hpp"
#include "redco/ops/cuda/tensor_util.hpp"

namespace redco {
namespace {

float* f32_ptr(const Tensor& t, Device dev, const char* op, const char* what) {
  cuda::expect_on(t, dev, op);
  REDCO_CHECK(t.dtype() == DType::f32, "{}: the {} must be an f32 tensor, got {}", op, what,
              dtype_name(t.dtype()));
  return t.device_data<float>();
}

void check_numel(const Tensor& p, const Tensor& t, const char* op, const char* what) {
  REDCO_CHECK(t.numel() == p.numel(), "{}: the {} has shape {} but the parameter has {}", op, what,
              t.shape(), p.shape());
}

}  // namespace

void CudaBackend::sgd_update(Tensor& param, const Tensor& grad, Tensor& buf, const SgdCoeffs& c) {
  const Device dev = param.device();
  cuda::Scope scope(dev);
  float* p = f32_ptr(param, dev, "sgd_update", "parameter");
  const float* g = f32_ptr(grad, dev, "sgd_update", "gradient");
  check_numel(param, grad, "sgd_update", "gradient");
  float* b = nullptr;
  if (buf.defined()) {
    b = f32_ptr(buf, dev, "sgd_update", "momentum buffer");
    check_numel(param, buf, "sgd_update", "momentum buffer");
  }
  cuda::k::sgd_update(p, g, b, c, param.numel());
}

void CudaBackend::adam_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v,
                              const AdamCoeffs& c) {
  const Device dev = param.device();
  cuda::Scope scope(dev);
  const char* op = "adam_update";
  float* p = f32_ptr(param, dev, op, "parameter");
  const float* g = f32_ptr(grad, dev, op, "gradient");
  float* mp = f32_ptr(m, dev, op, "first moment");
  float* vp = f32_ptr(v, dev, op, "second moment");
  check_numel(param, grad, op, "gradient");
  check_numel(param, m, op, "first moment");
  check_numel(param, v, op, "second moment");
  cuda::k::adam_update(p, g, mp, vp, c, param.numel());
}

double CudaBackend::sum_of_squares(const Tensor& x) {
  const Device dev = x.device();
  cuda::Scope scope(dev);
  const float* p = f32_ptr(x, dev, "sum_of_squares", "input");
  const int64_t blocks = cuda::k::squares_blocks(x.numel());
  // Doubles in an 8-byte integer buffer (there is no f64 dtype): the partials, then the total.
  Tensor scratch = Tensor::empty({blocks + 1}, DType::i64, dev);
  double* s = reinterpret_cast<double*>(scratch.device_data<int64_t>());
  cuda::k::sum_of_squares(p, x.numel(), s, blocks, s + blocks);
  return std::bit_cast<double>(scratch.slice0(blocks, blocks + 1).values<int64_t>()[0]);
}

}  // namespace redco
