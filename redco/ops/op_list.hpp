#pragma once
// The op list: every kernel a backend implements, written once. Each entry is
//   X(return type, name, (parameters), (arguments))
// and everything that names the ops is generated from it: Backend's pure
// virtuals (ops/backend.hpp), each backend's overrides (REDCO_OP_OVERRIDES in
// ops/cpu/backend_cpu.hpp, ops/test_device/backend_test.hpp,
// ops/cuda/backend_cuda.hpp) and the `kernels::` entry points that check
// devices and dispatch (ops/backend.hpp). A new op is one entry here plus its
// kernel in each backend (docs/architecture.md, "A new op").
//
// REDCO_DISPATCHED_OPS take at least one tensor, whose device picks the
// backend; the others are dispatched by hand (dropout_mask names its device).

// Entries are aligned by hand (clang-format would fold the macros):
// clang-format off

// ---- generic kernels ------------------------------------------------------------------------
// binary: broadcasting; comparisons (eq, gt) yield 1.f / 0.f. binary_scalar: a op s.
// add_inplace: a += b, same shape. reduce: over `axes` (sorted, distinct), kept
// as size-1 dims. argmax: i64, axis dropped. slice: out[..., start:start+len, ...]
// along `axis` (a copy); slice_assign: dst[..., start:start+src.dim(axis), ...] = src.
// matmul: op(a)[..., M, K] x op(b)[..., K, N], batch dims broadcast. matmul_into:
// c = op(a) op(b), or c += op(a) op(b) when `accumulate`, for 2-d a and b and an
// f32 c [M, N] that may be a row range of a larger buffer (a gradient summed
// over chunks in place, a chunk's rows written where they go).
#define REDCO_GENERIC_OPS(X)                                                                     \
  X(Tensor, unary, (UnaryOp op, const Tensor& x), (op, x))                                       \
  X(Tensor, binary, (BinaryOp op, const Tensor& a, const Tensor& b), (op, a, b))                 \
  X(Tensor, binary_scalar, (BinaryOp op, const Tensor& a, float s), (op, a, s))                  \
  X(void, add_inplace, (Tensor & a, const Tensor& b), (a, b))                                    \
  X(Tensor, reduce, (ReduceOp op, const Tensor& x, std::span<const int> axes), (op, x, axes))    \
  X(Tensor, argmax, (const Tensor& x, int axis), (x, axis))                                      \
  X(Tensor, broadcast_to, (const Tensor& x, const Shape& shape), (x, shape))                     \
  X(Tensor, permute, (const Tensor& x, std::span<const int> perm), (x, perm))                    \
  X(Tensor, slice, (const Tensor& x, int axis, int64_t start, int64_t len), (x, axis, start, len)) \
  X(void, slice_assign, (Tensor & dst, const Tensor& src, int axis, int64_t start),              \
    (dst, src, axis, start))                                                                     \
  X(Tensor, matmul, (const Tensor& a, const Tensor& b, bool trans_a, bool trans_b),              \
    (a, b, trans_a, trans_b))                                                                    \
  X(void, matmul_into,                                                                           \
    (const Tensor& a, const Tensor& b, bool trans_a, bool trans_b, Tensor& c, bool accumulate), \
    (a, b, trans_a, trans_b, c, accumulate))

// ---- nn kernels -----------------------------------------------------------------------------
// softmax and log_softmax: over the last axis. *_norm_backward: {dx, dgamma,
// dbeta (if beta was given)}. cross_entropy: per-row losses [rows] and the saved
// log-sum-exp [rows]; its backward may write the gradient into the logits'
// buffer when overwrite_logits (the caller holds the only reference and drops
// it after). embedding_backward: scatter-adds dout's rows into `into` [vocab,
// dim] when it is defined (a gradient summed so far) and returns it, else into
// a fresh zero table. attention: q [B,Hq,Tq,D], k/v [B,Hkv,Tk,D] -> o
// [B,Hq,Tq,D], lse [B,Hq,Tq]; its backward returns {dq, dk, dv}, and dbias
// (extras.bias's shape) after them when extras.bias is defined.
#define REDCO_NN_OPS(X)                                                                          \
  X(Tensor, softmax, (const Tensor& x), (x))                                                     \
  X(Tensor, softmax_backward, (const Tensor& y, const Tensor& dy), (y, dy))                      \
  X(Tensor, log_softmax, (const Tensor& x), (x))                                                 \
  X(Tensor, log_softmax_backward, (const Tensor& y, const Tensor& dy), (y, dy))                  \
  X(Tensor, layer_norm,                                                                          \
    (const Tensor& x, const Tensor& gamma, const Tensor& beta, float eps, LayerNormSaved& saved), \
    (x, gamma, beta, eps, saved))                                                                \
  X(TensorList, layer_norm_backward,                                                             \
    (const Tensor& dy, const Tensor& x, const Tensor& gamma, bool has_beta,                      \
     const LayerNormSaved& saved),                                                               \
    (dy, x, gamma, has_beta, saved))                                                             \
  X(Tensor, rms_norm, (const Tensor& x, const Tensor& gamma, float eps, LayerNormSaved& saved),  \
    (x, gamma, eps, saved))                                                                      \
  X(TensorList, rms_norm_backward,                                                               \
    (const Tensor& dy, const Tensor& x, const Tensor& gamma, const LayerNormSaved& saved),       \
    (dy, x, gamma, saved))                                                                       \
  X(Tensor, gelu, (const Tensor& x, bool tanh_approx), (x, tanh_approx))                         \
  X(Tensor, gelu_backward, (const Tensor& x, const Tensor& dy, bool tanh_approx),                \
    (x, dy, tanh_approx))                                                                        \
  X(Tensor, silu, (const Tensor& x), (x))                                                        \
  X(Tensor, silu_backward, (const Tensor& x, const Tensor& dy), (x, dy))                         \
  X(Tensor, cross_entropy,                                                                       \
    (const Tensor& logits, const Tensor& labels, int64_t ignore_index, Tensor& lse),             \
    (logits, labels, ignore_index, lse))                                                         \
  X(Tensor, cross_entropy_backward,                                                              \
    (const Tensor& logits, const Tensor& labels, const Tensor& lse, const Tensor& dloss,         \
     int64_t ignore_index, bool overwrite_logits),                                               \
    (logits, labels, lse, dloss, ignore_index, overwrite_logits))                                \
  X(Tensor, embedding, (const Tensor& table, const Tensor& ids), (table, ids))                   \
  X(Tensor, embedding_backward,                                                                  \
    (const Tensor& dout, const Tensor& ids, int64_t vocab, const Tensor& into),                  \
    (dout, ids, vocab, into))                                                                    \
  X(Tensor, rotary, (const Tensor& x, int64_t pos_offset, float base, bool inverse),             \
    (x, pos_offset, base, inverse))                                                              \
  X(Tensor, attention,                                                                           \
    (const Tensor& q, const Tensor& k, const Tensor& v, bool causal, float scale, Tensor& lse,   \
     const AttentionExtras& extras),                                                             \
    (q, k, v, causal, scale, lse, extras))                                                       \
  X(TensorList, attention_backward,                                                              \
    (const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o, const Tensor& lse,      \
     const Tensor& dout, bool causal, float scale, const AttentionExtras& extras),               \
    (q, k, v, o, lse, dout, causal, scale, extras))

// ---- image kernels --------------------------------------------------------------------------
// max_pool2d_gather: the adjoint of max_pool2d_backward, out[n, c, p] =
// dx[n, c, argmax[n, c, p]]. group_norm: x [N, C, ...] normalised over each of
// `groups` channel groups per sample, then gamma[c] * . + beta[c]; saved: mean
// and rstd [N * groups]. upsample_nearest2d: x [N, C, H, W] -> [N, C, H*f, W*f],
// each pixel repeated over an f x f block; the backward sums each block.
#define REDCO_IMAGE_OPS(X)                                                                       \
  X(Tensor, conv2d,                                                                              \
    (const Tensor& x, const Tensor& w, const Tensor& bias, int64_t stride, int64_t pad),         \
    (x, w, bias, stride, pad))                                                                   \
  X(TensorList, conv2d_backward,                                                                 \
    (const Tensor& dy, const Tensor& x, const Tensor& w, bool has_bias, int64_t stride,          \
     int64_t pad),                                                                               \
    (dy, x, w, has_bias, stride, pad))                                                           \
  X(Tensor, max_pool2d, (const Tensor& x, int64_t k, int64_t stride, Tensor& argmax),            \
    (x, k, stride, argmax))                                                                      \
  X(Tensor, max_pool2d_backward,                                                                 \
    (const Tensor& dy, const Tensor& argmax, const Shape& x, int64_t k, int64_t stride),         \
    (dy, argmax, x, k, stride))                                                                  \
  X(Tensor, max_pool2d_gather, (const Tensor& dx, const Tensor& argmax), (dx, argmax))           \
  X(Tensor, avg_pool2d, (const Tensor& x, int64_t k, int64_t stride), (x, k, stride))            \
  X(Tensor, avg_pool2d_backward, (const Tensor& dy, const Shape& x, int64_t k, int64_t stride),  \
    (dy, x, k, stride))                                                                          \
  X(Tensor, group_norm,                                                                          \
    (const Tensor& x, const Tensor& gamma, const Tensor& beta, int64_t groups, float eps,        \
     LayerNormSaved& saved),                                                                     \
    (x, gamma, beta, groups, eps, saved))                                                        \
  X(TensorList, group_norm_backward,                                                             \
    (const Tensor& dy, const Tensor& x, const Tensor& gamma, int64_t groups, bool has_beta,      \
     const LayerNormSaved& saved),                                                               \
    (dy, x, gamma, groups, has_beta, saved))                                                     \
  X(Tensor, upsample_nearest2d, (const Tensor& x, int64_t f), (x, f))                            \
  X(Tensor, upsample_nearest2d_backward, (const Tensor& dy, int64_t f), (dy, f))

// ---- optimizer kernels ----------------------------------------------------------------------
// The updates of one f32 parameter, in place on its device (buf undefined: SGD
// without momentum). sum_of_squares: of an f32 tensor, accumulated in double in
// a fixed order (bitwise the same from run to run), returned to the host: the
// gradient norm's one device-to-host transfer per tensor.
#define REDCO_OPTIM_OPS(X)                                                                       \
  X(void, sgd_update, (Tensor & param, const Tensor& grad, Tensor& buf, const SgdCoeffs& c),     \
    (param, grad, buf, c))                                                                       \
  X(void, adam_update,                                                                           \
    (Tensor & param, const Tensor& grad, Tensor& m, Tensor& v, const AdamCoeffs& c),             \
    (param, grad, m, v, c))                                                                      \
  X(double, sum_of_squares, (const Tensor& x), (x))

#define REDCO_DISPATCHED_OPS(X) \
  REDCO_GENERIC_OPS(X) REDCO_NN_OPS(X) REDCO_IMAGE_OPS(X) REDCO_OPTIM_OPS(X)

// 1/(1-p) where a Philox draw keeps the element, else 0: element i depends
// only on (seed, stream, i).
#define REDCO_OPS(X)         \
  REDCO_DISPATCHED_OPS(X)    \
  X(Tensor, dropout_mask, (const Shape& shape, float p, uint64_t seed, uint64_t stream), \
    (shape, p, seed, stream))

// Inside a backend's class: the declarations of all its kernels.
#define REDCO_OP_OVERRIDE(ret, name, params, args) ret name params override;
#define REDCO_OP_OVERRIDES REDCO_OPS(REDCO_OP_OVERRIDE)
// clang-format on
