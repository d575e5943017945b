// Matrix products. For C = op(A) op(B) the gradients are again products with
// transpose flags, so no transposed copy is ever made:
//   C = A B     : dA = dC B^T        dB = A^T dC
//   C = A^T B   : dA = B dC^T        dB = A dC
//   C = A B^T   : dA = dC B          dB = dC^T A
//   C = A^T B^T : dA = B^T dC^T      dB = dC^T A^T
// Batch dimensions that were broadcast are summed back. When b is one matrix
// shared by a batch of a's (a tied LM head, x [B, T, d] @ wte^T), its gradient
// folds the batch into the GEMM's K instead: one [rows, ...] product, with no
// [B, ...] stack of per-batch gradients to reduce afterwards.
#include <array>

#include "redco/autodiff/recording.hpp"
#include "redco/ops/backend.hpp"
#include "redco/ops/cpu/decode_panels.hpp"
#include "redco/ops/cpu/quantized_rows.hpp"

namespace redco {
using detail::building_higher_order;
using detail::reference_vjp;
using detail::SavedInput;
using detail::unbroadcast;

namespace {
// d loss / d b for c = op(a) op(b), g = d loss / d c.
Tensor matmul_grad_b(const Tensor& a, const Tensor& b, const Tensor& g, bool ta, bool tb) {
  if (b.rank() == 2 && a.rank() > 2 && !ta) {
    // Rows of a (and of g) are contiguous across the batch: fold it into K.
    const Tensor a2 = reshape(a, {-1, a.shape().last()});  // [rows, K]
    const Tensor g2 = reshape(g, {-1, g.shape().last()});  // [rows, N]
    return tb ? matmul(g2, a2, true, false) : matmul(a2, g2, true, false);
  }
  const Tensor gb = tb ? matmul(g, a, true, ta) : matmul(a, g, !ta, false);
  return unbroadcast(gb, b.shape());
}
}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b, bool ta, bool tb) {
  // The products run, forward and backward, in the precision that was current
  // when the op was recorded (backward runs after any PrecisionGuard closed).
  const Precision precision = matmul_precision();
  return record("matmul", {a, b}, kernels::matmul(a, b, ta, tb),
                [a, b, ta, tb, precision](const Node& self, const TensorList& grads) {
                  PrecisionGuard same(precision);
                  const Tensor& g = grads[0];
                  Tensor ga, gb;
                  if (self.needs_grad(0)) {
                    ga = ta ? matmul(b, g, tb, true) : matmul(g, b, false, !tb);
                    ga = unbroadcast(ga, a.shape());
                  }
                  if (self.needs_grad(1)) gb = matmul_grad_b(a, b, g, ta, tb);
                  return TensorList{ga, gb};
                });
}

Tensor linear(const Tensor& x, const Tensor& w, const Tensor& bias) {
  REDCO_CHECK(w.rank() == 2 && x.rank() >= 1 && x.shape().last() == w.dim(1),
              "linear: input {} does not match weight {} (stored [out, in])", x.shape(), w.shape());
  REDCO_CHECK(!bias.defined() || bias.shape() == Shape{w.dim(0)},
              "linear: bias {} must be [{}] for weight {}", bias.shape(), w.dim(0), w.shape());
  // Fold every leading dim into the GEMM's M: one [tokens, in] x [in, out]
  // product forward, and dW = dY^T X is a single GEMM too (no batch to sum).
  // x is saved as a SavedInput: a norm's output is recomputed in backward.
  // So is w: a ZeRO-3 weight, gathered for this read, is gathered again when
  // backward needs it rather than kept whole in between (train/param_gather.hpp).
  const int64_t in = w.dim(1), out = w.dim(0);
  const Shape x_shape = x.shape(), out_shape = x.shape().with(-1, out);
  const Precision precision = matmul_precision();
  Tensor y =
      record("linear", {x, w}, kernels::matmul(x.view({-1, in}), w, false, true).view(out_shape),
             [saved_x = SavedInput(x), saved_w = SavedInput(w), in, out, x_shape, precision](
                 const Node& self, const TensorList& g) {
               PrecisionGuard same(precision);
               const Tensor x = saved_x.get();
               if (building_higher_order())
                 return reference_vjp(self, {x, saved_w.get()}, g[0], [&](const TensorList& a) {
                   return reshape(matmul(reshape(a[0], {-1, in}), a[1], false, true),
                                  x_shape.with(-1, out));
                 });
               const Tensor dy = g[0].view({-1, out});  // [rows, out]
               TensorList grads(2);
               if (self.needs_grad(0))
                 grads[0] = kernels::matmul(dy, saved_w.get(), false, false).view(x_shape);
               if (self.needs_grad(1))
                 grads[1] = kernels::matmul(dy, x.view({-1, in}), true, false);
               return grads;
             });
  return bias.defined() ? add(y, bias) : y;
}

namespace {
// The tensors stacked along dim 0 into a new buffer (no autograd).
// The tensors' rows, one after another (their elements as stored).
Tensor stack_plain(const TensorList& ts) {
  int64_t rows = 0;
  for (const Tensor& t : ts) rows += t.dim(0);
  Tensor out = Tensor::empty(ts[0].shape().with(0, rows), ts[0].dtype(), ts[0].device());
  int64_t at = 0;
  for (const Tensor& t : ts) {
    kernels::slice_assign(out, t, 0, at);
    at += t.dim(0);
  }
  return out;
}

Tensor stack_rows(const TensorList& ts) {
  if (in_panels(ts[0]) || in_i8_panels(ts[0])) {  // packed for decoding: widened to stack
    TensorList wide;
    for (const Tensor& t : ts) {
      REDCO_CHECK(in_panels(t) || in_i8_panels(t),
                  "linear_stacked: packed and row-major weights cannot be stacked");
      wide.push_back(t.to(DType::f32));
    }
    return stack_plain(wide);
  }
  if (!row_scales(ts[0])) return stack_plain(ts);
  TensorList scales;  // int8 weights: their rows, and their scales likewise
  for (const Tensor& t : ts) {
    REDCO_CHECK(row_scales(t), "linear_stacked: int8 and other weights cannot be stacked");
    scales.push_back(*row_scales(t));
  }
  return quantized_rows(stack_plain(ts), stack_plain(scales));
}
}  // namespace

bool stacks_as_stored(const Tensor& w) {
  return !in_panels(w) && !in_i8_panels(w) && !row_scales(w);
}

// One GEMM against weights stacked on the fly (q, k and v projections of one
// input). The stacked copy is a temporary in forward and rebuilt in backward
// (a few MB), so the node keeps only x and the weights it was given, not a
// third copy of them; dW is one GEMM, cut into the weights' rows.
Tensor linear_stacked(const Tensor& x, const TensorList& ws, const TensorList& bs) {
  REDCO_CHECK(!ws.empty(), "linear_stacked: no weights given");
  REDCO_CHECK(bs.empty() || bs.size() == ws.size(),
              "linear_stacked: {} biases for {} weights (give one per weight, or none)", bs.size(),
              ws.size());
  const int64_t in = x.shape().last();
  int64_t out = 0;
  for (size_t i = 0; i < ws.size(); ++i) {
    REDCO_CHECK(ws[i].rank() == 2 && ws[i].dim(1) == in,
                "linear_stacked: input {} does not match weight {} (stored [out, in])", x.shape(),
                ws[i].shape());
    REDCO_CHECK(bs.empty() || bs[i].shape() == Shape{ws[i].dim(0)},
                "linear_stacked: bias {} must be [{}] for weight {}", bs[i].shape(), ws[i].dim(0),
                ws[i].shape());
    out += ws[i].dim(0);
  }
  const Precision precision = matmul_precision();
  Tensor y = kernels::matmul(x.view({-1, in}), stack_rows(ws), false, true);  // [rows, out]
  if (!bs.empty()) y = kernels::binary(BinaryOp::add, y, stack_rows(bs));
  TensorList inputs{x};
  inputs.insert(inputs.end(), ws.begin(), ws.end());
  inputs.insert(inputs.end(), bs.begin(), bs.end());
  // Every input saved as a SavedInput (x a norm's output, the weights
  // possibly ZeRO-3's gathered ones); the weights are read again only for dx.
  std::vector<SavedInput> saved;
  for (const Tensor& t : inputs) saved.emplace_back(t);
  std::vector<int64_t> rows_of;  // each weight's output rows
  for (const Tensor& w : ws) rows_of.push_back(w.dim(0));
  return record(
      "linear", inputs, y.view(x.shape().with(-1, out)),
      [saved, rows_of, n = ws.size(), has_bias = !bs.empty(), in, out, precision](
          const Node& self, const TensorList& g) {
        PrecisionGuard same(precision);
        const bool higher = building_higher_order();
        TensorList inputs(saved.size());
        for (size_t i = 0; i < saved.size(); ++i)
          if (i == 0 || (i <= n && (higher || self.needs_grad(0))) || (i > n && higher))
            inputs[i] = saved[i].get();
        const TensorList ws(inputs.begin() + 1, inputs.begin() + 1 + long(n));
        if (higher)
          return reference_vjp(self, inputs, g[0], [n, has_bias](const TensorList& a) {
            const TensorList w(a.begin() + 1, a.begin() + 1 + long(n));
            return linear(
                a[0], concat(w, 0),
                has_bias ? concat(TensorList(a.begin() + 1 + long(n), a.end()), 0) : Tensor());
          });
        const Tensor dy = g[0].view({-1, out});  // [rows, out]
        TensorList grads(inputs.size());
        if (self.needs_grad(0))
          grads[0] = kernels::matmul(dy, stack_rows(ws), false, false).view(inputs[0].shape());
        const Tensor dw = kernels::matmul(dy, inputs[0].view({-1, in}), true, false);  // [out, in]
        const std::array<int, 1> rows{0};
        const Tensor db =
            has_bias ? kernels::reduce(ReduceOp::sum, dy, rows).view({out}) : Tensor();
        int64_t at = 0;
        for (size_t i = 0; i < n; ++i) {
          const int64_t r = rows_of[i];
          grads[1 + i] = kernels::slice(dw, 0, at, r);
          if (has_bias) grads[1 + n + i] = kernels::slice(db, 0, at, r);
          at += r;
        }
        return grads;
      });
}

}  // namespace redco
