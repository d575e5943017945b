// CpuBackend: checks shapes, allocates outputs from the caching allocator and
// forwards to the raw-pointer kernels in redco/ops/cpu. Half-precision inputs
// are upcast to f32 here (compute is f32; outputs are f32).
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
Tensor f32(const Tensor& t, const char* op) {
  REDCO_CHECK(t.defined(), "{}: an input tensor is undefined", op);
  if (t.dtype() == DType::f32) return t;
  REDCO_CHECK(is_floating(t.dtype()), "{}: expected a floating tensor, got {}{}", op,
              dtype_name(t.dtype()), t.shape());
  return t.to(DType::f32);
}

const int64_t* ids_of(const Tensor& t, const char* op) {
  REDCO_CHECK(t.dtype() == DType::i64, "{}: indices must be i64, got {}{}", op,
              dtype_name(t.dtype()), t.shape());
  return t.data<int64_t>();
}

Tensor like(const Tensor& x) { return Tensor::empty(x.shape()); }

void check_last_dim(const Tensor& x, const Tensor& v, const char* op, const char* what) {
  REDCO_CHECK(v.rank() == 1 && v.dim(0) == x.shape().last(),
              "{}: {} has shape {} but the input {} needs [{}]", op, what, v.shape(), x.shape(),
              x.shape().last());
}

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
  Tensor x = f32(x_in, "softmax"), y = like(x);
  cpu::softmax_forward(x.data<float>(), y.data<float>(), x.shape().rows(), x.shape().last());
  return y;
}
Tensor CpuBackend::softmax_backward(const Tensor& y, const Tensor& dy_in) {
  Tensor dy = f32(dy_in, "softmax backward"), dx = like(y);
  check_same_shape(y, dy, "softmax backward");
  cpu::softmax_backward(y.data<float>(), dy.data<float>(), dx.data<float>(), y.shape().rows(),
                        y.shape().last());
  return dx;
}
Tensor CpuBackend::log_softmax(const Tensor& x_in) {
  Tensor x = f32(x_in, "log_softmax"), y = like(x);
  cpu::log_softmax_forward(x.data<float>(), y.data<float>(), x.shape().rows(), x.shape().last());
  return y;
}
Tensor CpuBackend::log_softmax_backward(const Tensor& y, const Tensor& dy_in) {
  Tensor dy = f32(dy_in, "log_softmax backward"), dx = like(y);
  check_same_shape(y, dy, "log_softmax backward");
  cpu::log_softmax_backward(y.data<float>(), dy.data<float>(), dx.data<float>(), y.shape().rows(),
                            y.shape().last());
  return dx;
}
Tensor CpuBackend::cross_entropy(const Tensor& logits_in, const Tensor& labels,
                                 int64_t ignore_index, Tensor& lse) {
  Tensor logits = f32(logits_in, "cross_entropy");
  const int64_t rows = logits.shape().rows(), vocab = logits.shape().last();
  REDCO_CHECK(labels.numel() == rows,
              "cross_entropy: logits {} need {} labels (one per row), got labels {}",
              logits.shape(), rows, labels.shape());
  Tensor losses = Tensor::empty(labels.shape());
  lse = Tensor::empty(labels.shape());
  cpu::cross_entropy_forward(logits.data<float>(), ids_of(labels, "cross_entropy"),
                             losses.data<float>(), lse.data<float>(), rows, vocab, ignore_index);
  return losses;
}
Tensor CpuBackend::cross_entropy_backward(const Tensor& logits_in, const Tensor& labels,
                                          const Tensor& lse, const Tensor& dloss_in,
                                          int64_t ignore_index, bool overwrite_logits) {
  Tensor logits = f32(logits_in, "cross_entropy backward");
  Tensor dloss = f32(dloss_in, "cross_entropy backward");
  // In place: each element is read once, then overwritten (softmax.cpp).
  Tensor dlogits = overwrite_logits && logits_in.dtype() == DType::f32 ? logits : like(logits);
  check_same_shape(labels, dloss, "cross_entropy backward");
  cpu::cross_entropy_backward(logits.data<float>(), ids_of(labels, "cross_entropy"),
                              lse.data<float>(), dloss.data<float>(), dlogits.data<float>(),
                              logits.shape().rows(), logits.shape().last(), ignore_index);
  return dlogits;
}

// ---- norms ------------------------------------------------------------------------
Tensor CpuBackend::layer_norm(const Tensor& x_in, const Tensor& gamma_in, const Tensor& beta_in,
                              float eps, LayerNormSaved& saved) {
  Tensor x = f32(x_in, "layer_norm"), gamma = f32(gamma_in, "layer_norm");
  check_last_dim(x, gamma, "layer_norm", "gamma");
  Tensor beta;
  if (beta_in.defined()) {
    beta = f32(beta_in, "layer_norm");
    check_last_dim(x, beta, "layer_norm", "beta");
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
  Tensor dy = f32(dy_in, "layer_norm backward"), x = f32(x_in, "layer_norm backward");
  Tensor gamma = f32(gamma_in, "layer_norm backward");
  check_same_shape(x, dy, "layer_norm backward");
  Tensor dx = like(x), dgamma = like(gamma), dbeta = has_beta ? like(gamma) : Tensor();
  cpu::layer_norm_backward(dy.data<float>(), x.data<float>(), gamma.data<float>(),
                           saved.mean.data<float>(), saved.rstd.data<float>(), dx.data<float>(),
                           dgamma.data<float>(), has_beta ? dbeta.data<float>() : nullptr,
                           x.shape().rows(), x.shape().last());
  return {dx, dgamma, dbeta};
}
Tensor CpuBackend::rms_norm(const Tensor& x_in, const Tensor& gamma_in, float eps,
                            LayerNormSaved& saved) {
  Tensor x = f32(x_in, "rms_norm"), gamma = f32(gamma_in, "rms_norm");
  check_last_dim(x, gamma, "rms_norm", "gamma");
  const int64_t rows = x.shape().rows();
  saved.rstd = Tensor::empty({rows});
  Tensor y = like(x);
  cpu::rms_norm_forward(x.data<float>(), gamma.data<float>(), y.data<float>(),
                        saved.rstd.data<float>(), rows, x.shape().last(), eps);
  return y;
}
TensorList CpuBackend::rms_norm_backward(const Tensor& dy_in, const Tensor& x_in,
                                         const Tensor& gamma_in, const LayerNormSaved& saved) {
  Tensor dy = f32(dy_in, "rms_norm backward"), x = f32(x_in, "rms_norm backward");
  Tensor gamma = f32(gamma_in, "rms_norm backward");
  check_same_shape(x, dy, "rms_norm backward");
  Tensor dx = like(x), dgamma = like(gamma);
  cpu::rms_norm_backward(dy.data<float>(), x.data<float>(), gamma.data<float>(),
                         saved.rstd.data<float>(), dx.data<float>(), dgamma.data<float>(),
                         x.shape().rows(), x.shape().last());
  return {dx, dgamma};
}

// ---- activations -------------------------------------------------------------------
Tensor CpuBackend::gelu(const Tensor& x_in, bool tanh_approx) {
  Tensor x = f32(x_in, "gelu"), y = like(x);
  cpu::gelu_forward(x.data<float>(), y.data<float>(), x.numel(), tanh_approx);
  return y;
}
Tensor CpuBackend::gelu_backward(const Tensor& x_in, const Tensor& dy_in, bool tanh_approx) {
  Tensor x = f32(x_in, "gelu backward"), dy = f32(dy_in, "gelu backward"), dx = like(x);
  check_same_shape(x, dy, "gelu backward");
  cpu::gelu_backward(x.data<float>(), dy.data<float>(), dx.data<float>(), x.numel(), tanh_approx);
  return dx;
}
Tensor CpuBackend::silu(const Tensor& x_in) {
  Tensor x = f32(x_in, "silu"), y = like(x);
  cpu::silu_forward(x.data<float>(), y.data<float>(), x.numel());
  return y;
}
Tensor CpuBackend::silu_backward(const Tensor& x_in, const Tensor& dy_in) {
  Tensor x = f32(x_in, "silu backward"), dy = f32(dy_in, "silu backward"), dx = like(x);
  check_same_shape(x, dy, "silu backward");
  cpu::silu_backward(x.data<float>(), dy.data<float>(), dx.data<float>(), x.numel());
  return dx;
}

// ---- embedding and positions -----------------------------------------------------------
Tensor CpuBackend::embedding(const Tensor& table_in, const Tensor& ids) {
  REDCO_CHECK(table_in.rank() == 2, "embedding: the table must be [vocab, dim], got {}",
              table_in.shape());
  if (in_panels(table_in)) {  // a tied LM head packed for decoding: gather its rows
    Tensor out = Tensor::empty(ids.shape().append(table_in.dim(1)));
    cpu::embedding_forward_panels(panel_data(table_in), ids_of(ids, "embedding"), out.data<float>(),
                                  ids.numel(), table_in.dim(0), table_in.dim(1));
    return out;
  }
  if (table_in.dtype() == DType::bf16) {  // widen only the rows looked up, not the table
    Tensor out = Tensor::empty(ids.shape().append(table_in.dim(1)));
    cpu::embedding_forward_bf16(static_cast<const uint16_t*>(table_in.raw()),
                                ids_of(ids, "embedding"), out.data<float>(), ids.numel(),
                                table_in.dim(0), table_in.dim(1));
    return out;
  }
  if (in_i8_panels(table_in)) {  // a tied LM head in int8 panels: gather and scale its rows
    Tensor out = Tensor::empty(ids.shape().append(table_in.dim(1)));
    cpu::embedding_forward_i8_panels(i8_panel_data(table_in), i8_panel_scales(table_in),
                                     ids_of(ids, "embedding"), out.data<float>(), ids.numel(),
                                     table_in.dim(0), table_in.dim(1));
    return out;
  }
  if (row_scales(table_in)) {  // int8: scale only the rows looked up
    Tensor out = Tensor::empty(ids.shape().append(table_in.dim(1)));
    cpu::embedding_forward_i8(static_cast<const int8_t*>(table_in.raw()),
                              row_scales(table_in)->data<float>(), ids_of(ids, "embedding"),
                              out.data<float>(), ids.numel(), table_in.dim(0), table_in.dim(1));
    return out;
  }
  Tensor table = f32(table_in, "embedding");
  Tensor out = Tensor::empty(ids.shape().append(table.dim(1)));
  cpu::embedding_forward(table.data<float>(), ids_of(ids, "embedding"), out.data<float>(),
                         ids.numel(), table.dim(0), table.dim(1));
  return out;
}
Tensor CpuBackend::embedding_backward(const Tensor& dout_in, const Tensor& ids, int64_t vocab,
                                      const Tensor& into) {
  Tensor dout = f32(dout_in, "embedding backward");
  const int64_t dim = dout.shape().last();
  REDCO_CHECK(dout.numel() == ids.numel() * dim,
              "embedding backward: gradient {} does not match ids {} x dim {}", dout.shape(),
              ids.shape(), dim);
  REDCO_CHECK(!into.defined() || (into.dtype() == DType::f32 && into.shape() == Shape{vocab, dim}),
              "embedding backward: cannot accumulate into {}, the table is f32[{}, {}]",
              into.str(0), vocab, dim);
  Tensor dtable = into.defined() ? into : Tensor::zeros({vocab, dim});
  cpu::embedding_backward(dout.data<float>(), ids_of(ids, "embedding"), dtable.data<float>(),
                          ids.numel(), vocab, dim);
  return dtable;
}
Tensor CpuBackend::rotary(const Tensor& x_in, int64_t pos_offset, float base, bool inverse) {
  Tensor x = f32(x_in, "rotary"), y = like(x);
  REDCO_CHECK(x.rank() == 4 && x.dim(3) % 2 == 0,
              "rotary: expected x [batch, heads, seq, head_dim] with an even head_dim, got {}",
              x.shape());
  cpu::rotary_apply(x.data<float>(), y.data<float>(), x.dim(0), x.dim(1), x.dim(2), x.dim(3),
                    pos_offset, base, inverse);
  return y;
}

// ---- attention ------------------------------------------------------------------------
namespace {
cpu::AttentionShape attention_shape(const Tensor& q, const Tensor& k, const Tensor& v, bool causal,
                                    float scale) {
  REDCO_CHECK(q.rank() == 4 && k.rank() == 4 && k.shape() == v.shape() && q.dim(0) == k.dim(0) &&
                  q.dim(3) == k.dim(3) && k.dim(1) > 0 && q.dim(1) % k.dim(1) == 0,
              "attention: expected q [B, Hq, Tq, D] and k, v [B, Hkv, Tk, D] with Hq a multiple "
              "of Hkv; got q {}, k {}, v {}",
              q.shape(), k.shape(), v.shape());
  REDCO_CHECK(!causal || q.dim(2) <= k.dim(2),
              "attention: causal attention needs Tq <= Tk (queries are the last Tq positions); "
              "got q {}, k {}",
              q.shape(), k.shape());
  return {q.dim(0), q.dim(1), k.dim(1), q.dim(2), k.dim(2), q.dim(3), scale, causal};
}

// Checks the extras against the shape and points the kernel's view at them.
void attach_extras(cpu::AttentionShape& s, const AttentionExtras& x, Tensor& bias) {
  REDCO_CHECK(x.key_begin.defined() == x.key_end.defined(),
              "attention: key ranges need both key_begin and key_end");
  if (x.key_begin.defined()) {
    for (const Tensor* t : {&x.key_begin, &x.key_end})
      REDCO_CHECK(t->dtype() == DType::i64 && t->shape() == Shape{s.B} && t->device().is_cpu(),
                  "attention: key ranges must be i64 [B = {}] CPU tensors, got {} {}", s.B,
                  dtype_name(t->dtype()), t->shape());
    s.key_begin = x.key_begin.data<int64_t>();
    s.key_end = x.key_end.data<int64_t>();
    for (int64_t b = 0; b < s.B; ++b)
      REDCO_CHECK(0 <= s.key_begin[b] && s.key_begin[b] <= s.key_end[b] && s.key_end[b] <= s.Tk,
                  "attention: batch row {} sees keys [{}, {}), outside [0, {})", b, s.key_begin[b],
                  s.key_end[b], s.Tk);
  }
  if (x.causal_offset.defined()) {
    REDCO_CHECK(x.causal_offset.dtype() == DType::i64 && x.causal_offset.shape() == Shape{s.B} &&
                    x.causal_offset.device().is_cpu(),
                "attention: causal offsets must be an i64 [B = {}] CPU tensor, got {}", s.B,
                x.causal_offset.shape());
    s.causal_offset = x.causal_offset.data<int64_t>();
  }
  if (x.bias.defined()) {
    bias = f32(x.bias, "attention bias");
    s.bias_per_row = bias.shape() == (Shape{s.B, s.Hq, s.Tq, s.Tk});
    REDCO_CHECK(s.bias_per_row || bias.shape() == (Shape{s.Hq, s.Tq, s.Tk}),
                "attention: the bias must be [Hq, Tq, Tk] = [{}, {}, {}] or one per batch row "
                "[{}, {}, {}, {}], got {}",
                s.Hq, s.Tq, s.Tk, s.B, s.Hq, s.Tq, s.Tk, bias.shape());
    s.bias = bias.data<float>();
  }
}

// A paged KV cache: the decode kernel reads the blocks where they lie; more
// query rows than it takes (a prompt continued on a paged cache) get them
// gathered into rows first.
Tensor paged_attention(CpuBackend& cpu, const Tensor& q_in, const Tensor& k_in, const Tensor& v_in,
                       bool causal, float scale, Tensor& lse, const AttentionExtras& x) {
  check_paged_kv("attention", q_in, k_in, v_in, x.block_table);
  REDCO_CHECK(!x.bias.defined(), "attention: a paged KV cache takes no score bias");
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
  Tensor q = f32(q_in, "attention"), bias;
  attach_extras(s, x, bias);
  s.block_table = table.data<int64_t>(), s.block = block, s.blocks_per_row = table.dim(1);
  for (int64_t b = 0; b < s.B; ++b) {  // the kernel reads every block below a row's key end
    const int64_t end = s.key_end ? s.key_end[b] : s.Tk;
    for (int64_t m = 0; m * block < end; ++m)
      REDCO_CHECK(s.block_table[b * s.blocks_per_row + m] >= 0,
                  "attention: row {} sees {} keys of a paged KV cache, but its block table holds "
                  "no block {}",
                  b, end, m);
  }
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
  Tensor q = f32(q_in, "attention");
  auto s = attention_shape(q, k_in, v_in, causal, scale);
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
  Tensor k = f32(k_in, "attention"), v = f32(v_in, "attention");
  cpu::flash_attention_forward(s, q.data<float>(), k.data<float>(), v.data<float>(),
                               o.data<float>(), lse.data<float>());
  return o;
}
TensorList CpuBackend::attention_backward(const Tensor& q_in, const Tensor& k_in,
                                          const Tensor& v_in, const Tensor& o, const Tensor& lse,
                                          const Tensor& dout_in, bool causal, float scale,
                                          const AttentionExtras& x) {
  Tensor q = f32(q_in, "attention"), k = f32(k_in, "attention"), v = f32(v_in, "attention");
  REDCO_CHECK(!x.block_table.defined(),
              "attention backward: a paged KV cache serves inference only (no gradients)");
  Tensor dout = f32(dout_in, "attention backward");
  auto s = attention_shape(q, k, v, causal, scale);
  Tensor bias;
  attach_extras(s, x, bias);
  check_same_shape(o, dout, "attention backward");
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
  REDCO_CHECK(x.rank() == 4 && w.rank() == 4 && x.dim(1) == w.dim(1),
              "conv2d: expected x [N, C, H, W] and w [O, C, KH, KW] with matching C; got x {}, "
              "w {}",
              x.shape(), w.shape());
  cpu::Conv2dGeometry g{x.dim(0), x.dim(1), x.dim(2), x.dim(3), w.dim(0),
                        w.dim(2), w.dim(3), stride,   pad};
  REDCO_CHECK(stride > 0 && pad >= 0 && g.out_h() > 0 && g.out_w() > 0,
              "conv2d: kernel {}x{} (stride {}, pad {}) does not fit the input {}", g.KH, g.KW,
              stride, pad, x.shape());
  return g;
}
Tensor cols_scratch(const cpu::Conv2dGeometry& g) {
  return Tensor::empty({g.N, g.C * g.KH * g.KW, g.out_h() * g.out_w()});
}
cpu::Pool2dGeometry pool_geometry(const Shape& x, int64_t k, int64_t stride, const char* op) {
  REDCO_CHECK(x.rank() == 4 && k > 0 && stride > 0 && x[2] >= k && x[3] >= k,
              "{}: expected x [N, C, H, W] at least {}x{} (stride {}), got {}", op, k, k, stride,
              x);
  return {x[0], x[1], x[2], x[3], k, stride};
}
}  // namespace

Tensor CpuBackend::conv2d(const Tensor& x_in, const Tensor& w_in, const Tensor& bias_in,
                          int64_t stride, int64_t pad) {
  Tensor x = f32(x_in, "conv2d"), w = f32(w_in, "conv2d");
  const auto g = conv_geometry(x, w, stride, pad);
  Tensor bias;
  if (bias_in.defined()) {
    bias = f32(bias_in, "conv2d");
    REDCO_CHECK(bias.shape() == Shape{g.O}, "conv2d: bias {} must be [{}] for weight {}",
                bias.shape(), g.O, w.shape());
  }
  Tensor y = Tensor::empty({g.N, g.O, g.out_h(), g.out_w()}), cols = cols_scratch(g);
  cpu::conv2d_forward(x.data<float>(), w.data<float>(),
                      bias.defined() ? bias.data<float>() : nullptr, y.data<float>(),
                      cols.data<float>(), g);
  return y;
}
TensorList CpuBackend::conv2d_backward(const Tensor& dy_in, const Tensor& x_in, const Tensor& w_in,
                                       bool has_bias, int64_t stride, int64_t pad) {
  Tensor x = f32(x_in, "conv2d"), w = f32(w_in, "conv2d"), dy = f32(dy_in, "conv2d backward");
  const auto g = conv_geometry(x, w, stride, pad);
  REDCO_CHECK(dy.shape() == (Shape{g.N, g.O, g.out_h(), g.out_w()}),
              "conv2d backward: gradient {} does not match the output shape", dy.shape());
  Tensor dx = like(x), dw = like(w), dbias = has_bias ? Tensor::empty({g.O}) : Tensor();
  Tensor cols = cols_scratch(g);
  cpu::conv2d_backward(dy.data<float>(), x.data<float>(), w.data<float>(), dx.data<float>(),
                       dw.data<float>(), has_bias ? dbias.data<float>() : nullptr,
                       cols.data<float>(), g);
  return {dx, dw, dbias};
}
Tensor CpuBackend::max_pool2d(const Tensor& x_in, int64_t k, int64_t stride, Tensor& argmax) {
  Tensor x = f32(x_in, "max_pool2d");
  const auto g = pool_geometry(x.shape(), k, stride, "max_pool2d");
  Tensor y = Tensor::empty({g.N, g.C, g.out_h(), g.out_w()});
  argmax = Tensor::empty(y.shape(), DType::i32);
  cpu::max_pool2d_forward(x.data<float>(), y.data<float>(), argmax.data<int32_t>(), g);
  return y;
}
Tensor CpuBackend::max_pool2d_backward(const Tensor& dy_in, const Tensor& argmax, const Shape& x,
                                       int64_t k, int64_t stride) {
  Tensor dy = f32(dy_in, "max_pool2d backward"), dx = Tensor::empty(x);
  check_same_shape(dy, argmax, "max_pool2d backward");
  const auto g = pool_geometry(x, k, stride, "max_pool2d backward");
  cpu::max_pool2d_backward(dy.data<float>(), argmax.data<int32_t>(), dx.data<float>(), g);
  return dx;
}
Tensor CpuBackend::max_pool2d_gather(const Tensor& dx_in, const Tensor& argmax) {
  Tensor dx = f32(dx_in, "max_pool2d gather"), out = Tensor::empty(argmax.shape());
  REDCO_CHECK(dx.rank() == 4 && argmax.rank() == 4 && dx.dim(0) == argmax.dim(0) &&
                  dx.dim(1) == argmax.dim(1),
              "max_pool2d gather: input {} does not match the pooled indices {}", dx.shape(),
              argmax.shape());
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
  Tensor x = f32(x_in, "avg_pool2d");
  const auto g = pool_geometry(x.shape(), k, stride, "avg_pool2d");
  Tensor y = Tensor::empty({g.N, g.C, g.out_h(), g.out_w()});
  cpu::avg_pool2d_forward(x.data<float>(), y.data<float>(), g);
  return y;
}
Tensor CpuBackend::avg_pool2d_backward(const Tensor& dy_in, const Shape& x, int64_t k,
                                       int64_t stride) {
  Tensor dy = f32(dy_in, "avg_pool2d backward"), dx = Tensor::empty(x);
  const auto g = pool_geometry(x, k, stride, "avg_pool2d backward");
  REDCO_CHECK(dy.shape() == (Shape{g.N, g.C, g.out_h(), g.out_w()}),
              "avg_pool2d backward: gradient {} does not match the pooled shape of {}", dy.shape(),
              x);
  cpu::avg_pool2d_backward(dy.data<float>(), dx.data<float>(), g);
  return dx;
}

// ---- group norm and upsampling ---------------------------------------------------------------
namespace {
cpu::GroupNormGeometry group_geometry(const Tensor& x, const Tensor& gamma, int64_t groups,
                                      const char* op) {
  REDCO_CHECK(x.rank() >= 2 && groups >= 1 && x.dim(1) % groups == 0,
              "{}: expected x [N, C, ...] with C divisible by the {} groups, got {}", op, groups,
              x.shape());
  REDCO_CHECK(gamma.shape() == Shape{x.dim(1)}, "{}: gamma {} must be [{}] for the input {}", op,
              gamma.shape(), x.dim(1), x.shape());
  return {x.dim(0), x.dim(1), x.numel() / std::max<int64_t>(x.dim(0) * x.dim(1), 1), groups};
}
Shape upsampled(const Shape& x, int64_t f, const char* op) {
  REDCO_CHECK(x.rank() == 4 && f >= 1, "{}: expected x [N, C, H, W] and a factor >= 1, got {} x{}",
              op, x, f);
  return Shape{x[0], x[1], x[2] * f, x[3] * f};
}
}  // namespace

Tensor CpuBackend::group_norm(const Tensor& x_in, const Tensor& gamma_in, const Tensor& beta_in,
                              int64_t groups, float eps, LayerNormSaved& saved) {
  Tensor x = f32(x_in, "group_norm"), gamma = f32(gamma_in, "group_norm"), beta;
  const auto g = group_geometry(x, gamma, groups, "group_norm");
  if (beta_in.defined()) {
    beta = f32(beta_in, "group_norm");
    REDCO_CHECK(beta.shape() == gamma.shape(), "group_norm: beta {} must be [{}]", beta.shape(),
                g.C);
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
  Tensor dy = f32(dy_in, "group_norm backward"), x = f32(x_in, "group_norm backward");
  Tensor gamma = f32(gamma_in, "group_norm backward");
  check_same_shape(x, dy, "group_norm backward");
  const auto g = group_geometry(x, gamma, groups, "group_norm backward");
  Tensor dx = like(x), dgamma = like(gamma), dbeta = has_beta ? like(gamma) : Tensor();
  Tensor partials = Tensor::empty({2, g.N, g.C});
  cpu::group_norm_backward(dy.data<float>(), x.data<float>(), gamma.data<float>(),
                           saved.mean.data<float>(), saved.rstd.data<float>(), dx.data<float>(),
                           dgamma.data<float>(), has_beta ? dbeta.data<float>() : nullptr,
                           partials.data<float>(), g);
  return {dx, dgamma, dbeta};
}
Tensor CpuBackend::upsample_nearest2d(const Tensor& x_in, int64_t f) {
  Tensor x = f32(x_in, "upsample_nearest2d");
  Tensor y = Tensor::empty(upsampled(x.shape(), f, "upsample_nearest2d"));
  cpu::upsample_nearest2d_forward(x.data<float>(), y.data<float>(), x.dim(0) * x.dim(1), x.dim(2),
                                  x.dim(3), f);
  return y;
}
Tensor CpuBackend::upsample_nearest2d_backward(const Tensor& dy_in, int64_t f) {
  Tensor dy = f32(dy_in, "upsample_nearest2d backward");
  REDCO_CHECK(dy.rank() == 4 && f >= 1 && dy.dim(2) % f == 0 && dy.dim(3) % f == 0,
              "upsample_nearest2d backward: gradient {} is not a {}x upsampled image", dy.shape(),
              f);
  Tensor dx = Tensor::empty({dy.dim(0), dy.dim(1), dy.dim(2) / f, dy.dim(3) / f});
  cpu::upsample_nearest2d_backward(dy.data<float>(), dx.data<float>(), dy.dim(0) * dy.dim(1),
                                   dx.dim(2), dx.dim(3), f);
  return dx;
}

// ---- dropout ------------------------------------------------------------------------------
Tensor CpuBackend::dropout_mask(const Shape& shape, float p, uint64_t seed, uint64_t stream) {
  REDCO_CHECK(p >= 0.f && p < 1.f, "dropout: probability must be in [0, 1), got {}", p);
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
