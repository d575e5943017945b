// CudaBackend, nn kernels: outputs on the input's device, the kernels in the
// .cu files; shapes and dtypes are checked by the ops' meta functions.
// Index validation (labels, ids) needs the answer on the host before the
// error can be thrown, so those ops read back one 8-byte result (a sync).
#include <algorithm>
#include <cmath>

#include "redco/ops/cuda/backend_cuda.hpp"
#include "redco/ops/cuda/cuda_util.hpp"
#include "redco/ops/cuda/tensor_util.hpp"

namespace redco {
namespace {
using cuda::f32;
using cuda::Scope;

Tensor like(const Tensor& x) { return Tensor::empty(x.shape(), DType::f32, x.device()); }

const int64_t* ids_of(const Tensor& t, Device dev, const char* op) {
  cuda::expect_on(t, dev, op);
  return t.device_data<int64_t>();
}

// Element i of an i64 device tensor, read back for an error message.
int64_t value_at(const Tensor& ids, int64_t i) {
  return ids.view({-1})[i].to(Device::cpu()).values<int64_t>()[0];
}

void check_labels(const char* op, const Tensor& labels, int64_t V, int64_t ignore_index) {
  const int64_t bad =
      cuda::k::first_bad_id(labels.device_data<int64_t>(), labels.numel(), V, ignore_index);
  if (bad < 0) return;
  const int64_t l = value_at(labels, bad);
  fail("{}: row {} has label {}, outside [0, {}) and not ignore_index ({})", op, bad, l, V,
       ignore_index);
}

void check_ids(const char* op, const Tensor& ids, int64_t V) {
  // ids < 0 are all bad, so -1 works as "skip nothing".
  const int64_t bad = cuda::k::first_bad_id(ids.device_data<int64_t>(), ids.numel(), V, -1);
  if (bad < 0) return;
  const int64_t id = value_at(ids, bad);
  fail("{}: id {} at position {} is out of range for a table of {} rows", op, id, bad, V);
}

// Sums [chunks, 2, D] partials over the chunks (in chunk order) into {dgamma, dbeta}.
TensorList sum_partials(const Tensor& partials, int64_t D, bool has_beta) {
  Tensor both = Tensor::empty({2 * D}, DType::f32, partials.device());
  cuda::k::reduce_pass(false, partials.device_data<float>(), both.device_data<float>(), 1,
                       partials.dim(0), 2 * D);
  Tensor dgamma = both.slice0(0, D).clone();
  return {dgamma, has_beta ? both.slice0(D, 2 * D).clone() : Tensor()};
}

}  // namespace

Tensor CudaBackend::softmax(const Tensor& x_in) {
  Scope scope(x_in.device());
  Tensor x = f32(x_in, x_in.device(), "softmax"), y = like(x);
  cuda::k::softmax_forward(x.device_data<float>(), y.device_data<float>(), x.shape().rows(),
                           x.shape().last(), false);
  return y;
}
Tensor CudaBackend::softmax_backward(const Tensor& y, const Tensor& dy_in) {
  Scope scope(y.device());
  Tensor dy = f32(dy_in, y.device(), "softmax backward"), dx = like(y);
  cuda::k::softmax_backward(y.device_data<float>(), dy.device_data<float>(),
                            dx.device_data<float>(), y.shape().rows(), y.shape().last(), false);
  return dx;
}
Tensor CudaBackend::log_softmax(const Tensor& x_in) {
  Scope scope(x_in.device());
  Tensor x = f32(x_in, x_in.device(), "log_softmax"), y = like(x);
  cuda::k::softmax_forward(x.device_data<float>(), y.device_data<float>(), x.shape().rows(),
                           x.shape().last(), true);
  return y;
}
Tensor CudaBackend::log_softmax_backward(const Tensor& y, const Tensor& dy_in) {
  Scope scope(y.device());
  Tensor dy = f32(dy_in, y.device(), "log_softmax backward"), dx = like(y);
  cuda::k::softmax_backward(y.device_data<float>(), dy.device_data<float>(),
                            dx.device_data<float>(), y.shape().rows(), y.shape().last(), true);
  return dx;
}

Tensor CudaBackend::cross_entropy(const Tensor& logits_in, const Tensor& labels,
                                  int64_t ignore_index, Tensor& lse) {
  const Device dev = logits_in.device();
  Scope scope(dev);
  Tensor logits = f32(logits_in, dev, "cross_entropy");
  const int64_t rows = logits.shape().rows(), vocab = logits.shape().last();
  const int64_t* l = ids_of(labels, dev, "cross_entropy");
  check_labels("cross_entropy_forward", labels, vocab, ignore_index);
  Tensor losses = Tensor::empty(labels.shape(), DType::f32, dev);
  lse = Tensor::empty(labels.shape(), DType::f32, dev);
  cuda::k::cross_entropy_forward(logits.device_data<float>(), l, losses.device_data<float>(),
                                 lse.device_data<float>(), rows, vocab, ignore_index);
  return losses;
}
Tensor CudaBackend::cross_entropy_backward(const Tensor& logits_in, const Tensor& labels,
                                           const Tensor& lse, const Tensor& dloss_in,
                                           int64_t ignore_index, bool overwrite_logits) {
  const Device dev = logits_in.device();
  Scope scope(dev);
  Tensor logits = f32(logits_in, dev, "cross_entropy backward");
  Tensor dloss = f32(dloss_in, dev, "cross_entropy backward");
  // In place: each thread reads its element once, then overwrites it (ce_bwd).
  Tensor dlogits = overwrite_logits && logits_in.dtype() == DType::f32 ? logits : like(logits);
  const int64_t* l = ids_of(labels, dev, "cross_entropy");
  cuda::expect_on(lse, dev, "cross_entropy backward");
  check_labels("cross_entropy_backward", labels, logits.shape().last(), ignore_index);
  cuda::k::cross_entropy_backward(logits.device_data<float>(), l, lse.device_data<float>(),
                                  dloss.device_data<float>(), dlogits.device_data<float>(),
                                  logits.shape().rows(), logits.shape().last(), ignore_index);
  return dlogits;
}

Tensor CudaBackend::layer_norm(const Tensor& x_in, const Tensor& gamma_in, const Tensor& beta_in,
                               float eps, LayerNormSaved& saved) {
  const Device dev = x_in.device();
  Scope scope(dev);
  Tensor x = f32(x_in, dev, "layer_norm"), gamma = f32(gamma_in, dev, "layer_norm");
  Tensor beta;
  if (beta_in.defined()) {
    beta = f32(beta_in, dev, "layer_norm");
  }
  const int64_t rows = x.shape().rows();
  saved.mean = Tensor::empty({rows}, DType::f32, dev);
  saved.rstd = Tensor::empty({rows}, DType::f32, dev);
  Tensor y = like(x);
  cuda::k::norm_forward(x.device_data<float>(), gamma.device_data<float>(),
                        beta.defined() ? beta.device_data<float>() : nullptr,
                        y.device_data<float>(), saved.mean.device_data<float>(),
                        saved.rstd.device_data<float>(), rows, x.shape().last(), eps);
  return y;
}

// Shared by layer norm (mean defined) and RMS norm.
static TensorList norm_backward(const Tensor& dy_in, const Tensor& x_in, const Tensor& gamma_in,
                                bool has_beta, const LayerNormSaved& saved, const char* op) {
  const Device dev = x_in.device();
  Scope scope(dev);
  Tensor dy = f32(dy_in, dev, op), x = f32(x_in, dev, op), gamma = f32(gamma_in, dev, op);
  const int64_t N = x.shape().rows(), D = x.shape().last();
  const int64_t chunks = cuda::k::norm_chunks(N);
  Tensor dx = like(x), partials = Tensor::empty({chunks, 2, D}, DType::f32, dev);
  const bool layer = saved.mean.defined();
  cuda::k::norm_backward(
      dy.device_data<float>(), x.device_data<float>(), gamma.device_data<float>(),
      layer ? saved.mean.device_data<float>() : nullptr, saved.rstd.device_data<float>(),
      dx.device_data<float>(), partials.device_data<float>(), chunks, N, D);
  TensorList dg = sum_partials(partials, D, has_beta);
  return has_beta ? TensorList{dx, dg[0], dg[1]} : TensorList{dx, dg[0]};
}

TensorList CudaBackend::layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                                            bool has_beta, const LayerNormSaved& saved) {
  TensorList r = norm_backward(dy, x, gamma, has_beta, saved, "layer_norm backward");
  if (!has_beta) r.push_back(Tensor());  // {dx, dgamma, dbeta} like the CPU backend
  return r;
}

Tensor CudaBackend::rms_norm(const Tensor& x_in, const Tensor& gamma_in, float eps,
                             LayerNormSaved& saved) {
  const Device dev = x_in.device();
  Scope scope(dev);
  Tensor x = f32(x_in, dev, "rms_norm"), gamma = f32(gamma_in, dev, "rms_norm");
  const int64_t rows = x.shape().rows();
  saved.mean = Tensor();
  saved.rstd = Tensor::empty({rows}, DType::f32, dev);
  Tensor y = like(x);
  cuda::k::norm_forward(x.device_data<float>(), gamma.device_data<float>(), nullptr,
                        y.device_data<float>(), nullptr, saved.rstd.device_data<float>(), rows,
                        x.shape().last(), eps);
  return y;
}
TensorList CudaBackend::rms_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                                          const LayerNormSaved& saved) {
  return norm_backward(dy, x, gamma, false, saved, "rms_norm backward");
}

Tensor CudaBackend::gelu(const Tensor& x_in, bool tanh_approx) {
  Scope scope(x_in.device());
  Tensor x = f32(x_in, x_in.device(), "gelu"), y = like(x);
  cuda::k::gelu_forward(x.device_data<float>(), y.device_data<float>(), x.numel(), tanh_approx);
  return y;
}
Tensor CudaBackend::gelu_backward(const Tensor& x_in, const Tensor& dy_in, bool tanh_approx) {
  const Device dev = x_in.device();
  Scope scope(dev);
  Tensor x = f32(x_in, dev, "gelu backward"), dy = f32(dy_in, dev, "gelu backward"), dx = like(x);
  cuda::k::gelu_backward(x.device_data<float>(), dy.device_data<float>(), dx.device_data<float>(),
                         x.numel(), tanh_approx);
  return dx;
}
Tensor CudaBackend::silu(const Tensor& x_in) {
  Scope scope(x_in.device());
  Tensor x = f32(x_in, x_in.device(), "silu"), y = like(x);
  cuda::k::silu_forward(x.device_data<float>(), y.device_data<float>(), x.numel());
  return y;
}
Tensor CudaBackend::silu_backward(const Tensor& x_in, const Tensor& dy_in) {
  const Device dev = x_in.device();
  Scope scope(dev);
  Tensor x = f32(x_in, dev, "silu backward"), dy = f32(dy_in, dev, "silu backward"), dx = like(x);
  cuda::k::silu_backward(x.device_data<float>(), dy.device_data<float>(), dx.device_data<float>(),
                         x.numel());
  return dx;
}

Tensor CudaBackend::embedding(const Tensor& table_in, const Tensor& ids) {
  const Device dev = table_in.device();
  Scope scope(dev);
  Tensor table = f32(table_in, dev, "embedding");
  const int64_t* p = ids_of(ids, dev, "embedding");
  check_ids("embedding_forward", ids, table.dim(0));
  Tensor out = Tensor::empty(ids.shape().append(table.dim(1)), DType::f32, dev);
  cuda::k::embedding_forward(table.device_data<float>(), p, out.device_data<float>(), ids.numel(),
                             table.dim(1));
  return out;
}
Tensor CudaBackend::embedding_backward(const Tensor& dout_in, const Tensor& ids, int64_t vocab,
                                       const Tensor& into) {
  const Device dev = dout_in.device();
  Scope scope(dev);
  Tensor dout = f32(dout_in, dev, "embedding backward");
  const int64_t dim = dout.shape().last();
  const int64_t* p = ids_of(ids, dev, "embedding");
  check_ids("embedding_backward", ids, vocab);
  Tensor dtable = into.defined() ? into : Tensor::zeros({vocab, dim}, DType::f32, dev);
  const size_t bytes = cuda::k::embedding_backward_scratch(ids.numel());
  Tensor scratch = Tensor::empty({int64_t(bytes)}, DType::u8, dev);
  cuda::k::embedding_backward(dout.device_data<float>(), p, dtable.device_data<float>(),
                              ids.numel(), vocab, dim, scratch.device_ptr(), bytes);
  return dtable;
}

Tensor CudaBackend::rotary(const Tensor& x_in, int64_t pos_offset, float base, bool inverse) {
  const Device dev = x_in.device();
  Scope scope(dev);
  Tensor x = f32(x_in, dev, "rotary"), y = like(x);
  const int64_t T = x.dim(2), D = x.dim(3);
  Tensor table = Tensor::empty({2, T, D / 2}, DType::f32, dev);  // cos, sin
  const int64_t rows = x.numel() / std::max<int64_t>(D, 1);
  cuda::k::rotary(x.device_data<float>(), y.device_data<float>(), table.device_data<float>(), rows,
                  T, D, pos_offset, base, inverse);
  return y;
}

Tensor CudaBackend::dropout_mask(const Shape& shape, float p, uint64_t seed, uint64_t stream) {
  // The kernels entry point passes no tensor: the mask goes to the current device.
  const Device dev = Device::cuda(cuda::current_device());
  Tensor mask = Tensor::empty(shape, DType::f32, dev);
  cuda::k::dropout_mask(mask.device_data<float>(), shape.numel(), p, seed, stream);
  return mask;
}

// ---- group norm and upsampling ----------------------------------------------------------
namespace {
struct GroupDims {
  int64_t N, C, S;
};
GroupDims group_dims(const Tensor& x) {
  return {x.dim(0), x.dim(1), x.numel() / std::max<int64_t>(x.dim(0) * x.dim(1), 1)};
}
}  // namespace

Tensor CudaBackend::group_norm(const Tensor& x_in, const Tensor& gamma_in, const Tensor& beta_in,
                               int64_t groups, float eps, LayerNormSaved& saved) {
  const Device dev = x_in.device();
  Scope scope(dev);
  Tensor x = f32(x_in, dev, "group_norm"), gamma = f32(gamma_in, dev, "group_norm"), beta;
  const GroupDims g = group_dims(x);
  if (beta_in.defined()) {
    beta = f32(beta_in, dev, "group_norm");
  }
  saved.mean = Tensor::empty({g.N * groups}, DType::f32, dev);
  saved.rstd = Tensor::empty({g.N * groups}, DType::f32, dev);
  Tensor y = like(x);
  cuda::k::group_norm_forward(x.device_data<float>(), gamma.device_data<float>(),
                              beta.defined() ? beta.device_data<float>() : nullptr,
                              y.device_data<float>(), saved.mean.device_data<float>(),
                              saved.rstd.device_data<float>(), g.N, g.C, g.S, groups, eps);
  return y;
}
TensorList CudaBackend::group_norm_backward(const Tensor& dy_in, const Tensor& x_in,
                                            const Tensor& gamma_in, int64_t groups, bool has_beta,
                                            const LayerNormSaved& saved) {
  const Device dev = x_in.device();
  Scope scope(dev);
  const char* op = "group_norm backward";
  Tensor dy = f32(dy_in, dev, op), x = f32(x_in, dev, op), gamma = f32(gamma_in, dev, op);
  const GroupDims g = group_dims(x);
  Tensor dx = like(x), partials = Tensor::empty({2, g.N, g.C}, DType::f32, dev);
  cuda::k::group_norm_backward(dy.device_data<float>(), x.device_data<float>(),
                               gamma.device_data<float>(), saved.mean.device_data<float>(),
                               saved.rstd.device_data<float>(), dx.device_data<float>(),
                               partials.device_data<float>(), g.N, g.C, g.S, groups);
  // Over the batch in a fixed order: [2, N, C] -> [2, C] = {dgamma, dbeta}.
  Tensor both = Tensor::empty({2 * g.C}, DType::f32, dev);
  cuda::k::reduce_pass(false, partials.device_data<float>(), both.device_data<float>(), 2, g.N,
                       g.C);
  return {dx, both.slice0(0, g.C).clone(), has_beta ? both.slice0(g.C, 2 * g.C).clone() : Tensor()};
}
Tensor CudaBackend::upsample_nearest2d(const Tensor& x_in, int64_t f) {
  Scope scope(x_in.device());
  Tensor x = f32(x_in, x_in.device(), "upsample_nearest2d");
  Tensor y =
      Tensor::empty({x.dim(0), x.dim(1), x.dim(2) * f, x.dim(3) * f}, DType::f32, x.device());
  cuda::k::upsample_nearest2d_forward(x.device_data<float>(), y.device_data<float>(),
                                      x.dim(0) * x.dim(1), x.dim(2), x.dim(3), f);
  return y;
}
Tensor CudaBackend::upsample_nearest2d_backward(const Tensor& dy_in, int64_t f) {
  Scope scope(dy_in.device());
  Tensor dy = f32(dy_in, dy_in.device(), "upsample_nearest2d backward");
  Tensor dx =
      Tensor::empty({dy.dim(0), dy.dim(1), dy.dim(2) / f, dy.dim(3) / f}, DType::f32, dy.device());
  cuda::k::upsample_nearest2d_backward(dy.device_data<float>(), dx.device_data<float>(),
                                       dy.dim(0) * dy.dim(1), dx.dim(2), dx.dim(3), f);
  return dx;
}

}  // namespace redco
