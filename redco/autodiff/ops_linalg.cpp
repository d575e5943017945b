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
#include "redco/autodiff/recording.hpp"
#include "redco/ops/backend.hpp"

namespace redco {
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
  // Fold every leading dim into the GEMM's M: one [tokens, in] x [in, out]
  // product forward, and dW = dY^T X is a single GEMM too (no batch to sum).
  const Shape out_shape = x.shape().with(-1, w.dim(0));
  Tensor y = matmul(reshape(x, {-1, w.dim(1)}), w, false, true);
  if (bias.defined()) {
    REDCO_CHECK(bias.shape() == Shape{w.dim(0)}, "linear: bias {} must be [{}] for weight {}",
                bias.shape(), w.dim(0), w.shape());
    y = add(y, bias);
  }
  return reshape(y, out_shape);
}

}  // namespace redco
