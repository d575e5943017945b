// CpuBackend: allocates outputs from the caching allocator and forwards to the
// raw-pointer kernels in redco/ops/cpu. The arguments arrive checked by the
// op's meta function (ops/meta.hpp). Half-precision inputs are upcast to f32
// here (compute is f32; outputs are f32).
#include <cmath>

#include "redco/core/philox.hpp"
#include "redco/ops/cpu/activation.hpp"
#include "redco/ops/cpu/attention.hpp"
#include "redco/ops/cpu/backend_cpu.hpp"
#include "redco/ops/cpu/conv.hpp"
#include "redco/ops/cpu/decode_panels.hpp"
#include "redco/ops/cpu/embedding.hpp"
#include "redco/ops/cpu/group_norm.hpp"
#include "redco/ops/cpu/norm.hpp"
#include "redco/ops/cpu/quantized_rows.hpp"
#include "redco/ops/cpu/rotary.hpp"
#include "redco/ops/cpu/softmax.hpp"
#include "redco/ops/cpu/tensor_ops.hpp"
#include "redco/ops/paged_kv.hpp"

namespace redco {
namespace {

// The f32 data of `t`, converting half-precision storage on the way in.
Tensor f32(const Tensor& t) { return t.dtype() == DType::f32 ? t : t.to(DType::f32); }

const int64_t* ids_of(const Tensor& t) { return t.data<int64_t>(); }

Tensor like(const Tensor& x) { return Tensor::empty(x.shape()); }

}  // namespace

// ---- generic kernels ---------------------------------------------------------
Tensor CpuBackend::unary(UnaryOp op, const Tensor& x) { return cpu::unary(op, x); }
Tensor CpuBackend::binary(BinaryOp op, const Tensor& a, const Tensor& b) {
  return cpu::binary(op, a, b);
}
Tensor CpuBackend::binary_scalar(BinaryOp op, const Tensor& a, float s) {
  return cpu::binary_scalar(op, a, s);
}
void CpuBackend::add_inplace(Tensor& a, const Tensor& b) { cpu::add_inplace(a, b); }
Tensor CpuBackend::reduce(ReduceOp op, const Tensor& x, std::span<const int> axes) {
  return cpu::reduce(op, x, axes);
}
Tensor CpuBackend::argmax(const Tensor& x, int axis) { return cpu::argmax(x, axis); }
Tensor CpuBackend::broadcast_to(const Tensor& x, const Shape& shape) {
  return cpu::broadcast_to(x, shape);
}
Tensor CpuBackend::permute(const Tensor& x, std::span<const int> perm) {
  return cpu::permute(x, perm);
}
Tensor CpuBackend::slice(const Tensor& x, int axis, int64_t start, int64_t len) {
  return cpu::slice(x, axis, start, len);
}
void CpuBackend::slice_assign(Tensor& dst, const Tensor& src, int axis, int64_t start) {
  cpu::slice_assign(dst, src, axis, start);
}
Tensor CpuBackend::matmul(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  return cpu::matmul(a, b, ta, tb);
}
void CpuBackend::matmul_into(const Tensor& a, const Tensor& b, bool ta, bool tb, Tensor& c,
                             bool accumulate) {
  cpu::matmul_into(a, b, ta, tb, c, accumulate);
}

// ---- softmax family ------------------------------------------------------------
Tensor CpuBackend::softmax(const Tensor& x_in) {
  Tensor x = f32(x_in), y = like(x);
  cpu::softmax_forward(x.data<float>(), y.data<float>(), x.shape().rows(), x.shape().last());
  return y;
}
Tensor CpuBackend::softmax_backward(const Tensor& y, const Tensor& dy_in) {
  Tensor dy = f32(dy_in), dx = like(y);
  cpu::softmax_backward(y.data<float>(), dy.data<float>(), dx.data<float>(), y.shape().rows(),
                        y.shape().last());
  return dx;
}
Tensor CpuBackend::log_softmax(const Tensor& x_in) {
  Tensor x = f32(x_in), y = like(x);
  cpu::log_softmax_forward(x.data<float>(), y.data<float>(), x.shape().rows(), x.shape().last());
  return y;
}
Tensor CpuBackend::log_softmax_backward(const Tensor& y, const Tensor& dy_in) {
  Tensor dy = f32(dy_in), dx = like(y);
  cpu::log_softmax_backward(y.data<float>(), dy.data<float>(), dx.data<float>(), y.shape().rows(),
                            y.shape().last());
  return dx;
}
Tensor CpuBackend::cross_entropy(const Tensor& logits_in, const Tensor& labels,
                                 int64_t ignore_index, Tensor& lse) {
  Tensor logits = f32(logits_in);
  const int64_t rows = logits.shape().rows(), vocab = logits.shape().last();
  Tensor losses = Tensor::empty(labels.shape());
  lse = Tensor::empty(labels.shape());
  cpu::cross_entropy_forward(logits.data<float>(), ids_of(labels), losses.data<float>(),
                             lse.data<float>(), rows, vocab, ignore_index);
  return losses;
}
Tensor CpuBackend::cross_entropy_backward(const Tensor& logits_in, const Tensor& labels,
                                          const Tensor& lse, const Tensor& dloss_in,
                                          int64_t ignore_index, bool overwrite_logits) {
  Tensor logits = f32(logits_in);
  Tensor dloss = f32(dloss_in);
  // In place: each element is read once, then overwritten (softmax.cpp).
  Tensor dlogits = overwrite_logits && logits_in.dtype() == DType::f32 ? logits : like(logits);
  cpu::cross_entropy_backward(logits.data<float>(), ids_of(labels), lse.data<float>(),
                              dloss.data<float>(), dlogits.data<float>(), logits.shape().rows(),
                              logits.shape().last(), ignore_index);
  return dlogits;
}

// ---- norms ------------------------------------------------------------------------
Tensor CpuBackend::layer_norm(const Tensor& x_in, const Tensor& gamma_in, const Tensor& beta_in,
                              float eps, LayerNormSaved& saved) {
  Tensor x = f32(x_in), gamma = f32(gamma_in);
  Tensor beta;
  if (beta_in.defined()) {
    beta = f32(beta_in);
  }
  const int64_t rows = x.shape().rows();
  saved.mean = Tensor::empty({rows});
  saved.rstd = Tensor::empty({rows});
  Tensor y = like(x);
  cpu::layer_norm_forward(x.data<float>(), gamma.data<float>(),
                          beta.defined() ? beta.data<float>() : nullptr, y.data<float>(),
                          saved.mean.data<float>(), saved.rstd.data<float>(), rows,
                          x.shape().last(), eps);
  return y;
}
TensorList CpuBackend::layer_norm_backward(const Tensor& dy_in, const Tensor& x_in,
                                           const Tensor& gamma_in, bool has_beta,
                                           const LayerNormSaved& saved) {
  Tensor dy = f32(dy_in), x = f32(x_in);
  Tensor gamma = f32(gamma_in);
  Tensor dx = like(x), dgamma = like(gamma), dbeta = has_beta ? like(gamma) : Tensor();
  cpu::layer_norm_backward(dy.data<float>(), x.data<float>(), gamma.data<float>(),
                           saved.mean.data<float>(), saved.rstd.data<float>(), dx.data<float>(),
                           dgamma.data<float>(), has_beta ? dbeta.data<float>() : nullptr,
                           x.shape().rows(), x.shape().last());
  return {dx, dgamma, dbeta};
}
Tensor CpuBackend::rms_norm(const Tensor& x_in, const Tensor& gamma_in, float eps,
                            LayerNormSaved& saved) {
  Tensor x = f32(x_in), gamma = f32(gamma_in);
  const int64_t rows = x.shape().rows();
  saved.rstd = Tensor::empty({rows});
  Tensor y = like(x);
  cpu::rms_norm_forward(x.data<float>(), gamma.data<float>(), y.data<float>(),
                        saved.rstd.data<float>(), rows, x.shape().last(), eps);
  return y;
}
TensorList CpuBackend::rms_norm_backward(const Tensor& dy_in, const Tensor& x_in,
                                         const Tensor& gamma_in, const LayerNormSaved& saved) {
  Tensor dy = f32(dy_in), x = f32(x_in);
  Tensor gamma = f32(gamma_in);
  Tensor dx = like(x), dgamma = like(gamma);
  cpu::rms_norm_backward(dy.data<float>(), x.data<float>(), gamma.data<float>(),
                         saved.rstd.data<float>(), dx.data<float>(), dgamma.data<float>(),
                         x.shape().rows(), x.shape().last());
  return {dx, dgamma};
}

// ---- activations -------------------------------------------------------------------
Tensor CpuBackend::gelu(const Tensor& x_in, bool tanh_approx) {
  Tensor x = f32(x_in), y = like(x);
  cpu::gelu_forward(x.data<float>(), y.data<float>(), x.numel(), tanh_approx);
  return y;
}
Tensor CpuBackend::gelu_backward(const Tensor& x_in, const Tensor& dy_in, bool tanh_approx) {
  Tensor x = f32(x_in), dy = f32(dy_in), dx = like(x);
  cpu::gelu_backward(x.data<float>(), dy.data<float>(), dx.data<float>(), x.numel(), tanh_approx);
  return dx;
}
Tensor CpuBackend::silu(const Tensor& x_in) {
  Tensor x = f32(x_in), y = like(x);
  cpu::silu_forward(x.data<float>(), y.data<float>(), x.numel());
  return y;
}
Tensor CpuBackend::silu_backward(const Tensor& x_in, const Tensor& dy_in) {
  Tensor x = f32(x_in), dy = f32(dy_in), dx = like(x);
  cpu::silu_backward(x.data<float>(), dy.data<float>(), dx.data<float>(), x.numel());
  return dx;
}

// ---- embedding and positions -----------------------------------------------------------
Tensor CpuBackend::embedding(const Tensor& table_in, const Tensor& ids) {
  if (in_panels(table_in)) {  // a tied LM head packed for decoding: gather its rows
    Tensor out = Tensor::empty(ids.shape().append(table_in.dim(1)));
    cpu::embedding_forward_panels(panel_data(table_in), ids_of(ids), out.data<float>(), ids.numel(),
                                  table_in.dim(0), table_in.dim(1));
    return out;
  }
  if (table_in.dtype() == DType::bf16) {  // widen only the rows looked up, not the table
    Tensor out = Tensor::empty(ids.shape().append(table_in.dim(1)));
    cpu::embedding_forward_bf16(static_cast<const uint16_t*>(table_in.raw()), ids_of(ids),
                                out.data<float>(), ids.numel(), table_in.dim(0), table_in.dim(1));
    return out;
  }
  if (in_i8_panels(table_in)) {  // a tied LM head in int8 panels: gather and scale its rows
    Tensor out = Tensor::empty(ids.shape().append(table_in.dim(1)));
    cpu::embedding_forward_i8_panels(i8_panel_data(table_in), i8_panel_scales(table_in),
                                     ids_of(ids), out.data<float>(), ids.numel(), table_in.dim(0),
                                     table_in.dim(1));
    return out;
  }
  if (row_scales(table_in)) {  // int8: scale only the rows looked up
    Tensor out = Tensor::empty(ids.shape().append(table_in.dim(1)));
    cpu::embedding_forward_i8(static_cast<const int8_t*>(table_in.raw()),
                              row_scales(table_in)->data<float>(), ids_of(ids), out.data<float>(),
                              ids.numel(), table_in.dim(0), table_in.dim(1));
    return out;
  }
  Tensor table = f32(table_in);
  Tensor out = Tensor::empty(ids.shape().append(table.dim(1)));
  cpu::embedding_forward(table.data<float>(), ids_of(ids), out.data<float>(), ids.numel(),
                         table.dim(0), table.dim(1));
  return out;
}
Tensor CpuBackend::embedding_backward(const Tensor& dout_in, const Tensor& ids, int64_t vocab,
                                      const Tensor& into) {
  Tensor dout = f32(dout_in);
  const int64_t dim = dout.shape().last();
  Tensor dtable = into.defined() ? into : Tensor::zeros({vocab, dim});
  cpu::embedding_backward(dout.data<float>(), ids_of(ids), dtable.data<float>(), ids.numel(), vocab,
                          dim);
  return dtable;
}
Tensor CpuBackend::rotary(const Tensor& x_in, int64_t pos_offset, float base, bool inverse) {
  Tensor x = f32(x_in), y = like(x);
  cpu::rotary_apply(x.data<float>(), y.data<float>(), x.dim(0), x.dim(1), x.dim(2), x.dim(3),
                    pos_offset, base, inverse);
  return y;
}

// ---- attention ------------------------------------------------------------------------
namespace {
cpu::AttentionShape attention_shape(const Tensor& q, const Tensor& k, bool causal, float scale) {
  return {q.dim(0), q.dim(1), k.dim(1), q.dim(2), k.dim(2), q.dim(3), scale, causal};
}

// Points the kernel's view at the extras.
void attach_extras(cpu::AttentionShape& s, const AttentionExtras& x, Tensor& bias) {
  if (x.key_begin.defined()) {
    s.key_begin = x.key_begin.data<int64_t>();
    s.key_end = x.key_end.data<int64_t>();
  }
  if (x.causal_offset.defined()) s.causal_offset = x.causal_offset.data<int64_t>();
  if (x.bias.defined()) {
    bias = f32(x.bias);
    s.bias_per_row = bias.shape() == (Shape{s.B, s.Hq, s.Tq, s.Tk});
    s.bias = bias.data<float>();
  }
}

// A paged KV cache: the decode kernel reads the blocks where they lie; more
// query rows than it takes (a prompt continued on a paged cache) get them
// gathered into rows first.
Tensor paged_attention(CpuBackend& cpu, const Tensor& q_in, const Tensor& k_in, const Tensor& v_in,
                       bool causal, float scale, Tensor& lse, const AttentionExtras& x) {
  const Tensor& table = x.block_table;
  const int64_t block = k_in.dim(2);
  cpu::AttentionShape s{q_in.dim(0),          q_in.dim(1), k_in.dim(1), q_in.dim(2),
                        table.dim(1) * block, q_in.dim(3), scale,       causal};
  const bool bf16_kv = k_in.dtype() == DType::bf16 && v_in.dtype() == DType::bf16;
  const bool f32_kv = k_in.dtype() == DType::f32 && v_in.dtype() == DType::f32;
  if (!cpu::use_decode_attention(s) || !(bf16_kv || f32_kv)) {
    AttentionExtras rows = x;
    rows.block_table = Tensor();
    return cpu.attention(q_in, gather_paged_kv(k_in, table), gather_paged_kv(v_in, table), causal,
                         scale, lse, rows);
  }
  Tensor q = f32(q_in), bias;
  attach_extras(s, x, bias);
  s.block_table = table.data<int64_t>(), s.block = block, s.blocks_per_row = table.dim(1);
  Tensor o = like(q);
  lse = Tensor::empty({s.B, s.Hq, s.Tq});
  cpu::decode_attention_forward(s, q.data<float>(), k_in.raw(), v_in.raw(), bf16_kv,
                                o.data<float>(), lse.data<float>());
  return o;
}
}  // namespace

Tensor CpuBackend::attention(const Tensor& q_in, const Tensor& k_in, const Tensor& v_in,
                             bool causal, float scale, Tensor& lse, const AttentionExtras& x) {
  if (x.block_table.defined())
    return paged_attention(*this, q_in, k_in, v_in, causal, scale, lse, x);
  Tensor q = f32(q_in);
  auto s = attention_shape(q, k_in, causal, scale);
  Tensor bias;
  attach_extras(s, x, bias);
  Tensor o = like(q);
  lse = Tensor::empty({s.B, s.Hq, s.Tq});
  const bool bf16_kv = k_in.dtype() == DType::bf16 && v_in.dtype() == DType::bf16;
  if (cpu::use_decode_attention(s) &&
      (bf16_kv || (k_in.dtype() == DType::f32 && v_in.dtype() == DType::f32))) {
    // A decode step: the cached keys and values read once, as stored.
    cpu::decode_attention_forward(s, q.data<float>(), k_in.raw(), v_in.raw(), bf16_kv,
                                  o.data<float>(), lse.data<float>());
    return o;
  }
  Tensor k = f32(k_in), v = f32(v_in);
  cpu::flash_attention_forward(s, q.data<float>(), k.data<float>(), v.data<float>(),
                               o.data<float>(), lse.data<float>());
  return o;
}
TensorList CpuBackend::attention_backward(const Tensor& q_in, const Tensor& k_in,
                                          const Tensor& v_in, const Tensor& o, const Tensor& lse,
                                          const Tensor& dout_in, bool causal, float scale,
                                          const AttentionExtras& x) {
  Tensor q = f32(q_in), k = f32(k_in), v = f32(v_in);
  Tensor dout = f32(dout_in);
  auto s = attention_shape(q, k, causal, scale);
  Tensor bias;
  attach_extras(s, x, bias);
  Tensor dq = like(q), dk = like(k), dv = like(v);
  // Each batch row's bias gradient [B, Hq, Tq, Tk], summed over B after.
  Tensor dbias_rows = bias.defined() ? Tensor::empty({s.B, s.Hq, s.Tq, s.Tk}) : Tensor();
  cpu::flash_attention_backward(s, q.data<float>(), k.data<float>(), v.data<float>(),
                                o.data<float>(), lse.data<float>(), dout.data<float>(),
                                dq.data<float>(), dk.data<float>(), dv.data<float>(),
                                bias.defined() ? dbias_rows.data<float>() : nullptr);
  if (!bias.defined()) return {dq, dk, dv};
  if (s.bias_per_row) return {dq, dk, dv, dbias_rows};
  const int axes[] = {0};
  return {dq, dk, dv, reduce(ReduceOp::sum, dbias_rows, axes).view({s.Hq, s.Tq, s.Tk})};
}

// ---- convolution and pooling --------------------------------------------------------------
namespace {
cpu::Conv2dGeometry conv_geometry(const Tensor& x, const Tensor& w, int64_t stride, int64_t pad) {
  return {x.dim(0), x.dim(1), x.dim(2), x.dim(3), w.dim(0), w.dim(2), w.dim(3), stride, pad};
}
Tensor cols_scratch(const cpu::Conv2dGeometry& g) {
  return Tensor::empty({g.N, g.C * g.KH * g.KW, g.out_h() * g.out_w()});
}
cpu::Pool2dGeometry pool_geometry(const Shape& x, int64_t k, int64_t stride) {
  return {x[0], x[1], x[2], x[3], k, stride};
}
}  // namespace

Tensor CpuBackend::conv2d(const Tensor& x_in, const Tensor& w_in, const Tensor& bias_in,
                          int64_t stride, int64_t pad) {
  Tensor x = f32(x_in), w = f32(w_in);
  const auto g = conv_geometry(x, w, stride, pad);
  Tensor bias;
  if (bias_in.defined()) {
    bias = f32(bias_in);
  }
  Tensor y = Tensor::empty({g.N, g.O, g.out_h(), g.out_w()}), cols = cols_scratch(g);
  cpu::conv2d_forward(x.data<float>(), w.data<float>(),
                      bias.defined() ? bias.data<float>() : nullptr, y.data<float>(),
                      cols.data<float>(), g);
  return y;
}
TensorList CpuBackend::conv2d_backward(const Tensor& dy_in, const Tensor& x_in, const Tensor& w_in,
                                       bool has_bias, int64_t stride, int64_t pad) {
  Tensor x = f32(x_in), w = f32(w_in), dy = f32(dy_in);
  const auto g = conv_geometry(x, w, stride, pad);
  Tensor dx = like(x), dw = like(w), dbias = has_bias ? Tensor::empty({g.O}) : Tensor();
  Tensor cols = cols_scratch(g);
  cpu::conv2d_backward(dy.data<float>(), x.data<float>(), w.data<float>(), dx.data<float>(),
                       dw.data<float>(), has_bias ? dbias.data<float>() : nullptr,
                       cols.data<float>(), g);
  return {dx, dw, dbias};
}
Tensor CpuBackend::max_pool2d(const Tensor& x_in, int64_t k, int64_t stride, Tensor& argmax) {
  Tensor x = f32(x_in);
  const auto g = pool_geometry(x.shape(), k, stride);
  Tensor y = Tensor::empty({g.N, g.C, g.out_h(), g.out_w()});
  argmax = Tensor::empty(y.shape(), DType::i32);
  cpu::max_pool2d_forward(x.data<float>(), y.data<float>(), argmax.data<int32_t>(), g);
  return y;
}
Tensor CpuBackend::max_pool2d_backward(const Tensor& dy_in, const Tensor& argmax, const Shape& x,
                                       int64_t k, int64_t stride) {
  Tensor dy = f32(dy_in), dx = Tensor::empty(x);
  const auto g = pool_geometry(x, k, stride);
  cpu::max_pool2d_backward(dy.data<float>(), argmax.data<int32_t>(), dx.data<float>(), g);
  return dx;
}
Tensor CpuBackend::max_pool2d_gather(const Tensor& dx_in, const Tensor& argmax) {
  Tensor dx = f32(dx_in), out = Tensor::empty(argmax.shape());
  const int64_t planes = dx.dim(0) * dx.dim(1), hw = dx.dim(2) * dx.dim(3);
  const int64_t ohw = argmax.dim(2) * argmax.dim(3);
  const float* src = dx.data<float>();
  const int32_t* idx = argmax.data<int32_t>();
  float* o = out.data<float>();
  for (int64_t p = 0; p < planes; ++p)
    for (int64_t i = 0; i < ohw; ++i) o[p * ohw + i] = src[p * hw + idx[p * ohw + i]];
  return out;
}
Tensor CpuBackend::avg_pool2d(const Tensor& x_in, int64_t k, int64_t stride) {
  Tensor x = f32(x_in);
  const auto g = pool_geometry(x.shape(), k, stride);
  Tensor y = Tensor::empty({g.N, g.C, g.out_h(), g.out_w()});
  cpu::avg_pool2d_forward(x.data<float>(), y.data<float>(), g);
  return y;
}
Tensor CpuBackend::avg_pool2d_backward(const Tensor& dy_in, const Shape& x, int64_t k,
                                       int64_t stride) {
  Tensor dy = f32(dy_in), dx = Tensor::empty(x);
  const auto g = pool_geometry(x, k, stride);
  cpu::avg_pool2d_backward(dy.data<float>(), dx.data<float>(), g);
  return dx;
}

// ---- group norm and upsampling ---------------------------------------------------------------
namespace {
cpu::GroupNormGeometry group_geometry(const Tensor& x, int64_t groups) {
  return {x.dim(0), x.dim(1), x.numel() / std::max<int64_t>(x.dim(0) * x.dim(1), 1), groups};
}
Shape upsampled(const Shape& x, int64_t f) { return Shape{x[0], x[1], x[2] * f, x[3] * f}; }
}  // namespace

Tensor CpuBackend::group_norm(const Tensor& x_in, const Tensor& gamma_in, const Tensor& beta_in,
                              int64_t groups, float eps, LayerNormSaved& saved) {
  Tensor x = f32(x_in), gamma = f32(gamma_in), beta;
  const auto g = group_geometry(x, groups);
  if (beta_in.defined()) {
    beta = f32(beta_in);
  }
  Tensor y = like(x);
  saved.mean = Tensor::empty({g.rows()});
  saved.rstd = Tensor::empty({g.rows()});
  cpu::group_norm_forward(x.data<float>(), gamma.data<float>(),
                          beta.defined() ? beta.data<float>() : nullptr, y.data<float>(),
                          saved.mean.data<float>(), saved.rstd.data<float>(), g, eps);
  return y;
}
TensorList CpuBackend::group_norm_backward(const Tensor& dy_in, const Tensor& x_in,
                                           const Tensor& gamma_in, int64_t groups, bool has_beta,
                                           const LayerNormSaved& saved) {
  Tensor dy = f32(dy_in), x = f32(x_in);
  Tensor gamma = f32(gamma_in);
  const auto g = group_geometry(x, groups);
  Tensor dx = like(x), dgamma = like(gamma), dbeta = has_beta ? like(gamma) : Tensor();
  Tensor partials = Tensor::empty({2, g.N, g.C});
  cpu::group_norm_backward(dy.data<float>(), x.data<float>(), gamma.data<float>(),
                           saved.mean.data<float>(), saved.rstd.data<float>(), dx.data<float>(),
                           dgamma.data<float>(), has_beta ? dbeta.data<float>() : nullptr,
                           partials.data<float>(), g);
  return {dx, dgamma, dbeta};
}
Tensor CpuBackend::upsample_nearest2d(const Tensor& x_in, int64_t f) {
  Tensor x = f32(x_in);
  Tensor y = Tensor::empty(upsampled(x.shape(), f));
  cpu::upsample_nearest2d_forward(x.data<float>(), y.data<float>(), x.dim(0) * x.dim(1), x.dim(2),
                                  x.dim(3), f);
  return y;
}
Tensor CpuBackend::upsample_nearest2d_backward(const Tensor& dy_in, int64_t f) {
  Tensor dy = f32(dy_in);
  Tensor dx = Tensor::empty({dy.dim(0), dy.dim(1), dy.dim(2) / f, dy.dim(3) / f});
  cpu::upsample_nearest2d_backward(dy.data<float>(), dx.data<float>(), dy.dim(0) * dy.dim(1),
                                   dx.dim(2), dx.dim(3), f);
  return dx;
}

// ---- dropout ------------------------------------------------------------------------------
Tensor CpuBackend::dropout_mask(const Shape& shape, float p, uint64_t seed, uint64_t stream) {
  const int64_t n = shape.numel();
  Tensor keep = Tensor::empty(shape, DType::u8), mask = Tensor::empty(shape);
  // philox_bernoulli marks element i with probability `1 - p` of being kept.
  philox_bernoulli(keep.data<uint8_t>(), n, seed, stream, 0, 1.f - p);
  const uint8_t* k = keep.data<uint8_t>();
  float* m = mask.data<float>();
  const float scale = 1.f / (1.f - p);
  for (int64_t i = 0; i < n; ++i) m[i] = k[i] ? scale : 0.f;
  return mask;
}

}  // namespace redco
