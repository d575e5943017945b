#pragma once
// The dispatch table: one Backend per device kind, each implementing every
// kernel redco needs on Tensors. Differentiable ops (redco/autodiff) call the
// free functions in `redco::kernels`, which check that every tensor argument
// is on one device (an op mixing devices is an error naming the op and both
// devices, whatever the backend) and pick the backend of that device. The CPU
// and test-device backends are always registered; the CUDA backend registers
// itself when built.
#include <atomic>
#include <span>
#include <string>
#include <vector>

#include "redco/core/profile.hpp"
#include "redco/core/tensor.hpp"
#include "redco/ops/optim_update.hpp"

namespace redco {

enum class UnaryOp {
  neg,
  exp,
  log,
  tanh,
  sqrt,
  rsqrt,
  sigmoid,
  relu,
  erf,
  abs,
  square,
  reciprocal,
  step,  // 1 where x > 0 else 0 (the derivative of relu)
};
// Comparisons (eq, gt) yield 1.f / 0.f in the output dtype (f32).
enum class BinaryOp { add, sub, mul, div, max, min, pow, eq, gt };
enum class ReduceOp { sum, max };

// What attention may take beyond q, k, v: per-batch-row key ranges (padded
// batches, left or right: row b sees keys [key_begin[b], key_end[b]) only;
// a query that sees no key gets a zero output) and an additive bias on the
// scaled scores (T5's relative position bias), differentiable.
struct AttentionExtras {
  Tensor key_begin, key_end;  // i64 [B] on q's device, or undefined (all keys)
  // i64 [B] on q's device, or undefined (Tk - Tq): with causal, query i of row b
  // sees keys j <= i + causal_offset[b] (a KV cache's rows of other lengths).
  Tensor causal_offset;
  Tensor bias;  // f32 [Hq, Tq, Tk], [B, Hq, Tq, Tk] (per row), or undefined
};

struct LayerNormSaved {
  Tensor mean, rstd;  // [rows] each; mean undefined for RMS norm
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual Tensor unary(UnaryOp op, const Tensor& x) = 0;
  virtual Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b) = 0;  // broadcasting
  virtual Tensor binary_scalar(BinaryOp op, const Tensor& a, float s) = 0;   // a op s
  virtual void add_inplace(Tensor& a, const Tensor& b) = 0;                  // a += b, same shape
  // Reduces over `axes` (sorted, distinct); the result keeps them as size-1 dims.
  virtual Tensor reduce(ReduceOp op, const Tensor& x, std::span<const int> axes) = 0;
  virtual Tensor argmax(const Tensor& x, int axis) = 0;  // i64, axis dropped
  virtual Tensor broadcast_to(const Tensor& x, const Shape& shape) = 0;
  virtual Tensor permute(const Tensor& x, std::span<const int> perm) = 0;
  // out[..., start:start+len, ...] along `axis` (a copy).
  virtual Tensor slice(const Tensor& x, int axis, int64_t start, int64_t len) = 0;
  // dst[..., start:start+src.dim(axis), ...] = src along `axis`.
  virtual void slice_assign(Tensor& dst, const Tensor& src, int axis, int64_t start) = 0;
  // op(a)[..., M, K] x op(b)[..., K, N]; batch dims broadcast.
  virtual Tensor matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) = 0;
  // c = op(a) op(b), or c += op(a) op(b) when `accumulate`, for 2-d a and b
  // and an f32 c [M, N] that may be a row range of a larger buffer: a
  // gradient summed over chunks in place, a chunk's rows written where they go.
  virtual void matmul_into(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b, Tensor& c,
                           bool accumulate) = 0;

  virtual Tensor softmax(const Tensor& x) = 0;  // over the last axis
  virtual Tensor softmax_backward(const Tensor& y, const Tensor& dy) = 0;
  virtual Tensor log_softmax(const Tensor& x) = 0;
  virtual Tensor log_softmax_backward(const Tensor& y, const Tensor& dy) = 0;
  virtual Tensor layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps,
                            LayerNormSaved& saved) = 0;
  // Returns {dx, dgamma, dbeta (if beta was given)}.
  virtual TensorList layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                                         bool has_beta, const LayerNormSaved& saved) = 0;
  virtual Tensor rms_norm(const Tensor& x, const Tensor& gamma, float eps,
                          LayerNormSaved& saved) = 0;
  virtual TensorList rms_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                                       const LayerNormSaved& saved) = 0;
  virtual Tensor gelu(const Tensor& x, bool tanh_approx) = 0;
  virtual Tensor gelu_backward(const Tensor& x, const Tensor& dy, bool tanh_approx) = 0;
  virtual Tensor silu(const Tensor& x) = 0;
  virtual Tensor silu_backward(const Tensor& x, const Tensor& dy) = 0;
  // Per-row losses [rows] and the saved log-sum-exp [rows].
  virtual Tensor cross_entropy(const Tensor& logits, const Tensor& labels, int64_t ignore_index,
                               Tensor& lse) = 0;
  // overwrite_logits: the gradient may be written into the logits' buffer
  // (the caller holds the only reference and drops it after).
  virtual Tensor cross_entropy_backward(const Tensor& logits, const Tensor& labels,
                                        const Tensor& lse, const Tensor& dloss,
                                        int64_t ignore_index, bool overwrite_logits) = 0;
  virtual Tensor embedding(const Tensor& table, const Tensor& ids) = 0;
  // Scatter-adds dout's rows into `into` [vocab, dim] when it is defined (a
  // gradient summed so far) and returns it, else into a fresh zero table.
  virtual Tensor embedding_backward(const Tensor& dout, const Tensor& ids, int64_t vocab,
                                    const Tensor& into) = 0;
  virtual Tensor rotary(const Tensor& x, int64_t pos_offset, float base, bool inverse) = 0;
  // q [B,Hq,Tq,D], k/v [B,Hkv,Tk,D] -> o [B,Hq,Tq,D], lse [B,Hq,Tq]. The
  // backward returns {dq, dk, dv}, and dbias (extras.bias's shape) after them
  // when extras.bias is defined.
  virtual Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                           float scale, Tensor& lse, const AttentionExtras& extras) = 0;
  virtual TensorList attention_backward(const Tensor& q, const Tensor& k, const Tensor& v,
                                        const Tensor& o, const Tensor& lse, const Tensor& dout,
                                        bool causal, float scale,
                                        const AttentionExtras& extras) = 0;
  virtual Tensor conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, int64_t stride,
                        int64_t pad) = 0;
  virtual TensorList conv2d_backward(const Tensor& dy, const Tensor& x, const Tensor& w,
                                     bool has_bias, int64_t stride, int64_t pad) = 0;
  virtual Tensor max_pool2d(const Tensor& x, int64_t k, int64_t stride, Tensor& argmax) = 0;
  virtual Tensor max_pool2d_backward(const Tensor& dy, const Tensor& argmax, const Shape& x,
                                     int64_t k, int64_t stride) = 0;
  // The adjoint of max_pool2d_backward: out[n, c, p] = dx[n, c, argmax[n, c, p]].
  virtual Tensor max_pool2d_gather(const Tensor& dx, const Tensor& argmax) = 0;
  virtual Tensor avg_pool2d(const Tensor& x, int64_t k, int64_t stride) = 0;
  virtual Tensor avg_pool2d_backward(const Tensor& dy, const Shape& x, int64_t k,
                                     int64_t stride) = 0;
  // x [N, C, ...] normalised over each of `groups` channel groups per sample,
  // then gamma[c] * . + beta[c]; saved: mean and rstd [N * groups].
  virtual Tensor group_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta,
                            int64_t groups, float eps, LayerNormSaved& saved) = 0;
  // Returns {dx, dgamma, dbeta (if beta was given)}.
  virtual TensorList group_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                                         int64_t groups, bool has_beta,
                                         const LayerNormSaved& saved) = 0;
  // x [N, C, H, W] -> [N, C, H*f, W*f], each pixel repeated over an f x f block;
  // the backward sums each block (and is the forward's adjoint).
  virtual Tensor upsample_nearest2d(const Tensor& x, int64_t f) = 0;
  virtual Tensor upsample_nearest2d_backward(const Tensor& dy, int64_t f) = 0;
  // 1/(1-p) where a Philox draw keeps the element, else 0: element i depends
  // only on (seed, stream, i).
  virtual Tensor dropout_mask(const Shape& shape, float p, uint64_t seed, uint64_t stream) = 0;
  // The optimizers' updates of one f32 parameter, in place on its device;
  // buf undefined: SGD without momentum.
  virtual void sgd_update(Tensor& param, const Tensor& grad, Tensor& buf, const SgdCoeffs& c) = 0;
  virtual void adam_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v,
                           const AdamCoeffs& c) = 0;
  // The sum of an f32 tensor's squares, accumulated in double in a fixed
  // order (bitwise the same from run to run), returned to the host: the
  // gradient norm's one device-to-host transfer per tensor.
  virtual double sum_of_squares(const Tensor& x) = 0;
};

Backend& backend(Device device);
void register_backend(DeviceKind kind, Backend* backend);

// Device checks of the kernel entry points: a few comparisons per op.
namespace detail {
[[noreturn]] void mixed_devices(const char* op, Device first, const Tensor& other);
inline void same_device(const char* op, Device d, const Tensor& t) {
  if (t.defined() && t.device() != d) [[unlikely]]
    mixed_devices(op, d, t);
}
inline void same_device(const char* op, Device d, const AttentionExtras& x) {
  for (const Tensor* t : {&x.key_begin, &x.key_end, &x.causal_offset, &x.bias})
    same_device(op, d, *t);
}
inline void same_device(const char* op, Device d, const LayerNormSaved& s) {
  same_device(op, d, s.mean);
  same_device(op, d, s.rstd);
}
template <typename T>
void same_device(const char*, Device, const T&) {}  // not a tensor
template <typename... A>
Device one_device([[maybe_unused]] const char* op, const Tensor& first, const A&... rest) {
  const Device d = first.device();
  (same_device(op, d, rest), ...);
  return d;
}
}  // namespace detail

// Kernel entry points: dispatch on the device of the tensor arguments.
namespace kernels {
#define REDCO_KERNEL(name)                                    \
  template <typename... A>                                    \
  auto name(const Tensor& first, A&&... rest) {               \
    profile::Scope scope(#name);                              \
    return backend(detail::one_device(#name, first, rest...)) \
        .name(first, std::forward<A>(rest)...);               \
  }
inline Tensor unary(UnaryOp op, const Tensor& x) {
  profile::Scope scope("unary");
  return backend(x.device()).unary(op, x);
}
inline Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b) {
  profile::Scope scope("binary");
  return backend(detail::one_device("binary", a, b)).binary(op, a, b);
}
inline Tensor binary_scalar(BinaryOp op, const Tensor& a, float s) {
  profile::Scope scope("binary_scalar");
  return backend(a.device()).binary_scalar(op, a, s);
}
inline void add_inplace(Tensor& a, const Tensor& b) {
  profile::Scope scope("add_inplace");
  backend(detail::one_device("add_inplace", a, b)).add_inplace(a, b);
}
inline Tensor reduce(ReduceOp op, const Tensor& x, std::span<const int> axes) {
  profile::Scope scope("reduce");
  return backend(x.device()).reduce(op, x, axes);
}
inline Tensor dropout_mask(const Shape& s, float p, uint64_t seed, uint64_t stream, Device d) {
  return backend(d).dropout_mask(s, p, seed, stream);
}
inline void slice_assign(Tensor& dst, const Tensor& src, int axis, int64_t start) {
  backend(detail::one_device("slice_assign", dst, src)).slice_assign(dst, src, axis, start);
}
inline void sgd_update(Tensor& param, const Tensor& grad, Tensor& buf, const SgdCoeffs& c) {
  backend(detail::one_device("sgd_update", param, grad, buf)).sgd_update(param, grad, buf, c);
}
inline void adam_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v,
                        const AdamCoeffs& c) {
  backend(detail::one_device("adam_update", param, grad, m, v)).adam_update(param, grad, m, v, c);
}
inline double sum_of_squares(const Tensor& x) { return backend(x.device()).sum_of_squares(x); }
REDCO_KERNEL(argmax)
REDCO_KERNEL(broadcast_to)
REDCO_KERNEL(permute)
REDCO_KERNEL(slice)
REDCO_KERNEL(matmul)
REDCO_KERNEL(matmul_into)
REDCO_KERNEL(softmax)
REDCO_KERNEL(softmax_backward)
REDCO_KERNEL(log_softmax)
REDCO_KERNEL(log_softmax_backward)
REDCO_KERNEL(layer_norm)
REDCO_KERNEL(layer_norm_backward)
REDCO_KERNEL(rms_norm)
REDCO_KERNEL(rms_norm_backward)
REDCO_KERNEL(gelu)
REDCO_KERNEL(gelu_backward)
REDCO_KERNEL(silu)
REDCO_KERNEL(silu_backward)
REDCO_KERNEL(cross_entropy)
REDCO_KERNEL(cross_entropy_backward)
REDCO_KERNEL(embedding)
REDCO_KERNEL(embedding_backward)
REDCO_KERNEL(rotary)
REDCO_KERNEL(attention)
REDCO_KERNEL(attention_backward)
REDCO_KERNEL(conv2d)
REDCO_KERNEL(conv2d_backward)
REDCO_KERNEL(max_pool2d)
REDCO_KERNEL(max_pool2d_backward)
REDCO_KERNEL(max_pool2d_gather)
REDCO_KERNEL(avg_pool2d)
REDCO_KERNEL(avg_pool2d_backward)
REDCO_KERNEL(group_norm)
REDCO_KERNEL(group_norm_backward)
REDCO_KERNEL(upsample_nearest2d)
REDCO_KERNEL(upsample_nearest2d_backward)
#undef REDCO_KERNEL
}  // namespace kernels

}  // namespace redco
