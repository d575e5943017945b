// The meta functions of the op list (ops/meta.hpp): every check a backend
// would otherwise repeat, written once, with the messages users see.
#include "redco/ops/meta.hpp"

#include <array>
#include <cmath>
#include <string>

#include "redco/core/error.hpp"
#include "redco/ops/matmul_batch.hpp"
#include "redco/ops/paged_kv.hpp"

namespace redco::meta {
namespace {

// A tensor in a message, the same on every device: "f32[2, 3]".
std::string described(const Tensor& t) {
  return t.defined() ? fmt::format("{}{}", dtype_name(t.dtype()), t.shape()) : "(undefined)";
}
// Generic ops take any dtype (integers convert where a kernel computes in f32).
void defined(const Tensor& t, const char* op) {
  REDCO_CHECK(t.defined(), "{}: an input tensor is undefined", op);
}
// A tensor a kernel reads as floating-point values: a floating dtype, or bytes
// that encode such values (int8 rows with scales, decode panels).
void floating(const Tensor& t, const char* op) {
  defined(t, op);
  REDCO_CHECK(is_floating(t.dtype()) || t.encoding(), "{}: expected a floating tensor, got {}{}",
              op, dtype_name(t.dtype()), t.shape());
}
void floating_like(const Tensor& x, const Tensor& dy, const char* op) {
  floating(x, op);
  floating(dy, op);
  check_same_shape(x, dy, op);
}
void indices(const Tensor& t, const char* op) {
  REDCO_CHECK(t.defined() && t.dtype() == DType::i64, "{}: indices must be i64, got {}{}", op,
              t.defined() ? dtype_name(t.dtype()) : "an undefined tensor", t.shape());
}
// Row-wise kernels see [rows, last]; an empty last dim has no rows to divide into.
void rows_of(const Tensor& x, const char* op) {
  floating(x, op);
  REDCO_CHECK(x.shape().last() >= 1, "{}: the last dim of {} is empty", op, x.shape());
}
void last_dim(const Tensor& x, const Tensor& v, const char* op, const char* what) {
  floating(v, op);
  REDCO_CHECK(v.rank() == 1 && v.dim(0) == x.shape().last(),
              "{}: {} has shape {} but the input {} needs [{}]", op, what, v.shape(), x.shape(),
              x.shape().last());
}
void saved_rows(const LayerNormSaved& s, const Tensor& x, bool layer, const char* op) {
  REDCO_CHECK(s.rstd.defined() && s.rstd.numel() == x.shape().rows() && s.mean.defined() == layer &&
                  (!layer || s.mean.numel() == s.rstd.numel()),
              "{}: the saved statistics ({}) are not a {}'s of the input {}; pass what the "
              "forward pass saved",
              op, described(s.rstd), layer ? "layer norm" : "RMS norm", x.shape());
}

}  // namespace

// ---- generic ops ------------------------------------------------------------------------
void unary(UnaryOp, const Tensor& x) { defined(x, "unary"); }
void binary(BinaryOp op, const Tensor& a, const Tensor& b) {
  defined(a, binary_name(op));
  defined(b, binary_name(op));
  broadcast_shapes(a.shape(), b.shape(), binary_name(op));
}
void binary_scalar(BinaryOp, const Tensor& a, float) { defined(a, "binary_scalar"); }
void add_inplace(Tensor& a, const Tensor& b) {
  defined(a, "add_inplace");
  defined(b, "add_inplace");
  check_same_shape(a, b, "add_inplace");
}
void reduce(ReduceOp, const Tensor& x, std::span<const int> axes) {
  defined(x, "reduce");
  const Shape& xs = x.shape();
  for (size_t k = 0; k < axes.size(); ++k) {
    const int a = axes[k];
    REDCO_CHECK(a >= 0 && a < xs.rank() && (k == 0 || axes[k - 1] < a),
                "reduce: axes must be sorted, distinct and in [0, {}) for shape {}", xs.rank(), xs);
  }
}
ReducePasses reduce_passes(const Shape& xs, std::span<const int> axes) {
  std::array<bool, Shape::kMaxRank> reduced{};
  for (const int a : axes) reduced[size_t(a)] = true;
  ReducePasses r;
  Shape shape = xs;
  for (int hi = xs.rank() - 1; hi >= 0;) {
    if (!reduced[size_t(hi)]) {
      --hi;
      continue;
    }
    int lo = hi;
    while (lo > 0 && reduced[size_t(lo - 1)]) --lo;
    ReducePass& p = r.pass[size_t(r.count++)];
    p.outer = p.reduced = p.inner = 1;
    for (int d = 0; d < lo; ++d) p.outer *= shape[d];
    for (int d = lo; d <= hi; ++d) p.reduced *= shape[d];
    for (int d = hi + 1; d < xs.rank(); ++d) p.inner *= shape[d];
    for (int d = lo; d <= hi; ++d) shape[d] = 1;
    p.out = shape;
    hi = lo - 1;
  }
  return r;
}
void argmax(const Tensor& x, int axis) {
  defined(x, "argmax");
  const int a = x.shape().axis(axis);
  REDCO_CHECK(x.dim(a) > 0 || x.shape().drop(a).numel() == 0,
              "argmax: axis {} of shape {} is empty", a, x.shape());
}
void broadcast_to(const Tensor& x, const Shape& shape) {
  defined(x, "broadcast_to");
  const Shape& xs = x.shape();
  bool ok = xs.rank() <= shape.rank();
  for (int i = 0; ok && i < xs.rank(); ++i) {
    const int64_t d = xs[i], t = shape[shape.rank() - xs.rank() + i];
    ok = d == t || d == 1;
  }
  REDCO_CHECK(ok, "broadcast_to: shape {} cannot be broadcast to {}", xs, shape);
}
void permute(const Tensor& x, std::span<const int> perm) {
  defined(x, "permute");
  const Shape& xs = x.shape();
  bool ok = int(perm.size()) == xs.rank();
  std::array<bool, Shape::kMaxRank> seen{};
  for (size_t i = 0; ok && i < perm.size(); ++i) {
    ok = perm[i] >= 0 && perm[i] < xs.rank() && !seen[size_t(perm[i])];
    if (ok) seen[size_t(perm[i])] = true;
  }
  REDCO_CHECK(ok, "permute: ({}) is not a permutation of the axes of shape {}",
              fmt::join(perm, ", "), xs);
}
void slice(const Tensor& x, int axis_in, int64_t start, int64_t len) {
  defined(x, "slice");
  const int axis = x.shape().axis(axis_in);
  REDCO_CHECK(start >= 0 && len >= 0 && start + len <= x.dim(axis),
              "slice: [{}, {}) is out of range for axis {} of shape {}", start, start + len, axis,
              x.shape());
}
void slice_assign(Tensor& dst, const Tensor& src, int axis_in, int64_t start) {
  defined(dst, "slice_assign");
  defined(src, "slice_assign");
  const int axis = dst.shape().axis(axis_in);
  REDCO_CHECK(src.rank() == dst.rank() && src.shape().with(axis, 0) == dst.shape().with(axis, 0),
              "slice_assign: source {} does not fit destination {} outside axis {}", src.shape(),
              dst.shape(), axis);
  REDCO_CHECK(start >= 0 && start + src.dim(axis) <= dst.dim(axis),
              "slice_assign: source {} placed at {} along axis {} overruns destination {}",
              src.shape(), start, axis, dst.shape());
}
void matmul(const Tensor& a, const Tensor& b, bool trans_a, bool trans_b) {
  matmul_shape(a.shape(), b.shape(), trans_a, trans_b);  // the shapes first: they name both
  floating(a, "matmul");
  floating(b, "matmul");
}
void matmul_into(const Tensor& a, const Tensor& b, bool ta, bool tb, Tensor& c, bool) {
  floating(a, "matmul_into");
  floating(b, "matmul_into");
  matmul_detail::into_dims(a, b, ta, tb, c);
}

Shape matmul_shape(const Shape& as, const Shape& bs, bool trans_a, bool trans_b) {
  REDCO_CHECK(as.rank() >= 2 && bs.rank() >= 2,
              "matmul: both operands need at least 2 dims, got shapes {} and {}", as, bs);
  const int64_t M = trans_a ? as[-1] : as[-2], K = trans_a ? as[-2] : as[-1];
  const int64_t kb = trans_b ? bs[-1] : bs[-2], N = trans_b ? bs[-2] : bs[-1];
  REDCO_CHECK(K == kb,
              "matmul: shapes {} and {} do not match: op(a) has K = {} but op(b) has K = {} "
              "(trans_a={}, trans_b={})",
              as, bs, K, kb, trans_a, trans_b);
  matmul_detail::broadcast_batch(as, bs, 1, 1);  // throws unless the batch dims broadcast
  std::array<int64_t, Shape::kMaxRank> dims{};
  const int r = std::max(as.rank(), bs.rank()) - 2;
  for (int i = 0; i < r; ++i) {
    const int ia = as.rank() - 2 - r + i, ib = bs.rank() - 2 - r + i;
    dims[size_t(i)] = std::max(ia >= 0 ? as[ia] : 1, ib >= 0 ? bs[ib] : 1);
  }
  dims[size_t(r)] = M;
  dims[size_t(r + 1)] = N;
  return Shape(std::span<const int64_t>(dims.data(), size_t(r + 2)));
}

// ---- softmax, losses, norms, activations ------------------------------------------------
void softmax(const Tensor& x) { rows_of(x, "softmax"); }
void softmax_backward(const Tensor& y, const Tensor& dy) {
  rows_of(y, "softmax backward");
  floating_like(y, dy, "softmax backward");
}
void log_softmax(const Tensor& x) { rows_of(x, "log_softmax"); }
void log_softmax_backward(const Tensor& y, const Tensor& dy) {
  rows_of(y, "log_softmax backward");
  floating_like(y, dy, "log_softmax backward");
}
void cross_entropy(const Tensor& logits, const Tensor& labels, int64_t, Tensor&) {
  rows_of(logits, "cross_entropy");
  indices(labels, "cross_entropy");
  REDCO_CHECK(labels.numel() == logits.shape().rows(),
              "cross_entropy: logits {} need {} labels (one per row), got labels {}",
              logits.shape(), logits.shape().rows(), labels.shape());
}
void cross_entropy_backward(const Tensor& logits, const Tensor& labels, const Tensor& lse,
                            const Tensor& dloss, int64_t ignore_index, bool) {
  Tensor no_lse;
  cross_entropy(logits, labels, ignore_index, no_lse);
  floating(dloss, "cross_entropy backward");
  check_same_shape(labels, dloss, "cross_entropy backward");
  REDCO_CHECK(lse.defined() && lse.dtype() == DType::f32 && lse.numel() == labels.numel(),
              "cross_entropy backward: lse {} must be the forward pass's f32 [{}]", described(lse),
              labels.numel());
}
void layer_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, float, LayerNormSaved&) {
  rows_of(x, "layer_norm");
  last_dim(x, gamma, "layer_norm", "gamma");
  if (beta.defined()) last_dim(x, beta, "layer_norm", "beta");
}
void layer_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, bool,
                         const LayerNormSaved& saved) {
  rows_of(x, "layer_norm backward");
  floating_like(x, dy, "layer_norm backward");
  last_dim(x, gamma, "layer_norm backward", "gamma");
  saved_rows(saved, x, true, "layer_norm backward");
}
void rms_norm(const Tensor& x, const Tensor& gamma, float, LayerNormSaved&) {
  rows_of(x, "rms_norm");
  last_dim(x, gamma, "rms_norm", "gamma");
}
void rms_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma,
                       const LayerNormSaved& saved) {
  rows_of(x, "rms_norm backward");
  floating_like(x, dy, "rms_norm backward");
  last_dim(x, gamma, "rms_norm backward", "gamma");
  saved_rows(saved, x, false, "rms_norm backward");
}
void gelu(const Tensor& x, bool) { floating(x, "gelu"); }
void gelu_backward(const Tensor& x, const Tensor& dy, bool) {
  floating_like(x, dy, "gelu backward");
}
void silu(const Tensor& x) { floating(x, "silu"); }
void silu_backward(const Tensor& x, const Tensor& dy) { floating_like(x, dy, "silu backward"); }

// ---- embedding and positions -------------------------------------------------------------
void embedding(const Tensor& table, const Tensor& ids) {
  floating(table, "embedding");
  REDCO_CHECK(table.rank() == 2, "embedding: the table must be [vocab, dim], got {}",
              table.shape());
  indices(ids, "embedding");
}
void embedding_backward(const Tensor& dout, const Tensor& ids, int64_t vocab, const Tensor& into) {
  floating(dout, "embedding backward");
  indices(ids, "embedding backward");
  const int64_t dim = dout.shape().last();
  REDCO_CHECK(dout.numel() == ids.numel() * dim,
              "embedding backward: gradient {} does not match ids {} x dim {}", dout.shape(),
              ids.shape(), dim);
  REDCO_CHECK(!into.defined() || (into.dtype() == DType::f32 && into.shape() == Shape{vocab, dim}),
              "embedding backward: cannot accumulate into {}, the table is f32[{}, {}]",
              described(into), vocab, dim);
}
void rotary(const Tensor& x, int64_t, float base, bool) {
  floating(x, "rotary");
  REDCO_CHECK(x.rank() == 4 && x.dim(3) % 2 == 0,
              "rotary: expected x [batch, heads, seq, head_dim] with an even head_dim, got {}",
              x.shape());
  REDCO_CHECK(base > 0.f && std::isfinite(base), "rotary: base must be positive, got {}", base);
}

// ---- attention ----------------------------------------------------------------------------
namespace {
// q [B, Hq, Tq, D] against k, v [B, Hkv, Tk, D]; returns Tk.
int64_t dense_keys(const Tensor& q, const Tensor& k, const Tensor& v, bool causal) {
  for (const Tensor* t : {&q, &k, &v}) floating(*t, "attention");
  REDCO_CHECK(q.rank() == 4 && k.rank() == 4 && k.shape() == v.shape() && q.dim(0) == k.dim(0) &&
                  q.dim(3) == k.dim(3) && k.dim(1) > 0 && q.dim(1) % k.dim(1) == 0,
              "attention: expected q [B, Hq, Tq, D] and k, v [B, Hkv, Tk, D] with Hq a multiple "
              "of Hkv; got q {}, k {}, v {}",
              q.shape(), k.shape(), v.shape());
  REDCO_CHECK(!causal || q.dim(2) <= k.dim(2),
              "attention: causal attention needs Tq <= Tk (queries are the last Tq positions); "
              "got q {}, k {}",
              q.shape(), k.shape());
  return k.dim(2);
}
// An i64 [B] extra, its values on the host (they are host bookkeeping; a
// device's copy is read back, B values).
Tensor row_values(const Tensor& t, int64_t B, const char* what) {
  REDCO_CHECK(t.dtype() == DType::i64 && t.shape() == Shape{B},
              "attention: {} must be an i64 [B = {}] tensor, got {} {}", what, B,
              dtype_name(t.dtype()), t.shape());
  return t.device().is_cpu() ? t : t.to(Device::cpu());
}
void extras_fit(const Tensor& q, int64_t Tk, const AttentionExtras& x) {
  const int64_t B = q.dim(0), Hq = q.dim(1), Tq = q.dim(2);
  REDCO_CHECK(x.key_begin.defined() == x.key_end.defined(),
              "attention: key ranges need both key_begin and key_end");
  if (x.key_begin.defined()) {
    const Tensor hb = row_values(x.key_begin, B, "key_begin");
    const Tensor he = row_values(x.key_end, B, "key_end");
    const int64_t *lo = hb.data<int64_t>(), *hi = he.data<int64_t>();
    for (int64_t b = 0; b < B; ++b)
      REDCO_CHECK(0 <= lo[b] && lo[b] <= hi[b] && hi[b] <= Tk,
                  "attention: batch row {} sees keys [{}, {}), outside [0, {})", b, lo[b], hi[b],
                  Tk);
  }
  if (x.causal_offset.defined()) row_values(x.causal_offset, B, "causal_offset");
  if (x.bias.defined()) {
    floating(x.bias, "attention bias");
    REDCO_CHECK(x.bias.shape() == (Shape{Hq, Tq, Tk}) || x.bias.shape() == (Shape{B, Hq, Tq, Tk}),
                "attention: the bias must be [Hq, Tq, Tk] = [{}, {}, {}] or one per batch row "
                "[{}, {}, {}, {}], got {}",
                Hq, Tq, Tk, B, Hq, Tq, Tk, x.bias.shape());
  }
}
}  // namespace

void attention(const Tensor& q, const Tensor& k, const Tensor& v, bool causal, float, Tensor&,
               const AttentionExtras& x) {
  if (!x.block_table.defined()) return extras_fit(q, dense_keys(q, k, v, causal), x);
  for (const Tensor* t : {&q, &k, &v}) floating(*t, "attention");
  check_paged_kv("attention", q, k, v, x.block_table);
  REDCO_CHECK(!x.bias.defined(), "attention: a paged KV cache takes no score bias");
  const int64_t block = k.dim(2), M = x.block_table.dim(1);
  extras_fit(q, M * block, x);
  // The kernels read every block below a row's key end.
  const int64_t* table = x.block_table.data<int64_t>();
  const Tensor ends = x.key_end.defined() ? row_values(x.key_end, q.dim(0), "key_end") : Tensor();
  for (int64_t b = 0; b < q.dim(0); ++b) {
    const int64_t end = ends.defined() ? ends.data<int64_t>()[b] : M * block;
    for (int64_t m = 0; m * block < end; ++m)
      REDCO_CHECK(table[b * M + m] >= 0,
                  "attention: row {} sees {} keys of a paged KV cache, but its block table holds "
                  "no block {}",
                  b, end, m);
  }
}
void attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& o,
                        const Tensor& lse, const Tensor& dout, bool causal, float,
                        const AttentionExtras& x) {
  REDCO_CHECK(!x.block_table.defined(),
              "attention backward: a paged KV cache serves inference only (no gradients)");
  extras_fit(q, dense_keys(q, k, v, causal), x);
  floating(o, "attention backward");
  floating(dout, "attention backward");
  REDCO_CHECK(o.shape() == q.shape() && dout.shape() == q.shape() && lse.defined() &&
                  lse.dtype() == DType::f32 && lse.shape() == q.shape().drop(3),
              "attention backward: the output {}, its gradient {} and lse {} must be shaped "
              "like q {} and f32 [B, Hq, Tq]",
              o.shape(), dout.shape(), described(lse), q.shape());
}
// ---- images -------------------------------------------------------------------------------
namespace {
void image(const Tensor& x, const char* op) {
  floating(x, op);
  REDCO_CHECK(x.rank() == 4, "{}: expected x [N, C, H, W], got {}", op, x.shape());
}
void conv_fits(const Tensor& x, const Tensor& w, int64_t stride, int64_t pad, const char* op) {
  floating(x, op);
  floating(w, op);
  REDCO_CHECK(x.rank() == 4 && w.rank() == 4 && x.dim(1) == w.dim(1),
              "{}: expected x [N, C, H, W] and w [O, C, KH, KW] with matching C; got x {}, w {}",
              op, x.shape(), w.shape());
  conv2d_shape(x.shape(), w.shape(), stride, pad);
}
void groups_fit(const Tensor& x, const Tensor& gamma, int64_t groups, const char* op) {
  floating(x, op);
  floating(gamma, op);
  REDCO_CHECK(x.rank() >= 2 && groups >= 1 && x.dim(1) % groups == 0,
              "{}: expected x [N, C, ...] with C divisible by the {} groups, got {}", op, groups,
              x.shape());
  REDCO_CHECK(gamma.shape() == Shape{x.dim(1)}, "{}: gamma {} must be [{}] for the input {}", op,
              gamma.shape(), x.dim(1), x.shape());
}
Shape pooled(const Shape& x, int64_t k, int64_t stride, const char* op) {
  REDCO_CHECK(x.rank() == 4 && k > 0 && stride > 0 && x[2] >= k && x[3] >= k,
              "{}: expected x [N, C, H, W] at least {}x{} (stride {}), got {}", op, k, k, stride,
              x);
  return Shape{x[0], x[1], (x[2] - k) / stride + 1, (x[3] - k) / stride + 1};
}
}  // namespace

Shape conv2d_shape(const Shape& x, const Shape& w, int64_t stride, int64_t pad) {
  const int64_t oh = stride > 0 ? (x[2] + 2 * pad - w[2]) / stride + 1 : 0;
  const int64_t ow = stride > 0 ? (x[3] + 2 * pad - w[3]) / stride + 1 : 0;
  REDCO_CHECK(stride > 0 && pad >= 0 && x[2] + 2 * pad >= w[2] && x[3] + 2 * pad >= w[3],
              "conv2d: kernel {}x{} (stride {}, pad {}) does not fit the input {}", w[2], w[3],
              stride, pad, x);
  return Shape{x[0], w[0], oh, ow};
}
Shape pooled_shape(const Shape& x, int64_t k, int64_t stride) {
  return pooled(x, k, stride, "pool2d");
}

void conv2d(const Tensor& x, const Tensor& w, const Tensor& bias, int64_t stride, int64_t pad) {
  conv_fits(x, w, stride, pad, "conv2d");
  if (!bias.defined()) return;
  floating(bias, "conv2d");
  REDCO_CHECK(bias.shape() == Shape{w.dim(0)}, "conv2d: bias {} must be [{}] for weight {}",
              bias.shape(), w.dim(0), w.shape());
}
void conv2d_backward(const Tensor& dy, const Tensor& x, const Tensor& w, bool, int64_t stride,
                     int64_t pad) {
  conv_fits(x, w, stride, pad, "conv2d backward");
  floating(dy, "conv2d backward");
  REDCO_CHECK(dy.shape() == conv2d_shape(x.shape(), w.shape(), stride, pad),
              "conv2d backward: gradient {} does not match the output shape", dy.shape());
}
void max_pool2d(const Tensor& x, int64_t k, int64_t stride, Tensor&) {
  image(x, "max_pool2d");
  pooled(x.shape(), k, stride, "max_pool2d");
}
void max_pool2d_backward(const Tensor& dy, const Tensor& argmax, const Shape& x, int64_t k,
                         int64_t stride) {
  floating(dy, "max_pool2d backward");
  REDCO_CHECK(argmax.defined() && argmax.dtype() == DType::i32 &&
                  dy.shape() == pooled(x, k, stride, "max_pool2d backward") &&
                  argmax.shape() == dy.shape(),
              "max_pool2d backward: gradient {} and indices {} must both be the pooled shape of {}",
              dy.shape(), described(argmax), x);
}
void max_pool2d_gather(const Tensor& dx, const Tensor& argmax) {
  image(dx, "max_pool2d gather");
  REDCO_CHECK(argmax.defined() && argmax.dtype() == DType::i32 && argmax.rank() == 4 &&
                  dx.dim(0) == argmax.dim(0) && dx.dim(1) == argmax.dim(1),
              "max_pool2d gather: input {} does not match the pooled indices {}", dx.shape(),
              described(argmax));
}
void avg_pool2d(const Tensor& x, int64_t k, int64_t stride) {
  image(x, "avg_pool2d");
  pooled(x.shape(), k, stride, "avg_pool2d");
}
void avg_pool2d_backward(const Tensor& dy, const Shape& x, int64_t k, int64_t stride) {
  floating(dy, "avg_pool2d backward");
  REDCO_CHECK(dy.shape() == pooled(x, k, stride, "avg_pool2d backward"),
              "avg_pool2d backward: gradient {} does not match the pooled shape of {}", dy.shape(),
              x);
}
void group_norm(const Tensor& x, const Tensor& gamma, const Tensor& beta, int64_t groups, float,
                LayerNormSaved&) {
  groups_fit(x, gamma, groups, "group_norm");
  if (!beta.defined()) return;
  floating(beta, "group_norm");
  REDCO_CHECK(beta.shape() == gamma.shape(), "group_norm: beta {} must be [{}]", beta.shape(),
              gamma.numel());
}
void group_norm_backward(const Tensor& dy, const Tensor& x, const Tensor& gamma, int64_t groups,
                         bool, const LayerNormSaved& saved) {
  groups_fit(x, gamma, groups, "group_norm backward");
  floating_like(x, dy, "group_norm backward");
  const int64_t rows = x.dim(0) * groups;
  REDCO_CHECK(saved.mean.defined() && saved.rstd.defined() && saved.mean.numel() == rows &&
                  saved.rstd.numel() == rows,
              "group_norm backward: the saved statistics must be the forward pass's [N * groups "
              "= {}]",
              rows);
}
void upsample_nearest2d(const Tensor& x, int64_t f) {
  image(x, "upsample_nearest2d");
  REDCO_CHECK(f >= 1, "upsample_nearest2d: the factor must be >= 1, got {}", f);
}
void upsample_nearest2d_backward(const Tensor& dy, int64_t f) {
  image(dy, "upsample_nearest2d backward");
  REDCO_CHECK(f >= 1 && dy.dim(2) % f == 0 && dy.dim(3) % f == 0,
              "upsample_nearest2d backward: gradient {} is not a {}x upsampled image", dy.shape(),
              f);
}

// ---- optimizer updates --------------------------------------------------------------------
namespace {
void f32_like(const Tensor& p, const Tensor& t, const char* op, const char* what) {
  REDCO_CHECK(t.defined() && t.dtype() == DType::f32, "{}: the {} must be an f32 tensor, got {}",
              op, what, t.defined() ? dtype_name(t.dtype()) : "an undefined one");
  REDCO_CHECK(t.numel() == p.numel(), "{}: the {} has shape {} but the parameter has {}", op, what,
              t.shape(), p.shape());
}
}  // namespace
void sgd_update(Tensor& param, const Tensor& grad, Tensor& buf, const SgdCoeffs&) {
  f32_like(param, param, "sgd_update", "parameter");
  f32_like(param, grad, "sgd_update", "gradient");
  if (buf.defined()) f32_like(param, buf, "sgd_update", "momentum buffer");
}
void adam_update(Tensor& param, const Tensor& grad, Tensor& m, Tensor& v, const AdamCoeffs&) {
  f32_like(param, param, "adam_update", "parameter");
  f32_like(param, grad, "adam_update", "gradient");
  f32_like(param, m, "adam_update", "first moment");
  f32_like(param, v, "adam_update", "second moment");
}
void sum_of_squares(const Tensor& x) { f32_like(x, x, "sum_of_squares", "input"); }
void dropout_mask(const Shape&, float p, uint64_t, uint64_t) {
  REDCO_CHECK(p >= 0.f && p < 1.f, "dropout: probability must be in [0, 1), got {}", p);
}

}  // namespace redco::meta
